"""float32's "3xtf32" at float32's accuracy on the GPU, at reduction lengths K >= 4096
(docs/decisions.md, "tf32_accuracy": the tensor cores' accumulation truncates
toward zero at every step, so a long product drifts low; the wgmma kernel adds each
k-tile's product on the CUDA cores instead). Each path against float64, beside the IEEE
(FMA) result of the same product: its error within a small multiple of IEEE's, and no
bias ("shrink": the least-squares scale of the result against the exact one, less 1;
a truncating accumulation gives -8e-6 and worse at K 4096)."""
import numpy as np
import pytest

import nbdnn
from nbdnn.cuda import SIMULATOR

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(SIMULATOR, reason="the tensor cores")]


def _errors(got, exact):
    got = np.asarray(got, np.float64)
    err = float(np.abs(got - exact).max() / np.abs(exact).max())
    shrink = float(((got - exact) * exact).sum() / (exact * exact).sum())
    return err, shrink


@pytest.fixture(autouse=True)
def _promoted(monkeypatch):
    """The promoted accumulations (nbdnn.cuda.matmul.PROMOTE_3XTF32, flash_tf32's
    PROMOTE_3X), on whatever the defaults."""
    from nbdnn.cuda import matmul
    from nbdnn.cuda.attention import flash_tf32
    from nbdnn.ops import _plan
    monkeypatch.setattr(matmul, "PROMOTE_3XTF32", True)
    monkeypatch.setattr(flash_tf32, "PROMOTE_3X", True)
    _plan.clear()


def _check(run, exact):
    ieee, _ = _errors(run("ieee"), exact)
    err, shrink = _errors(run("3xtf32"), exact)
    assert abs(shrink) < 1e-6, f"3xtf32 biased: shrink {shrink:.2e} (ieee error {ieee:.2e})"
    assert err <= 4 * ieee, f"3xtf32 error {err:.2e} against ieee's {ieee:.2e}"


@pytest.mark.parametrize("m,n,k", [(512, 512, 4096), (256, 384, 8192), (64, 512, 6144)])
def test_matmul_3xtf32_is_float32_class(m, n, k):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(k)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n)))
    exact = a.astype(np.float64) @ b.astype(np.float64)
    da, db = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    _check(lambda mode: nbdnn.matmul(da, db, math=mode).cpu().numpy(), exact)


def test_conv_3xtf32_is_float32_class():
    """C * R * S = 4608 taps a sum: the convolution's GEMM path (algo "gemm")."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 512, 10, 10)).astype(np.float32)
    w = rng.standard_normal((64, 512, 3, 3)).astype(np.float32)
    exact = nbdnn.conv2d(x.astype(np.float64), w.astype(np.float64), padding=1)
    dx, dw = torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda()
    _check(lambda mode: nbdnn.conv2d(dx, dw, padding=1, algo="gemm", math=mode).cpu().numpy(),
           exact)


@pytest.mark.parametrize("D", [64, 128])
def test_attention_3xtf32_is_float32_class(D):
    """4096 keys a row: O's sum over the keys (D 64: flash_tf32's mma.sync chain, D 128:
    gemm.py's P V on the wgmma kernel)."""
    torch = pytest.importorskip("torch")
    g = torch.Generator(device="cuda").manual_seed(D)
    q = torch.randn(1, 2, 256, D, device="cuda", generator=g)
    k, v = (torch.randn(1, 2, 4096, D, device="cuda", generator=g) for _ in range(2))
    exact = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double(), v.double()).cpu().numpy()
    _check(lambda mode: nbdnn.scaled_dot_product_attention(q, k, v, math=mode)[0].cpu().numpy(),
           exact)


def test_attention_backward_3xtf32_is_float32_class():
    """dq sums over 4096 keys, dk and dv over 4096 queries (gemm.py's five products)."""
    torch = pytest.importorskip("torch")
    g = torch.Generator(device="cuda").manual_seed(7)
    q, k, v, do = (torch.randn(1, 1, 4096, 64, device="cuda", generator=g) for _ in range(4))
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    torch.nn.functional.scaled_dot_product_attention(*leaves).backward(do.double())
    exact = [t.grad.cpu().numpy() for t in leaves]
    o, lse = nbdnn.scaled_dot_product_attention(q, k, v)
    grads = {mode: [t.cpu().numpy() for t in nbdnn.scaled_dot_product_attention_backward(
        do, q, k, v, o, lse, math=mode)] for mode in ("ieee", "3xtf32")}
    for i, name in enumerate(("dq", "dk", "dv")):
        ieee, _ = _errors(grads["ieee"][i], exact[i])
        err, shrink = _errors(grads["3xtf32"][i], exact[i])
        assert abs(shrink) < 1e-6, f"{name}: 3xtf32 biased: shrink {shrink:.2e}"
        assert err <= 4 * ieee, f"{name}: 3xtf32 error {err:.2e} against ieee's {ieee:.2e}"

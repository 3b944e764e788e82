"""Which GEMM tiles and how many split-K chunks run for which shape
(nbdnn.cuda.matmul.choose_tile), and every (tile, chunks) pair forced on small shapes: the
chunk edges, a reduction shorter than one chunk, transposes, the beta blend and a
broadcast batch. Under the simulator (2 SMs) random shapes split only from K = 256 (MIN_CHUNK = 128)."""
import numpy as np
import pytest

import nbdnn
from nbdnn.cuda import matmul as MM
from nbdnn.cuda.runtime import device


def test_tile_by_shape(monkeypatch):
    monkeypatch.setattr(device, "_sm", {device.current(): 132})  # (the H200's 132)
    monkeypatch.setattr(MM, "TILES", MM.HW_TILES)
    big = "float32"
    assert MM.choose_tile(4096, 4096, 4096, 1, big, True) == ("large", 1)      # 1024 tiles
    assert MM.choose_tile(2048, 2048, 2048, 1, big, True) == ("large", 1)      # 256 tiles
    assert MM.choose_tile(1024, 1024, 1024, 1, big, True) == ("small", 1)      # 256 small tiles
    assert MM.choose_tile(512, 512, 512, 1, big, True) == ("small", 4)         # 64 tiles x 4
    assert MM.choose_tile(64, 4096, 4096, 1, big, True) == ("small", 9)        # ~4 blocks an SM
    assert MM.choose_tile(64, 8192, 1024, 1, big, True) == ("small", 5)
    assert MM.choose_tile(64, 576, 100352, 1, big, True) == ("small", 59)      # conv dW
    assert MM.choose_tile(64, 576, 100352, 1, big, False) == ("tiny", 1)       # no split
    assert MM.choose_tile(32, 32, 10 ** 7, 1, big, True) == ("tiny", MM.MAX_SPLITS)
    assert MM.choose_tile(100, 100, 0, 1, big, True)[1] == 1


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("size", ["large", "small", "tiny"])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("trans", [(False, False), (True, True), (True, False)])
def test_forced_tile_matches_numpy(monkeypatch, size, splits, trans):
    monkeypatch.setattr(MM, "MIN_CHUNK", 1)
    monkeypatch.setattr(MM, "FORCE_TILE", (size, splits))
    rng = np.random.default_rng(splits)
    ta, tb = trans
    M, N, K = 9, 7, 19                       # no tile, chunk or k-step edge lines up
    a = rng.standard_normal((2, K, M) if ta else (2, M, K))
    b = rng.standard_normal((1, N, K) if tb else (1, K, N))
    out = rng.standard_normal((2, M, N))
    want = 0.5 * np.matmul(a.swapaxes(-1, -2) if ta else a,
                           b.swapaxes(-1, -2) if tb else b) + 2.0 * out
    got = nbdnn.matmul(a, b, trans_a=ta, trans_b=tb, alpha=0.5, beta=2.0, out=out.copy(),
                       backend="cuda")
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("splits", [1, 3])
def test_split_k_with_bias_and_activation(monkeypatch, dtype, splits):
    """A float32 product with a bias and an activation splits its reduction too: the
    chunks summed in order by split_k's sum, then bias, activation, alpha and beta in
    the GEMM's order (alpha act(a b + bias) + beta c); float64's stays whole (that sum
    is float32's). Against the CPU reference, a broadcast batch."""
    from nbdnn.cuda.runtime.launch.kernel import launched
    monkeypatch.setattr(MM, "MIN_CHUNK", 1)
    monkeypatch.setattr(MM, "FORCE_TILE", ("small", splits))
    rng = np.random.default_rng(7)
    M, N, K = 9, 7, 19
    a, b = rng.uniform(-1, 1, (2, M, K)), rng.uniform(-1, 1, (1, K, N))
    bias, out = rng.uniform(-1, 1, N), rng.uniform(-1, 1, (2, M, N))
    a, b, bias, out = (t.astype(dtype) for t in (a, b, bias, out))
    kw = dict(bias=bias, activation="elu", alpha=0.5, beta=2.0)
    want = nbdnn.matmul(a, b, out=out.copy(), backend="cpu", math="ieee", **kw)
    with launched() as names:
        got = nbdnn.matmul(a, b, out=out.copy(), backend="cuda", math="ieee", **kw)
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    assert any("splitk_sum" in n for n in names) == (splits > 1 and dtype == "float32"), names

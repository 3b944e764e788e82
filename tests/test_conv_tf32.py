"""float32 convolution in math "tf32" on the tensor cores (wgmma_conv.tf32_usable, the
wgmma kernel's tf32 kind over TFLOAT32 im2col maps; conv's variant tf32_tensor_cores):
its host decisions without a GPU, and on
an sm_90 GPU the forward against the CPU reference in math "tf32" (the same rounded
operands, float32 sums)."""
import numpy as np
import pytest
from tensorcore_cases import cc as _cc

from nbdnn.cuda import SIMULATOR
from test_conv_tensorcore import _geometry

# (x shape NHWC, w shape KRSC, stride, padding): a ResNet 3x3, stride 2 with 40
# channels (a 32-channel k-tile past C: TMA's zeros), a 1x1, 49 rows (split-K)
CASES = [((2, 14, 14, 64), (64, 3, 3, 64), 1, 1), ((3, 9, 11, 40), (96, 3, 3, 40), 2, 1),
         ((4, 8, 8, 128), (256, 1, 1, 128), 1, 0), ((1, 7, 7, 256), (256, 3, 3, 256), 1, 1)]


def test_tf32_usable_and_plan(monkeypatch):
    """float32, channels-last, one group, C and K multiples of 4,
    16-byte bases, no residual, alpha 1, beta 0 (the GEMM's epilogue order); the plan's
    reduction counts 32-channel k-tiles."""
    from nbdnn.cuda.conv import wgmma_conv as C
    monkeypatch.setattr(C, "ptr", lambda a: a)
    monkeypatch.setattr(C, "dtype_name", lambda a: "float32")
    monkeypatch.setattr(C, "sm_count", lambda: 132)
    monkeypatch.setattr(C.split_k, "sm_count", lambda: 132)
    g = _geometry((32, 56, 56, 64), (64, 3, 3, 64), 1, 1, 1)
    assert C.tf32_usable(256, 512, 1024, g, 64, None, 1.0, 0.0)
    assert not C.tf32_usable(256, 512, 1024, g, None, 2048, 1.0, 1.0)   # a residual
    assert not C.tf32_usable(256, 512, 1024, g, None, None, 0.5, 0.0)   # alpha
    assert not C.tf32_usable(256, 520, 1024, g, None, None, 1.0, 0.0)   # w unaligned
    assert not C.tf32_usable(256, 512, 1024, _geometry((2, 9, 9, 6), (8, 3, 3, 6), 1, 1, 1),
                             None, None, 1.0, 0.0)                       # C = 6
    odd = _geometry((3, 9, 11, 40), (96, 3, 3, 40), 2, 1, 1)
    assert C.tf32_usable(256, 512, 1024, odd, None, None, 1.0, 0.0)
    assert C.plan(odd, "float32")[3] == 9 * 64 and C.plan(odd, "bfloat16")[3] == 9 * 64
    assert C.plan(_geometry((2, 8, 8, 32), (64, 3, 3, 32), 1, 1, 1), "float32")[3] == 9 * 32


@pytest.mark.skipif(SIMULATOR, reason="inline PTX needs a GPU")
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[1])))
def test_tf32_forward_on_tensor_cores(case, monkeypatch):
    """conv2d(math="tf32") on float32 NHWC through the tf32 wgmma kernel (which ran),
    with a bias and relu and plain, against the CPU reference in math "tf32"."""
    torch = pytest.importorskip("torch")
    import nbdnn
    from nbdnn.cuda.runtime.launch.kernel import launched
    if _cc() < (9, 0):
        pytest.skip("wgmma needs sm_90")
    xs, ws, stride, padding = case
    rng = np.random.default_rng(sum(xs) + sum(ws))
    x = rng.standard_normal(xs, dtype=np.float32)
    w = (rng.standard_normal(ws, dtype=np.float32) / np.sqrt(np.prod(ws[1:]))).astype(np.float32)
    b = rng.standard_normal(ws[0], dtype=np.float32)
    kw = dict(stride=stride, padding=padding, layout="NHWC", math="tf32")
    xd, wd, bd = (torch.from_numpy(a).cuda() for a in (x, w, b))
    with launched() as names:
        y = nbdnn.conv2d(xd, wd, bd, activation="relu", **kw)
        plain = nbdnn.conv2d(xd, wd, **kw)
    assert sum(n.startswith("wgmma_conv_tf32") for n in names) == 2, names
    for got, args in ((y, (x, w, b)), (plain, (x, w))):
        want = nbdnn.conv2d(*args, activation="relu" if len(args) == 3 else None,
                            backend="cpu", **kw)
        np.testing.assert_allclose(got.cpu().numpy(), want, rtol=1e-4, atol=1e-4)


def test_tf32_channels_first_goes_through_copies_where_a_filter_has_taps(monkeypatch):
    """conv's variant tf32_channels_first_copies: float32 NCHW in math "tf32" that the tf32
    kernel takes channels-last, wanted where the filter has more than one tap (a 1x1
    keeps the GEMM path: no im2col to save); never a channels-last call
    (tf32_tensor_cores takes those), another math mode, groups, or C not a multiple of 4."""
    from nbdnn.cuda import conv as CV
    from nbdnn.cuda.conv import wgmma_conv as C
    from nbdnn.cuda.conv.geometry import geometry
    monkeypatch.setattr(C, "ptr", lambda a: a)
    monkeypatch.setattr(C, "dtype_name", lambda a: "float32")
    monkeypatch.setattr(CV, "dtype_name", lambda a: "float32")
    monkeypatch.setattr(C, "sm_count", lambda: 132)
    monkeypatch.setattr(C.split_k, "sm_count", lambda: 132)
    monkeypatch.setattr(CV, "_tensor_cores", lambda: True)
    v = next(v for v in CV.FORWARD if v.name == "tf32_channels_first_copies")

    def call(xs, ws, pad=1, last=0, math="tf32", groups=1):
        g = geometry(xs, ws, (1, 1), ((pad, pad),) * 2, (1, 1), groups, "cross_correlation",
                     last)
        return CV.Call(g, "gemm", math, 1.0, 0.0, 0, x=256, w=512, y=1024)
    c = call((32, 64, 56, 56), (64, 64, 3, 3))
    assert v.usable(c) and v.wanted(c)
    c = call((32, 64, 56, 56), (256, 64, 1, 1), pad=0)
    assert v.usable(c) and not v.wanted(c)
    assert not v.usable(call((32, 56, 56, 64), (64, 3, 3, 64), last=1))
    assert not v.usable(call((32, 64, 56, 56), (64, 64, 3, 3), math="ieee"))
    assert not v.usable(call((32, 64, 56, 56), (64, 64, 3, 3), math="3xtf32"))
    assert not v.usable(call((32, 64, 56, 56), (64, 32, 3, 3), groups=2))
    assert not v.usable(call((2, 6, 9, 9), (8, 6, 3, 3)))


@pytest.mark.skipif(SIMULATOR, reason="inline PTX needs a GPU")
@pytest.mark.parametrize("case", CASES[:2], ids=lambda c: "x".join(map(str, c[1])))
def test_tf32_forward_channels_first_through_copies(case):
    """conv2d(math="tf32") on float32 NCHW: x and w copied channels-last, the tf32 wgmma
    kernel (which ran), y copied back; with a bias and relu, against the CPU reference."""
    torch = pytest.importorskip("torch")
    import nbdnn
    from nbdnn.cuda.runtime.launch.kernel import launched
    if _cc() < (9, 0):
        pytest.skip("wgmma needs sm_90")
    xs, ws, stride, padding = case
    xs, ws = (xs[0], xs[3], xs[1], xs[2]), (ws[0], ws[3], ws[1], ws[2])  # NCHW, KCRS
    rng = np.random.default_rng(sum(xs) + sum(ws))
    x = rng.standard_normal(xs, dtype=np.float32)
    w = (rng.standard_normal(ws, dtype=np.float32) / np.sqrt(np.prod(ws[1:]))).astype(np.float32)
    b = rng.standard_normal(ws[0], dtype=np.float32)
    kw = dict(stride=stride, padding=padding, math="tf32")
    with launched() as names:
        y = nbdnn.conv2d(*(torch.from_numpy(a).cuda() for a in (x, w, b)), activation="relu",
                         **kw)
    assert sum(n.startswith("wgmma_conv_tf32") for n in names) == 1, names
    want = nbdnn.conv2d(x, w, b, activation="relu", backend="cpu", **kw)
    np.testing.assert_allclose(y.cpu().numpy(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layout,xs,ws,pad,dil", [
    ("NCHW", (2, 8, 7, 6), (4, 8, 3, 3), 1, 1),
    ("NHWC", (2, 6, 7, 8), (4, 3, 3, 8), (2, 0), (2, 1)),
])
def test_tf32_data_gradient_as_a_forward(layout, xs, ws, pad, dil):
    """conv's data-gradient variant tf32_as_forward (float32 in math "tf32", stride 1,
    more than one tap): the transposed, flipped filter and the forward over dy in math
    "tf32" (the tf32 kernel on an sm_90 GPU, channels-first through copies; the GEMM in
    the simulator), against the CPU reference in math "tf32"; it ran, and "auto" takes it
    only where the tensor cores are (else the GEMM path, as before)."""
    import nbdnn
    from nbdnn.cuda import conv as CV
    from nbdnn.cuda.runtime import variants
    from nbdnn.cuda.runtime.memory.arrays import to_device
    rng = np.random.default_rng(sum(xs))
    last = layout == "NHWC"
    K = ws[0]
    x_shape = xs
    y_sp = [(n + 2 * p - d * (r - 1) - 1) + 1 for n, p, d, r in zip(
        xs[1:3] if last else xs[2:], (pad, pad) if isinstance(pad, int) else pad,
        (dil, dil) if isinstance(dil, int) else dil, ws[1:3] if last else ws[2:])]
    dys = (xs[0], *y_sp, K) if last else (xs[0], K, *y_sp)
    dy = rng.standard_normal(dys).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    kw = dict(stride=1, padding=pad, dilation=dil, layout=layout, math="tf32")
    from nbdnn.cuda.runtime.launch.kernel import launched
    with variants.chosen() as ran, CV.forced("tf32_as_forward"), launched() as names:
        got = nbdnn.conv_backward_data(to_device(dy), to_device(w), x_shape, backend="cuda",
                                       **kw)
    assert ("conv", "tf32_as_forward") in ran, ran
    if not SIMULATOR and _cc() >= (9, 0):  # (the forward on the tf32 kernel)
        assert sum(n.startswith("wgmma_conv_tf32") for n in names) == 1, names
    want = nbdnn.conv_backward_data(dy, w, x_shape, backend="cpu", **kw)
    np.testing.assert_allclose(got.copy_to_host(), want, rtol=1e-5, atol=1e-5)
    exact = nbdnn.conv_backward_data(dy, w, x_shape, backend="cpu", **dict(kw, math="ieee"))
    assert np.abs(exact - want).max() > 1e-4  # (the tolerance tells tf32 from ieee)
    v = next(v for v in CV.DATA if v.name == "tf32_as_forward")
    assert v.wanted(None) == CV._tensor_cores()

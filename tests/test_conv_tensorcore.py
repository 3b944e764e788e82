"""Convolution on the tensor cores (nbdnn/cuda/conv/wgmma_conv.py, the im2col operands
of nbdnn/cuda/matmul/tensor_core_gemm/wgmma_im2col.py): on an sm_90 GPU against the CPU reference in
float64 on the same 16-bit operands, over the geometries its TMA maps must get right
(strides, paddings per side, dilation, flipped filters, channels not a multiple of 64,
1-d, tiles across images, split-K); without one, its host decisions and the producer's
generated coordinate code run against a model of TMA's im2col walk."""
import contextlib

import numpy as np
import pytest
from tensorcore_cases import cc as _cc

from nbdnn.cuda import SIMULATOR

# (x shape NHWC, w shape KRSC, stride, padding, dilation, mode)
CASES = [
    ((2, 14, 14, 64), (64, 3, 3, 64), 1, 1, 1, "cross_correlation"),      # ResNet 3x3
    ((3, 9, 11, 72), (96, 3, 3, 72), 2, 1, 1, "cross_correlation"),       # stride 2, odd
    ((2, 10, 7, 40), (200, 3, 5, 40), 1, ((2, 0), (1, 3)), 1, "convolution"),  # per side
    ((1, 12, 12, 16), (48, 3, 3, 16), 1, 2, 2, "cross_correlation"),      # dilation 2
    ((2, 20, 20, 8), (64, 7, 7, 8), 2, 3, 1, "cross_correlation"),        # 7x7/2, C = 8
    ((4, 8, 8, 128), (256, 1, 1, 128), 2, 0, 1, "cross_correlation"),     # 1x1 stride 2
    ((1, 7, 7, 512), (512, 3, 3, 512), 1, 1, 1, "cross_correlation"),     # 49 rows: split-K
    ((5, 6, 6, 64), (128, 1, 1, 64), 1, 0, 1, "cross_correlation"),       # 1x1: the GEMM
]


def _reference(xv, wv, bias, stride, padding, dilation, mode, act):
    import nbdnn
    y = nbdnn.conv2d(xv, wv, bias, stride=stride, padding=padding, dilation=dilation,
                     mode=mode, layout="NHWC", activation=act, backend="cpu")
    return np.asarray(y)


@pytest.mark.skipif(SIMULATOR, reason="inline PTX needs a GPU")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[0])) + "_" +
                         "x".join(map(str, c[1])))
def test_conv_forward_on_tensor_cores(case, dtype, monkeypatch):
    """The tensor-core forward (im2col kernel, or the GEMM for a stride-1 1x1) against
    the CPU reference on the same rounded operands, with a bias and relu and plain;
    which kernel ran. Every case the kernel's limits allow (the
    64 x 64 tiles' direct stores: the stride-2, 72-channel, 90-row case, an unwritten output)."""
    torch = pytest.importorskip("torch")
    import nbdnn
    from nbdnn.cuda.runtime.launch.kernel import launched
    if _cc() < (9, 0):
        pytest.skip("wgmma needs sm_90")
    xs, ws, stride, padding, dilation, mode = case
    rng = np.random.default_rng(sum(xs) + sum(ws))
    tdt = getattr(torch, dtype)
    x = torch.from_numpy(rng.standard_normal(xs, dtype=np.float32)).to(tdt).cuda()
    w = torch.from_numpy(rng.standard_normal(ws, dtype=np.float32) /
                         np.sqrt(np.prod(ws[1:]))).to(tdt).cuda()
    b = torch.from_numpy(rng.standard_normal(ws[0], dtype=np.float32)).to(tdt).cuda()
    xv, wv, bv = (t.double().cpu().numpy() for t in (x, w, b))
    kw = dict(stride=stride, padding=padding, dilation=dilation, mode=mode, layout="NHWC")
    with launched() as names:
        y = nbdnn.conv2d(x, w, b, activation="relu", **kw)
        plain = nbdnn.conv2d(x, w, **kw)
    gemm = ws[1:3] == (1, 1) and stride == 1 and padding == 0
    want = "wgmma_gemm" if gemm else "wgmma_conv"
    assert all(n.startswith(want) or n == "_splitk_sum" for n in names) and \
        sum(n.startswith(want) for n in names) == 2, names
    ulp = 2.0 ** -8 if dtype == "bfloat16" else 2.0 ** -11
    taps = np.prod(ws[1:])
    for got, ref in ((y, _reference(xv, wv, bv, stride, padding, dilation, mode, "relu")),
                     (plain, _reference(xv, wv, None, stride, padding, dilation, mode, None))):
        assert tuple(got.shape) == ref.shape
        np.testing.assert_allclose(got.double().cpu().numpy(), ref, rtol=2 * ulp,
                                   atol=2 * ulp + 1e-6 * np.sqrt(taps))


@pytest.mark.skipif(SIMULATOR, reason="inline PTX needs a GPU")
def test_conv1d_and_fallbacks_on_tensor_cores(monkeypatch):
    """A 1-d channels-last convolution runs the im2col kernel as 2-d with H = 1
    ; what it cannot take runs other algorithms, correctly: a residual, beta, C = 3
    (pixels of 6 bytes: the padded columns and the GEMM,
    test_narrow_channels_through_padded_columns), two groups (SIMT);
    find_conv_algorithm's kernel names."""
    torch = pytest.importorskip("torch")
    import nbdnn
    from nbdnn.cuda.runtime.launch.kernel import launched
    if _cc() < (9, 0):
        pytest.skip("wgmma needs sm_90")
    rng = np.random.default_rng(7)

    def t(shape, scale=1.0):
        return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32) * scale) \
            .to(torch.bfloat16).cuda()

    x1, w1 = t((3, 50, 24)), t((40, 5, 24), 0.1)
    with launched() as names:
        y1 = nbdnn.conv1d(x1, w1, stride=2, padding=2, layout="NHWC")
    assert len(names) == 1 and names[0].startswith("wgmma_conv"), names
    ref = nbdnn.conv1d(x1.double().cpu().numpy(), w1.double().cpu().numpy(), stride=2,
                       padding=2, layout="NHWC", backend="cpu")
    np.testing.assert_allclose(y1.double().cpu().numpy(), np.asarray(ref), rtol=2 ** -7,
                               atol=2 ** -7)
    x, w = t((2, 9, 9, 16)), t((32, 3, 3, 16), 0.2)
    for kw, extra in (({}, {"x": t((2, 9, 9, 3)), "w": t((32, 3, 3, 3))}),
                      ({"groups": 2}, {"w": t((32, 3, 3, 8))})):
        xx, ww = extra.get("x", x), extra.get("w", w)
        with launched() as names:
            y = nbdnn.conv2d(xx, ww, padding=1, layout="NHWC", **kw)
        assert not any(n.startswith("wgmma_conv") for n in names), (kw, names)
        cpu = {k: (v.double().cpu().numpy() if hasattr(v, "cpu") else v) for k, v in kw.items()}
        ref = nbdnn.conv2d(xx.double().cpu().numpy(), ww.double().cpu().numpy(), padding=1,
                           layout="NHWC", backend="cpu", **cpu)
        np.testing.assert_allclose(y.double().cpu().numpy(), np.asarray(ref), rtol=2 ** -6,
                                   atol=2 ** -6)
    # find_conv_algorithm names each algorithm's kernels: implicit_gemm is the
    # tensor cores' im2col kernel here, direct is not
    found = {r["algo"]: r["kernels"] for r in nbdnn.find_conv_algorithm(
        x, w, padding=1, layout="NHWC", reps=1)}
    assert found["implicit_gemm"][0].startswith("wgmma_conv_bf16"), found
    assert not any(n.startswith("wgmma") for n in found["direct"]), found


@pytest.mark.skipif(SIMULATOR, reason="inline PTX needs a GPU")
@pytest.mark.parametrize("store", [True, False])
@pytest.mark.parametrize("shapes", [((2, 12, 12, 64), (64, 3, 3, 64)),
                                    ((2, 12, 12, 64), (128, 1, 1, 64))],
                         ids=["3x3", "1x1"])
def test_conv_epilogue_in_conv_order(shapes, store, monkeypatch):
    """The convolution's epilogue on the tensor cores, act(alpha acc + beta z + bias):
    z a residual (ResNet's last convolution of a block: relu(conv + bias + identity)),
    or y itself (beta, in place), with alpha; staged TMA stores and direct stores; a
    1x1 filter with z runs the im2col kernel (the GEMM's epilogue has the other order)."""
    torch = pytest.importorskip("torch")
    import nbdnn
    from nbdnn.cuda.matmul.tensor_core_gemm import wgmma_gemm as W
    from nbdnn.cuda.runtime.launch.kernel import launched
    if _cc() < (9, 0):
        pytest.skip("wgmma needs sm_90")
    monkeypatch.setattr(W, "TMA_STORE", store)
    rng = np.random.default_rng(11)
    xs, ws = shapes
    ys = xs[:3] + (ws[0],)

    def t(shape, scale=1.0):
        return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32) * scale) \
            .to(torch.bfloat16).cuda()

    x, w, b, res = t(xs), t(ws, 0.1), t((ws[0],)), t(ys)
    pad = ws[1] // 2
    cpu = {k: v.double().cpu().numpy() for k, v in dict(x=x, w=w, b=b, res=res).items()}
    for kw, ckw in (({"residual": res, "alpha": 0.5}, {"residual": cpu["res"], "alpha": 0.5}),
                    ({"residual": res, "alpha2": 2.0}, {"residual": cpu["res"], "alpha2": 2.0}),
                    ({"beta": 0.75, "out": res.clone()}, {"beta": 0.75,
                                                          "out": cpu["res"].copy()})):
        with launched() as names:
            y = nbdnn.conv2d(x, w, b, padding=pad, layout="NHWC", activation="relu", **kw)
        assert len(names) == 1 and names[0].startswith("wgmma_conv") and \
            ("_ts" in names[0]) == store, (kw, names)
        ref = nbdnn.conv2d(cpu["x"], cpu["w"], cpu["b"], padding=pad, layout="NHWC",
                           activation="relu", backend="cpu", **ckw)
        np.testing.assert_allclose(y.double().cpu().numpy(), np.asarray(ref), rtol=2 ** -7,
                                   atol=2 ** -7)


def _geometry(xs, ws, stride, padding, dilation, mode="cross_correlation"):
    from nbdnn.cuda.conv.geometry import geometry
    nd = len(xs) - 2
    st = (stride,) * nd if isinstance(stride, int) else stride
    dl = (dilation,) * nd if isinstance(dilation, int) else dilation
    pads = ((padding, padding),) * nd if isinstance(padding, int) else padding
    return geometry(xs, ws, st, pads, dl, 1, mode, 1)


def test_channels_first_geometry_is_the_channels_last_one():
    """conv/channels_first.forward takes the NCHW call's geometry with `last` set as the NHWC
    call's: every other field is the layout's own (1-d, 2-d, 3-d, per-side padding,
    stride, dilation, mode)."""
    from nbdnn.cuda.conv.geometry import geometry
    for nd, x, w in ((1, (2, 8, 30), (16, 8, 5)), (2, (2, 8, 13, 11), (16, 8, 3, 5)),
                     (3, (1, 8, 5, 6, 7), (16, 8, 3, 3, 1))):
        to_last = (0,) + tuple(range(2, nd + 2)) + (1,)
        kw = ((2,) * nd, ((1, 2),) * nd, (1,) * (nd - 1) + (2,), 1, "convolution")
        first = geometry(x, w, *kw, False)
        last = geometry(tuple(x[p] for p in to_last), tuple(w[p] for p in to_last), *kw, True)
        assert first._replace(last=1) == last


def test_channels_first_goes_channels_last_where_it_measured_faster():
    """conv/channels_first.pays on ResNet-50's layers at batch 32 in bf16 NCHW, as measured
    the copies around the tensor cores against "auto" without them: the 1x1 layers of
    s2-s4 and s1's 3x3 (the SIMT implicit GEMM otherwise) through the copies; s1's 1x1
    layers (too few flops a copied byte) and the 3x3 layers of s2-s4 (winograd) not;
    "implicit_gemm" asked for goes by the flops alone. (The stem's 3 channels pay but
    the im2col kernel does not take them: forward asks wgmma_conv.usable.)"""
    from nbdnn.cuda import conv as CV
    from nbdnn.cuda.conv import channels_first as CF
    from nbdnn.cuda.conv.geometry import geometry

    def pays(hw, c, k, r, stride=1, algo="auto"):
        g = geometry((32, c, hw, hw), (k, c, r, r), (stride, stride), ((r // 2,) * 2,) * 2,
                     (1, 1), 1, "cross_correlation", 0)
        return CF.pays(g, "bfloat16", CV._auto_forward(g, "bfloat16") if algo == "auto"
                       else algo)
    assert [pays(56, c, k, 1) for c, k in ((64, 64), (64, 256), (256, 64))] == [False] * 3
    assert pays(56, 64, 64, 3)
    assert all(pays(hw, c, k, 1) for hw, c in ((28, 128), (14, 256), (7, 512))
               for k in (c, 4 * c) if k != c) and pays(7, 2048, 512, 1)
    assert not any(pays(hw, c, c, 3) for hw, c in ((28, 128), (14, 256), (7, 512)))
    assert pays(14, 256, 256, 3, algo="implicit_gemm")


@pytest.mark.skipif(SIMULATOR, reason="inline PTX needs a GPU")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_channels_first_through_channels_last(dtype, monkeypatch):
    """conv/channels_first.py: 16-bit NCHW forwards (a 3x3 with bias and relu, a strided
    1x1 with a residual, a stride-1 1x1: the GEMM) run the tensor cores on tiled
    channels-last copies; two groups keep the SIMT kernels; all against the CPU
    reference on the same rounded operands."""
    torch = pytest.importorskip("torch")
    import nbdnn
    from nbdnn.cuda.conv import channels_first as CF
    from nbdnn.cuda.runtime.launch.kernel import launched
    if _cc() < (9, 0):
        pytest.skip("wgmma needs sm_90")
    from nbdnn.cuda import tensor
    monkeypatch.setattr(CF, "MIN_FLOP_PER_BYTE", 0)  # (small layers: the paths)
    monkeypatch.setattr(tensor, "TILED_TRANSPOSE", True)
    rng = np.random.default_rng(11)
    dt = getattr(torch, dtype)

    def t(shape, scale=1.0):
        return torch.from_numpy(rng.standard_normal(shape).astype(np.float32) * scale) \
            .to(dt).cuda()

    for xs, ws, kw, res, tc in (
            ((2, 64, 12, 10), (96, 64, 3, 3), dict(padding=1, activation="relu"), False, True),
            ((3, 32, 9, 9), (64, 32, 1, 1), dict(stride=2), True, True),
            ((2, 48, 7, 7), (40, 48, 1, 1), {}, False, True),
            ((2, 32, 8, 8), (32, 16, 3, 3), dict(padding=1, groups=2), False, False)):
        x, w, b = t(xs), t(ws, 0.1), t((ws[0],))
        y0 = nbdnn.conv2d(x.cpu().double().numpy(), w.cpu().double().numpy(), backend="cpu",
                          **{k: v for k, v in kw.items() if k != "activation"})
        z = t(y0.shape) if res else None
        with launched() as names:
            y = nbdnn.conv2d(x, w, b, residual=z, **kw)
        want = nbdnn.conv2d(x.cpu().double().numpy(), w.cpu().double().numpy(),
                            b.cpu().double().numpy(), backend="cpu",
                            residual=None if z is None else z.cpu().double().numpy(), **kw)
        assert any(n.startswith("wgmma") for n in names) == tc, (xs, names)
        assert any(n.startswith("_transpose_tiles") for n in names) == tc, (xs, names)
        np.testing.assert_allclose(y.double().cpu().numpy(), np.asarray(want), rtol=2 ** -6,
                                   atol=2 ** -6)


class _Arr:
    def __init__(self, address):
        self.__cuda_array_interface__ = {"data": (address, False)}


def test_usable_and_plan(monkeypatch):
    """wgmma_conv.usable and plan without a GPU: the limits (channels and filters
    multiples of 8, 16-byte bases, strides <= 8, one group, the GEMM's epilogue), the
    corners TMA gets, the width for K filters (64 for K = 64, 256 for a wave-filling
    K = 512) and split-K for 49 rows."""
    from nbdnn.cuda.conv import wgmma_conv as C
    monkeypatch.setattr(C, "ptr", lambda a: a)
    monkeypatch.setattr(C, "dtype_name", lambda a: "bfloat16")
    monkeypatch.setattr(C, "sm_count", lambda: 132)
    monkeypatch.setattr(C.split_k, "sm_count", lambda: 132)
    g = _geometry((32, 56, 56, 64), (64, 3, 3, 64), 1, 1, 1)
    assert C.usable(256, 512, 1024, g, None, None, 1.0, 0.0)
    assert C.corners(g) == ((-1, -1), (-1, -1))
    assert C.plan(g, "bfloat16")[0][0] == 64 and C.plan(g, "bfloat16")[1] == 1
    assert C.usable(256, 512, 1024, g, None, 2048, 1.0, 1.0)          # a residual
    assert C.usable(256, 512, 1024, g, None, None, 0.5, 0.0)          # alpha
    assert not C.usable(256, 512, 1024, g, None, 2050, 1.0, 1.0)      # residual unaligned
    assert not C.usable(256, 520, 1024, g, None, None, 1.0, 0.0)      # w unaligned
    assert not C.usable(256, 512, 1024, _geometry((2, 9, 9, 3), (8, 3, 3, 3), 1, 1, 1),
                        None, None, 1.0, 0.0)                          # C = 3
    s2 = _geometry((8, 56, 56, 256), (512, 1, 1, 256), 2, 0, 1)
    assert C.corners(s2) == ((0, 0), (-1, -1)) and C.usable(256, 512, 1024, s2, None, None,
                                                             1.0, 0.0)
    assert not C.usable(256, 512, 1024, _geometry((1, 64, 64, 8), (8, 3, 3, 8), 9, 1, 1),
                        None, None, 1.0, 0.0)                          # stride 9
    tail = _geometry((1, 7, 7, 512), (512, 3, 3, 512), 1, 1, 1)
    tile, splits, chunk, red = C.plan(tail, "bfloat16")
    assert tile[2:] == (64,) and splits > 1 and red == 9 * 512 and chunk % 64 == 0
    assert C.plan(tail, "bfloat16", can_split=False)[1:3] == (1, red)  # (z, alpha: no split)
    wide = _geometry((64, 28, 28, 128), (512, 1, 1, 128), 1, 0, 1)
    assert C.plan(wide, "bfloat16")[0][0] == 256


def test_filter_usable(monkeypatch):
    """wgmma_conv.filter_usable without a GPU: 16-bit channels-last single-group 2-d calls with C % 64 ==
    0, K % 8 == 0, 16-byte bases and the forward's TMA limits."""
    from nbdnn.cuda.conv import wgmma_conv as C
    monkeypatch.setattr(C, "ptr", lambda a: a)
    monkeypatch.setattr(C, "dtype_name", lambda a: "bfloat16")
    g = _geometry((32, 56, 56, 64), (64, 3, 3, 64), 1, 1, 1)
    assert C.filter_usable(256, 512, 1024, g)
    assert C.filter_usable(256, 512, 1024, _geometry((3, 9, 11, 64), (96, 3, 3, 64), 2, 1, 1))
    assert not C.filter_usable(256, 512, 1024, _geometry((2, 9, 9, 72), (8, 3, 3, 72), 1, 1,
                                                         1))  # C = 72: boxes span taps
    assert not C.filter_usable(256, 520, 1024, g)                       # x unaligned
    assert not C.filter_usable(256, 512, 1024, _geometry((2, 9, 9, 3), (8, 7, 7, 3), 2, 3, 1))


def test_narrow_consumers_store_directly():
    """The fix of an unwritten output: a 64 x 64 tile's consumers hold 32
    columns each, less than a 16-bit staging tile's 64, so its epilogue stores directly
    (the staged TMA stores wrote whole 64-column tiles only: none); float32 chunks (32
    columns a staging tile) still stage; the generator refuses the mismatch."""
    from nbdnn.cuda.matmul.tensor_core_gemm.epilogue import staged_store as staged
    from nbdnn.cuda.matmul.tensor_core_gemm import wgmma_stage as ws
    assert ws.consumer_columns(64, 64) == 32 and ws.consumer_columns(64, 128) == 64
    assert not staged.usable("f16", False, False, 96, 0, width=32)
    assert staged.usable("f16", False, False, 96, 0, width=64)
    assert staged.usable("f16", True, False, 96, 0, True, width=32)   # split-K chunks
    with pytest.raises(ValueError, match="32 columns"):
        staged.tile_lines(32, False, None)


def _im2col_walk(x, g, bm, c0, start, offs):
    """A model of one TMA im2col load (x (N, H, W, C), zeros outside it): the output
    positions' window corners walk w by sw inside [lower, W - 1 + upper], then h, then n,
    from `start` = (n, y0, x0); each pixel reads x at corner + offsets (off_h, off_w),
    channels c0 .. c0 + 63."""
    from nbdnn.cuda.conv.wgmma_conv import corners
    (lh, lw), (uh, uw) = corners(g)
    N, H, W, C = x.shape
    hs, ws_ = list(range(lh, H - 1 + uh + 1, g.sh)), list(range(lw, W - 1 + uw + 1, g.sw))
    seq = [(n, h, w) for n in range(N + 1) for h in hs for w in ws_]
    i = seq.index(start)
    rows = np.zeros((bm, 64))
    for r, (n, h, w) in enumerate(seq[i:i + bm]):
        hh, ww = h + offs[1], w + offs[0]
        if n < N and 0 <= hh < H and 0 <= ww < W:
            chans = x[n, hh, ww, c0:c0 + 64]
            rows[r, :len(chans)] = chans
    return rows


@pytest.mark.parametrize("case", CASES[:6], ids=lambda c: "x".join(map(str, c[1])))
def test_generated_producer_walks_the_right_pixels(case):
    """The producer's generated lines (wgmma_im2col.tile_lines, load_lines) run in
    Python with the TMA loads replaced by the model above and a tiled load of w (K,
    taps, C): every tile's k-tiles, multiplied out, give the reference convolution's
    rows. Checks the corners, the start coordinates, the tap walk, the flipped offsets
    and the channel blocks against the module's reading of TMA's im2col mode (the GPU
    test checks that reading)."""
    import nbdnn
    from nbdnn.cuda.conv.wgmma_conv import geometry_values
    from nbdnn.cuda.matmul.tensor_core_gemm import wgmma_im2col as I
    xs, ws, stride, padding, dilation, mode = case
    g = _geometry(xs, ws, stride, padding, dilation, mode)
    rng = np.random.default_rng(3)
    x = rng.standard_normal(xs)
    w = rng.standard_normal(ws)
    ref = np.asarray(nbdnn.conv2d(x, w, stride=stride, padding=padding, dilation=dilation,
                                  mode=mode, layout="NHWC", backend="cpu")).reshape(-1, ws[0])
    offs = geometry_values(g)
    taps, Cp = g.R * g.S, -(-g.C // 64) * 64
    wk = w.reshape(ws[0], taps, g.C)
    bm, M = 64, ref.shape[0]
    code = "\n".join(["def produce(m0, k0, ktiles, offs):"] +
                     ["    " + line for line in I.geometry_lines("")] +
                     ["    " + line for line in I.tile_lines("", 64)] +
                     ["    out = []", "    for kt in range(ktiles):", "        s = 0"] +
                     ["        " + line for line in I.load_lines("", 64)] +
                     ["    return out"])
    for m0 in range(0, M, bm):
        got = np.zeros((min(bm, M - m0), ws[0]))
        loads = []
        env = {"I": int, "I32": int, "U16": int, "U32": int, "full0": 0, "sa": 0, "sb": 0,
               "map_a": 0, "map_b": 0, "n0": 0,
               "tma_load_im2col_4d": lambda sa, m, c, x0, y0, n, ow, oh, bar:
               loads.append(("a", c, (n, y0, x0), (ow, oh))),
               "tma_load_3d": lambda sb, m, c, tap, n0, bar: loads.append(("b", c, tap))}
        exec(code.replace("    out = []", "    out = None"), env)
        env["produce"](m0, 0, taps * Cp // 64, offs)
        for (_, c0, start, o), (_, cb, tap) in zip(loads[0::2], loads[1::2]):
            a = _im2col_walk(x, g, bm, c0, start, o)[:got.shape[0]]
            b = np.zeros((ws[0], 64))
            chans = wk[:, tap, cb:cb + 64]
            b[:, :chans.shape[1]] = chans
            got += a @ b.T
        np.testing.assert_allclose(got, ref[m0:m0 + bm], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("bn", [64, 128, 256])
@pytest.mark.parametrize("case", [CASES[0], CASES[1], CASES[3], CASES[2]],
                         ids=["3x3", "stride2", "dilation2", "per_side_flipped"])
def test_generated_filter_producer_gives_the_filter_gradient(case, bn):
    """The filter gradient's producer lines (wgmma_im2col.filter_tile_lines,
    filter_load_lines) run in Python with TMA's loads replaced by models (a 64 x 64 box
    of dy as stored; the im2col walk above): each tile's k-tiles multiplied out give
    the CPU reference's dW (K, taps x C). Channels padded to a multiple of 64 here (the
    kernel takes C % 64 == 0 only), BN / 64 B boxes a tile (each box's channel and
    offsets from its column word: wgmma_im2col.FILTER_COLUMNS, the last tile's past
    the last tap included), 64-filter A boxes."""
    import nbdnn
    from nbdnn.cuda.conv.wgmma_conv import filter_offsets
    from nbdnn.cuda.matmul.tensor_core_gemm import wgmma_im2col as I
    xs, ws, stride, padding, dilation, mode = case
    xs, ws = xs[:3] + (64,), ws[:3] + (64,)
    g = _geometry(xs, ws, stride, padding, dilation, mode)
    rng = np.random.default_rng(4)
    x = rng.standard_normal(xs)
    PH, PW = g.PH, g.PW
    dy = rng.standard_normal((xs[0], PH, PW, ws[0]))
    ref = np.asarray(nbdnn.conv_backward_filter(dy, x, ws, stride=stride, padding=padding,
                                                dilation=dilation, mode=mode, layout="NHWC",
                                                backend="cpu")).reshape(ws[0], -1)
    K, N, red = ws[0], ref.shape[1], dy.size // ws[0]
    dyr = dy.reshape(red, K)
    offs = filter_offsets(g)
    bm, per = 64, 1 + bn // 64  # (a k-tile's loads)
    code = "\n".join(["def produce(m0, n0, k0, ktiles, offs):"] +
                     ["    " + line for line in I.filter_tile_lines("", bn)] +
                     ["    for kt in range(ktiles):", "        s = 0"] +
                     ["        " + line for line in I.filter_load_lines("", 64, bm, bn)])
    got = np.zeros((-(-K // bm) * bm, -(-N // bn) * bn))
    for m0 in range(0, K, bm):
        for n0 in range(0, N, bn):
            loads = []
            env = {"I": int, "I32": int, "U16": int, "U32": int, "full0": 0, "sa": 0,
                   "sb": 0, "map_a": 0, "map_b": 0, "min": min,
                   "tma_load_3d": lambda sa, m, f, pos, z, bar: loads.append(("a", f, pos)),
                   "tma_load_im2col_4d": lambda sb, m, c, x0, y0, n, ow, oh, bar:
                   loads.append(("b", sb, c, (n, y0, x0), (ow, oh)))}
            exec(code, env)
            env["produce"](m0, n0, 0, -(-red // 64), offs)
            assert len(loads) == -(-red // 64) * per
            for kt in range(-(-red // 64)):
                (_, f, pos), *bs = loads[kt * per:kt * per + per]
                a = np.zeros((64, 64))
                rows = dyr[pos:pos + 64, f:f + 64]
                a[:rows.shape[0], :rows.shape[1]] = rows
                for j, (_, sb, c, start, o) in enumerate(bs):
                    assert sb == j * 64 * 64 * 2
                    b = _im2col_walk(x, g, 64, c, start, o)
                    got[m0:m0 + 64, n0 + 64 * j:n0 + 64 * j + 64] += a.T @ b
    np.testing.assert_allclose(got[:K, :N], ref, rtol=1e-10, atol=1e-10)


FILTER_CASES = [((2, 14, 14, 64), (64, 3, 3, 64), 1, 1, 1, "cross_correlation"),
                ((3, 9, 11, 64), (96, 3, 3, 64), 2, 1, 1, "cross_correlation"),
                ((1, 12, 12, 64), (48, 3, 3, 64), 1, 2, 2, "cross_correlation"),
                ((2, 10, 7, 64), (200, 3, 5, 64), 1, ((2, 0), (1, 3)), 1, "convolution"),
                ((8, 28, 28, 128), (128, 3, 3, 128), 1, 1, 1, "cross_correlation")]


@pytest.mark.skipif(SIMULATOR, reason="inline PTX needs a GPU")
@pytest.mark.parametrize("widths", [(256,), (64, 128, 192, 256)], ids=["wide", "narrow"])
@pytest.mark.parametrize("case", FILTER_CASES, ids=lambda c: "x".join(map(str, c[1])))
def test_filter_gradient_on_tensor_cores(case, widths, monkeypatch):
    """The filter gradient on the tensor cores (wgmma_conv.backward_filter, written in
    measured) against the CPU reference on the same bf16 operands, with alpha and beta;
    split-K over 6272 positions in the last case; 256-wide tiles and the narrow widths
    (FILTER_WIDTHS, for 128-row tiles; 64 filters take 64-row tiles, 256 wide)."""
    torch = pytest.importorskip("torch")
    import nbdnn
    from nbdnn.cuda.conv import wgmma_conv
    from nbdnn.cuda.runtime.launch.kernel import launched
    if _cc() < (9, 0):
        pytest.skip("wgmma needs sm_90")
    monkeypatch.setattr(wgmma_conv, "FILTER_WIDTHS", widths)
    xs, ws, stride, padding, dilation, mode = case
    g = _geometry(xs, ws, stride, padding, dilation, mode)
    rng = np.random.default_rng(sum(ws))

    def t(shape):
        return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32)) \
            .to(torch.bfloat16).cuda()

    x, dy, old = t(xs), t((xs[0], g.PH, g.PW, ws[0])), t(ws)
    kw = dict(stride=stride, padding=padding, dilation=dilation, mode=mode, layout="NHWC")
    with launched() as names:
        dw = nbdnn.conv_backward_filter(dy, x, ws, alpha=0.5, beta=2.0, out=old.clone(), **kw)
    assert names[0].startswith("wgmma_convdw"), names
    want = nbdnn.conv_backward_filter(dy.double().cpu().numpy(), x.double().cpu().numpy(), ws,
                                      alpha=0.5, beta=2.0, out=old.double().cpu().numpy(),
                                      backend="cpu", **kw)
    red = xs[0] * g.PH * g.PW
    tol = 2.0 ** -8 * 4 + 1e-3 * np.sqrt(red) / 16
    np.testing.assert_allclose(dw.double().cpu().numpy(), want, rtol=tol, atol=tol)


@pytest.mark.skipif(SIMULATOR, reason="inline PTX needs a GPU")
@pytest.mark.parametrize("on", [False, True])
def test_filter_gradient_1x1_kernel_choice(on):
    """conv's filter variant gemm_1x1 ("auto"'s choice): a bf16 channels-last 1x1 filter
    gradient runs the GEMM dW = dy^T @ x (wgmma_gemm, over 8 x 14 x 14 positions); the
    variant tensor_cores forced, the im2col filter kernel (wgmma_convdw); alpha and
    beta, the CPU reference."""
    torch = pytest.importorskip("torch")
    import nbdnn
    from nbdnn.cuda import conv as CV
    from nbdnn.cuda.runtime.launch.kernel import launched
    if _cc() < (9, 0):
        pytest.skip("wgmma needs sm_90")
    rng = np.random.default_rng(3)

    def t(shape):
        return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32)) \
            .to(torch.bfloat16).cuda()

    x, dy, old, ws = t((8, 14, 14, 128)), t((8, 14, 14, 256)), t((256, 1, 1, 128)), \
        (256, 1, 1, 128)
    with (contextlib.nullcontext() if on else CV.forced("tensor_cores")), \
            launched() as names:
        dw = nbdnn.conv_backward_filter(dy, x, ws, alpha=0.5, beta=2.0, out=old.clone(),
                                        layout="NHWC")
    assert names[0].startswith("wgmma_gemm" if on else "wgmma_convdw"), names
    want = nbdnn.conv_backward_filter(dy.double().cpu().numpy(), x.double().cpu().numpy(), ws,
                                      alpha=0.5, beta=2.0, out=old.double().cpu().numpy(),
                                      backend="cpu", layout="NHWC")
    tol = 2.0 ** -8 * 4 + 1e-3 * np.sqrt(8 * 14 * 14) / 16
    np.testing.assert_allclose(dw.double().cpu().numpy(), want, rtol=tol, atol=tol)


def test_filter_rows_pad_each_filter():
    """conv/gemm.py filter_rows: the filters (K, R, S, C) as rows of R S C values
    taps-major, zero-padded to `row` (the stem's 147 to 152), in any backend's run."""
    from nbdnn.cuda.conv import gemm
    from nbdnn.cuda.conv.kernels import KERNELS
    from nbdnn.cuda.runtime.memory.arrays import to_device
    w = np.random.default_rng(2).standard_normal((5, 7, 7, 3)).astype(np.float16)
    rows = np.asarray(gemm.filter_rows(KERNELS, to_device(w), 152, 0).copy_to_host())
    want = np.zeros((1, 5, 152), np.float16)
    want[0, :, :147] = w.reshape(5, 147)
    np.testing.assert_array_equal(rows, want)


@pytest.mark.skipif(SIMULATOR, reason="inline PTX needs a GPU")
@pytest.mark.parametrize("rows", [False, True])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_narrow_channels_through_padded_columns(dtype, rows):
    """conv's variant stem_words: a 3-channel 7x7/2 stem with bias and relu as padded
    columns and filter rows through the tensor-core GEMM's fused epilogue, against the
    CPU reference; the columns by the staged-row kernel (im2col_rows, the choice) or the
    word gather (im2col_words forced)."""
    torch = pytest.importorskip("torch")
    import nbdnn
    from nbdnn.cuda import conv as CV
    from nbdnn.cuda.runtime.launch.kernel import launched
    if _cc() < (9, 0):
        pytest.skip("wgmma needs sm_90")
    rng = np.random.default_rng(9)
    tdt = getattr(torch, dtype)
    x = torch.from_numpy(rng.standard_normal((4, 40, 38, 3), dtype=np.float32)).to(tdt).cuda()
    w = torch.from_numpy(rng.standard_normal((64, 7, 7, 3), dtype=np.float32) / 12).to(tdt).cuda()
    b = torch.from_numpy(rng.standard_normal(64, dtype=np.float32)).to(tdt).cuda()
    kw = dict(stride=2, padding=3, layout="NHWC", activation="relu")
    with (contextlib.nullcontext() if rows else CV.forced("im2col_words")), \
            launched() as names:
        y = nbdnn.conv2d(x, w, b, **kw)
    gather = "conv_im2col_rows" if rows else "conv_im2col_words"
    assert all(n.startswith(gather) for n in names[:2]) and \
        names[2].startswith("wgmma_gemm"), names  # (words32: 32-bit offsets)
    ref = nbdnn.conv2d(*(t.double().cpu().numpy() for t in (x, w, b)), backend="cpu", **kw)
    ulp = 2.0 ** -8 if dtype == "bfloat16" else 2.0 ** -11
    np.testing.assert_allclose(y.double().cpu().numpy(), np.asarray(ref), rtol=4 * ulp,
                               atol=4 * ulp + 1e-3)

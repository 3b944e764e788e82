"""Both implicit-GEMM variants (nbdnn/cuda/conv/implicit_gemm_source.py) with every tile forced,
against the CPU reference: variant 2 (a table entry a reduction index) runs when
C/groups < BK, variant 3 (taps, then BK-channel chunks) otherwise. The shapes put
C/groups below, at, past and well past a chunk (ragged last chunks), both layouts,
groups, stride, dilation, per-side padding, the flipped mode and the fused epilogue;
float64 compares to 1e-12, float32 and float16 by their reduction tolerances."""
import contextlib
import math

import numpy as np
import pytest

import nbdnn
from nbdnn.cuda import SIMULATOR, conv as CV
from nbdnn.cuda import matmul as MM
from nbdnn.cuda.matmul import TILES
from nbdnn.cuda.runtime.launch.kernel import launched
import nbdnn.testing  # noqa: F401  (imports the spec modules in order)
from nbdnn.testing.specs.matmul import matmul_tol

# (C, K, groups, H, W, R, S, stride, dilation, padding, mode)
GEOMS = [(1, 3, 1, 5, 4, 2, 3, (1, 1), (1, 1), ((1, 0), (2, 1)), "cross_correlation"),
         (4, 5, 1, 6, 5, 3, 3, (1, 1), (1, 1), ((1, 1), (1, 1)), "convolution"),
         (9, 6, 1, 5, 6, 3, 2, (2, 1), (1, 2), ((0, 2), (1, 0)), "cross_correlation"),
         (16, 8, 2, 4, 4, 1, 1, (1, 1), (1, 1), ((0, 0), (0, 0)), "cross_correlation"),
         (10, 9, 1, 7, 5, 1, 3, (1, 2), (1, 1), ((0, 0), (1, 1)), "convolution"),
         (20, 3, 1, 3, 2, 2, 1, (1, 1), (1, 1), ((0, 0), (0, 0)), "cross_correlation")]
# the simulator runs a block's threads as OS threads: the 4-thread tiny tile's many
# blocks make it slow there, so it takes the cheapest shapes only
TINY = GEOMS if not SIMULATOR else GEOMS[:1] + GEOMS[-1:]
CASES = [(g, s) for g in GEOMS for s in ("large", "small")] + [(g, "tiny") for g in TINY]


def _run(geom, dtype, last, size, monkeypatch):
    C, K, G, H, W, R, S, stride, dil, pads, mode = geom
    monkeypatch.setattr(MM, "FORCE_TILE", (size, 1))
    rng = np.random.default_rng(C * 31 + K)
    x = rng.uniform(-1, 1, (2, H, W, C) if last else (2, C, H, W)).astype(dtype)
    w = rng.uniform(-1, 1, (K, R, S, C // G) if last else (K, C // G, R, S)).astype(dtype)
    bias = rng.uniform(-1, 1, K).astype(dtype)
    kw = dict(stride=stride, dilation=dil, padding=pads, groups=G, mode=mode,
              layout="NHWC" if last else "NCHW", activation="relu")
    want = nbdnn.conv2d(x, w, bias, backend="cpu", **kw)
    got = nbdnn.conv2d(x, w, bias, backend="cuda", algo="implicit_gemm", **kw)
    return got, want, C // G * R * S


@pytest.mark.parametrize("last", [False, True])
@pytest.mark.parametrize("geom,size", CASES, ids=lambda v: v if isinstance(v, str) else
                         f"C{v[0]}K{v[1]}G{v[2]}")
def test_igemm_variants_match_reference(monkeypatch, geom, size, last):
    got, want, _ = _run(geom, np.float64, last, size, monkeypatch)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_igemm_chunked_low_precision(monkeypatch, dtype):
    got, want, red = _run(GEOMS[4], dtype, True, "small", monkeypatch)
    atol, rtol = matmul_tol(np.dtype(dtype).name, red + 2)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, atol=atol, rtol=rtol)


def test_shapes_reach_both_variants():
    """The geometries above put C/groups on both sides of every tile's BK, and reach
    the vector epilogue in both layouts (NCHW: 4 | P; NHWC: 4 | K and 4 | K/g)."""
    for cfg in TILES["float64"].values():
        bk = cfg[2]
        cg = {g[0] // g[2] for g in GEOMS}
        assert min(cg) < bk <= max(cg) and any(c > bk and c % bk for c in cg)
    chunked = [g for g in GEOMS if g[0] // g[2] >= TILES["float64"]["large"][2]]
    assert any(_positions(g) % 4 == 0 for g in chunked)
    assert any(g[1] % 4 == 0 and g[1] // g[2] % 4 == 0 for g in chunked)


def _positions(geom):
    C, K, G, H, W, R, S, stride, dil, pads, mode = geom
    return math.prod((n + a + b - d * (r - 1) - 1) // q + 1 for n, r, q, d, (a, b) in
                     zip((H, W), (R, S), stride, dil, pads))


@pytest.mark.parametrize("last", [False, True])
@pytest.mark.parametrize("geom", GEOMS, ids=lambda g: f"C{g[0]}K{g[1]}G{g[2]}")
def test_backward_data_auto_matches_reference(geom, last):
    """"auto" backward data: a forward convolution of dy (nbdnn.cuda.conv.
    as_forward) where every stride is 1 and the paddings allow it, else the gemm
    path; with the beta blend."""
    C, K, G, H, W, R, S, stride, dil, pads, mode = geom
    rng = np.random.default_rng(C * 7 + K)
    xs = (2, H, W, C) if last else (2, C, H, W)
    w = rng.uniform(-1, 1, (K, R, S, C // G) if last else (K, C // G, R, S))
    kw = dict(stride=stride, dilation=dil, padding=pads, groups=G, mode=mode,
              layout="NHWC" if last else "NCHW")
    dy = rng.uniform(-1, 1, nbdnn.conv2d(np.zeros(xs), w, backend="cpu", **kw).shape)
    out = rng.uniform(-1, 1, xs)
    want = nbdnn.conv_backward_data(dy, w, xs, backend="cpu", alpha=0.5, beta=2.0,
                                    out=out.copy(), **kw)
    got = nbdnn.conv_backward_data(dy, w, xs, backend="cuda", alpha=0.5, beta=2.0,
                                   out=out.copy(), **kw)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("last,G,dtype,direct", [(False, 1, np.float64, True),
                                                (False, 2, np.float64, True),
                                                (True, 1, np.float64, True),
                                                (True, 2, np.float64, False),
                                                (False, 1, np.float16, False)])
def test_backward_filter_1x1_matches_reference(last, G, dtype, direct):
    """1x1, stride 1, no padding: backward filter straight through the GEMM (no
    im2col) where it applies (`direct`), else the im2col path; the beta blend;
    channels-last with the variant gemm_1x1 forced, the same."""
    rng = np.random.default_rng(G)
    C, K, H = 4, 6, 12                                     # P = 144 positions
    xs = (2, H, H, C) if last else (2, C, H, H)
    ws = (K, 1, 1, C // G) if last else (K, C // G, 1, 1)
    kw = dict(groups=G, layout="NHWC" if last else "NCHW")
    x = rng.uniform(-1, 1, xs).astype(dtype)
    dy = rng.uniform(-1, 1, nbdnn.conv2d(x, np.zeros(ws, dtype), backend="cpu", **kw).shape)
    dy, out = dy.astype(dtype), rng.uniform(-1, 1, ws).astype(dtype)
    want = nbdnn.conv_backward_filter(dy, x, ws, backend="cpu", alpha=0.5, beta=2.0,
                                      out=out.copy(), **kw)
    with launched() as names:
        got = nbdnn.conv_backward_filter(dy, x, ws, backend="cuda", alpha=0.5, beta=2.0,
                                         out=out.copy(), **kw)
    atol, rtol = (1e-12, 1e-12) if dtype == np.float64 else matmul_tol("float16", 2 * 144)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, atol=atol, rtol=rtol)
    assert ("conv_im2col" not in names) == direct, names  # (the GEMM path builds no columns)
    if not (last and G == 1):
        return
    with CV.forced("gemm_1x1"), launched() as names:
        got = nbdnn.conv_backward_filter(dy, x, ws, backend="cuda", alpha=0.5, beta=2.0,
                                         out=out.copy(), **kw)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, atol=atol, rtol=rtol)
    assert "conv_im2col" not in names and not any("convdw" in n for n in names), names


@pytest.mark.parametrize("on", [True, False])
@pytest.mark.parametrize("last,G,mode", [(True, 1, "convolution"), (True, 2, "cross_correlation"),
                                         (False, 1, "cross_correlation")])
def test_backward_data_1x1(last, G, mode, on):
    """conv's data variant gemm_1x1 (on: "auto"'s choice; off: as_forward forced): a
    channels-last 1x1 data gradient of one group is one GEMM dx = dy @ W (no transposed
    filter, no forward kernel), the beta blend included; groups and channels-first keep
    the flipped-filter path; either way the reference's numbers."""
    rng = np.random.default_rng(G + 3 * last)
    C, K, H = 4, 6, 5
    xs = (2, H, H, C) if last else (2, C, H, H)
    ws = (K, 1, 1, C // G) if last else (K, C // G, 1, 1)
    kw = dict(groups=G, mode=mode, layout="NHWC" if last else "NCHW", dilation=2)
    w = rng.uniform(-1, 1, ws)
    dy = rng.uniform(-1, 1, nbdnn.conv2d(np.zeros(xs), w, backend="cpu", **kw).shape)
    out = rng.uniform(-1, 1, xs)
    want = nbdnn.conv_backward_data(dy, w, xs, backend="cpu", alpha=0.5, beta=2.0,
                                    out=out.copy(), **kw)
    with (contextlib.nullcontext() if on else CV.forced("as_forward")), launched() as names:
        got = nbdnn.conv_backward_data(dy, w, xs, backend="cuda", alpha=0.5, beta=2.0,
                                       out=out.copy(), **kw)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    one_gemm = on and last and G == 1
    assert (not any("transform" in n or "transpose" in n for n in names)) == one_gemm, names


@pytest.mark.parametrize("case", ["plain", "groups", "3d", "beta", "tf32", "bias", "stride",
                                  "pad", "last", "ieee-auto"])
def test_channels_first_1x1_as_one_gemm(case):
    """A channels-first 1x1 filter at stride 1 without padding runs forward and data
    gradient as one batched GEMM over the positions as stored (variant
    gemm_1x1_channels_first: no im2col columns, epilogue, rows or col2im) where the
    gemm algorithm runs it, alpha and beta included; a bias, a stride, a padding, the
    channels-last layout or "auto" in ieee math (the implicit GEMM; as_forward for the
    data gradient) keep their paths; float32 in math "tf32" takes it under "auto". Either
    way the reference's numbers."""
    rng = np.random.default_rng(len(case))
    N, C, K, G, H = 2, 4, 6, 1, 5
    kw = dict(algo="gemm")
    if case == "tf32":
        kw = dict(algo="auto", math="tf32")
    if case == "groups":
        G, kw["groups"] = 2, 2
    if case == "stride":
        kw["stride"] = 2
    if case == "pad":
        kw["padding"] = 1
    if case == "ieee-auto":
        kw["algo"] = "auto"
    last = case == "last"
    kw["layout"] = "NHWC" if last else "NCHW"
    spatial = (3, H, H) if case == "3d" else (H, H)
    conv = nbdnn.conv3d if case == "3d" else nbdnn.conv2d
    kw["layout"] = ("NDHWC" if last else "NCDHW") if case == "3d" else kw["layout"]
    xs = (N,) + spatial + (C,) if last else (N, C) + spatial
    ws = (K,) + (1,) * len(spatial) + (C // G,) if last else (K, C // G) + (1,) * len(spatial)
    dt = np.float32 if case == "tf32" else np.float64
    tol = 1e-5 if case == "tf32" else 1e-12
    x, w = rng.uniform(-1, 1, xs).astype(dt), rng.uniform(-1, 1, ws).astype(dt)
    bias = rng.uniform(-1, 1, K) if case == "bias" else None
    ab = dict(alpha=0.5, beta=2.0) if case == "beta" else {}
    y0 = conv(x, w, backend="cpu", **{k: v for k, v in kw.items() if k != "algo"})
    out = rng.uniform(-1, 1, y0.shape).astype(dt)
    fkw = {k: v for k, v in kw.items() if k != "algo"}
    want = conv(x, w, bias, backend="cpu", out=out.copy(), **fkw, **ab)
    with launched() as names:
        got = conv(x, w, bias, backend="cuda", out=out.copy(), **kw, **ab)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    one_gemm = case in ("plain", "groups", "3d", "beta", "tf32")
    columns = any("im2col" in n or "epilogue" in n for n in names)
    assert columns != one_gemm or case in ("last", "ieee-auto"), names
    if one_gemm:
        assert any("gemm" in n for n in names), names
    dy = rng.uniform(-1, 1, y0.shape).astype(dt)
    dkw = dict(ab) if ab else dict(alpha=1.0, beta=0.0)
    dx0 = rng.uniform(-1, 1, xs).astype(dt)
    want = nbdnn.conv_backward_data(dy, w, xs, backend="cpu", out=dx0.copy(), **fkw, **dkw)
    with launched() as names:
        got = nbdnn.conv_backward_data(dy, w, xs, backend="cuda", out=dx0.copy(), **kw, **dkw)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    gathers = any("col2im" in n or "rows" in n or "transform" in n for n in names)
    one_gemm = case in ("plain", "groups", "3d", "beta", "bias", "tf32")
    assert gathers != one_gemm or case == "last", names


def _both_backends(fn, args, out_shape, case, kw, rng):
    """fn(*args, **kw) on both backends into one random out (alpha 0.5 and beta 2 in the
    "blend" case), compared at TF32's tolerance; the kernels the GPU call launched."""
    ab = dict(alpha=0.5, beta=2.0) if case == "blend" else dict(alpha=1.0, beta=0.0)
    out = rng.uniform(-1, 1, out_shape).astype(np.float32)
    want = fn(*args, backend="cpu", out=out.copy(), **kw, **ab)
    with launched() as names:
        got = fn(*args, backend="cuda", out=out.copy(), **kw, **ab)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    return names


def _columns_t_reference(x, R, stride, pads, dilation, groups, flip):
    """x's im2col columns of each image transposed, (N, G, Cg*T*R*S, P), NumPy."""
    N, C = x.shape[:2]
    nd = x.ndim - 2
    xp = np.pad(x, ((0, 0), (0, 0)) + tuple(pads))
    P = [(x.shape[2 + a] + sum(pads[a]) - dilation[a] * (R[a] - 1) - 1) // stride[a] + 1
         for a in range(nd)]
    taps = []
    for tap in np.ndindex(*R):
        src = tuple(R[a] - 1 - tap[a] if flip else tap[a] for a in range(nd))
        taps.append(xp[(slice(None), slice(None)) + tuple(
            slice(src[a] * dilation[a], src[a] * dilation[a] + (P[a] - 1) * stride[a] + 1,
                  stride[a]) for a in range(nd))].reshape(N, C, -1))
    cols = np.stack(taps, axis=2)  # (N, C, taps, P)
    return cols.reshape(N, groups, (C // groups) * len(taps), -1)


@pytest.mark.parametrize("case", ["small-plane", "wide", "tall", "3d", "joint-flip"])
def test_columns_t_match_reference(case):
    """im2col_t's transposed columns, element for element: a block's threads over a
    plane's w and rows, each looping over its rows and planes (7x7: rows past a block's;
    a plane wider than a block's threads; rows over several row blocks; 3-d planes),
    groups, a flipped filter and the joint (G, Kr, N, P) layout."""
    from nbdnn.cuda.conv.gemm import COLUMN_BLOCK, columns_t
    from nbdnn.cuda.conv.geometry import geometry
    from nbdnn.cuda.conv.kernels import KERNELS
    from nbdnn.cuda.runtime.memory.arrays import to_device, to_host
    N, C, G, flip, joint = 2, 3, 1, False, False
    spatial, R, stride, dil, pads = (7, 7), (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1))
    if case == "wide":  # (w past the block's threads: their loop)
        spatial, R, pads = (3, COLUMN_BLOCK + 13), (1, 3), ((0, 0), (1, 1))
    if case == "tall":  # (3 x 10 threads a block, 4 rows each: three row blocks)
        spatial, R, pads = (90, 5), (3, 3), ((0, 0), (0, 0))
    if case == "3d":
        spatial, R, stride, dil = (5, 9, 9), (2, 3, 3), (2, 2, 1), (1, 2, 1)
        pads = ((0, 1), (1, 1), (0, 0))
    if case == "joint-flip":
        C, G, flip, joint, stride = 4, 2, True, True, (2, 1)
    x = np.random.default_rng(len(case)).uniform(-1, 1, (N, C) + spatial).astype(np.float32)
    g = geometry(x.shape, (6, C // G) + R, stride, pads, dil, G,
                 "convolution" if flip else "cross_correlation", False)
    want = _columns_t_reference(x, R, stride, pads, dil, G, flip)
    if joint:  # (G, Kr, N, P)
        want = want.transpose(1, 2, 0, 3)
    got = to_host(columns_t(KERNELS, to_device(x), g, 0, joint=joint)).reshape(want.shape)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("case", ["3x3", "stride-pad", "groups", "3d", "blend", "few",
                                  "joint", "1x1-few", "1x1", "ieee", "last"])
def test_filter_gradient_over_positions(case):
    """float32 channels-first filter gradients in math "tf32" run as products over
    transposed columns (variant gemm_positions: conv_im2col_t, no rows copy, no
    transposed operand copies), alpha and beta blended: per image, or over all images
    at once where dy's copy is smaller than the partials ("joint": few positions, many
    columns); 1x1 at stride 1 over P >= 128 positions, ieee math and channels-last keep
    their paths. Either way the reference's numbers in the same math."""
    rng = np.random.default_rng(len(case) + 7)
    N, C, K, G, H, R = 2, 4, 6, 1, 12, 3
    kw = dict(padding=1, math="tf32")
    if case == "stride-pad":
        kw.update(stride=2, padding=2)
        H = 24
    if case == "groups":
        G = kw["groups"] = 2
        kw["mode"] = "convolution"
    if case in ("few", "1x1-few"):
        H = 8
    if case == "joint":
        C, H = 8, 4                                        # Kr 72 columns, P 16
    if case in ("1x1", "1x1-few"):
        R, kw["padding"] = 1, 0
    if case == "ieee":
        kw["math"] = "ieee"
    last = case == "last"
    nd = 3 if case == "3d" else 2
    if nd == 3:
        C, H = 2, 8                                        # P = 2 x 8 x 8 = 128
    spatial = ((2,) if nd == 3 else ()) + (H, H)
    kw["layout"] = ("NDHWC" if last else "NCDHW") if nd == 3 else ("NHWC" if last else "NCHW")
    conv = nbdnn.conv3d if nd == 3 else nbdnn.conv2d
    xs = (N,) + spatial + (C,) if last else (N, C) + spatial
    ws = (K,) + (R,) * nd + (C // G,) if last else (K, C // G) + (R,) * nd
    x = rng.uniform(-1, 1, xs).astype(np.float32)
    dy = rng.uniform(-1, 1, conv(x, np.zeros(ws, np.float32), backend="cpu",
                                 **kw).shape).astype(np.float32)
    names = _both_backends(nbdnn.conv_backward_filter, (dy, x, ws), ws, case, kw, rng)
    positions = case in ("3x3", "stride-pad", "groups", "3d", "blend", "few", "joint",
                         "1x1-few")
    assert ("conv_im2col_t" in names) == positions, names
    assert any("transpose" in n or "transform" in n for n in names) == (case == "joint"), \
        names
    assert ("conv_y_to_rows" in names) == (not positions and case not in ("1x1", "last")), \
        names


@pytest.mark.parametrize("case", ["stem", "strided-1x1", "groups", "blend", "bias", "ieee",
                                  "last"])
def test_forward_over_positions(case):
    """float32 channels-first forwards in math "tf32" that the tf32 kernel's copies do
    not take (a 3-channel stem, a strided 1x1) and carry no bias, residual or
    activation run as per-image products over transposed columns writing y as stored
    (variant gemm_positions: conv_im2col_t, no epilogue pass), alpha and beta
    blended; a bias, ieee math and channels-last keep their paths. Either way the
    reference's numbers in the same math."""
    rng = np.random.default_rng(len(case) + 11)
    N, C, K, G, H, R = 2, 3, 8, 1, 12, 5
    kw = dict(stride=2, padding=2, math="tf32")
    if case == "strided-1x1":
        C, R, kw["padding"] = 8, 1, 0
    if case == "groups":
        C, G, kw["groups"], kw["mode"] = 4, 2, 2, "convolution"
    if case == "ieee":
        kw["math"] = "ieee"
    last = case == "last"
    kw["layout"] = "NHWC" if last else "NCHW"
    xs = (N, H, H, C) if last else (N, C, H, H)
    ws = (K, R, R, C // G) if last else (K, C // G, R, R)
    x, w = (rng.uniform(-1, 1, s).astype(np.float32) for s in (xs, ws))
    bias = rng.uniform(-1, 1, K).astype(np.float32) if case == "bias" else None
    ab = dict(alpha=0.5, beta=2.0) if case == "blend" else {}
    y0 = nbdnn.conv2d(x, w, backend="cpu", **kw)
    out = rng.uniform(-1, 1, y0.shape).astype(np.float32)
    want = nbdnn.conv2d(x, w, bias, backend="cpu", out=out.copy(), **kw, **ab)
    with launched() as names:
        got = nbdnn.conv2d(x, w, bias, backend="cuda", out=out.copy(), **kw, **ab)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    positions = case in ("stem", "strided-1x1", "groups", "blend")
    assert ("conv_im2col_t" in names) == positions, names
    assert ("conv_gemm_epilogue" in names) == (case == "bias") or last, names


@pytest.mark.parametrize("case", ["3x3-s2", "1x1-s2", "groups", "dilated", "3d", "blend",
                                  "wide", "stride-1", "ieee", "last"])
def test_data_gradient_over_positions(case):
    """float32 channels-first data gradients in math "tf32" that tf32_as_forward does not
    take (a stride; alpha or beta) run as per-image products W^T dy[n] into transposed
    columns gathered back by col2im_t (variant gemm_positions: no rows copy, no
    col2im), alpha and beta blended; stride 1 (tf32_as_forward), ieee math and
    channels-last keep their paths. Either way the reference's numbers in the same
    math."""
    rng = np.random.default_rng(len(case) + 5)
    N, C, K, G, H, R = 2, 4, 8, 1, 9, 3  # (C, K multiples of 4: the tf32 kernel's rows)
    kw = dict(stride=2, padding=1, math="tf32")
    if case == "1x1-s2":
        R, kw["padding"] = 1, 0
    if case == "groups":
        G, kw["groups"], kw["mode"] = 2, 2, "convolution"
    if case == "dilated":
        kw.update(dilation=2, padding=2, stride=(2, 3))
    if case == "stride-1":
        kw["stride"] = 1
    if case == "ieee":
        kw["math"] = "ieee"
    last = case == "last"
    nd = 3 if case == "3d" else 2
    spatial = ((3,) if nd == 3 else ()) + ((3, 70) if case == "wide" else (H, H))
    # ("wide": dx's rows past the simulator's 32 threads a block along w, col2im_t's loop)
    conv = nbdnn.conv3d if nd == 3 else nbdnn.conv2d
    kw["layout"] = ("NDHWC" if last else "NCDHW") if nd == 3 else ("NHWC" if last else "NCHW")
    xs = (N,) + spatial + (C,) if last else (N, C) + spatial
    ws = (K,) + (R,) * nd + (C // G,) if last else (K, C // G) + (R,) * nd
    w = rng.uniform(-1, 1, ws).astype(np.float32)
    dy = rng.uniform(-1, 1, conv(np.zeros(xs, np.float32), w, backend="cpu",
                                 **kw).shape).astype(np.float32)
    names = _both_backends(nbdnn.conv_backward_data, (dy, w, xs), xs, case, kw, rng)
    positions = case in ("3x3-s2", "1x1-s2", "groups", "dilated", "3d", "blend", "wide") or \
        (case == "stride-1" and not MM.tensor_cores())  # (tf32_as_forward: sm_90's)
    assert ("conv_col2im_t" in names) == positions, names
    assert "conv_y_to_rows" not in names or not positions, names


@pytest.mark.parametrize("dtype", [np.float16, "bfloat16"])
def test_backward_filter_pads_16bit_columns(dtype):
    """A 16-bit filter gradient whose im2col rows are no 16-byte multiple (3 channels
    x 3x3 taps = 27 columns, a 7x7 stem's 147 alike) runs on columns padded with zeros
    to 32 (the tensor-core GEMM's TMA rows) and blends the first 27 into dW:
    alpha, beta, both modes of the strided view's gather."""
    import ml_dtypes
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    rng = np.random.default_rng(5)
    xs, ws = (2, 9, 8, 3), (5, 3, 3, 3)
    kw = dict(stride=2, padding=1, layout="NHWC")
    x = rng.uniform(-1, 1, xs).astype(dt)
    dy = rng.uniform(-1, 1, (2, 5, 4, 5)).astype(dt)
    out = rng.uniform(-1, 1, ws).astype(dt)
    want = nbdnn.conv_backward_filter(dy.astype(np.float64), x.astype(np.float64), ws,
                                      backend="cpu", alpha=0.5, beta=2.0,
                                      out=out.astype(np.float64), **kw)
    with launched() as names:
        got = nbdnn.conv_backward_filter(dy, x, ws, backend="cuda", alpha=0.5, beta=2.0,
                                         out=out.copy(), **kw)
    assert names[0].startswith("conv_im2col_rows") and "strided_gather" in names, names
    atol, rtol = matmul_tol("float16", 2 * 20)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, atol=8 * atol, rtol=8 * rtol)


def _gemm_forward(x, w, kw):
    """(CPU reference in float64, algo "gemm" on the CUDA backend, its kernels' names)
    of a channels-last forward."""
    want = nbdnn.conv2d(x.astype(np.float64), w.astype(np.float64), layout="NHWC",
                        backend="cpu", **kw)
    with launched() as names:
        got = nbdnn.conv2d(x, w, layout="NHWC", algo="gemm", backend="cuda", **kw)
    return want, got, names


@pytest.mark.parametrize("dtype,C,magic", [(np.float16, 3, False), (np.float16, 8, False),
                                           (np.float32, 3, False), (np.float32, 2, False),
                                           (np.float64, 3, False), (np.float16, 3, True),
                                           (np.float16, 8, True)])
def test_im2col_words_match_reference(dtype, C, magic, monkeypatch):
    """conv/im2col_words.py (channels-last, one group) through algo "gemm": words of 2,
    4 and 8 bytes (fp16 C = 3: one channel a word, C = 8: four; float32 C = 3: one, C = 2:
    two; float64: one), stride, dilation, per-side padding and the flipped mode; the
    64-bit kernel and the 32-bit one (MAGIC_INDEX: multiply-high index splits); the
    variant im2col_words forced (C = 3 would take im2col_rows)."""
    from nbdnn.cuda.conv import im2col_words
    monkeypatch.setattr(im2col_words, "MAGIC_INDEX", magic)
    rng = np.random.default_rng(C)
    x = rng.uniform(-1, 1, (2, 7, 6, C)).astype(dtype)
    w = rng.uniform(-1, 1, (4, 3, 2, C)).astype(dtype)
    for kw in (dict(stride=(2, 1), dilation=(1, 2), padding=((1, 0), (2, 1))),
               dict(padding=1, mode="convolution")):
        with CV.forced("im2col_words"):
            want, got, names = _gemm_forward(x, w, kw)
        assert names[0] == "conv_im2col_words" + ("32" if magic else ""), names
        tol = {np.float16: 4e-3, np.float32: 1e-5, np.float64: 1e-12}[dtype]
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype,C", [(np.float16, 3), (np.float16, 5), (np.float32, 3),
                                     (np.float32, 1)])
def test_im2col_rows_match_reference(dtype, C):
    """conv/im2col_rows.py (narrow channels: a block an output row, the
    window rows staged in shared memory) through algo "gemm"'s forward and filter
    gradient: stride, dilation, per-side padding past the image, the flipped mode,
    rows padded past R S C; each against the CPU reference."""
    rng = np.random.default_rng(C + 7)
    x = rng.uniform(-1, 1, (2, 7, 9, C)).astype(dtype)
    w = rng.uniform(-1, 1, (4, 3, 2, C)).astype(dtype)
    tol = {np.float16: 4e-3, np.float32: 1e-5}[dtype]
    for kw in (dict(stride=(2, 3), dilation=(1, 2), padding=((1, 3), (2, 1))),
               dict(padding=1, mode="convolution")):
        want, got, names = _gemm_forward(x, w, kw)
        assert names[0] == "conv_im2col_rows", names
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol)
        dy = rng.uniform(-1, 1, want.shape).astype(dtype)
        want_dw = nbdnn.conv_backward_filter(dy.astype(np.float64), x.astype(np.float64),
                                             w.shape, layout="NHWC", backend="cpu", **kw)
        with launched() as names:
            dw = nbdnn.conv_backward_filter(dy, x, w.shape, layout="NHWC", algo="gemm",
                                            backend="cuda", **kw)
        assert "conv_im2col_rows" in names, names
        np.testing.assert_allclose(np.asarray(dw, np.float64), want_dw, rtol=4 * tol,
                                   atol=4 * tol)


@pytest.mark.parametrize("dtype,on", [(np.float16, True), (np.float64, True),
                                      (np.float32, False)])
def test_col2im_quads_match_reference(dtype, on):
    """conv/col2im_quads.py (channels-last, one group, C % 4 == 0: four channels a
    thread) through algo "gemm"'s data gradient: strides 2 and 3, dilation, per-side
    padding, the flipped mode, alpha and beta; off (the variant col2im forced), the
    general col2im."""
    with (contextlib.nullcontext() if on else CV.forced("col2im")):
        _check_col2im(dtype, 8, [((2, 7, 8, 8), (4, 3, 2, 8), kw) for kw in _COL2IM_KW],
                      "conv_col2im_quads" if on else "conv_col2im")


_COL2IM_KW = (dict(stride=(2, 3), dilation=(1, 2), padding=((1, 0), (2, 1))),
              dict(stride=2, padding=1, mode="convolution"))


def _check_col2im(dtype, seed, cases, kernel):
    """algo "gemm"'s channels-last data gradient with alpha and beta for each (x shape,
    w shape, conv keywords): its last kernel `kernel`, against the CPU reference."""
    rng = np.random.default_rng(seed)
    for xs, ws, kw in cases:
        y = nbdnn.conv2d(np.zeros(xs), np.zeros(ws), layout="NHWC", backend="cpu", **kw)
        dy, w = rng.uniform(-1, 1, y.shape).astype(dtype), rng.uniform(-1, 1, ws).astype(dtype)
        dx0 = rng.uniform(-1, 1, xs).astype(dtype)
        want = nbdnn.conv_backward_data(dy.astype(np.float64), w.astype(np.float64), xs,
                                        layout="NHWC", backend="cpu", alpha=0.5, beta=2.0,
                                        out=dx0.astype(np.float64), **kw)
        with launched() as names:
            got = nbdnn.conv_backward_data(dy, w, xs, layout="NHWC", algo="gemm",
                                           backend="cuda", alpha=0.5, beta=2.0,
                                           out=dx0.copy(), **kw)
        assert names[-1] == kernel, names
        tol = {np.float16: 8e-3, np.float32: 1e-5, np.float64: 1e-12}[dtype]
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype,C", [(np.float16, 3), (np.float32, 3), (np.float64, 3),
                                     (np.float32, 1), (np.float16, 6)])
def test_col2im_rows_match_reference(dtype, C):
    """conv/col2im_rows.py (narrow channels: a block an input row, the
    landing rows' columns staged in shared memory; the filter as padded rows) through
    algo "gemm"'s data gradient: strides 2 and 3, dilation, per-side padding, the
    flipped mode, a 7x7/2 stem-like layer, alpha and beta."""
    _check_col2im(dtype, 9 + C, [((2, 7, 8, C), (4, 3, 2, C), kw) for kw in _COL2IM_KW] +
                  [((1, 12, 11, C), (5, 7, 7, C), dict(stride=2, padding=3))],
                  "conv_col2im_rows")


def test_auto_forward_choice():
    """"auto" on the GPU: depthwise for groups == C; for 3x3/1 2-d layers of >= 32
    channels a group winograd4 when K * its tiles >= 24576, else winograd (float16:
    winograd from 128 channels); else the implicit GEMM."""
    def g(C, K, G, R, stride=1, dil=1, D=1, N=32, H=28):
        return CV.geometry((N, C, H, H), (K, C // G, R, R), (stride, stride),
                            ((1, 1), (1, 1)), (dil, dil), G, "cross_correlation",
                            False) if D == 1 else \
            CV.geometry((N, C, D, H, H), (K, C // G, 1, R, R), (1, stride, stride),
                         ((0, 0), (1, 1), (1, 1)), (1, dil, dil), G, "cross_correlation",
                         False)
    assert CV._auto_forward(g(128, 128, 1, 3)) == "winograd4"
    assert CV._auto_forward(g(512, 512, 1, 3), "float64") == "winograd4"
    assert CV._auto_forward(g(512, 512, 1, 3, N=32, H=7)) == "winograd4"  # 512 * 128 tiles
    assert CV._auto_forward(g(512, 512, 1, 3, N=8, H=7)) == "winograd"    # 512 * 32
    assert CV._auto_forward(g(64, 64, 1, 3, N=1, H=56)) == "winograd"     # 64 * 196
    assert CV._auto_forward(g(64, 64, 1, 3, N=1, H=112)) == "winograd4"   # 64 * 784
    assert CV._auto_forward(g(512, 512, 1, 3), "float16") == "winograd"
    assert CV._auto_forward(g(64, 64, 1, 3), "float16") == "implicit_gemm"
    assert CV._auto_forward(g(16, 16, 1, 3)) == "implicit_gemm"     # too few channels
    assert CV._auto_forward(g(256, 256, 8, 3)) == "winograd4"       # 32 a group
    assert CV._auto_forward(g(256, 256, 16, 3)) == "implicit_gemm"  # 16 a group
    assert CV._auto_forward(g(256, 256, 1, 3, stride=2)) == "implicit_gemm"
    assert CV._auto_forward(g(256, 256, 1, 3, dil=2)) == "implicit_gemm"
    assert CV._auto_forward(g(256, 256, 1, 1)) == "implicit_gemm"
    assert CV._auto_forward(g(256, 256, 1, 3, D=4)) == "implicit_gemm"  # 3-d
    assert CV._auto_forward(g(64, 128, 64, 3)) == "depthwise"
    # the workspace limit: 36 * (64*64 + 128 * 256*14*14) float32s = 0.9 GB fits,
    # at batch 1024 (3.7 GB) the implicit GEMM takes over
    assert CV._auto_forward(g(64, 64, 1, 3, N=256, H=56)) == "winograd4"
    assert CV._auto_forward(g(64, 64, 1, 3, N=1024, H=56)) == "implicit_gemm"
    assert CV._auto_forward(g(64, 64, 1, 3, N=512, H=56), "float64") == "implicit_gemm"


@pytest.mark.parametrize("algo", ["winograd", "winograd4"])
@pytest.mark.parametrize("last", [False, True])
@pytest.mark.parametrize("C,K,G,H,W,pads,mode", [
    (4, 5, 1, 6, 5, ((1, 1), (1, 1)), "convolution"),
    (6, 4, 2, 5, 7, ((0, 2), (2, 0)), "cross_correlation"),   # odd sizes: partial tiles
    (2, 3, 1, 9, 10, ((1, 0), (0, 1)), "convolution"),        # several F(4x4) tiles
    (3, 3, 1, 3, 3, ((0, 0), (0, 0)), "cross_correlation")])  # a single output
def test_winograd_matches_reference(C, K, G, H, W, pads, mode, last, algo):
    """F(2x2, 3x3) and F(4x4, 3x3) (their transforms' clamped loads and index split)
    against the CPU reference, with bias, ReLU and the beta blend."""
    rng = np.random.default_rng(C + K + H)
    x = rng.uniform(-1, 1, (2, H, W, C) if last else (2, C, H, W))
    w = rng.uniform(-1, 1, (K, 3, 3, C // G) if last else (K, C // G, 3, 3))
    bias = rng.uniform(-1, 1, K)
    kw = dict(padding=pads, groups=G, mode=mode, layout="NHWC" if last else "NCHW",
              activation="relu", alpha=0.5, beta=2.0)
    out = rng.uniform(-1, 1, nbdnn.conv2d(x, w, backend="cpu", padding=pads, groups=G,
                                          layout=kw["layout"]).shape)
    want = nbdnn.conv2d(x, w, bias, backend="cpu", out=out.copy(), **kw)
    got = nbdnn.conv2d(x, w, bias, backend="cuda", algo=algo, out=out.copy(), **kw)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("last", [False, True])
def test_winograd4_float16_works_in_float32(last):
    """float16 layers: F(4x4)'s tiles and GEMM in float32, so the result is the exact
    convolution of the float16 inputs rounded once to float16 (plus float32's error)."""
    rng = np.random.default_rng(7)
    x = rng.uniform(-1, 1, (2, 9, 10, 5) if last else (2, 5, 9, 10)).astype(np.float16)
    w = rng.uniform(-1, 1, (4, 3, 3, 5) if last else (4, 5, 3, 3)).astype(np.float16)
    kw = dict(padding=1, layout="NHWC" if last else "NCHW")
    want = nbdnn.conv2d(x.astype(np.float64), w.astype(np.float64), backend="cpu", **kw)
    got = nbdnn.conv2d(x, w, backend="cuda", algo="winograd4", **kw)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2 ** -10, atol=1e-4)


# (C, multiplier, H, W, R, stride, dilation, padding, mode): variant 3 (rows) on
# channels-first maps, else variant 2 (tiles) where stride is square and dilation 1,
# variant 1 (column strips) otherwise
DEPTHWISE = [(3, 1, 7, 8, 3, 1, 1, ((1, 1), (1, 1)), "cross_correlation"),   # rows of 4: vec
             (2, 2, 6, 9, 3, 1, 1, ((0, 2), (1, 1)), "convolution"),        # ragged blocks
             (3, 1, 9, 6, 3, 2, 1, ((1, 1), (1, 1)), "cross_correlation"),
             (2, 1, 7, 9, 5, 1, 1, ((2, 2), (2, 2)), "convolution"),
             (2, 1, 11, 7, 5, 2, 1, ((2, 1), (0, 2)), "cross_correlation"),
             (2, 1, 7, 7, 3, 1, 2, ((2, 2), (2, 2)), "cross_correlation")]  # dilated: v1


@pytest.mark.parametrize("variant", ["rows", "rows_rpt1", "other"])
@pytest.mark.parametrize("last", [False, True])
@pytest.mark.parametrize("plain", [True, False])
@pytest.mark.parametrize("geom", DEPTHWISE)
def test_depthwise_variants_match_reference(geom, plain, last, variant, monkeypatch):
    """The depthwise forward kernels against the CPU reference (float64, 1e-12): the
    plain epilogue (one add) and full one (alpha, beta blend, ReLU), the tile kernel's
    16-byte row stores (channels-first, PW % 4 == 0) and scalar ones, channel
    multipliers, the flipped mode, strides and dilation in the row kernel (the rule's
    rows a thread, partial groups of rows, and 1 row); "other": the next variant the row
    kernel's layers would take, forced (variant 2, tiles, where stride is square and
    dilation 1; else variant 1, column strips, where it takes the layer; else direct)."""
    from nbdnn.cuda.conv import depthwise_rows as DR
    if variant != "other" and last:
        pytest.skip("the row kernel is channels-first only")
    if variant == "rows_rpt1":
        monkeypatch.setattr(DR, "RPT", 1)
    C, m, H, W, R, st, dil, pads, mode = geom
    rng = np.random.default_rng(C * 7 + H)
    x = rng.uniform(-1, 1, (2, H, W, C) if last else (2, C, H, W))
    w = rng.uniform(-1, 1, (C * m, R, R, 1) if last else (C * m, 1, R, R))
    bias = rng.uniform(-1, 1, C * m)
    kw = dict(stride=st, dilation=dil, padding=pads, groups=C, mode=mode,
              layout="NHWC" if last else "NCHW")
    if not plain:
        kw.update(activation="relu", alpha=0.5, beta=2.0)
    out = rng.uniform(-1, 1, nbdnn.conv2d(x, w, backend="cpu", **{
        k: v for k, v in kw.items() if k not in ("activation", "alpha", "beta")}).shape)
    want = nbdnn.conv2d(x, w, bias, backend="cpu", out=out.copy(), **kw)
    g = CV.geometry(x.shape, w.shape, (st, st), pads, (dil, dil), C, mode, last)
    force = contextlib.nullcontext()
    if variant == "other":
        dw = CV._conv_depthwise
        force = CV.forced("depthwise_tiles" if dw.tile_spec(g) else
                          "depthwise_strips" if dw.fwd_spec(g) else "direct")
    with force, launched() as names:
        got = nbdnn.conv2d(x, w, bias, backend="cuda", algo="depthwise", out=out.copy(),
                           **kw)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert any(n.startswith("dw_rows") for n in names) == (variant != "other"), names
    assert DR.usable(g, x.size, got.size) == (not last)
    assert (CV._conv_depthwise.tile_spec(g) is None) == (dil > 1)

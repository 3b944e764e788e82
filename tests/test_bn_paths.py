"""Batch-norm kernel paths on the CUDA backend (in the simulator without a GPU): the
channels-first fast path (_bn_planes: 16-byte vectors, chunked statistics and sums,
the backwards-walking apply and dx of training) and the general kernels (_bn_sums and
batch_norm's apply: planes not a multiple of 4, misaligned views, channels last),
forward and backward, every epilogue, against the CPU reference."""
import contextlib

import numpy as np
import pytest

import nbdnn
from nbdnn.cuda import SIMULATOR, batch_norm as BN
from nbdnn.cuda.batch_norm import planes as _bn_planes
from nbdnn.cuda.runtime.memory.arrays import to_device

# (shape, layout, offset): MULTI's channels span several chunks whose last iteration is
# partly masked (asserted below); 5x5 planes and an offset view take the general
# kernels; NHWC the columns kernels
MULTI = (4, 3, 8, 12) if SIMULATOR else (4, 3, 32, 36)
CASES = [(MULTI, "NCHW", 0), ((2, 5, 4, 4), "NCHW", 0), ((2, 3, 5, 5), "NCHW", 0),
         ((2, 3, 4, 4), "NCHW", 1), ((2, 4, 4, 3), "NHWC", 0)]


def _inputs(shape, offset, dtype, seed):
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    def arr(s=shape, loc=0.0):
        flat = (loc + rng.standard_normal(n + offset)).astype(dtype)
        return flat[offset:offset + int(np.prod(s))].reshape(s)
    return arr


def test_fast_path_applies_where_expected():
    dev = to_device(np.zeros(4 * 3 * 96 + 1, np.float32))
    assert BN._planes((4, 3, 96, 0), (dev[:-1],))
    assert not BN._planes((4, 3, 96, 0), (dev[1:],))  # misaligned
    assert not BN._planes((2, 3, 25, 0), (dev[:150],))
    assert not BN._planes((2, 4, 12, 1), (dev[:96],))
    N, C, H, W = MULTI
    G, V = _bn_planes.chunking(N, C, H * W)
    assert G > 1 and V % (_bn_planes.VPT * _bn_planes.BLOCK)


@pytest.mark.parametrize("shape, layout, offset", CASES)
@pytest.mark.parametrize("act", [None, "relu"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_train_backward_infer_match_reference(shape, layout, offset, act, dtype):
    arr = _inputs(shape, offset, dtype, sum(shape) + offset)
    C = shape[-1] if layout == "NHWC" else shape[1]
    x, z, dy = arr(loc=3.0), arr(), arr()
    scale, bias = arr((C,)).copy(), arr((C,)).copy()
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == "float32" else dict(rtol=1e-10, atol=1e-10)
    kw = dict(layout=layout, residual=z, activation=act)
    got = {}
    for be in ("cpu", "cuda"):
        rm, rv = np.zeros(C, dtype), np.ones(C, dtype)
        y, mean, invstd = nbdnn.batch_norm_train(x, scale, bias, rm, rv, backend=be, **kw)
        grads = nbdnn.batch_norm_backward(dy, x, scale, mean, invstd, bias=bias, backend=be, **kw)
        plain = nbdnn.batch_norm_backward(dy, x, scale, mean, invstd, layout=layout, backend=be)
        yi = nbdnn.batch_norm_infer(x, scale, bias, rm, rv, alpha=0.5, beta=2.0,
                                    out=np.array(z), backend=be, **kw)
        got[be] = (y, mean, invstd, rm, rv, *grads, *plain, yi)
    for g, w in zip(got["cuda"], got["cpu"]):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), **tol)


def test_float16_planes():
    arr = _inputs(MULTI, 0, "float16", 7)
    x, dy = arr(loc=1.0), arr()
    y, mean, invstd = nbdnn.batch_norm_train(x, backend="cuda")
    x32 = x.astype(np.float32)
    y32, m32, i32 = nbdnn.batch_norm_train(x32, backend="cpu")
    np.testing.assert_allclose(mean, m32, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y.astype(np.float32), y32, atol=4e-3)
    dx = nbdnn.batch_norm_backward(dy, x, None, mean, invstd, backend="cuda")[0]
    dx32 = nbdnn.batch_norm_backward(dy.astype(np.float32), x32, None, m32, i32,
                                     backend="cpu")[0]
    np.testing.assert_allclose(dx.astype(np.float32), dx32, atol=1e-2)


def test_fast_path_is_deterministic():
    arr = _inputs(MULTI, 0, "float32", 3)
    x, dy = arr(loc=5.0), arr()
    a = nbdnn.batch_norm_train(x, backend="cuda")
    b = nbdnn.batch_norm_train(x, backend="cuda")
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)
    ga = nbdnn.batch_norm_backward(dy, x, None, a[1], a[2], backend="cuda")
    gb = nbdnn.batch_norm_backward(dy, x, None, a[1], a[2], backend="cuda")
    for u, v in zip(ga, gb):
        np.testing.assert_array_equal(u, v)


def test_misaligned_residual_gradient_buffer():
    """out=(dx, dscale, dbias, dz) with dz a misaligned view: both the fast and the
    general dx kernels must fall back to scalar stores (a 16-byte store there faults on
    a GPU)."""
    shape = MULTI
    arr = _inputs(shape, 0, "float32", 11)
    x, z, dy = arr(loc=1.0), arr(), arr()
    C = shape[1]
    scale, bias = arr((C,)).copy(), arr((C,)).copy()
    y, mean, invstd = nbdnn.batch_norm_train(to_device(x), to_device(scale), to_device(bias),
                                             residual=to_device(z))
    n = x.size
    dz_buf = to_device(np.zeros(n + 1, np.float32))
    out = (to_device(np.zeros_like(x)), to_device(np.zeros(C, np.float32)),
           to_device(np.zeros(C, np.float32)), dz_buf[1:].reshape(shape))
    got = nbdnn.batch_norm_backward(to_device(dy), to_device(x), to_device(scale), mean, invstd,
                                    bias=to_device(bias), residual=to_device(z), out=out)
    want = nbdnn.batch_norm_backward(dy, x, scale, mean.copy_to_host(),
                                     invstd.copy_to_host(), bias=bias, residual=z)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.copy_to_host(), w, rtol=1e-4, atol=1e-4)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("shape, layout, offset", CASES + [((2, 4, 5, 16), "NHWC", 0)])
@pytest.mark.parametrize("where", ["first", "later", "both signs"])
def test_statistics_with_an_infinity(shape, layout, offset, where):
    """A channel holding +inf has mean +inf (and +inf with -inf: NaN) on every path, as
    in the reference: the kernels shift by the channel's first element (inf - inf was
    NaN) and merge chunks with Chan's formula (d = mb - mu was inf - inf); the H200's
    error fuzz found it in group_norm. 16 channels: batch_norm/columns.py."""
    x = _inputs(shape, offset, "float32", 7)(loc=3.0)
    C = shape[-1] if layout == "NHWC" else shape[1]
    first = np.zeros(shape, bool)
    first[(0,) * len(shape)] = True  # channel 0's first element in either layout
    last = np.zeros(shape, bool)
    last[(-1,) * (len(shape) - 1) + (0,) if layout == "NHWC" else (-1, 0, -1, -1)] = True
    if where in ("first", "both signs"):
        x[first] = np.inf
    if where in ("later", "both signs"):
        x[last] = -np.inf if where == "both signs" else np.inf
    got = {be: nbdnn.batch_norm_train(x, np.ones(C, np.float32), np.zeros(C, np.float32),
                                      layout=layout, backend=be)[1] for be in ("cpu", "cuda")}
    assert np.isnan(got["cpu"][0]) if where == "both signs" else got["cpu"][0] == np.inf
    np.testing.assert_allclose(got["cuda"], got["cpu"], rtol=1e-5)


@pytest.mark.parametrize("shape, layout, act", [((3, 5, 7, 3), "NHWC", "relu"),
                                                ((3, 2, 10, 11), "NCHW", None)])
def test_chunks_a_block_match_reference(shape, layout, act, monkeypatch):
    """sums.CHUNKS_A_BLOCK: a block merges `per` consecutive chunks into one partial
    (Chan's merge for the statistics, sums for the backward), the last group short;
    the finals read partials of per * E elements. Forced here to 2 and 3 chunks a
    block over channels of 3 to 7 chunks (general kernels: columns, and planes of an
    odd size)."""
    from nbdnn.cuda.batch_norm import sums
    assert sums.chunks_a_block(3136, 2, 132, "bwd") == 6
    assert sums.chunks_a_block(5, 1, 132, "bwd") == 1
    assert sums.chunks_a_block(3136, 2, 132, "stats") == (1 if "stats" not in
                                                          sums.CHUNKS_A_BLOCK else 6)
    C = shape[-1] if layout == "NHWC" else shape[1]
    for per in (2, 3):
        monkeypatch.setattr(sums, "chunks_a_block", lambda nch, gx, sm, kind, per=per: per)
        arr = _inputs(shape, 0, "float64", per)
        x, dy = arr(loc=3.0), arr()
        scale, bias = arr((C,)).copy(), arr((C,)).copy()
        got = {}
        for be in ("cpu", "cuda"):
            rm, rv = np.zeros(C), np.ones(C)
            y, mean, invstd = nbdnn.batch_norm_train(x, scale, bias, rm, rv, layout=layout,
                                                     activation=act, backend=be)
            grads = nbdnn.batch_norm_backward(dy, x, scale, mean, invstd, bias=bias,
                                              layout=layout, activation=act, backend=be)
            got[be] = (y, mean, invstd, rm, rv, *grads)
        for g, w in zip(got["cuda"], got["cpu"]):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype, shape, blocks_an_sm", [("float32", (2, 5, 13, 16), 1),
                                                       ("float16", (2, 3, 9, 24), 4)])
def test_columns_path_matches_general(dtype, shape, blocks_an_sm, monkeypatch):
    """batch_norm/columns.py (NHWC, C % 8 == 0: 8 channels a thread): training's
    statistics and apply, inference with alpha/beta, the backward's sums (with relu
    and a residual, and plain; dx on the general kernel), equal to the general kernels'
    results. 2 row blocks for apply (its grid-stride loop and masked last rows); float32:
    one chunk of several iterations (a thread's Chan merges), float16: several chunks."""
    from nbdnn.cuda.batch_norm import columns
    from nbdnn.cuda.runtime.launch.kernel import launched
    monkeypatch.setattr(columns, "MAX_GRID_Y", 2)
    monkeypatch.setattr(columns, "BLOCKS_AN_SM", blocks_an_sm)
    arr = _inputs(shape, 0, dtype, 5)
    C = shape[-1]
    x, z, dy = arr(loc=3.0), arr(), arr()
    scale, bias = arr((C,)).copy(), arr((C,)).copy()
    kw = dict(layout="NHWC", residual=z, activation="relu")
    got = {}
    for on in (False, True):
        with (contextlib.nullcontext() if on else BN.forced("general")), \
                launched() as names:
            rm, rv = np.zeros(C, np.float32), np.ones(C, np.float32)
            y, mean, invstd = nbdnn.batch_norm_train(x, scale, bias, rm, rv, backend="cuda",
                                                     **kw)
            grads = nbdnn.batch_norm_backward(dy, x, scale, mean, invstd, bias=bias,
                                              backend="cuda", **kw)
            plain = nbdnn.batch_norm_backward(dy, x, scale, mean, invstd, layout="NHWC",
                                              backend="cuda")
            yi = nbdnn.batch_norm_infer(x, scale, bias, rm, rv, alpha=0.5, beta=2.0,
                                        out=np.array(z), backend="cuda", **kw)
        assert [names.count(k) for k in ("apply_columns", "stats_columns8",
                                         "bwd_act_columns8", "bwd_columns8")] == \
            ([2, 1, 1, 1] if on else [0] * 4), names
        got[on] = [np.asarray(a, np.float64) for a in (y, mean, invstd, rm, rv, *grads,
                                                       *plain, yi)]
    for a, b in zip(got[True], got[False]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 if dtype == "float32" else 1e-3)


@pytest.mark.parametrize("shape, layout", [(MULTI, "NCHW"), ((2, 3, 5, 5), "NCHW"),
                                           ((2, 3, 4, 8), "NHWC"), ((2, 4, 4, 3), "NHWC")])
@pytest.mark.parametrize("act", [None, "relu"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_float32_parameters_beside_16_bit_x(shape, layout, act, dtype):
    """float32 scale and bias beside 16-bit x (cuDNN's float scale-bias descriptor; a
    PyTorch batch norm under autocast): the kernels built for them (PARAMS_READ: the
    statistics' and the backward's finals, inference's coefficients, the backward's
    sums, which read them with an activation) on every path (planes, general, columns),
    against the reference; dscale and dbias come back float32; and the same values as
    16-bit parameters (exactly representable: halves) give the same results (dscale
    and dbias: rounded to x's dtype). Only
    scale (bias None) and only bias take the float32 kernels too."""
    import ml_dtypes
    dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16
    arr = _inputs(shape, 0, dt, sum(shape))
    C = shape[-1] if layout == "NHWC" else shape[1]
    x, z, dy = arr(loc=3.0), arr(), arr()
    rng = np.random.default_rng(C)
    scale, bias = (np.round(rng.standard_normal(C) * 2) / 2).astype(np.float32), \
        (np.round(rng.standard_normal(C) * 2) / 2).astype(np.float32)
    kw = dict(layout=layout, residual=z, activation=act)

    def run(be, sc, bi):
        rm, rv = np.zeros(C, np.float32), np.ones(C, np.float32)
        y, mean, invstd = nbdnn.batch_norm_train(x, sc, bi, rm, rv, backend=be, **kw)
        grads = nbdnn.batch_norm_backward(dy, x, sc, mean, invstd, bias=bi, backend=be, **kw)
        yi = nbdnn.batch_norm_infer(x, sc, bi, rm, rv, backend=be, **kw)
        return [np.asarray(a) for a in (y, mean, invstd, rm, rv, *grads, yi)]

    got = run("cuda", scale, bias)
    assert got[6].dtype == got[7].dtype == np.float32  # dscale, dbias
    assert got[0].dtype == got[5].dtype == got[8].dtype == np.dtype(dt)  # y, dx, dz
    for g, w in zip(got, run("cpu", scale, bias)):
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=3e-2,
                                   atol=3e-2)
    for i, (g, w) in enumerate(zip(got, run("cuda", scale.astype(dt), bias.astype(dt)))):
        if i in (6, 7):  # (the same float32 sums, there rounded to x's dtype)
            g = g.astype(dt)
        np.testing.assert_array_equal(g.astype(np.float64), w.astype(np.float64))
    for sc, bi in ((scale, None), (None, bias)):
        one = nbdnn.batch_norm_backward(dy, x, sc, got[1], got[2], bias=bi, backend="cuda",
                                        **kw)
        assert one[1].dtype == np.float32

"""The pooling reference (nbdnn/cpu/pool.py) against naive loops over every window in
float64 (1-3 d, both layouts, every mode, ceil mode, NaN propagation on and off), max
backward's first-maximum rule with ties, avg backward against finite differences, and
PyTorch's pooling where it is installed."""
import itertools

import numpy as np
import pytest

import nbdnn

POOL = {1: nbdnn.pool1d, 2: nbdnn.pool2d, 3: nbdnn.pool3d}


def _positions(S, k, t, d, pre, post, ceil):
    """Output positions of one axis, counted window by window (not nbdnn's formula,
    which the backends share): a window starting at p*t - pre and spanning d*(k-1)+1
    counts when it ends inside the padded input; in ceil mode also when it runs past
    the end by less than a stride, as long as it starts inside the input or its
    pre-padding (PyTorch's rule)."""
    span, n = d * (k - 1) + 1, 0
    while True:
        start = n * t - pre
        end = start + span - 1
        fits = end <= S - 1 + post
        if not (fits or ceil and end <= S - 1 + post + t - 1 and start < S):
            return n
        n += 1


def windows(S, K, st, pads, dil, ceil):
    """For every output position: the list of (input index or None for padding,
    inside the padded extent) over the window in row-major order."""
    P = [_positions(s, k, t, d, a, b, ceil) for s, k, t, d, (a, b) in zip(S, K, st, dil, pads)]
    for p in itertools.product(*map(range, P)):
        taps = []
        for j in itertools.product(*map(range, K)):
            i = tuple(q * t - a + jj * d for q, t, (a, _), jj, d in zip(p, st, pads, j, dil))
            inside = all(0 <= ii < s for ii, s in zip(i, S))
            extent = all(-a <= ii < s + b for ii, s, (a, b) in zip(i, S, pads))
            taps.append((i if inside else None, extent))
        yield p, taps


def naive_pool(x, K, st, pads, dil, mode, ceil, prop):
    """x (N, C, *S) -> (y, argmax index per output or None)."""
    S = x.shape[2:]
    out, arg = {}, {}
    for p, taps in windows(S, K, st, pads, dil, ceil):
        for n, c in itertools.product(range(x.shape[0]), range(x.shape[1])):
            vals = [(i, x[(n, c) + i]) for i, _ in taps if i is not None]
            if mode == "max":
                nans = [i for i, v in vals if np.isnan(v)]
                real = [(i, v) for i, v in vals if not np.isnan(v)]
                if nans and (prop or not real):
                    out[n, c, p], arg[n, c, p] = np.nan, nans[0]
                elif real:
                    m = max(v for _, v in real)
                    out[n, c, p], arg[n, c, p] = m, next(i for i, v in real if v == m)
                else:
                    out[n, c, p], arg[n, c, p] = -np.inf, None
            else:
                count = len(vals) if mode == "avg_exclude_pad" else sum(e for _, e in taps)
                out[n, c, p] = sum(v for _, v in vals) / count if count else 0.0
                arg[n, c, p] = count
    P = tuple(max(k[2][a] for k in out) + 1 for a in range(len(S)))
    y = np.empty(x.shape[:2] + P)
    for k, v in out.items():
        y[k[:2] + k[2]] = v
    return y, arg


CASES = [((3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1)), ((2, 3), (1, 2), ((0, 1), (1, 0)), (2, 1)),
         # ceil mode's last window starting exactly past the input + pre-padding (PyTorch
         # drops it): x's axes 7 and 6, window 2, stride 2, padding 1
         ((2, 2), (2, 2), ((1, 1), (1, 1)), (1, 1)), ((3, 2), (3, 2), ((1, 0), (1, 1)), (1, 1)),
         ((2,), (2,), ((1, 0),), (1,)), ((2, 1, 2), (1, 2, 2), ((1, 0), (0, 0), (0, 1)), (1, 1, 2))]


# ceil mode only: windows larger than the padded input (floor mode leaves no output)
CEIL_ONLY = [((8,), (3,), ((0, 0),), (1,)), ((3, 7), (2, 4), ((1, 1), (0, 0)), (3, 1)),
             ((2, 4, 6), (1, 2, 5), ((0, 1), (1, 0), (0, 0)), (1, 2, 1))]


@pytest.mark.parametrize("K, st, pads, dil", CASES + CEIL_ONLY)
@pytest.mark.parametrize("mode", ["max", "avg", "avg_exclude_pad"])
@pytest.mark.parametrize("ceil, prop", [(False, True), (True, False)])
def test_forward_and_backward_match_naive_loops(K, st, pads, dil, mode, ceil, prop):
    if not ceil and (K, st, pads, dil) in CEIL_ONLY:
        with pytest.raises(nbdnn.ShapeError, match="no larger than the padded input"):
            POOL[len(K)](np.zeros((1, 1) + (7, 6, 5)[:len(K)]), K, stride=st, padding=pads,
                         dilation=dil, mode=mode)
        return
    nd = len(K)
    rng = np.random.default_rng(len(K) * 7 + len(mode))
    x = np.round(rng.standard_normal((2, 2) + (7, 6, 5)[:nd]), 1)  # rounding makes ties
    x[(0, 0) + (1,) * nd] = np.nan
    kw = dict(stride=st, padding=pads, dilation=dil, mode=mode, ceil_mode=ceil,
              nan_propagation=prop)
    want, arg = naive_pool(x, K, st, pads, dil, mode, ceil, prop)
    np.testing.assert_allclose(POOL[nd](x, K, **kw), want, rtol=1e-14, atol=1e-14)
    xl = np.moveaxis(x, 1, -1).copy()  # channels-last gives the same numbers
    got_l = POOL[nd](xl, K, layout="NHWC" if nd == 2 else "N" + "DHW"[3 - nd:] + "C", **kw)
    np.testing.assert_allclose(np.moveaxis(got_l, -1, 1), want, rtol=1e-14, atol=1e-14)
    dy = rng.standard_normal(want.shape)
    dx = np.zeros_like(x)
    for (n, c, p), a in arg.items():
        if mode == "max" and a is not None:
            dx[(n, c) + a] += dy[(n, c) + p]
        elif mode != "max" and a:
            for i, _ in next(t for q, t in windows(x.shape[2:], K, st, pads, dil, ceil)
                             if q == p):
                if i is not None:
                    dx[(n, c) + i] += dy[(n, c) + p] / a
    np.testing.assert_allclose(nbdnn.pool_backward(dy, x, K, **kw), dx, rtol=1e-13,
                               atol=1e-13)


def test_avg_backward_is_the_derivative():
    rng = np.random.default_rng(3)
    x, K = rng.standard_normal((1, 2, 6, 5)), (3, 2)
    kw = dict(stride=(2, 1), padding=1, mode="avg", ceil_mode=True)
    dy = rng.standard_normal(nbdnn.pool2d(x, K, **kw).shape)
    dx = nbdnn.pool_backward(dy, x, K, **kw)
    eps, i = 1e-6, (0, 1, 2, 3)
    xp = x.copy()
    xp[i] += eps
    num = ((nbdnn.pool2d(xp, K, **kw) - nbdnn.pool2d(x, K, **kw)) * dy).sum() / eps
    assert abs(num - dx[i]) < 1e-6


def test_global_average_pooling():
    x = np.random.default_rng(4).standard_normal((2, 3, 5, 4))
    y = nbdnn.pool2d(x, (5, 4), mode="avg")
    np.testing.assert_allclose(y[..., 0, 0], x.mean(axis=(2, 3)), rtol=1e-14)


@pytest.mark.parametrize("mode", ["max", "avg", "avg_exclude_pad"])
def test_against_pytorch(mode):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    x = np.random.default_rng(5).standard_normal((2, 3, 9, 8))
    for k, s, p, ceil in ((3, 2, 1, False), (3, 2, 1, True), (2, 2, 0, False)):
        t = torch.from_numpy(x)
        want = F.max_pool2d(t, k, s, p, ceil_mode=ceil) if mode == "max" else \
            F.avg_pool2d(t, k, s, p, ceil_mode=ceil, count_include_pad=mode == "avg")
        got = nbdnn.pool2d(x, k, stride=s, padding=p, mode=mode, ceil_mode=ceil)
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("K, st, pads", [((3, 3), (2, 2), ((1, 1), (1, 1))),   # compiled in
                                         ((2, 2), (2, 2), ((0, 0), (0, 0))),   # compiled in
                                         ((2, 3), (1, 2), ((0, 1), (1, 0)))])  # general
@pytest.mark.parametrize("prop", [True, False])
def test_gpu_forward_nan_windows_match_naive_loops(K, st, pads, prop):
    """The GPU forward's branch-free window (NaN seen / number seen flags) against the
    naive loops: windows holding a NaN, all NaN, or only padding; max and both averages."""
    rng = np.random.default_rng(3)
    x = np.round(rng.standard_normal((2, 2, 7, 6)), 1)
    x[0, 0, 1, 1] = x[0, 1, :3, :3] = x[1, 0, 4, 2] = np.nan
    for mode in ("max", "avg", "avg_exclude_pad"):
        kw = dict(stride=st, padding=pads, mode=mode, nan_propagation=prop)
        want, _ = naive_pool(x, K, st, pads, (1, 1), mode, False, prop)
        got = nbdnn.pool2d(x, K, backend="cuda", **kw)
        np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-14)

"""OpSpec rows for pooling (imported by nbdnn.testing): random rank (1-3 d), layout,
window, stride, per-side padding, dilation, ceil mode, every mode (the averages with
and without a divisor), NaN propagation on and off with a NaN planted in some inputs. fp16 inputs tie often: the first-maximum
rule of max backward is exercised on both backends with the same rounded values;
pool_indices draws few distinct values for ties."""
import math

import numpy as np

import nbdnn
from nbdnn._vocab import BF16_DTYPES, POOL_MODES as MODES
from nbdnn.testing.harness import Case, OpSpec, rand

POOL = {1: nbdnn.pool1d, 2: nbdnn.pool2d, 3: nbdnn.pool3d}


def _problem(draw, big):
    """(x shape, kernel, keywords) with every output size > 0."""
    nd = (2, 2, 1, 3)[draw(0, 3)]
    cap = (10, 6, 3)[nd - 1] if not big else (40, 24, 8)[nd - 1]
    K = tuple(draw(1, 3) for _ in range(nd))
    dil = tuple(draw(1, 2) for _ in range(nd))
    pads = tuple((draw(0, 1), draw(0, 2)) for _ in range(nd))
    S = tuple(max(draw(1, cap), (k - 1) * d + 1 - a - b)
              for k, d, (a, b) in zip(K, dil, pads))
    last, C = draw(0, 1) == 1, draw(1, 3)
    xs = (draw(1, 2),) + S + (C,) if last else (draw(1, 2), C) + S
    kw = dict(stride=tuple(draw(1, 3) for _ in range(nd)), padding=pads, dilation=dil,
              mode=MODES[draw(0, 2)], ceil_mode=draw(0, 1) == 1,
              nan_propagation=draw(0, 1) == 1, layout="NHWC" if last else "NCHW")
    if kw["mode"] != "max" and draw(0, 2) == 0:  # (PyTorch's divisor_override)
        kw["divisor"] = (-2, -1, 1, 2, 3, 7)[draw(0, 5)]
    return nd, xs, K, kw


def _make(backward):
    def make(draw, dtype, big):
        rng = np.random.default_rng(draw(0, 2 ** 31))
        nd, xs, K, kw = _problem(draw, big)
        x = rand(rng, xs, dtype)
        if backward:  # float16: dx sums up to prod(K) overlapping dy shares
            y = POOL[nd](x.astype(np.float64), K, **kw)
            fp16 = (8e-3, 8e-3) if dtype == "float16" and math.prod(K) > 1 else None
            return Case((rand(rng, y.shape, dtype), x, K), kw, tol=fp16)
        if draw(0, 3) == 0:
            x.flat[draw(0, x.size - 1)] = np.nan
        return Case((x, K), dict(kw, nd=nd))
    return make


def _indices(draw, dtype, big):
    """Max windows only; half the draws of few distinct values (ties: the first maximal
    element is the one named), some with a NaN."""
    rng = np.random.default_rng(draw(0, 2 ** 31))
    _, xs, K, kw = _problem(draw, big)
    kw.pop("mode")
    kw.pop("divisor", None)
    x = rand(rng, xs, dtype) if draw(0, 1) else rng.integers(0, 3, xs).astype(dtype)
    if draw(0, 3) == 0:
        x.flat[draw(0, x.size - 1)] = np.nan
    return Case((x, K), kw)


def _indices_edge(name):
    def make(dtype):
        shape, K, kw = EDGES[name]
        return Case((np.random.default_rng(len(name)).integers(0, 2, shape).astype(dtype), K),
                    dict(kw))
    return make


def _pool(x, K, nd=2, **kw):
    return POOL[nd](x, K, **kw)


# (x shape, window, keywords): where the output-size and window-bound rules bend
EDGES = {
    # ceil mode: a 4th window would start in the right padding (6 >= 5 + 1): PyTorch
    # drops it, so P = 3, not 4
    "ceil mode drops a window starting in padding":
        ((1, 2, 5, 6), (2, 2), dict(stride=2, padding=((1, 1), (1, 1)), ceil_mode=True)),
    # ceil mode: the last window hangs past the input (no padding) and is kept
    "ceil mode keeps a window hanging past the input":
        ((2, 1, 6, 7), (3, 3), dict(stride=2, padding=0, ceil_mode=True)),
    "padding at half the window": ((1, 3, 7, 5), (5, 4), dict(stride=(2, 3), padding=(2, 2))),
    "prime sizes, dilation and ceil mode":
        ((1, 2, 13), (3,), dict(stride=3, dilation=2, padding=((1, 0),), ceil_mode=True)),
    "window as large as the input, channels last":
        ((2, 5, 3, 4, 3), (5, 3, 4), dict(stride=1, layout="NHWC")),
}
# the averages' divisor where the counts vary most (ceil mode's clipped windows)
AVERAGE_EDGES = {"divisor over ceil mode's clipped windows":
                 ((1, 2, 5, 7), (3, 3), dict(stride=2, padding=1, ceil_mode=True, divisor=5)),
                 "a negative divisor, 3-d (the general kernels)":
                 ((1, 2, 3, 4, 5), (2, 2, 2), dict(stride=1, padding=1, divisor=-3))}


def _edge(name, mode, backward):
    def make(dtype):
        shape, K, kw = {**EDGES, **AVERAGE_EDGES}[name]
        nd = len(K)
        kw = dict(kw, mode=mode)
        rng = np.random.default_rng(len(name))
        x = rand(rng, shape, dtype)
        if backward:
            y = POOL[nd](x.astype(np.float64), K, **kw)
            return Case((rand(rng, y.shape, dtype), x, K), kw,
                        tol=(8e-3, 8e-3) if dtype == "float16" else None)
        return Case((x, K), dict(kw, nd=nd))
    return make


def _edges(backward):
    edges = {f"{name}, {mode}": _edge(name, mode, backward) for name in EDGES for mode in MODES}
    return dict(edges, **{f"{name}, {mode}": _edge(name, mode, backward)
                          for name in AVERAGE_EDGES for mode in MODES[1:]})


SPECS = [OpSpec("pool", _pool, _make(False), family="pool", dtypes=BF16_DTYPES,
                ops=("pool1d", "pool2d", "pool3d"), boundary=_edges(False)),
         OpSpec("pool_backward", nbdnn.pool_backward, _make(True), family="pool",
                dtypes=BF16_DTYPES, boundary=_edges(True)),
         OpSpec("pool_indices", nbdnn.pool_indices, _indices, family="pool",
                dtypes=BF16_DTYPES, blend=False,
                boundary={name: _indices_edge(name) for name in EDGES})]

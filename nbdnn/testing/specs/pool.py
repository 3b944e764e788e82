"""OpSpec rows for pooling (imported by nbdnn.testing): random rank (1-3 d), layout,
window, stride, per-side padding, dilation, ceil mode, every mode, NaN propagation on
and off with a NaN planted in some inputs. fp16 inputs tie often: the first-maximum
rule of max backward is exercised on both backends with the same rounded values."""
import math

import numpy as np

import nbdnn
from nbdnn._vocab import POOL_MODES as MODES
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


def _pool(x, K, nd=2, **kw):
    return POOL[nd](x, K, **kw)


SPECS = [OpSpec("pool", _pool, _make(False), family="pool", ops=("pool1d", "pool2d", "pool3d")),
         OpSpec("pool_backward", nbdnn.pool_backward, _make(True), family="pool")]

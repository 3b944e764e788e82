"""OpSpec rows for layer_norm / rms_norm (imported by nbdnn.testing): any shape, 1 to
all trailing axes normalised, scale and bias drawn in or out; backward from the
forward's own statistics. Tolerances grow with the row length (sums) and, forward,
with the rows' conditioning (_conditioning)."""
import numpy as np

import nbdnn
from nbdnn._vocab import BF16_DTYPES
from nbdnn.testing.harness import Case, OpSpec, rand, reduction_tol, shape_nd

FORWARD = {"layer_norm": nbdnn.layer_norm, "rms_norm": nbdnn.rms_norm}
BACKWARD = {"layer_norm": nbdnn.layer_norm_backward, "rms_norm": nbdnn.rms_norm_backward}


def _problem(draw, dtype, big):
    rng = np.random.default_rng(draw(0, 2 ** 31))
    shape = shape_nd(draw, big)
    ndim = draw(1, len(shape))
    tail = shape[len(shape) - ndim:]
    scale = rand(rng, tail, dtype, 0.5, 2) if draw(0, 1) else None
    L = int(np.prod(tail))
    return rng, shape, ndim, scale, L


def _conditioning(name, x, L):
    """Extra absolute error a correct float32 kernel may show: the row's centre (its
    mean, summed in float32) carries an error ~ eps * sqrt(L) * max|x|, which the
    output amplifies by 1 / sqrt(var + eps). A short row of nearly equal values (L = 2,
    var ~ eps) turns it into 1e-5-level error no rounding of the output explains."""
    rows = np.asarray(x, np.float64).reshape(-1, L)
    centre = rows.mean(1, keepdims=True) if name == "layer_norm" else 0.0
    eps = FORWARD[name].__kwdefaults__["eps"]
    spread = np.sqrt(((rows - centre) ** 2).mean(1) + eps)
    return 8 * np.sqrt(L) * float((np.abs(rows).max(1) / spread).max()) if rows.size else 0.0


def _maker(name, backward):
    def make(draw, dtype, big):
        rng, shape, ndim, scale, L = _problem(draw, dtype, big)
        x = rand(rng, shape, dtype)
        tol = tuple(4 * t for t in reduction_tol(dtype, L + 2))
        if not backward:
            acc = np.finfo(np.float64 if dtype == "float64" else np.float32).eps
            tol = (tol[0] + acc * _conditioning(name, x, L), tol[1])
            bias = rand(rng, shape[len(shape) - ndim:], dtype) if draw(0, 1) else None
            return Case((x, scale, bias), {"ndim": ndim}, tol=tol)
        stats = FORWARD[name](x.astype(np.float64), ndim=ndim)[1:]
        ct = np.float64 if dtype == "float64" else np.float32
        stats = tuple(s.astype(ct) for s in stats)
        rows = int(np.prod(shape)) // L
        tol = tuple(4 * t for t in reduction_tol(dtype, max(L, rows) + 2))
        return Case((rand(rng, shape, dtype, -1, 1), x) + stats + (scale,), {"ndim": ndim},
                    tol=tol)
    return make


ROW = {"family": "norm", "dtypes": BF16_DTYPES}  # every norm takes bfloat16
SPECS = []
for _n in ("layer_norm", "rms_norm"):
    SPECS.append(OpSpec(_n, FORWARD[_n], _maker(_n, False), **ROW, blend=False))
    SPECS.append(OpSpec(f"{_n}_backward", BACKWARD[_n], _maker(_n, True), **ROW,
                        blend=False))


def _group_problem(draw, dtype, big):
    rng = np.random.default_rng(draw(0, 2 ** 31))
    G = draw(1, 3)
    C = G * draw(1, 3)
    spatial = shape_nd(draw, big, ndim_lo=0, ndim_hi=2, total_small=16, total_big=4096)
    last = draw(0, 1) == 1
    N = draw(1, 3)
    shape = (N,) + spatial + (C,) if last else (N, C) + spatial
    groups = [G, C, None][draw(0, 2)]  # None: instance_norm
    scale = rand(rng, (C,), dtype, 0.5, 2) if draw(0, 1) else None
    L = int(np.prod(shape)) // N // (G if groups == G else C)
    return rng, shape, groups, scale, last, L


def _group(x, scale=None, bias=None, groups=None, **kw):
    if groups is None:
        return nbdnn.instance_norm(x, scale, bias, **kw)
    return nbdnn.group_norm(x, groups, scale, bias, **kw)


def _group_backward(dy, x, mean, invstd, scale=None, groups=None, **kw):
    if groups is None:
        return nbdnn.instance_norm_backward(dy, x, mean, invstd, scale, **kw)
    return nbdnn.group_norm_backward(dy, x, mean, invstd, scale, groups=groups, **kw)


def _group_maker(backward):
    def make(draw, dtype, big):
        rng, shape, groups, scale, last, L = _group_problem(draw, dtype, big)
        kw = {"layout": "NHWC" if last else "NCHW"}
        x = rand(rng, shape, dtype)
        tol = tuple(4 * t for t in reduction_tol(dtype, L + 2))
        if not backward:
            bias = rand(rng, (shape[-1] if last else shape[1],), dtype) if draw(0, 1) else None
            return Case((x, scale, bias, groups), kw, tol=tol)
        ct = np.float64 if dtype == "float64" else np.float32
        stats = tuple(s.astype(ct) for s in _group(x.astype(np.float64), groups=groups,
                                                   **kw)[1:])
        tol = tuple(4 * t for t in reduction_tol(dtype, max(L, int(np.prod(shape))) + 2))
        return Case((rand(rng, shape, dtype, -1, 1), x) + stats + (scale, groups), kw, tol=tol)
    return make


SPECS += [OpSpec("group_norm", _group, _group_maker(False), **ROW, blend=False,
                 ops=("group_norm", "instance_norm")),
          OpSpec("group_norm_backward", _group_backward, _group_maker(True), **ROW,
                 ops=("group_norm_backward", "instance_norm_backward"),
                 blend=False)]

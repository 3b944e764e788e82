"""OpSpec rows for layer_norm / rms_norm (imported by nbdnn.testing): any shape, 1 to
all trailing axes normalised, scale and bias drawn in or out; backward from the
forward's own statistics. Tolerances grow with the row length (sums)."""
import numpy as np

import nbdnn
from nbdnn.testing import Case, OpSpec, rand, reduction_tol, shape_nd

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


def _maker(name, backward):
    def make(draw, dtype, big):
        rng, shape, ndim, scale, L = _problem(draw, dtype, big)
        x = rand(rng, shape, dtype)
        tol = tuple(4 * t for t in reduction_tol(dtype, L + 2))
        if not backward:
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


SPECS = []
for _n in ("layer_norm", "rms_norm"):
    SPECS.append(OpSpec(_n, FORWARD[_n], _maker(_n, False), family="norm", blend=False))
    SPECS.append(OpSpec(f"{_n}_backward", BACKWARD[_n], _maker(_n, True), family="norm",
                        blend=False))

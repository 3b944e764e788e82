"""OpSpec rows for the softmax family (imported by nbdnn.testing).

Each maker draws one of four shape families so that every CUDA kernel is reached:
any shape and axis; rows with L % 4 == 0 (the 16-byte vector path); NCHW over the
channels (the strided kernel); long rows (big: past the register cache, kernel 2;
small: short rows forced onto kernel 2: nbdnn.cuda.softmax.forced, around the CUDA call
alone). A forced path is also drawn at random ("rows_block" puts short rows on the
block-per-row variant, "fused" on the two-pass block-per-row kernel, "strided" runs the
strided kernel with inner == 1).
Backward inputs use a real forward output for y (softmax, or log-softmax for "log").
"""
import numpy as np

import nbdnn
from nbdnn.cpu.softmax import forward as _forward
from nbdnn.testing.harness import Case, OpSpec, rand, reduction_tol, shape_nd

from nbdnn._vocab import BF16_DTYPES, SOFTMAX_ALGOS as ALGOS
_FORCE = (None, None, None, "rows_block", "fused", "long", "strided")


def _forced(path):
    """The Case's context for the CUDA call: softmax's path `path` forced (None: none)."""
    if path is None:
        return None

    def context():
        from nbdnn.cuda import softmax as cuda_softmax
        return cuda_softmax.forced(path)
    return context


def _shape_axis(draw, big):
    """(shape, axis, force) from one of four families."""
    limit = (1 << 17) if big else 256
    fam = draw(0, 3)
    force = _FORCE[draw(0, len(_FORCE) - 1)]
    if fam == 0:
        shape = shape_nd(draw, big, total_big=limit)
        return shape, draw(-len(shape), len(shape) - 1), force
    if fam == 1:  # contiguous rows, L % 4 == 0
        L = 4 * draw(1, (8, 64, 512, 8192)[draw(0, 3)] if big else (8, 48)[draw(0, 1)])
        return (draw(1, max(1, limit // L)), L), -1, force
    if fam == 2:  # NCHW, softmax over channels (cuDNN CHANNEL mode)
        c = draw(1, 64 if big else 6)
        hw = draw(1, 32 if big else 4)
        n = draw(1, max(1, limit // (c * hw * hw)))
        return (n, c, hw, draw(1, hw)), 1, force
    if big:  # past the register cache: 32768 forward, 16384 backward
        rows = draw(1, 3)
        return (rows, draw(16385, limit // rows)), -1, None
    return (draw(1, 2), draw(33, 120)), -1, "long"


def _maker(algo, backward):
    def make(draw, dtype, big):
        rng = np.random.default_rng(draw(0, 2 ** 31))
        shape, axis, force = _shape_axis(draw, big)
        x = rand(rng, shape, dtype)
        L = shape[axis]
        kw = {"axis": axis, "algo": algo}
        tol = reduction_tol(dtype, L)
        if not backward:
            return Case((x,), kw, tol=tol, forced=_forced(force))
        y = _forward(x.astype(np.float64), axis, algo).astype(dtype)
        dy = rand(rng, shape, dtype, -1.0, 1.0)
        return Case((dy, y), kw, tol=tol, forced=_forced(force))
    return make


# (shape, axis, kernel): a row of one, rows one past a warp and a vector width, the
# channels of an NCHW map, and the first axis of a 3-d tensor ("fast" runs the
# kernels "accurate" does, without the max: its random rows cover it)
EDGES = {"rows of one element": ((5, 1), -1, None),
         "33-element rows, the block-per-row kernel": ((3, 33), -1, "rows_block"),
         "rows one past a 4-vector, fused kernel": ((2, 4 * 9 + 1), -1, "fused"),
         "long rows past a warp's cache": ((2, 65), -1, "long"),
         "channels of an NCHW map": ((2, 7, 3, 2), 1, None),
         "first axis of three": ((5, 2, 3), 0, None)}


def _edge(name, algo, backward):
    def make(dtype):
        shape, axis, force = EDGES[name]
        rng = np.random.default_rng(len(name))
        x = rand(rng, shape, dtype)
        kw = {"axis": axis, "algo": algo}
        tol = reduction_tol(dtype, shape[axis])
        if not backward:
            return Case((x,), kw, tol=tol, forced=_forced(force))
        y = _forward(x.astype(np.float64), axis, algo).astype(dtype)
        return Case((rand(rng, shape, dtype, -1.0, 1.0), y), kw, tol=tol,
                    forced=_forced(force))
    return make


SPECS = []
for _a in ALGOS:
    SPECS.append(OpSpec(f"softmax/{_a}", nbdnn.softmax, _maker(_a, False), family="softmax",
                        dtypes=BF16_DTYPES,
                        boundary={n: _edge(n, _a, False) for n in EDGES if _a != "fast"}))
for _a in ALGOS:
    SPECS.append(OpSpec(f"softmax_backward/{_a}", nbdnn.softmax_backward,
                        _maker(_a, True), family="softmax", dtypes=BF16_DTYPES,
                        boundary={n: _edge(n, _a, True) for n in EDGES if _a != "fast"}))

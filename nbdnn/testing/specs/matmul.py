"""OpSpec rows for matmul / matmul_backward (imported by nbdnn.testing).

Shapes come from four batch families (none; equal batches; a batched against one
b, as activations against weights; a (p, 1) against b (q,), broadcasting both ways),
with M, N, K drawn from 1 up (edges of every tile), both transposes, bias or not, and
an epilogue activation. Tolerances grow with the reduction length (matmul_tol).
"""
import math

import numpy as np

import nbdnn
from nbdnn._vocab import BF16_DTYPES, MATH_MODES
from nbdnn.cpu.matmul import tf32
from nbdnn.testing.harness import EPS, Case, OpSpec, rand

ACTIVATIONS = (None, None, "relu", "gelu", "sigmoid", "leaky_relu")


def matmul_tol(dtype, length):
    """(atol, rtol) for sums of `length` products of values in [-1, 1], accumulated in
    float32 (float64 for float64) and rounded once to dtype."""
    acc = EPS["float64" if dtype == "float64" else "float32"]
    return (4 * acc * length + 4 * EPS[dtype] * math.sqrt(length),
            4 * EPS[dtype] + 4 * acc * math.sqrt(length))


def _shapes(draw, big):
    """(a shape, b shape, trans_a, trans_b, (batch, M, N, K))."""
    hi = 160 if big else 9
    M, N, K = draw(1, hi), draw(1, hi), draw(1, hi)
    fam = draw(0, 3)
    n = draw(1, 3)
    ab, bb = [((), ()), ((n,), (n,)), ((n,), ()), ((draw(1, 2), 1), (n,))][fam]
    ta, tb = draw(0, 1) == 1, draw(0, 1) == 1
    a = ab + ((K, M) if ta else (M, K))
    b = bb + ((N, K) if tb else (K, N))
    return a, b, ta, tb, (np.broadcast_shapes(ab, bb), M, N, K)


def math_modes(draw, dtype, arrays, tol):
    """float32 rows draw a math mode. "tf32" operands are drawn already TF32-exact, so
    the float64 oracle (which has no mode) sees what the GPU multiplies; "3xtf32" is
    held to twice ieee's tolerance against it (the dropped lo * lo terms)."""
    if dtype != "float32":
        return "ieee", arrays, tol
    mode = MATH_MODES[draw(0, len(MATH_MODES) - 1)]
    if mode == "tf32":
        arrays = [None if x is None else tf32(x) for x in arrays]
    if mode == "3xtf32":
        tol = (2 * tol[0], 2 * tol[1])
    return mode, arrays, tol


def _matmul(a, b, bias=None, **kw):
    return nbdnn.matmul(a, b, bias=bias, **kw)


def _make_forward(draw, dtype, big):
    rng = np.random.default_rng(draw(0, 2 ** 31))
    ash, bsh, ta, tb, (_, _, N, K) = _shapes(draw, big)
    bias = rand(rng, (N,), dtype, -1, 1) if draw(0, 1) else None
    act = ACTIVATIONS[draw(0, len(ACTIVATIONS) - 1)]
    mode, (a, b), tol = math_modes(draw, dtype, [rand(rng, ash, dtype, -1, 1),
                                            rand(rng, bsh, dtype, -1, 1)],
                              matmul_tol(dtype, K + 1))
    return Case((a, b, bias), {"trans_a": ta, "trans_b": tb, "activation": act, "math": mode},
                tol=tol)


def _make_backward(draw, dtype, big):
    rng = np.random.default_rng(draw(0, 2 ** 31))
    ash, bsh, ta, tb, (batch, M, N, K) = _shapes(draw, big)
    dc = rand(rng, tuple(batch) + (M, N), dtype, -1, 1)
    length = max(N, M * max(1, math.prod(batch)))  # the longest sum: db, dbias
    mode, (dc, a, b), tol = math_modes(draw, dtype, [dc, rand(rng, ash, dtype, -1, 1),
                                                rand(rng, bsh, dtype, -1, 1)],
                                  matmul_tol(dtype, length))
    return Case((dc, a, b), {"trans_a": ta, "trans_b": tb, "bias": draw(0, 1) == 1,
                             "math": mode}, tol=tol)


# (a shape, b shape, trans_a, trans_b): tile tails (sizes one past and one short of
# 8, 16, 32), K = 1, a single row or column, broadcast batches
EDGES = {"K = 1": ((13, 1), (1, 17), False, False),
         "one row against a wide b, b transposed": ((1, 31), (33, 31), False, True),
         "tails past 32 and 16, a transposed": ((17, 33), (17, 15), True, False),
         "batched a against one b": ((3, 9, 7), (7, 5), False, False),
         "broadcast batches both ways": ((2, 1, 5, 4), (3, 4, 6), False, False)}


def _edge(name, backward):
    def make(dtype):
        ash, bsh, ta, tb = EDGES[name]
        rng = np.random.default_rng(len(name))
        a, b = rand(rng, ash, dtype, -1, 1), rand(rng, bsh, dtype, -1, 1)
        kw = {"trans_a": ta, "trans_b": tb}
        c = nbdnn.matmul(a.astype(np.float64), b.astype(np.float64), **kw)
        K = ash[-2] if ta else ash[-1]
        if backward:
            return Case((rand(rng, c.shape, dtype, -1, 1), a, b), dict(kw, bias=True),
                        tol=matmul_tol(dtype, max(c.size, K)))
        return Case((a, b, rand(rng, c.shape[-1:], dtype, -1, 1)), dict(kw, activation="gelu"),
                    tol=matmul_tol(dtype, K + 1))
    return make


SPECS = [OpSpec("matmul", _matmul, _make_forward, family="matmul", ops=("matmul",),
                dtypes=BF16_DTYPES, boundary={n: _edge(n, False) for n in EDGES}),
         OpSpec("matmul_backward", nbdnn.matmul_backward, _make_backward, family="matmul",
                dtypes=BF16_DTYPES, blend=False,
                boundary={n: _edge(n, True) for n in EDGES})]

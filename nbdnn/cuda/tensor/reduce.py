"""reduce_tensor on the GPU: row and column reduction kernels, split into two
deterministic passes when there are too few outputs to fill the GPU.

Every op is (pre, comb, post): add (id, +), avg (id, +, / n), norm1 (|x|, +),
norm2 (x^2, +, sqrt), mul (id, *), mul_no_zeros (0 -> 1, *), min/max (id, min/max),
amax (|x|, max). Accumulation in float32 (float64 for float64; bfloat16 as its bits,
widened on load and rounded on store), in a fixed order (a
per-thread sequential sweep, then a fixed shuffle/shared-memory tree): bit-identical
results run to run, no atomics. min/max carry an int64 index: (value, index) pairs
are ordered NaN first, then by value, then by smaller index, a total order, so the
tree gives NumPy's argmin/argmax (first occurrence, first NaN) whatever the split.

Views, after dropping size-1 dims and merging neighbours (x read once: ns bytes):
- rows (rows, L), reduced axes trailing: TPR threads per row (32 for L <= 1024, else
  256), each thread sweeping 16-byte vectors (load4, 2 in flight per iteration;
  a scalar head/tail aligns each row's start). Few long rows (the all-axes reduce)
  split each row into S chunks: pass 1 writes (rows, S) compute-type partials (+
  indices), pass 2 reduces those rows (post and alpha/beta applied there).
- cols (outer, R, inner), reduced axes leading or in the middle: one thread per 4
  adjacent columns (load4 when inner % 4 == 0), sweeping R in order: coalesced. R is
  split into S chunks the same way when outer * inner is small.
- anything else (e.g. axes (0, 2) of 4-D): moved last with the transform kernel
  first (+2ns bytes), then rows.
"""
import math

import numpy as np
from numba import cuda, float32, float64, int64

from ..runtime.simulator import SIMULATOR
from ..runtime.memory.arrays import dtype_name, empty, ptr
from ..runtime.device_code.intrinsics import (HAS_WARP, array_type, load4, narrow,
    vector_alignment, widen)
from ..runtime.launch.kernel import Kernel

BLOCK = 64 if SIMULATOR else 256  # (the simulator starts an OS thread a CUDA thread)
BIG = np.int64(1 << 62)       # index of "no element yet"
SPLIT_TARGET = 2048           # aim for at least this many blocks before splitting
ROW_MIN_CHUNK = 16384         # elements per row chunk when splitting rows
COL_MIN_ROWS = 64             # rows of R per chunk when splitting columns
OPS = {"add": ("id", "add", 0), "avg": ("id", "add", 1), "norm1": ("abs", "add", 0),
       "norm2": ("sq", "add", 2), "mul": ("id", "mul", 0),
       "mul_no_zeros": ("nz", "mul", 0), "min": ("id", "min", 0),
       "max": ("id", "max", 0), "amax": ("abs", "max", 0)}
INDEXED = (("id", "min"), ("id", "max"), ("abs", "max"))
# threads a row: a warp for short rows, the block for long ones (the simulator: 8 for
# short rows, a quarter of a warp's OS threads: reduce_tensor's crosscheck rows
# and the depthwise filter gradient's partial sums held ~5 minutes of CI)
TPRS = (8 if SIMULATOR else 32, BLOCK)


def _functions(npt):
    """pre, comb(a, b) and comb_indexed(a, ia, b, ib) device functions for type npt."""
    one, zero = npt(1), npt(0)
    dev = cuda.jit(device=True)
    pre = {"id": lambda v: v, "abs": lambda v: abs(v), "sq": lambda v: v * v,
           "nz": lambda v: one if v == zero else v}
    comb = {"add": lambda a, b: a + b, "mul": lambda a, b: a * b,
            "min": lambda a, b: b if (b < a or b != b) else a,
            "max": lambda a, b: b if (b > a or b != b) else a}

    def max_i(a, ia, b, ib):
        if a != a:
            if b != b and ib < ia:
                return b, ib
            return a, ia
        if b != b or b > a or (b == a and ib < ia):
            return b, ib
        return a, ia

    def min_i(a, ia, b, ib):
        if a != a:
            if b != b and ib < ia:
                return b, ib
            return a, ia
        if b != b or b < a or (b == a and ib < ia):
            return b, ib
        return a, ia

    def first(a, ia, b, ib):  # placeholder: add/mul carry no index
        return a, ia

    combi = {"min": dev(min_i), "max": dev(max_i), "add": dev(first), "mul": dev(first)}
    init = {"add": zero, "mul": one, "min": npt(np.inf), "max": npt(-np.inf)}
    return ({k: dev(f) for k, f in pre.items()}, {k: dev(f) for k, f in comb.items()},
            combi, init)


def _step_and_finish(pre, comb, combi, idx, ct):
    dev = cuda.jit(device=True)

    def step(acc, ai, v, i):
        # fold one element (index i) into the accumulator
        w = pre(v)
        if idx:
            return combi(acc, ai, w, i)
        return comb(acc, w), ai

    def finish(y, yi, k, acc, ai, post, n_avg, alpha, beta):
        # y[k] = alpha * post(acc) + beta * y[k]; yi[k] = index
        r = acc
        if post == 1:
            r = r / n_avg
        elif post == 2:
            r = math.sqrt(r)
        r = alpha * r
        if beta != 0:
            r = r + beta * widen(y[k])
        y[k] = narrow(r, y)
        if idx:
            yi[k] = ai

    return dev(step), dev(finish)


def _row_kernel(pre, comb, combi, idx, ct, init, tpr):
    step, finish = _step_and_finish(pre, comb, combi, idx, ct)
    _merge = _merger(comb, combi, idx)
    rpb = BLOCK // tpr      # rows per block
    nw = BLOCK // 32        # warps per block

    # x: sub-row k = (row, chunk j) covers x[row*L + j*C : min(.. + C, row*L + L)];
    # y[k], yi[k]: its result. has_xi: indices come from xi (pass 2), not positions.
    def reduce_rows(x, xi, y, yi, nsub, L, C, S, post, n_avg, alpha, beta, aligned,
                    has_xi):
        sv = cuda.shared.array(BLOCK, ct)
        si = cuda.shared.array(BLOCK, int64)
        tid = cuda.threadIdx.x
        lane = tid % tpr
        k = cuda.blockIdx.x * rpb + tid // tpr
        acc = init
        ai = BIG
        if k < nsub:
            row = k // S
            rbase = row * L
            start = rbase + (k - row * S) * C
            stop = min(start + C, rbase + L)
            if aligned != 0:
                body = start + (4 - start % 4) % 4  # first element on a 16-byte boundary
                e = start + lane
                if e < body and e < stop:
                    acc, ai = step(acc, ai, widen(x[e]), e - rbase)
                g = body // 4 + lane
                gstop = stop // 4
                while g + tpr < gstop:  # two 16-byte loads in flight
                    a0, a1, a2, a3 = load4(x, g)
                    b0, b1, b2, b3 = load4(x, g + tpr)
                    i = 4 * g - rbase
                    acc, ai = step(acc, ai, widen(a0), i)
                    acc, ai = step(acc, ai, widen(a1), i + 1)
                    acc, ai = step(acc, ai, widen(a2), i + 2)
                    acc, ai = step(acc, ai, widen(a3), i + 3)
                    i += 4 * tpr
                    acc, ai = step(acc, ai, widen(b0), i)
                    acc, ai = step(acc, ai, widen(b1), i + 1)
                    acc, ai = step(acc, ai, widen(b2), i + 2)
                    acc, ai = step(acc, ai, widen(b3), i + 3)
                    g += 2 * tpr
                if g < gstop:
                    a0, a1, a2, a3 = load4(x, g)
                    i = 4 * g - rbase
                    acc, ai = step(acc, ai, widen(a0), i)
                    acc, ai = step(acc, ai, widen(a1), i + 1)
                    acc, ai = step(acc, ai, widen(a2), i + 2)
                    acc, ai = step(acc, ai, widen(a3), i + 3)
                e = max(4 * gstop, body) + lane
                if e < stop:
                    acc, ai = step(acc, ai, widen(x[e]), e - rbase)
            else:
                e = start + lane
                while e < stop:
                    acc, ai = step(acc, ai, widen(x[e]), xi[e] if has_xi != 0 else e - rbase)
                    e += tpr
        if HAS_WARP:  # shuffle tree in each warp, then across the block's warps
            off = min(tpr, 32) // 2
            while off > 0:
                ov = cuda.shfl_down_sync(0xffffffff, acc, off)
                oi = cuda.shfl_down_sync(0xffffffff, ai, off)
                acc, ai = _merge(acc, ai, ov, oi)
                off //= 2
            if tpr > 32:
                if tid % 32 == 0:
                    sv[tid // 32] = acc
                    si[tid // 32] = ai
                cuda.syncthreads()
                if tid < 32:
                    acc = sv[tid] if tid < nw else init
                    ai = si[tid] if tid < nw else BIG
                    off = nw // 2
                    while off > 0:
                        ov = cuda.shfl_down_sync(0xffffffff, acc, off)
                        oi = cuda.shfl_down_sync(0xffffffff, ai, off)
                        acc, ai = _merge(acc, ai, ov, oi)
                        off //= 2
        else:  # the simulator: the same tree through shared memory
            sv[tid] = acc
            si[tid] = ai
            cuda.syncthreads()
            off = tpr // 2
            while off > 0:
                if lane < off:
                    v, i = _merge(sv[tid], si[tid], sv[tid + off], si[tid + off])
                    sv[tid] = v
                    si[tid] = i
                cuda.syncthreads()
                off //= 2
            acc = sv[tid]
            ai = si[tid]
        if lane == 0 and k < nsub:
            finish(y, yi, k, acc, ai, post, n_avg, alpha, beta)
    return reduce_rows


def _merger(comb, combi, idx):
    """Combine two partial (value, index) results (no pre)."""
    def merge(a, ia, b, ib):
        if idx:
            return combi(a, ia, b, ib)
        return comb(a, b), ia
    return cuda.jit(device=True)(merge)


def _col_kernel(pre, comb, combi, idx, ct, init):
    step, finish = _step_and_finish(pre, comb, combi, idx, ct)

    # x viewed (outer, R, inner); block b -> output row ob = (o, chunk j) and a run of
    # columns; each thread sweeps rows j*C .. j*C + C of 4 columns (aligned) or 1.
    # y viewed (outer*S, inner). has_xi: indices come from xi (pass 2), not r.
    def reduce_cols(x, xi, y, yi, nib, R, inner, C, S, post, n_avg, alpha, beta,
                    aligned, has_xi):
        tid = cuda.threadIdx.x
        bid = cuda.blockIdx.x
        ob = bid // nib
        o = ob // S
        r0 = (ob - o * S) * C
        r1 = min(r0 + C, R)
        base = o * R * inner
        if aligned != 0:
            col = ((bid - ob * nib) * BLOCK + tid) * 4
            if col < inner:
                c0, c1, c2, c3 = init, init, init, init
                i0, i1, i2, i3 = BIG, BIG, BIG, BIG
                g = (base + r0 * inner + col) // 4
                for r in range(r0, r1):
                    v0, v1, v2, v3 = load4(x, g)
                    c0, i0 = step(c0, i0, widen(v0), r)
                    c1, i1 = step(c1, i1, widen(v1), r)
                    c2, i2 = step(c2, i2, widen(v2), r)
                    c3, i3 = step(c3, i3, widen(v3), r)
                    g += inner // 4
                k = ob * inner + col
                finish(y, yi, k, c0, i0, post, n_avg, alpha, beta)
                finish(y, yi, k + 1, c1, i1, post, n_avg, alpha, beta)
                finish(y, yi, k + 2, c2, i2, post, n_avg, alpha, beta)
                finish(y, yi, k + 3, c3, i3, post, n_avg, alpha, beta)
        else:
            col = (bid - ob * nib) * BLOCK + tid
            if col < inner:
                acc = init
                ai = BIG
                e = base + r0 * inner + col
                for r in range(r0, r1):
                    acc, ai = step(acc, ai, widen(x[e]), xi[e] if has_xi != 0 else r)
                    e += inner
                finish(y, yi, ob * inner + col, acc, ai, post, n_avg, alpha, beta)
    return reduce_cols


def _build():
    """Kernels by (pre, comb, indexed[, threads a row]) and (input, output) dtype pair;
    one source for every pair (widen / narrow convert, bfloat16 passed as its bits)."""
    rows, cols = {}, {}
    pairs = sorted({(p, c) for p, c, _ in OPS.values()})
    for ctn, ct, npt in (("float32", float32, np.float32), ("float64", float64, np.float64)):
        pre, comb, combi, init = _functions(npt)
        dts = ("float16", "bfloat16", "float32") if ctn == "float32" else ("float64",)
        for p, c in pairs:
            for idx in ((False, True) if (p, c) in INDEXED else (False,)):
                ios = {(t, t) for t in dts} | {(t, ctn) for t in dts}
                if p == "id":  # pass 2 reads compute-type partials
                    ios |= {(ctn, t) for t in dts}
                ios = sorted(ios)
                tail = f"{ctn}, {ctn}, {ctn}, int64, int64)"
                for tpr in TPRS:
                    sigs = {io: f"void({array_type(io[0])}[::1], int64[::1], "
                                f"{array_type(io[1])}[::1], int64[::1], int64, int64, int64, "
                                f"int64, int64, {tail}" for io in ios}
                    kern = Kernel(_row_kernel(pre[p], comb[c], combi[c], idx, ct, init[c],
                                              tpr), list(sigs.values()))
                    kern.name = f"reduce_rows_{p}_{c}{'_idx' if idx else ''}_{tpr}_{ctn}"
                    rows.update({(p, c, idx, tpr) + io: (kern, s) for io, s in sigs.items()})
                sigs = {io: f"void({array_type(io[0])}[::1], int64[::1], "
                            f"{array_type(io[1])}[::1], int64[::1], int64, int64, int64, "
                            f"int64, int64, int64, {tail}" for io in ios}
                kern = Kernel(_col_kernel(pre[p], comb[c], combi[c], idx, ct, init[c]),
                              list(sigs.values()))
                kern.name = f"reduce_cols_{p}_{c}{'_idx' if idx else ''}_{ctn}"
                cols.update({(p, c, idx) + io: (kern, s) for io, s in sigs.items()})
    return rows, cols


_ROWS, _COLS = _build()
_NOIDX = {}


def _noidx():
    """A placeholder for unused index arrays (never read or written)."""
    if not SIMULATOR:
        return (0, 0)
    if "sim" not in _NOIDX:
        _NOIDX["sim"] = cuda.device_array(1, np.int64)
    return _NOIDX["sim"]


def _split(n, min_chunk, blocks):
    """(S, C): chunks of >= min_chunk (multiple of 4) so that blocks * S ~ SPLIT_TARGET."""
    if blocks >= SPLIT_TARGET or n < 2 * min_chunk:
        return 1, n
    s = min(-(-SPLIT_TARGET // blocks), n // min_chunk)
    c = -(-(-(-n // s)) // 4) * 4
    return -(-n // c), c


def _rows(x, xi, rows, L, key, tin, tout, y, yi, post, n, alpha, beta, stream):
    """Reduce x viewed (rows, L) into y[rows] (two passes for few long rows)."""
    p, c, idx, ctn = key
    tpr = TPRS[0] if L <= 1024 else TPRS[1]
    nsub = -(-rows // (BLOCK // tpr))
    S, C = _split(L, ROW_MIN_CHUNK, nsub) if xi is None else (1, L)
    al = int(xi is None and ptr(x) % vector_alignment(np.dtype(tin).itemsize) == 0)
    xi_ = xi if xi is not None else _noidx()
    if S == 1:
        kern, sig = _ROWS[(p, c, idx, tpr, tin, tout)]
        kern.launch(sig, nsub, BLOCK, stream, x, xi_, y, yi, rows, L, L, 1, post, n,
                    alpha, beta, al, int(xi is not None))
        return
    tpr = TPRS[0] if C <= 1024 else TPRS[1]
    part = empty(x, (rows * S,), ctn)
    pidx = empty(x, (rows * S,), np.int64) if idx else _noidx()
    kern, sig = _ROWS[(p, c, idx, tpr, tin, ctn)]
    kern.launch(sig, -(-rows * S // (BLOCK // tpr)), BLOCK, stream, x, xi_, part, pidx,
                rows * S, L, C, S, 0, 1.0, 1.0, 0.0, al, 0)
    _rows(part, pidx if idx else None, rows, S, ("id", c, idx, ctn), ctn, tout, y, yi,
          post, n, alpha, beta, stream)


def _cols(x, xi, outer, R, inner, key, tin, tout, y, yi, post, n, alpha, beta, stream):
    """Reduce x viewed (outer, R, inner) into y (outer, inner) (two passes when small)."""
    p, c, idx, ctn = key
    al = int(xi is None and inner % 4 == 0
             and ptr(x) % vector_alignment(np.dtype(tin).itemsize) == 0)
    nib = -(-inner // (BLOCK * (4 if al else 1)))
    S, C = _split(R, COL_MIN_ROWS, outer * nib) if xi is None else (1, R)
    xi_ = xi if xi is not None else _noidx()
    if S == 1:
        kern, sig = _COLS[(p, c, idx, tin, tout)]
        kern.launch(sig, outer * nib, BLOCK, stream, x, xi_, y, yi, nib, R, inner, R, 1,
                    post, n, alpha, beta, al, int(xi is not None))
        return
    part = empty(x, (outer * S * inner,), ctn)
    pidx = empty(x, (outer * S * inner,), np.int64) if idx else _noidx()
    kern, sig = _COLS[(p, c, idx, tin, ctn)]
    kern.launch(sig, outer * S * nib, BLOCK, stream, x, xi_, part, pidx, nib, R, inner,
                C, S, 0, 1.0, 1.0, 0.0, al, 0)
    _cols(part, pidx if idx else None, outer, S, inner, ("id", c, idx, ctn), ctn, tout,
          y, yi, post, n, alpha, beta, stream)


def reduce(x, shape, dtype, op, axes, y, yi, alpha, beta, stream, transform_into):
    """y (and indices yi, or None) = alpha * op(x over axes) + beta * y. transform_into:
    the tensor family's permuting copy (tensor/__init__.py), for reductions over axes
    that are not adjacent. y's dtype is x's, or, for the "id" ops (add, avg, mul), a
    16-bit y of compute-type x (other kernels' float32 partials summed into a 16-bit
    result, rounded once)."""
    p, c, post = OPS[op]
    ctn = "float64" if dtype == "float64" else "float32"
    key = (p, c, yi is not None, ctn)
    n = math.prod(shape[a] for a in axes)
    dims = []  # merged (size, reduced?) without size-1 dims
    for i, s in enumerate(shape):
        if s != 1:
            if dims and dims[-1][1] == (i in axes):
                dims[-1][0] *= s
            else:
                dims.append([s, i in axes])
    flags = [r for _, r in dims]
    sizes = [s for s, _ in dims]
    yi_ = yi if yi is not None else _noidx()
    args = (dtype, dtype_name(y), y, yi_, post, float(n), alpha, beta, stream)
    if flags in ([], [True], [False], [False, True]):
        rows = sizes[0] if flags and not flags[0] else 1
        _rows(x, None, rows, n, key, *args)
    elif flags in ([True, False], [False, True, False]):
        outer = sizes[0] if len(flags) == 3 else 1
        _cols(x, None, outer, sizes[-2], sizes[-1], key, *args)
    else:  # scattered axes: gather (kept..., reduced...) first
        perm = [k for k, f in enumerate(flags) if not f] + [k for k, f in enumerate(flags) if f]
        tmp = empty(x, (math.prod(shape),), dtype)
        transform_into(x, sizes, perm, tmp, 1.0, 0.0, stream)
        _rows(tmp, None, math.prod(shape) // n, n, key, *args)

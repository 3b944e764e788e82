"""Softmax forward and backward over any axis: x viewed as (outer, L, inner), L the
softmax axis. Arithmetic in float32 for float16/float32 storage, float64 for float64.
algo is a runtime int (FAST 0, ACCURATE 1, LOG 2): uniform per launch, so no divergence.

Kernels (traffic per element, float32; +4 B when beta != 0 reads out):
1. rows (inner == 1, L <= ROWS_MAX: 32768 forward, 16384 backward): G lanes per row,
   each holding 4*V values in registers (generated source, V in ROWS_VS; the slots are
   named scalars, so nothing goes to local memory). One read + one write: 8 B forward,
   12 B backward (dy, y in, dx out). 16-byte `load4`/`store4` when L % 4 == 0 and the
   bases are aligned; otherwise coalesced scalar accesses. `_rows_config`:
     L <= 128:    V = 1, G = pow2(L/4) <= 32, ROWS_BLOCK/G rows a block (shuffles only)
     L <= 1024:   G = 32 (a warp a row), V = pow2(L/128) in 2..8
     longer:      a block a row, G = pow2(L/(4V)) >= 64, V = 4 up to ROWS_MAX/2, then 8;
                  shuffles + one shared-memory step; register caps (max_registers)
                  keep 1024-lane (backward: 512-lane) blocks launchable.
2. long (inner == 1, rows past the register cache, up to 2**31 elements a row):
   each row is cut into C chunks of >= LONG_MIN_CHUNK elements, C chosen so that
   rows * C reaches ~4 blocks per SM (one row of 1M elements still fills the GPU);
   pass A reduces a chunk to an online (max, sum) pair (backward: a sum) in a small
   workspace, pass B combines the row's C pairs in a fixed order (deterministic, every
   block of the row gets the same value) and writes its chunk. 12 B forward (two
   reads, one write), 20 B backward; vector accesses when aligned.
3. strided (inner > 1, softmax over a non-last axis, e.g. NCHW channels): a block of
   BX x BY threads (BX = min(pow2(inner), 32)), BX consecutive columns of inner
   (coalesced), BY threads splitting L; each thread runs the online (max, sum) over
   its part of L, the BY partials are combined (shuffles + shared memory, fixed order),
   then a write pass. 12 B forward, 20 B backward; the second read mostly hits L2.

log-softmax is computed as (x - m) - log(s), so large |x| (1e4) loses nothing to
rounding m + log(s). Non-finite inputs follow nbdnn/cpu/softmax.py: NaN or +inf in a
row makes the row NaN (the online kernels force it: their sum stays finite when the max
is +inf). Under the simulator (no warp shuffles) every reduction goes through shared
memory, and LONG_*/STRIDED_* sizes shrink to keep thread counts small. The private
`_kernel` argument ("rows", "rows_block", "long", "strided") forces a path for tests.
"""
import math

import numpy as np
from numba import cuda, float32, float64

from . import SIMULATOR
from ._arrays import dtype_name, empty, ptr, size
from ._intrinsics import load4, store4, vector_alignment
from ._launch import Kernel
from ._reduce import FAST, LOG, SHM, device_functions
from ._softmax_rows import rows_kernel as _rows_kernel
from ..errors import NotSupportedError

DTYPES = ("float16", "float32", "float64")
ALGOS = {"fast": FAST, "accurate": 1, "log": LOG}

# kernel 1: register-cached rows
ROWS_VS = (1, 2, 4, 8)            # 4-element vectors per lane (generated kernels)
ROWS_BLOCK = 128                  # block size when G <= 32 (ROWS_BLOCK // G rows a block)
ROWS_MAX = {False: 32768, True: 16384}   # longest cached row: forward, backward
ROWS_MAX_G = {False: 1024, True: 512}    # backward caches 2 arrays: half the lanes
# kernel 2: long rows
LONG_BLOCK = 32 if SIMULATOR else 256
LONG_MIN_CHUNK = 32 if SIMULATOR else 4096   # >= 16 elements a thread per pass
# kernel 3: strided
STRIDED_BLOCK = 64 if SIMULATOR else 256
STRIDED_BX = 32                   # columns a block (fewer when inner is smaller)
MAX_GRID = 2 ** 31 - 1
_target_blocks = []               # 4 blocks per SM, measured once


def _pow2(n):
    return 1 << max(0, int(n) - 1).bit_length()


# ---- kernels 2 and 3 ------------------------------------------------------------

def _other_kernels(f, CT):
    NEG_INF, INF, ZERO, NAN = f["NEG_INF"], f["INF"], f["ZERO"], f["NAN"]
    update, grp_pair, col_pair = f["update"], f["grp_pair"], f["col_pair"]
    f_combine, f_grp_sum, finish = f["combine"], f["grp_sum"], f["finish"]
    dev = cuda.jit(device=True)

    @dev
    def fwd_elem(v, m, c, inv, alpha, algo):  # one output of the write pass
        return (v - m - c) * alpha if algo == LOG else math.exp(v - m) * inv

    @dev
    def bwd_term(d, w, lg):  # one term of the backward row sum
        return d if lg else d * w

    @dev
    def bwd_elem(d, w, s, alpha, lg):
        return (d - math.exp(w) * s) * alpha if lg else w * (d - s) * alpha


    def softmax_long_stats(x, part, nrows, L, C, chunk, algo, aligned):
        # block b = (row, c) reduces x[row, c*chunk : (c+1)*chunk] to part[2b], part[2b+1]
        b = cuda.blockIdx.x
        row = b // C
        lo = (b - row * C) * chunk
        hi = min(lo + chunk, L)
        t, T = cuda.threadIdx.x, cuda.blockDim.x
        fast = algo == FAST
        m, s = (ZERO if fast else NEG_INF), ZERO
        shm_m = cuda.shared.array(SHM, CT)
        shm_s = cuda.shared.array(SHM, CT)
        if row < nrows:
            if aligned != 0:
                g, gend = (row * L + lo) // 4 + t, (row * L + hi) // 4
                while g < gend:
                    a0, a1, a2, a3 = load4(x, g)
                    m, s = update(m, s, CT(a0), fast)
                    m, s = update(m, s, CT(a1), fast)
                    m, s = update(m, s, CT(a2), fast)
                    m, s = update(m, s, CT(a3), fast)
                    g += T
            else:
                for i in range(row * L + lo + t, row * L + hi, T):
                    m, s = update(m, s, CT(x[i]), fast)
        m, s = grp_pair(m, s, T, shm_m, shm_s)
        if t == 0:
            part[2 * b] = m
            part[2 * b + 1] = s

    def softmax_long_apply(x, y, part, nrows, L, C, chunk, algo, alpha, beta, aligned):
        b = cuda.blockIdx.x
        row = b // C
        lo = (b - row * C) * chunk
        hi = min(lo + chunk, L)
        t, T = cuda.threadIdx.x, cuda.blockDim.x
        m, s = NEG_INF, ZERO
        shm_m = cuda.shared.array(SHM, CT)
        shm_s = cuda.shared.array(SHM, CT)
        if row < nrows:
            for j in range(t, C, T):  # the row's C partial pairs, in order
                m, s = f_combine(m, s, part[2 * (row * C + j)], part[2 * (row * C + j) + 1])
        m, s = grp_pair(m, s, T, shm_m, shm_s)
        c, inv = finish(m, s, algo, alpha)
        if row < nrows and aligned != 0:
            g, gend = (row * L + lo) // 4 + t, (row * L + hi) // 4
            while g < gend:
                a0, a1, a2, a3 = load4(x, g)
                r0 = fwd_elem(CT(a0), m, c, inv, alpha, algo)
                r1 = fwd_elem(CT(a1), m, c, inv, alpha, algo)
                r2 = fwd_elem(CT(a2), m, c, inv, alpha, algo)
                r3 = fwd_elem(CT(a3), m, c, inv, alpha, algo)
                if beta != ZERO:
                    b0, b1, b2, b3 = load4(y, g)
                    r0, r1, r2, r3 = (r0 + beta * CT(b0), r1 + beta * CT(b1),
                                      r2 + beta * CT(b2), r3 + beta * CT(b3))
                store4(y, g, (r0, r1, r2, r3))
                g += T
        elif row < nrows:
            for i in range(row * L + lo + t, row * L + hi, T):
                r = fwd_elem(CT(x[i]), m, c, inv, alpha, algo)
                if beta != ZERO:
                    r += beta * CT(y[i])
                y[i] = r

    def softmax_strided(x, y, nouter, L, inner, BX, algo, alpha, beta):
        # x: (nouter, L, inner); block (o, column tile): thread t = ty * BX + tx
        t, T = cuda.threadIdx.x, cuda.blockDim.x
        BY = T // BX
        tx, ty = t % BX, t // BX
        nib = (inner + BX - 1) // BX
        o = cuda.blockIdx.x // nib
        i = (cuda.blockIdx.x - o * nib) * BX + tx
        live = i < inner
        fast = algo == FAST
        m, s = (ZERO if fast else NEG_INF), ZERO
        shm_m = cuda.shared.array(STRIDED_BLOCK, CT)
        shm_s = cuda.shared.array(STRIDED_BLOCK, CT)
        p0 = (o * L + ty) * inner + i
        if live:
            p = p0
            for _ in range(ty, L, BY):
                m, s = update(m, s, CT(x[p]), fast)
                p += BY * inner
        m, s = col_pair(m, s, BX, shm_m, shm_s, False)
        c, inv = finish(m, s, algo, alpha)
        if live:
            p = p0
            for _ in range(ty, L, BY):
                r = fwd_elem(CT(x[p]), m, c, inv, alpha, algo)
                if beta != ZERO:
                    r += beta * CT(y[p])
                y[p] = r
                p += BY * inner

    def softmax_long_stats_bwd(dy, y, part, nrows, L, C, chunk, algo, aligned):
        # part[b] = sum over the chunk of dy*y (dy for log)
        b = cuda.blockIdx.x
        row = b // C
        lo = (b - row * C) * chunk
        hi = min(lo + chunk, L)
        t, T = cuda.threadIdx.x, cuda.blockDim.x
        s = ZERO
        shm = cuda.shared.array(SHM, CT)
        lg = algo == LOG
        if row < nrows and aligned != 0:
            g, gend = (row * L + lo) // 4 + t, (row * L + hi) // 4
            while g < gend:
                d0, d1, d2, d3 = load4(dy, g)
                w0, w1, w2, w3 = load4(y, g)
                s += (bwd_term(CT(d0), CT(w0), lg) + bwd_term(CT(d1), CT(w1), lg)) + \
                    (bwd_term(CT(d2), CT(w2), lg) + bwd_term(CT(d3), CT(w3), lg))
                g += T
        elif row < nrows:
            for i in range(row * L + lo + t, row * L + hi, T):
                s += bwd_term(CT(dy[i]), CT(y[i]), lg)
        s = f_grp_sum(s, T, shm)
        if t == 0:
            part[b] = s

    def softmax_long_apply_bwd(dy, y, dx, part, nrows, L, C, chunk, algo, alpha, beta,
                               aligned):
        b = cuda.blockIdx.x
        row = b // C
        lo = (b - row * C) * chunk
        hi = min(lo + chunk, L)
        t, T = cuda.threadIdx.x, cuda.blockDim.x
        s = ZERO
        shm = cuda.shared.array(SHM, CT)
        if row < nrows:
            for j in range(t, C, T):
                s += part[row * C + j]
        s = f_grp_sum(s, T, shm)
        lg = algo == LOG
        if row < nrows and aligned != 0:
            g, gend = (row * L + lo) // 4 + t, (row * L + hi) // 4
            while g < gend:
                d0, d1, d2, d3 = load4(dy, g)
                w0, w1, w2, w3 = load4(y, g)
                r0 = bwd_elem(CT(d0), CT(w0), s, alpha, lg)
                r1 = bwd_elem(CT(d1), CT(w1), s, alpha, lg)
                r2 = bwd_elem(CT(d2), CT(w2), s, alpha, lg)
                r3 = bwd_elem(CT(d3), CT(w3), s, alpha, lg)
                if beta != ZERO:
                    b0, b1, b2, b3 = load4(dx, g)
                    r0, r1, r2, r3 = (r0 + beta * CT(b0), r1 + beta * CT(b1),
                                      r2 + beta * CT(b2), r3 + beta * CT(b3))
                store4(dx, g, (r0, r1, r2, r3))
                g += T
        elif row < nrows:
            for i in range(row * L + lo + t, row * L + hi, T):
                r = bwd_elem(CT(dy[i]), CT(y[i]), s, alpha, lg)
                if beta != ZERO:
                    r += beta * CT(dx[i])
                dx[i] = r

    def softmax_strided_bwd(dy, y, dx, nouter, L, inner, BX, algo, alpha, beta):
        t, T = cuda.threadIdx.x, cuda.blockDim.x
        BY = T // BX
        tx, ty = t % BX, t // BX
        nib = (inner + BX - 1) // BX
        o = cuda.blockIdx.x // nib
        i = (cuda.blockIdx.x - o * nib) * BX + tx
        live = i < inner
        s = ZERO
        shm_m = cuda.shared.array(STRIDED_BLOCK, CT)
        shm_s = cuda.shared.array(STRIDED_BLOCK, CT)
        p0 = (o * L + ty) * inner + i
        if live:
            p = p0
            for _ in range(ty, L, BY):
                s += bwd_term(CT(dy[p]), CT(y[p]), algo == LOG)
                p += BY * inner
        _, s = col_pair(ZERO, s, BX, shm_m, shm_s, True)
        if live:
            p = p0
            for _ in range(ty, L, BY):
                r = bwd_elem(CT(dy[p]), CT(y[p]), s, alpha, algo == LOG)
                if beta != ZERO:
                    r += beta * CT(dx[p])
                dx[p] = r
                p += BY * inner

    return dict(long_stats=softmax_long_stats, long_apply=softmax_long_apply,
                strided=softmax_strided, long_stats_bwd=softmax_long_stats_bwd,
                long_apply_bwd=softmax_long_apply_bwd, strided_bwd=softmax_strided_bwd)


# ---- building and launching -----------------------------------------------------

def _build():
    """kernels[(name, dtype)] -> (Kernel, sig) for every storage dtype."""
    table = {}
    for ct_name, CT, nt in (("float32", float32, np.float32), ("float64", float64, np.float64)):
        f = device_functions(nt)
        ns = dict(f, cuda=cuda, math=math, load4=load4, store4=store4, CT=CT, SHM=SHM,
                  FAST=FAST, LOG=LOG)  # globals of the generated row kernels
        others = _other_kernels(f, CT)
        for t in (d for d in DTYPES if (d == "float64") == (ct_name == "float64")):
            a, c = f"{t}[::1]", ct_name
            sigs = {
                "long_stats": f"void({a}, {c}[::1], int64, int64, int64, int64, int64, int64)",
                "long_apply": f"void({a}, {a}, {c}[::1], int64, int64, int64, int64, int64, "
                              f"{c}, {c}, int64)",
                "strided": f"void({a}, {a}, int64, int64, int64, int64, int64, {c}, {c})",
                "long_stats_bwd": f"void({a}, {a}, {c}[::1], int64, int64, int64, int64, "
                                  "int64, int64)",
                "long_apply_bwd": f"void({a}, {a}, {a}, {c}[::1], int64, int64, int64, "
                                  f"int64, int64, {c}, {c}, int64)",
                "strided_bwd": f"void({a}, {a}, {a}, int64, int64, int64, int64, int64, "
                               f"{c}, {c})",
            }
            for name, sig in sigs.items():
                table[name, t] = (Kernel(others[name], [sig]), sig)
            for bwd in (False, True):
                arrs = ", ".join([a] * (3 if bwd else 2))
                sig = f"void({arrs}, int64, int64, int64, int64, {c}, {c}, int64)"
                for V in ROWS_VS:
                    # a 1024-lane (512 backward) block must fit 64K registers
                    opts = {} if SIMULATOR or V < 4 else {"max_registers": 128 if bwd else 64}
                    k = Kernel(_rows_kernel(V, bwd, ns), [sig], **opts)
                    table[f"rows_{'bwd' if bwd else 'fwd'}_v{V}", t] = (k, sig)
    return table


_KERNELS = _build()


def _rows_config(L, backward, block):
    """(V, G) for kernel 1, or None when the row does not fit the register cache.
    block=True forces a block per row (G >= 64) even for short rows (tests).

    Past 128 elements the lanes hold as many values as they can (V = 8: 32 a lane):
    measured on the H200 at 8192 rows (perf/diagnose.py), fewer lanes with more
    values each won at every length: L = 4096 ran at 81% of copy with V = 8, G = 128
    against 60% with V = 4, G = 256; L = 8192 at 86% (V = 8, G = 256) against 46%."""
    if L <= 128 and not block:
        return 1, _pow2(-(-L // 4))
    if L <= 1024 and not block:
        return _pow2(-(-L // 128)), 32
    G = max(64, _pow2(-(-L // 32)))
    V = min(8, _pow2(-(-L // (4 * G))))
    return (V, G) if G <= ROWS_MAX_G[backward] and L <= ROWS_MAX[backward] else None


def _target():
    if not _target_blocks:
        n = 2 if SIMULATOR else cuda.get_current_device().MULTIPROCESSOR_COUNT
        _target_blocks.append(4 * n)
    return _target_blocks[0]


def _long_config(rows, L):
    """(C, chunk): C chunks of `chunk` elements (a multiple of 4) per row."""
    C = max(1, min(-(-L // LONG_MIN_CHUNK), -(-_target() // rows)))
    chunk = -(-(-(-L // C)) // 4) * 4
    return -(-L // chunk), chunk


def _strided_bx(inner):
    return min(_pow2(inner), STRIDED_BX, STRIDED_BLOCK)


def _check_grid(op, blocks):
    if blocks > MAX_GRID:
        raise NotSupportedError(f"{op}: {blocks} blocks exceed the CUDA grid limit "
                                f"{MAX_GRID}; split the tensor")
    return blocks


def _split(shape, axis):
    outer = math.prod(shape[:axis])
    return outer, shape[axis], math.prod(shape[axis + 1:])


def _path(inner, L, backward, force):
    if inner > 1 or force == "strided":
        return "strided", None
    cfg = None if force == "long" else _rows_config(L, backward, force == "rows_block")
    return ("rows", cfg) if cfg is not None else ("long", None)


def _run(op, arrays, dst, shape, axis, algo, alpha, beta, force, stream):
    """Pick the kernel for (outer, L, inner) and launch it. arrays: (x,) or (dy, y)."""
    backward = len(arrays) == 2
    dtype = dtype_name(dst)
    outer, L, inner = _split(shape, axis)
    if size(dst) == 0:
        return
    A = vector_alignment(np.dtype(dtype).itemsize)
    aligned = int(L % 4 == 0 and all(ptr(a) % A == 0 for a in arrays + (dst,)))
    a = ALGOS[algo]
    kind, cfg = _path(inner, L, backward, force)
    sfx = "_bwd" if backward else ""
    if kind == "rows":
        V, G = cfg
        k, sig = _KERNELS[f"rows_{'bwd' if backward else 'fwd'}_v{V}", dtype]
        block = G if G > 32 else ROWS_BLOCK  # a block a row past a warp
        grid = _check_grid(op, -(-outer // (block // G)))
        k.launch(sig, grid, block, stream, *arrays, dst, outer, L, G, a, alpha, beta,
                 aligned)
    elif kind == "long":
        C, chunk = _long_config(outer, L)
        grid = _check_grid(op, outer * C)
        ct = "float64" if dtype == "float64" else "float32"
        part = empty(dst, ((1 if backward else 2) * grid,), ct)
        k, sig = _KERNELS["long_stats" + sfx, dtype]
        k.launch(sig, grid, LONG_BLOCK, stream, *arrays, part, outer, L, C, chunk, a,
                 aligned)
        k, sig = _KERNELS["long_apply" + sfx, dtype]
        k.launch(sig, grid, LONG_BLOCK, stream, *arrays, dst, part, outer, L, C, chunk, a,
                 alpha, beta, aligned)
    else:
        bx = _strided_bx(inner)
        grid = _check_grid(op, outer * -(-inner // bx))
        k, sig = _KERNELS["strided" + sfx, dtype]
        k.launch(sig, grid, STRIDED_BLOCK, stream, *arrays, dst, outer, L, inner, bx, a,
                 alpha, beta)


def softmax(x, axis, algo, *, alpha, beta, out, stream, _kernel=None):
    """y = alpha * softmax(x, axis) + beta * out; x contiguous (ops made it so)."""
    y = out if out is not None else empty(x, x.shape, dtype_name(x))
    _run("softmax", (x,), y, tuple(x.shape), axis, algo, alpha, beta, _kernel, stream)
    return y


def softmax_backward(dy, y, axis, algo, *, alpha, beta, out, stream, _kernel=None):
    """dx = alpha * softmax'(dy, y) + beta * out."""
    dx = out if out is not None else empty(y, y.shape, dtype_name(y))
    _run("softmax_backward", (dy, y), dx, tuple(y.shape), axis, algo, alpha, beta,
         _kernel, stream)
    return dx

"""Softmax kernels 2-4 (nbdnn.cuda.softmax's docstring says when each runs): rows that
stream through memory twice instead of sitting in registers.

Each kernel is built from two per-thread range loops over x[i0:i1] (elements i0 + t,
i0 + t + T, ... or, aligned, 16-byte vectors (i0/4 + t), ...; two vectors in flight):
  pair_range / dot_range:    the online (max, sum) pair, or the backward sum of dy*y
  apply_range / bwd_range:   the write pass, given the row's statistics
- fused (2): a block a row, both passes in one block, so that the second read finds
  the row in L2 (H200: 50 MB; the grid keeps ~132 SMs x 2048 threads / T rows of
  L*4 B resident). 8 B/element from DRAM forward, 12 B backward.
- long (3, pass A then pass B): a row cut into C chunks of >= LONG_MIN_CHUNK elements
  so that one huge row still fills the GPU; pass A writes each chunk's pair (or sum)
  to a workspace, pass B combines the row's C pairs in a fixed order (deterministic,
  every block of the row gets the same value) and writes its chunk. 12 B forward,
  20 B backward (the chunk is read again from DRAM unless it stayed in L2).
- strided (4): softmax over a non-last axis (inner > 1, e.g. NCHW channels).
"""
import math

from numba import cuda

from ..runtime.device_code.intrinsics import load4, load4_lu, narrow, store4, store4_cs, widen
from ..runtime.device_code.block_reduce import FAST, LOG


def stream_kernels(f, CT, SHM, STRIDED_BLOCK, streaming=True):
    """name -> Python kernel, in compute type CT, over the device functions f.
    streaming: the write passes read with "last use" loads and write with evict-first
    stores, so that the rows still waiting for their second read stay in L2."""
    ld2, st2 = (load4_lu, store4_cs) if streaming else (load4, store4)
    NEG_INF, ZERO = f["NEG_INF"], f["ZERO"]
    update, update4, grp_pair, col_pair = f["update"], f["update4"], f["grp_pair"], f["col_pair"]
    combine, grp_sum, finish = f["combine"], f["grp_sum"], f["finish"]
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

    @dev
    def pair_range(x, i0, i1, fast, aligned):
        t, T = cuda.threadIdx.x, cuda.blockDim.x
        m, s = (ZERO if fast else NEG_INF), ZERO
        if aligned != 0:
            g, gend = i0 // 4 + t, i1 // 4
            while g + T < gend:
                a0, a1, a2, a3 = load4(x, g)
                b0, b1, b2, b3 = load4(x, g + T)
                m, s = update4(m, s, widen(a0), widen(a1), widen(a2), widen(a3), fast)
                m, s = update4(m, s, widen(b0), widen(b1), widen(b2), widen(b3), fast)
                g += 2 * T
            if g < gend:
                a0, a1, a2, a3 = load4(x, g)
                m, s = update4(m, s, widen(a0), widen(a1), widen(a2), widen(a3), fast)
        else:
            for i in range(i0 + t, i1, T):
                m, s = update(m, s, widen(x[i]), fast)
        return m, s

    @dev
    def fwd_vec(x, y, g, m, c, inv, alpha, beta, algo):
        a0, a1, a2, a3 = ld2(x, g)
        r0 = fwd_elem(widen(a0), m, c, inv, alpha, algo)
        r1 = fwd_elem(widen(a1), m, c, inv, alpha, algo)
        r2 = fwd_elem(widen(a2), m, c, inv, alpha, algo)
        r3 = fwd_elem(widen(a3), m, c, inv, alpha, algo)
        if beta != ZERO:
            b0, b1, b2, b3 = load4(y, g)
            r0, r1, r2, r3 = (r0 + beta * widen(b0), r1 + beta * widen(b1),
                              r2 + beta * widen(b2), r3 + beta * widen(b3))
        st2(y, g, (narrow(r0, y), narrow(r1, y), narrow(r2, y), narrow(r3, y)))

    @dev
    def apply_range(x, y, i0, i1, m, c, inv, alpha, beta, algo, aligned):
        t, T = cuda.threadIdx.x, cuda.blockDim.x
        if aligned != 0:
            g, gend = i0 // 4 + t, i1 // 4
            while g < gend:
                fwd_vec(x, y, g, m, c, inv, alpha, beta, algo)
                g += T
        else:
            for i in range(i0 + t, i1, T):
                r = fwd_elem(widen(x[i]), m, c, inv, alpha, algo)
                if beta != ZERO:
                    r += beta * widen(y[i])
                y[i] = narrow(r, y)

    @dev
    def dot_range(dy, y, i0, i1, lg, aligned):
        t, T = cuda.threadIdx.x, cuda.blockDim.x
        s = ZERO
        if aligned != 0:
            g, gend = i0 // 4 + t, i1 // 4
            while g < gend:
                d0, d1, d2, d3 = load4(dy, g)
                w0, w1, w2, w3 = load4(y, g)
                s += (bwd_term(widen(d0), widen(w0), lg) + bwd_term(widen(d1), widen(w1), lg)) + \
                    (bwd_term(widen(d2), widen(w2), lg) + bwd_term(widen(d3), widen(w3), lg))
                g += T
        else:
            for i in range(i0 + t, i1, T):
                s += bwd_term(widen(dy[i]), widen(y[i]), lg)
        return s

    @dev
    def bwd_range(dy, y, dx, i0, i1, s, alpha, beta, lg, aligned):
        t, T = cuda.threadIdx.x, cuda.blockDim.x
        if aligned != 0:
            g, gend = i0 // 4 + t, i1 // 4
            while g < gend:
                d0, d1, d2, d3 = ld2(dy, g)
                w0, w1, w2, w3 = ld2(y, g)
                r0 = bwd_elem(widen(d0), widen(w0), s, alpha, lg)
                r1 = bwd_elem(widen(d1), widen(w1), s, alpha, lg)
                r2 = bwd_elem(widen(d2), widen(w2), s, alpha, lg)
                r3 = bwd_elem(widen(d3), widen(w3), s, alpha, lg)
                if beta != ZERO:
                    b0, b1, b2, b3 = load4(dx, g)
                    r0, r1, r2, r3 = (r0 + beta * widen(b0), r1 + beta * widen(b1),
                                      r2 + beta * widen(b2), r3 + beta * widen(b3))
                st2(dx, g, (narrow(r0, dx), narrow(r1, dx), narrow(r2, dx),
                            narrow(r3, dx)))
                g += T
        else:
            for i in range(i0 + t, i1, T):
                r = bwd_elem(widen(dy[i]), widen(y[i]), s, alpha, lg)
                if beta != ZERO:
                    r += beta * widen(dx[i])
                dx[i] = narrow(r, dx)

    # ---- kernels: x viewed as (nrows, L) ----------------------------------------

    def softmax_fused(x, y, nrows, L, algo, alpha, beta, aligned):
        row = cuda.blockIdx.x
        shm_m = cuda.shared.array(SHM, CT)
        shm_s = cuda.shared.array(SHM, CT)
        m, s = pair_range(x, row * L, row * L + L, algo == FAST, aligned)
        m, s = grp_pair(m, s, cuda.blockDim.x, shm_m, shm_s)
        c, inv = finish(m, s, algo, alpha)
        apply_range(x, y, row * L, row * L + L, m, c, inv, alpha, beta, algo, aligned)

    def softmax_fused_bwd(dy, y, dx, nrows, L, algo, alpha, beta, aligned):
        row = cuda.blockIdx.x
        shm = cuda.shared.array(SHM, CT)
        lg = algo == LOG
        s = grp_sum(dot_range(dy, y, row * L, row * L + L, lg, aligned), cuda.blockDim.x, shm)
        bwd_range(dy, y, dx, row * L, row * L + L, s, alpha, beta, lg, aligned)

    def softmax_long_stats(x, part, nrows, L, C, chunk, algo, aligned):
        # block b = (row, c) reduces x[row, c*chunk : (c+1)*chunk] to part[2b], part[2b+1]
        b = cuda.blockIdx.x
        row = b // C
        lo = row * L + (b - row * C) * chunk
        hi = min(lo + chunk, row * L + L)
        shm_m = cuda.shared.array(SHM, CT)
        shm_s = cuda.shared.array(SHM, CT)
        m, s = pair_range(x, lo, hi, algo == FAST, aligned)
        m, s = grp_pair(m, s, cuda.blockDim.x, shm_m, shm_s)
        if cuda.threadIdx.x == 0:
            part[2 * b] = m
            part[2 * b + 1] = s

    def softmax_long_apply(x, y, part, nrows, L, C, chunk, algo, alpha, beta, aligned):
        b = cuda.blockIdx.x
        row = b // C
        lo = row * L + (b - row * C) * chunk
        hi = min(lo + chunk, row * L + L)
        m, s = NEG_INF, ZERO
        shm_m = cuda.shared.array(SHM, CT)
        shm_s = cuda.shared.array(SHM, CT)
        for j in range(cuda.threadIdx.x, C, cuda.blockDim.x):  # the row's pairs, in order
            m, s = combine(m, s, part[2 * (row * C + j)], part[2 * (row * C + j) + 1])
        m, s = grp_pair(m, s, cuda.blockDim.x, shm_m, shm_s)
        c, inv = finish(m, s, algo, alpha)
        apply_range(x, y, lo, hi, m, c, inv, alpha, beta, algo, aligned)

    def softmax_long_stats_bwd(dy, y, part, nrows, L, C, chunk, algo, aligned):
        # part[b] = sum over the chunk of dy*y (dy for log)
        b = cuda.blockIdx.x
        row = b // C
        lo = row * L + (b - row * C) * chunk
        hi = min(lo + chunk, row * L + L)
        shm = cuda.shared.array(SHM, CT)
        s = grp_sum(dot_range(dy, y, lo, hi, algo == LOG, aligned), cuda.blockDim.x, shm)
        if cuda.threadIdx.x == 0:
            part[b] = s

    def softmax_long_apply_bwd(dy, y, dx, part, nrows, L, C, chunk, algo, alpha, beta,
                               aligned):
        b = cuda.blockIdx.x
        row = b // C
        lo = row * L + (b - row * C) * chunk
        hi = min(lo + chunk, row * L + L)
        s = ZERO
        shm = cuda.shared.array(SHM, CT)
        for j in range(cuda.threadIdx.x, C, cuda.blockDim.x):
            s += part[row * C + j]
        s = grp_sum(s, cuda.blockDim.x, shm)
        bwd_range(dy, y, dx, lo, hi, s, alpha, beta, algo == LOG, aligned)

    # ---- kernel 4: x viewed as (nouter, L, inner), inner > 1 ------------------------

    def softmax_strided(x, y, nouter, L, inner, BX, algo, alpha, beta):
        # block (o, column tile): thread t = ty * BX + tx; BX columns (coalesced), BY
        # threads splitting L
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
                m, s = update(m, s, widen(x[p]), fast)
                p += BY * inner
        m, s = col_pair(m, s, BX, shm_m, shm_s, False)
        c, inv = finish(m, s, algo, alpha)
        if live:
            p = p0
            for _ in range(ty, L, BY):
                r = fwd_elem(widen(x[p]), m, c, inv, alpha, algo)
                if beta != ZERO:
                    r += beta * widen(y[p])
                y[p] = narrow(r, y)
                p += BY * inner

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
                s += bwd_term(widen(dy[p]), widen(y[p]), algo == LOG)
                p += BY * inner
        _, s = col_pair(ZERO, s, BX, shm_m, shm_s, True)
        if live:
            p = p0
            for _ in range(ty, L, BY):
                r = bwd_elem(widen(dy[p]), widen(y[p]), s, alpha, algo == LOG)
                if beta != ZERO:
                    r += beta * widen(dx[p])
                dx[p] = narrow(r, dx)
                p += BY * inner

    return dict(fused=softmax_fused, fused_bwd=softmax_fused_bwd,
                long_stats=softmax_long_stats, long_apply=softmax_long_apply,
                long_stats_bwd=softmax_long_stats_bwd, long_apply_bwd=softmax_long_apply_bwd,
                strided=softmax_strided, strided_bwd=softmax_strided_bwd)

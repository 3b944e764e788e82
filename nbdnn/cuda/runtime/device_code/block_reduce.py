"""Reductions shared by the row-wise kernels (softmax; norms can reuse them), built per
compute type: warp-shuffle trees on hardware, shared-memory loops under the simulator
(which has no shuffles). Every reduction runs in a fixed order, so results are
bit-identical run to run, and every lane of a group ends with the same value.

- combine / update / update4 / finish: the online softmax pair (m, s), s = sum exp(x - m).
- grp_max / grp_sum / grp_pair(v, G, shm...): over the G lanes of a row, G a power of
  two; G <= 32: aligned lane groups inside a warp (shuffles only); G > 32: groups of
  whole warps (shuffles, then one slot per warp in `shm`, SHM slots: <= 1024 threads).
- col_pair(m, s, BX, ...): over the threads of one column of a BX-wide tile
  (t = ty * BX + tx), `summing` for plain sums; shared arrays of blockDim entries.
"""
import math

import numpy as np
from numba import cuda

from .intrinsics import HAS_WARP

FAST, ACCURATE, LOG = 0, 1, 2     # softmax algo codes (runtime ints)
FULL = 0xFFFFFFFF
SHM = 32 if HAS_WARP else 1024    # one slot per warp; per thread under the simulator


def device_functions(nt):
    """Reductions and the online update in compute type nt (np.float32/np.float64)."""
    NEG_INF, INF, ZERO, ONE, NAN = nt(-np.inf), nt(np.inf), nt(0), nt(1), nt(np.nan)
    dev = cuda.jit(device=True)

    @dev
    def combine(m1, s1, m2, s2):
        # (m, s) pairs: s = sum exp(x - m). An empty side (s == 0, m == -inf) adds 0
        # without computing exp(-inf - -inf); a side poisoned by NaN (s NaN, m maybe
        # still -inf) keeps its NaN.
        M = m2 if m2 > m1 else m1
        a = s1 * math.exp(m1 - M) if s1 != ZERO else ZERO
        b = s2 * math.exp(m2 - M) if s2 != ZERO else ZERO
        return M, a + b

    @dev
    def update(m, s, v, fast):
        # one element into the running pair; fast keeps m = 0 (no max subtraction)
        if fast:
            return m, s + math.exp(v)
        if v > m:
            return v, s * math.exp(m - v) + ONE
        if v != NEG_INF:  # NaN lands here and poisons s, as in the reference
            return m, s + math.exp(v - m)
        return m, s

    @dev
    def update4(m, s, a0, a1, a2, a3, fast):
        # four elements with one rescale: max first (NaN never wins a comparison, so
        # b ignores it), then four exps against the new max. A NaN poisons s as in
        # `update`, also while m is still -inf (every element so far -inf or NaN).
        if fast:
            return m, s + ((math.exp(a0) + math.exp(a1)) + (math.exp(a2) + math.exp(a3)))
        b = a0 if a0 > NEG_INF else NEG_INF
        b = a1 if a1 > b else b
        b = a2 if a2 > b else b
        b = a3 if a3 > b else b
        if b > m:
            s = s * math.exp(m - b)
            m = b
        if m != NEG_INF:
            return m, s + ((math.exp(a0 - m) + math.exp(a1 - m))
                           + (math.exp(a2 - m) + math.exp(a3 - m)))
        if a0 != a0 or a1 != a1 or a2 != a2 or a3 != a3:
            return m, NAN
        return m, s

    @dev
    def finish(m, s, algo, alpha):
        # (c, inv): y = (x - m - c) * alpha for log (x - m first: exact, as in the
        # reference), exp(x - m) * inv otherwise. A max of
        # +inf (or a row of -inf) makes the row NaN as in the reference; the online sum
        # alone would stay finite there.
        if s == ZERO or (algo != FAST and (m == INF or m == NEG_INF)):
            s = NAN  # s == 0: every exp underflowed (fast) or no element: 0/0 anyway
        if algo == LOG:
            return math.log(s), ZERO
        return ZERO, alpha / s

    if HAS_WARP:
        @dev
        def grp_max(v, G, shm):
            # max over the G lanes of a row: G <= 32 lane groups, or groups of warps
            off = (G if G < 32 else 32) // 2
            while off > 0:
                o = cuda.shfl_xor_sync(FULL, v, off)
                v = o if o > v else v
                off //= 2
            if G > 32:
                t = cuda.threadIdx.x
                if t % 32 == 0:
                    shm[t // 32] = v
                cuda.syncthreads()
                b = t // G * (G // 32)  # this group's first warp
                v = shm[b]
                for i in range(b + 1, b + G // 32):
                    o = shm[i]
                    v = o if o > v else v
                cuda.syncthreads()
            return v

        @dev
        def grp_sum(v, G, shm):
            off = (G if G < 32 else 32) // 2
            while off > 0:
                v += cuda.shfl_xor_sync(FULL, v, off)
                off //= 2
            if G > 32:
                t = cuda.threadIdx.x
                if t % 32 == 0:
                    shm[t // 32] = v
                cuda.syncthreads()
                b = t // G * (G // 32)
                v = shm[b]
                for i in range(b + 1, b + G // 32):
                    v += shm[i]
                cuda.syncthreads()
            return v

        @dev
        def grp_pair(m, s, G, shm_m, shm_s):
            off = (G if G < 32 else 32) // 2
            while off > 0:
                m2 = cuda.shfl_xor_sync(FULL, m, off)
                s2 = cuda.shfl_xor_sync(FULL, s, off)
                m, s = combine(m, s, m2, s2)
                off //= 2
            if G > 32:
                t = cuda.threadIdx.x
                if t % 32 == 0:
                    shm_m[t // 32] = m
                    shm_s[t // 32] = s
                cuda.syncthreads()
                b = t // G * (G // 32)
                m, s = shm_m[b], shm_s[b]
                for i in range(b + 1, b + G // 32):
                    m, s = combine(m, s, shm_m[i], shm_s[i])
                cuda.syncthreads()
            return m, s
    else:
        @dev
        def grp_max(v, G, shm):
            t = cuda.threadIdx.x
            shm[t] = v
            cuda.syncthreads()
            b = t - t % G
            v = shm[b]
            for i in range(1, G):
                o = shm[b + i]
                v = o if o > v else v
            cuda.syncthreads()
            return v

        @dev
        def grp_sum(v, G, shm):
            t = cuda.threadIdx.x
            shm[t] = v
            cuda.syncthreads()
            b = t - t % G
            v = shm[b]
            for i in range(1, G):
                v += shm[b + i]
            cuda.syncthreads()
            return v

        @dev
        def grp_pair(m, s, G, shm_m, shm_s):
            t = cuda.threadIdx.x
            shm_m[t] = m
            shm_s[t] = s
            cuda.syncthreads()
            b = t - t % G
            m, s = shm_m[b], shm_s[b]
            for i in range(1, G):
                m, s = combine(m, s, shm_m[b + i], shm_s[b + i])
            cuda.syncthreads()
            return m, s

    @dev
    def col_pair(m, s, BX, shm_m, shm_s, summing):
        # combine over the BY threads of column tx = t % BX (t = ty * BX + tx): xor
        # shuffles over lane bits >= BX inside a warp, then one entry per warp in order.
        # summing: plain sums in s (backward), m unused.
        step = BX
        if HAS_WARP and BX < 32:
            off = 16
            while off >= BX:
                m2 = cuda.shfl_xor_sync(FULL, m, off)
                s2 = cuda.shfl_xor_sync(FULL, s, off)
                if summing:
                    s = s + s2
                else:
                    m, s = combine(m, s, m2, s2)
                off //= 2
            step = 32
        t = cuda.threadIdx.x
        shm_m[t] = m
        shm_s[t] = s
        cuda.syncthreads()
        i = t % BX
        m, s = shm_m[i], shm_s[i]
        i += step
        while i < cuda.blockDim.x:
            if summing:
                s = s + shm_s[i]
            else:
                m, s = combine(m, s, shm_m[i], shm_s[i])
            i += step
        cuda.syncthreads()
        return m, s

    return dict(NEG_INF=NEG_INF, INF=INF, ZERO=ZERO, ONE=ONE, NAN=NAN,
                combine=combine, update=update, update4=update4, finish=finish, grp_max=grp_max, grp_sum=grp_sum,
                grp_pair=grp_pair, col_pair=col_pair)

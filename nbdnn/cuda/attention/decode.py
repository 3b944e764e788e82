"""Attention for decoding (Sq <= 16 queries against a long key cache):
flash-decoding. The keys are cut into chunks of CHUNK, one block a (batch, kv head,
chunk), so one query row spreads over B Hk Sk / CHUNK blocks instead of one thread; a
combine kernel merges each row's chunks by their log-sum-exp.

Part kernel, block (b, hk, c), CHUNK threads, thread t on key j = c CHUNK + t, for each
of the R = G Sq query rows of kv head hk (the group's heads times the queries: the
chunk's K and V rows are read once from DRAM for all of them, then from L1/L2):
    s_t = scale q_r . k_j + bias      (-inf for a removed key; the exact path's rules)
    m = max_t s_t, l = sum_t exp(s_t - m)               (shared-memory tree reductions)
    e_t = exp(s_t - m) keep_t                           (dropout on the probabilities)
    o_r,c[d] = sum_t e_t v_j[d]       (threads over d: coalesced V reads)
and writes (m, l, o_r,c) to a float32 (float64) workspace. Combine kernel, block a
query row, threads over d:
    M = max_c m_c,  L = sum_c l_c exp(m_c - M),  o[d] = sum_c exp(m_c - M) o_c[d] / L,
    lse = M + log L                   (M = -inf: no live key, o = 0, lse = -inf)
Traffic: K and V once (2 Sk (D + Dv) items a kv head) plus the workspace (R Sk / CHUNK
(Dv + 2) floats, written and read once); flops 2 R Sk (D + Dv). The probabilities stay
in float32 (the exact path rounds 16-bit p before p v, as the tensor cores will).

The paged part kernel (key "paged_part", paged.py's paged_attention) is the same with
each key's K and V rows found through a block table (row_at), once a block: a key in a
page outside the cache takes no part and is never read.
"""
import math

import numpy as np
from numba import cuda, float32, float64, int64, uint8

from ..runtime.device_code.intrinsics import array_type, narrow, widen
from ..runtime.launch.kernel import Kernel
from ..runtime.simulator import SIMULATOR
from .simt import attention_device_functions, geometry_types

CHUNK = 32 if SIMULATOR else 128  # keys a block (its threads)
MAX_SQ = 16
MAX_ROWS = 128      # R = G Sq rows a kv head (beyond: the exact path)
MIN_KEYS = 1024     # keys from which decoding pays (below: the exact path's thread a row)


def usable(Sq, Sk, G):
    return Sq <= MAX_SQ and G * Sq <= MAX_ROWS and Sk >= MIN_KEYS


def _kernels(CT, NEG_INF, PAGED):
    mul, keep, key_range, _, bias, dot, capped, _, alibi_slope = attention_device_functions(CT)

    @cuda.jit(device=True)
    def row_at(b, j, sb, sj, table, P, W, npages):
        """The element offset of key j's row of batch entry b (the caller adds its head's):
        b sb + j sj, or, PAGED (paged.py), page table[b, j // P]'s row j % P with sb the
        page stride; -1 for a page outside [0, npages) (never read)."""
        if not PAGED:
            return b * sb + j * sj
        pg = table[b * W + j // P]
        if pg < 0 or pg >= npages:
            return -1
        return pg * sb + (j % P) * sj

    @cuda.jit(device=True)
    def block_reduce(red, t, x, is_max):
        """max (NaN propagates) or sum of x over the block's CHUNK threads."""
        red[t] = x
        cuda.syncthreads()
        w = CHUNK // 2
        while w > 0:
            if t < w:
                a, b = red[t], red[t + w]
                if is_max:
                    red[t] = b if (b > a or b != b) else a
                else:
                    red[t] = a + b
            cuda.syncthreads()
            w //= 2
        r = red[0]
        cuda.syncthreads()  # (red is reused by the next reduction)
        return r

    def attention_decode_part(q, k, v, ws_o, ws_ml, ma, mb, lens_q, lens_k, B, Hq, G, Sq,
                              Sk, D, Dv, qb, qh, qi, kb, kh, kj, vb, vh, vj, ob, oh, oi,
                              mkind, m0, m1, m2, m3, has_lq, has_lk, causal, scale, mode,
                              thr, kscale, off_lo, off_hi, key_lo, key_hi, win_lo, win_hi,
                              softcap, alibi, slope_b, slopes, table, P, W, npages):
        e = cuda.shared.array(CHUNK, CT)   # this chunk's e_t
        on = cuda.shared.array(CHUNK, uint8)  # 1: the key takes part (not removed)
        red = cuda.shared.array(CHUNK, CT)
        vr = cuda.shared.array(CHUNK, int64)  # the chunk's V rows (row_at)
        t = cuda.threadIdx.x
        chunks = (Sk + CHUNK - 1) // CHUNK
        c = cuda.blockIdx.x % chunks
        hk = (cuda.blockIdx.x // chunks) % (Hq // G)
        b = cuda.blockIdx.x // (chunks * (Hq // G))
        j = c * CHUNK + t
        n0 = min(CHUNK, Sk - c * CHUNK)  # keys in this chunk
        kr = row_at(b, j, kb, kj, table, P, W, npages) if t < n0 else -1
        vr[t] = row_at(b, j, vb, vj, table, P, W, npages) if t < n0 else -1
        for r in range(G * Sq):
            h, i = hk * G + r // Sq, r % Sq
            row = (b * Hq + h) * Sq + i
            x = NEG_INF
            live = False
            j0, j1 = key_range(lens_q, lens_k, has_lq, has_lk, b, i, Sq, Sk, causal, win_lo,
                               win_hi)
            asl, adg = alibi_slope(slopes, alibi, slope_b, lens_q, lens_k, has_lq, has_lk, b,
                                   h, Sq, Sk)
            if kr >= 0 and (has_lq == 0 or i < lens_q[b]) and j0 <= j < j1:
                ok, add = bias(ma, mb, mkind, b * m0 + h * m1 + i * m2 + j * m3)
                if ok:
                    live = True
                    x = capped(scale * dot(q, b * qb + h * qh + i * qi, k, kr + hk * kh, D,
                                           mode), softcap) + add - asl * CT(abs(i + adg - j))
            m = block_reduce(red, t, x, True)
            p = CT(0)
            if live and m != NEG_INF:
                p = math.exp(x - m)
            l = block_reduce(red, t, p, False)
            e[t] = p * keep(np.uint64(row) * np.uint64(Sk) + np.uint64(j), thr, kscale,
                            off_lo, off_hi, key_lo, key_hi) if live else CT(0)
            on[t] = 1 if live else 0
            cuda.syncthreads()
            w = (row * chunks + c) * Dv
            for d in range(t, Dv, CHUNK):
                acc = CT(0)
                for u in range(n0):
                    if on[u] != 0:  # (removed keys take no part: their V stays unread)
                        acc += mul(e[u], widen(v[vr[u] + hk * vh + d]), mode)
                ws_o[w + d] = acc
            if t == 0:
                ws_ml[2 * (row * chunks + c)] = m
                ws_ml[2 * (row * chunks + c) + 1] = l
            cuda.syncthreads()  # (e is rewritten for the next row)

    def attention_decode_combine(ws_o, ws_ml, o, lse, Hq, Sq, chunks, Dv, ob, oh, oi):
        row = cuda.blockIdx.x
        t = cuda.threadIdx.x
        i, h, b = row % Sq, (row // Sq) % Hq, row // (Sq * Hq)
        top = NEG_INF
        for c in range(chunks):
            m = ws_ml[2 * (row * chunks + c)]
            if m > top or m != m:
                top = m
        oo = b * ob + h * oh + i * oi
        if top == NEG_INF:
            for d in range(t, Dv, CHUNK):
                o[oo + d] = narrow(CT(0), o)
            if t == 0:
                lse[row] = NEG_INF
            return
        total = CT(0)
        for c in range(chunks):
            m = ws_ml[2 * (row * chunks + c)]
            if m != NEG_INF:
                total += ws_ml[2 * (row * chunks + c) + 1] * math.exp(m - top)
        for d in range(t, Dv, CHUNK):
            acc = CT(0)
            for c in range(chunks):
                m = ws_ml[2 * (row * chunks + c)]
                if m != NEG_INF:
                    acc += math.exp(m - top) * ws_o[(row * chunks + c) * Dv + d]
            o[oo + d] = narrow(acc / total, o)
        if t == 0:
            lse[row] = top + math.log(total)

    if PAGED:  # (its own name: launched(), the kernel cache's files, profiles)
        attention_decode_part.__name__ = attention_decode_part.__qualname__ = \
            "attention_paged_part"
    return attention_decode_part, attention_decode_combine


def _build():
    table = {}
    for t in ("float16", "bfloat16", "float32", "float64"):
        CT = float64 if t == "float64" else float32
        a, ct = f"{array_type(t)}[::1]", "float64" if t == "float64" else "float32"
        tail = geometry_types(ct)
        sp = f"void({a}, {a}, {a}, {ct}[::1], {ct}[::1], {a}, uint8[::1], {tail}, " \
            "int64[::1], int64, int64, int64)"  # (..., the block table, P, W, pages)
        sc = f"void({ct}[::1], {ct}[::1], {a}, {ct}[::1], " + ", ".join(["int64"] * 7) + ")"
        for paged in (False, True):
            part, combine = _kernels(CT, CT(-np.inf), paged)
            table["paged_part" if paged else "part", t] = (Kernel(part, [sp]), sp)
        table["combine", t] = (Kernel(combine, [sc]), sc)
    return table


KERNELS = _build()

"""Attention on the CUDA cores, the exact path (float32's "ieee" / "tf32" /
"3xtf32" and float64 exactly, 16-bit storage in float32; the simulator runs it): a
thread a query row forward and for dq, a thread a key row for dk and dv. Deterministic:
every sum in one thread, in index order; no atomics.

Forward, thread (b, h, i), two passes over the row's live keys j (nbdnn/cpu/attention.py
has the formulas):
    pass 1   s_j = scale q_i . k_j + bias_ij;  m = max s_j,  l = sum exp(s_j - m)
    pass 2   p_j = exp(s_j - lse_i) (lse_i = m + log l), dropped, rounded to the
             storage dtype (the reference's p'), o_i += p_j v_j
Two passes recompute each score once more (2 D flops a key) rather than rescale the
Dv accumulators per key as the online softmax does: the same p as the reference, which
rounds the normalised p before p v. Per key: k_j read twice, v_j once (D + Dv items).

Backward (FlashAttention-2's recomputation from lse; delta_i = do_i . o_i first):
    dq kernel, thread (b, h, i):     ds_ij = p_ij (keep_ij do_i . v_j - delta_i),
                                     dq_i = scale sum_j ds_ij k_j
    dkv kernel, thread (b, hk, j):   over the group's heads h and rows i,
                                     dv_j = sum p'_ij do_i,  dk_j = scale sum ds_ij q_i
Every tensor is read through its (batch, head, row) strides, so both layouts ("BHSD",
"BSHD") run the same kernels; the mask through its broadcast strides (0 on a
broadcast axis). Accumulators of up to MAX_D items a thread sit in local memory.
"""
import math

import numpy as np
from numba import cuda, float32, float64

from ..dropout import philox4x32_10
from ..runtime.device_code.intrinsics import array_type, narrow, round_tf32, widen
from ..runtime.launch.kernel import Kernel

MAX_D = 256
_MASK, _S32 = np.uint64(0xFFFFFFFF), np.uint64(32)



@cuda.jit(device=True)
def diagonal(lens_q, has_lq, b, Sq, n, causal):
    """The causal diagonal's offset d of an entry with n keys (query i's diagonal key is
    i + d): 0 top-left (causal 1, PyTorch's is_causal), n - Lq bottom-right (2: the rows
    are the sequence's last Lq; Lq its query length)."""
    if causal == 2:
        return n - (min(max(lens_q[b], 0), Sq) if has_lq != 0 else Sq)
    return 0


@cuda.jit(device=True)
def band_range(i, d, lo, hi, n):
    """The band lo <= j - i - d <= hi of row i within 0 .. n - 1: (j0, j1), empty as j0 =
    j1 (geometry.py: the band's sides; NO_BOUND an open one)."""
    j0 = min(max(i + d + lo, 0), n)
    return j0, max(min(i + d + hi + 1, n), j0)


def geometry_types(ct):
    """The types of the arguments every forward-shaped kernel takes after its tensors:
    the two length arrays, then the call's geometry (geometry.Geometry: B, Hq, G, Sq, Sk,
    D, Dv, the strides of q, k, v, o, the mask's kind and strides, the length and causal
    flags; scale, mode, the dropout's threshold, factor, offset and seed; the causal
    band's sides; the logit cap; ALiBi's code, slope stride and slopes)."""
    return "int64[::1], int64[::1], " + ", ".join(["int64"] * 27) + \
        f", {ct}, int64, uint64, {ct}, uint64, uint64, uint64, uint64, int64, int64, {ct}, " \
        "int64, int64, float32[::1]"


def attention_device_functions(CT):
    """mul (a product under math mode 0 ieee, 1 tf32, 2 3xtf32), keep (the dropout
    factor of score e), key_range, row_range, bias, dot, capped and capped_slope (the
    logit cap and its derivative), alibi_slope (ALiBi's slope and diagonal for a row)
    for compute type CT."""
    if CT is float64:
        @cuda.jit(device=True)
        def mul(x, y, mode):
            return x * y
    else:
        @cuda.jit(device=True)
        def mul(x, y, mode):
            if mode == 0:
                return x * y
            xh, yh = round_tf32(x), round_tf32(y)
            if mode == 1:
                return xh * yh
            return xh * yh + (xh * round_tf32(y - yh) + round_tf32(x - xh) * yh)

    @cuda.jit(device=True)
    def keep(e, thr, kscale, off_lo, off_hi, key_lo, key_hi):
        # score e of the (B, Hq, Sq, Sk) scores in C order: word e % 4 of the Philox call
        # e // 4, as nbdnn.dropout's element e (thr 2**32: p = 0, all kept)
        j = e >> np.uint64(2)
        w0, w1, w2, w3 = philox4x32_10(j & _MASK, j >> _S32, off_lo, off_hi, key_lo, key_hi)
        q = e & np.uint64(3)
        w = w0 if q == 0 else (w1 if q == 1 else (w2 if q == 2 else w3))
        return kscale if w < thr else CT(0)

    @cuda.jit(device=True)
    def key_range(lens_q, lens_k, has_lq, has_lk, b, i, Sq, Sk, causal, lo, hi):
        """Keys j0 .. j1 - 1 may attend to row i (of Sq): the entry's n keys, cut by the
        causal band (band_range) where causal != 0."""
        n = Sk
        if has_lk != 0:
            n = min(max(lens_k[b], 0), Sk)
        if causal == 0:
            return 0, n
        return band_range(i, diagonal(lens_q, has_lq, b, Sq, n, causal), lo, hi, n)

    @cuda.jit(device=True)
    def row_range(lens_q, lens_k, has_lq, has_lk, b, j, Sq, Sk, causal, lo, hi, rows):
        """The query rows i0 .. i1 - 1 (of the entry's `rows`) key j attends to:
        key_range's band seen from the key (row i's keys i + d + lo .. i + d + hi hold j
        for i in j - d - hi .. j - d - lo)."""
        if causal == 0:
            return 0, rows
        n = min(max(lens_k[b], 0), Sk) if has_lk != 0 else Sk
        return band_range(j, -diagonal(lens_q, has_lq, b, Sq, n, causal), -hi, -lo, rows)

    @cuda.jit(device=True)
    def bias(ma, mb, mkind, at):
        """(alive, additive term) of the mask element at `at`."""
        if mkind == 1:
            return mb[at] != 0, CT(0)
        if mkind == 2:
            return True, widen(ma[at])
        return True, CT(0)

    @cuda.jit(device=True)
    def dot(x, xo, y, yo, n, mode):
        s = CT(0)
        for d in range(n):
            s += mul(widen(x[xo + d]), widen(y[yo + d]), mode)
        return s

    @cuda.jit(device=True)
    def capped(x, cap):
        """The scaled product x as its score: cap tanh(x / cap), x where cap is 0."""
        if cap > 0:
            return cap * math.tanh(x / cap)
        return x

    @cuda.jit(device=True)
    def capped_slope(x, cap):
        """capped's derivative at x: 1 - tanh(x / cap)^2, 1 where cap is 0."""
        if cap > 0:
            t = math.tanh(x / cap)
            return CT(1) - t * t
        return CT(1)

    @cuda.jit(device=True)
    def alibi_slope(slopes, alibi, slope_b, lens_q, lens_k, has_lq, has_lk, b, h, Sq, Sk):
        """(slope, d) of batch entry b's head h: score (i, j) takes -slope |i + d - j|
        ((0, 0) without ALiBi: alibi 0)."""
        if alibi == 0:
            return CT(0), 0
        n = min(max(lens_k[b], 0), Sk) if has_lk != 0 else Sk
        return CT(slopes[b * slope_b + h]), diagonal(lens_q, has_lq, b, Sq, n, alibi)

    return mul, keep, key_range, row_range, bias, dot, capped, capped_slope, alibi_slope


def _kernels(CT, NEG_INF):
    mul, keep, key_range, row_range, bias, dot, capped, capped_slope, alibi_slope = \
        attention_device_functions(CT)

    @cuda.jit(device=True)
    def row_live(lens_q, has_lq, b, i):
        return has_lq == 0 or i < lens_q[b]

    def attention_fwd(q, k, v, o, lse, ma, mb, lens_q, lens_k, B, Hq, G, Sq, Sk, D, Dv, qb, qh,
                qi, kb, kh, kj, vb, vh, vj, ob, oh, oi, mkind, m0, m1, m2, m3, has_lq,
                has_lk, causal, scale, mode, thr, kscale, off_lo, off_hi, key_lo, key_hi, win_lo,
                win_hi, softcap, alibi, slope_b, slopes):
        r = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if r >= B * Hq * Sq:
            return
        i = r % Sq
        h = (r // Sq) % Hq
        b = r // (Sq * Hq)
        hk = h // G
        qo = b * qb + h * qh + i * qi
        oo = b * ob + h * oh + i * oi
        mo = b * m0 + h * m1 + i * m2
        j0, j1 = key_range(lens_q, lens_k, has_lq, has_lk, b, i, Sq, Sk, causal, win_lo,
                           win_hi)
        if not row_live(lens_q, has_lq, b, i):
            j1 = j0
        asl, adg = alibi_slope(slopes, alibi, slope_b, lens_q, lens_k, has_lq, has_lk, b, h,
                               Sq, Sk)
        ai = i + adg  # (score (i, j) takes -asl |ai - j|)
        top = NEG_INF
        for j in range(j0, j1):
            ok, add = bias(ma, mb, mkind, mo + j * m3)
            if ok:  # (NaN propagates: a NaN score makes a NaN row, as the reference)
                x = capped(scale * dot(q, qo, k, b * kb + hk * kh + j * kj, D, mode),
                           softcap) + add - asl * CT(abs(ai - j))
                if x > top or x != x:
                    top = x
        acc = cuda.local.array(MAX_D, CT)
        for d in range(Dv):
            acc[d] = CT(0)
        if top == NEG_INF:  # no live score: o = 0, lse = -inf
            lse[r] = NEG_INF
            for d in range(Dv):
                o[oo + d] = narrow(CT(0), o)
            return
        total = CT(0)
        for j in range(j0, j1):
            ok, add = bias(ma, mb, mkind, mo + j * m3)
            if ok:
                total += math.exp(capped(scale * dot(q, qo, k, b * kb + hk * kh + j * kj, D,
                                                     mode), softcap) + add -
                                  asl * CT(abs(ai - j)) - top)
        ls = top + math.log(total)
        lse[r] = ls
        e0 = np.uint64(r) * np.uint64(Sk)
        for j in range(j0, j1):
            ok, add = bias(ma, mb, mkind, mo + j * m3)
            if ok:
                p = math.exp(capped(scale * dot(q, qo, k, b * kb + hk * kh + j * kj, D, mode),
                                    softcap) + add - asl * CT(abs(ai - j)) - ls)
                p = widen(narrow(CT(p * keep(e0 + np.uint64(j), thr, kscale, off_lo, off_hi,
                                             key_lo, key_hi)), o))  # (p' in o's dtype)
                vo = b * vb + hk * vh + j * vj
                for d in range(Dv):
                    acc[d] += mul(p, widen(v[vo + d]), mode)
        for d in range(Dv):
            o[oo + d] = narrow(acc[d], o)

    def attention_delta(do, o, dl, B, Hq, Sq, Dv, ob, oh, oi):
        """delta_i = do_i . o_i (float32 / float64), a thread a query row."""
        r = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if r < B * Hq * Sq:
            i, h, b = r % Sq, (r // Sq) % Hq, r // (Sq * Hq)
            oo = b * ob + h * oh + i * oi
            s = CT(0)
            for d in range(Dv):
                s += widen(do[oo + d]) * widen(o[oo + d])
            dl[r] = s

    def attention_dq(do, q, k, v, lse, dl, dq, ma, mb, lens_q, lens_k, B, Hq, G, Sq, Sk, D, Dv,
               qb, qh, qi, kb, kh, kj, vb, vh, vj, ob, oh, oi, mkind, m0, m1, m2, m3, has_lq,
               has_lk, causal, scale, mode, thr, kscale, off_lo, off_hi, key_lo, key_hi, win_lo,
                win_hi, softcap, alibi, slope_b, slopes):
        r = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if r >= B * Hq * Sq:
            return
        i, h, b = r % Sq, (r // Sq) % Hq, r // (Sq * Hq)
        hk = h // G
        qo, oo, mo = b * qb + h * qh + i * qi, b * ob + h * oh + i * oi, b * m0 + h * m1 + i * m2
        acc = cuda.local.array(MAX_D, CT)
        for d in range(D):
            acc[d] = CT(0)
        ls = lse[r]
        j0, j1 = key_range(lens_q, lens_k, has_lq, has_lk, b, i, Sq, Sk, causal, win_lo,
                           win_hi)
        if not (row_live(lens_q, has_lq, b, i) and ls > NEG_INF):  # (a NaN lse: no live
            j1 = j0                                                  # row, as the reference)
        e0 = np.uint64(r) * np.uint64(Sk)
        asl, adg = alibi_slope(slopes, alibi, slope_b, lens_q, lens_k, has_lq, has_lk, b, h,
                               Sq, Sk)
        for j in range(j0, j1):
            ok, add = bias(ma, mb, mkind, mo + j * m3)
            if ok:
                ko, vo = b * kb + hk * kh + j * kj, b * vb + hk * vh + j * vj
                x = scale * dot(q, qo, k, ko, D, mode)
                p = math.exp(capped(x, softcap) + add - asl * CT(abs(i + adg - j)) - ls)
                dp = dot(do, oo, v, vo, Dv, mode) * keep(e0 + np.uint64(j), thr, kscale, off_lo,
                                                         off_hi, key_lo, key_hi)
                ds = p * (dp - dl[r]) * capped_slope(x, softcap)
                for d in range(D):
                    acc[d] += mul(ds, widen(k[ko + d]), mode)
        for d in range(D):
            dq[qo + d] = narrow(acc[d] * scale, dq)

    def attention_dkv(do, q, k, v, lse, dl, dk, dv, ma, mb, lens_q, lens_k, B, Hq, G, Sq, Sk, D,
                Dv, qb, qh, qi, kb, kh, kj, vb, vh, vj, ob, oh, oi, mkind, m0, m1, m2, m3,
                has_lq, has_lk, causal, scale, mode, thr, kscale, off_lo, off_hi, key_lo,
                key_hi, win_lo, win_hi, softcap, alibi, slope_b, slopes):
        r = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        Hk = Hq // G
        if r >= B * Hk * Sk:
            return
        j, hk, b = r % Sk, (r // Sk) % Hk, r // (Sk * Hk)
        ko, vo = b * kb + hk * kh + j * kj, b * vb + hk * vh + j * vj
        ak = cuda.local.array(MAX_D, CT)
        av = cuda.local.array(MAX_D, CT)
        for d in range(D):
            ak[d] = CT(0)
        for d in range(Dv):
            av[d] = CT(0)
        key = has_lk == 0 or j < lens_k[b]
        rows = Sq if key else 0
        if has_lq != 0:
            rows = min(rows, max(lens_q[b], 0))
        for h in range(hk * G, hk * G + G):
            i0, i1 = row_range(lens_q, lens_k, has_lq, has_lk, b, j, Sq, Sk, causal, win_lo,
                               win_hi, rows)
            asl, adg = alibi_slope(slopes, alibi, slope_b, lens_q, lens_k, has_lq, has_lk, b,
                                   h, Sq, Sk)
            for i in range(i0, i1):
                row = (b * Hq + h) * Sq + i
                ls = lse[row]
                ok, add = bias(ma, mb, mkind, b * m0 + h * m1 + i * m2 + j * m3)
                if ok and ls > NEG_INF:
                    qo, oo = b * qb + h * qh + i * qi, b * ob + h * oh + i * oi
                    x = scale * dot(q, qo, k, ko, D, mode)
                    p = math.exp(capped(x, softcap) + add - asl * CT(abs(i + adg - j)) - ls)
                    kp = keep(np.uint64(row) * np.uint64(Sk) + np.uint64(j), thr, kscale,
                              off_lo, off_hi, key_lo, key_hi)
                    pd = widen(narrow(CT(p * kp), dv))
                    for d in range(Dv):
                        av[d] += mul(pd, widen(do[oo + d]), mode)
                    ds = p * (dot(do, oo, v, vo, Dv, mode) * kp - dl[row]) * \
                        capped_slope(x, softcap)
                    for d in range(D):
                        ak[d] += mul(ds, widen(q[qo + d]), mode)
        for d in range(D):
            dk[ko + d] = narrow(ak[d] * scale, dk)
        for d in range(Dv):
            dv[vo + d] = narrow(av[d], dv)

    return attention_fwd, attention_delta, attention_dq, attention_dkv


def _signatures(t):
    """The kernels' signatures for storage dtype t."""
    a, ct = f"{array_type(t)}[::1]", "float64" if t == "float64" else "float32"
    tail = geometry_types(ct)
    arrays = {"forward": f"{a}, {a}, {a}, {a}, {ct}[::1]",
              "grad_q": f"{a}, {a}, {a}, {a}, {ct}[::1], {ct}[::1], {a}",
              "grad_kv": f"{a}, {a}, {a}, {a}, {ct}[::1], {ct}[::1], {a}, {a}"}
    sigs = {name: f"void({head}, {a}, uint8[::1], {tail})" for name, head in arrays.items()}
    sigs["delta"] = f"void({a}, {a}, {ct}[::1], " + ", ".join(["int64"] * 7) + ")"
    return sigs


def lengths64(src, dst, n):
    """int32 sequence lengths widened to the kernels' int64."""
    r = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if r < n:
        dst[r] = src[r]


def _build():
    sig = "void(int32[::1], int64[::1], int64)"
    table = {"lengths64": (Kernel(lengths64, [sig]), sig)}
    for t in ("float16", "bfloat16", "float32", "float64"):
        CT = float64 if t == "float64" else float32
        fns = dict(zip(("forward", "delta", "grad_q", "grad_kv"), _kernels(CT, CT(-np.inf))))
        for name, sig in _signatures(t).items():
            table[name, t] = (Kernel(fns[name], [sig]), sig)
    return table


KERNELS = _build()

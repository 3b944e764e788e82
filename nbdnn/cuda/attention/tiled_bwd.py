"""Attention's backward on the CUDA cores in tiles (float32 compute; tiled.py's forward
and simt.py's answers): simt.py's dq and dkv kernels, a block a 32-row tile instead of
a thread a row, after simt.py's delta kernel.

    dq:  a block a (batch, head, 32 queries); over the live 32-key tiles:
         S = Q K^T, dP = dO V^T (2 x 4 a thread), dS = P (keep dP - delta) -> shared
         memory, dQ (2 rows x D / 8 a thread) += dS K
    dkv: a block a (batch, kv head, 32 keys); over the group's heads and the live
         32-query tiles: S^T = K Q^T, dP^T = V dO^T, P' = P keep (rounded to the storage
         dtype, as the forward's), dS^T; dV += P'^T dO, dK += dS^T Q

P comes from the forward's lse (a row whose lse is -inf or NaN has no live pair), so
no row reduction. A removed pair's dS (and P') is flagged in shared memory and takes no
product: a NaN met only through it stays out. D and Dv up to 128 (the dkv block keeps
dK and dV: 2 x 32 + 2 x 32 registers); larger head dims run simt.py.
"""
import math

import numpy as np
from numba import cuda, float32, int32

from ..runtime.arrays import dtype_name
from ..runtime.codegen import compile_source
from ..runtime.intrinsics import array_type, narrow, widen
from ..runtime.launch import Kernel
from . import simt
from .tiled import BQ, CHUNK, THREADS

MAX_DIM = 128
T = BQ  # (square tiles: own rows and streamed rows, 32 each)


def _dot_tile(out, A, abase, astride, arow_ok, B, bbase, bstride, bcol_ok, n, ind):
    """out{ri}_{u} = sum over n of A[own row 2 rg + ri] B[streamed row cg + 8 u], through
    shared memory in chunks of 64 (sa: own rows, sb: streamed rows, padded)."""
    L = [f"{ind}{' = '.join(f'{out}{ri}_{u}' for ri in (0, 1) for u in range(4))} = F32(0)",
         f"{ind}for dc in range(0, {n}, {CHUNK}):",
         f"{ind}    for e in range(t, {T * CHUNK}, {THREADS}):",
         f"{ind}        rr = e // {CHUNK}",
         f"{ind}        d = dc + e % {CHUNK}",
         f"{ind}        sa[e] = widen({A}[{abase} + rr * {astride} + d]) if {arow_ok} and d < {n} "
         "else F32(0)",
         f"{ind}        sb[rr * {CHUNK + 1} + e % {CHUNK}] = widen({B}[{bbase} + rr * {bstride} + d]) "
         f"if {bcol_ok} and d < {n} else F32(0)",
         f"{ind}    cuda.syncthreads()",
         f"{ind}    for d in range(min({CHUNK}, {n} - dc)):",
         f"{ind}        a0 = sa[ar0 + d]", f"{ind}        a1 = sa[ar0 + {CHUNK} + d]"]
    L += [f"{ind}        b{u} = sb[(cg + {8 * u}) * {CHUNK + 1} + d]" for u in range(4)]
    L += [f"{ind}        {out}{ri}_{u} += mul(a{ri}, b{u}, mode)" for ri in (0, 1) for u in range(4)]
    return L + [f"{ind}    cuda.syncthreads()"]


def _accumulate(acc, coef, src, sbase, sstride, srow_ok, n, bucket, ind):
    """acc{ri}_{c} += coef[own 2 rg + ri][c'] src[streamed c'][col], col = 8 c + cg < n,
    over the 32 streamed rows c' whose flag (sf) is live; src staged 64 columns at a time."""
    L = []
    for vc in range(0, bucket, CHUNK):
        L += [f"{ind}if {vc} < {n}:",
              f"{ind}    for e in range(t, {T * CHUNK}, {THREADS}):",
              f"{ind}        rr = e // {CHUNK}",
              f"{ind}        d = {vc} + e % {CHUNK}",
              f"{ind}        sv[e] = widen({src}[{sbase} + rr * {sstride} + d]) if {srow_ok} and "
              f"d < {n} else F32(0)",
              f"{ind}    cuda.syncthreads()",
              f"{ind}    for c in range({T}):",
              f"{ind}        w0 = {coef}[2 * rg * {T + 1} + c]",
              f"{ind}        w1 = {coef}[(2 * rg + 1) * {T + 1} + c]",
              f"{ind}        f0 = sf[2 * rg * {T + 1} + c]",
              f"{ind}        f1 = sf[(2 * rg + 1) * {T + 1} + c]"]
        for w in range(CHUNK // 8):
            L += [f"{ind}        x = sv[c * {CHUNK} + cg + {8 * w}]"]
            for ri in (0, 1):
                L += [f"{ind}        if f{ri} != 0:",
                      f"{ind}            {acc}{ri}_{vc // 8 + w} += mul(w{ri}, x, mode)"]
        L += [f"{ind}    cuda.syncthreads()"]
    return L


def _store(acc, arr, base, n, bucket, scale, ind="    "):
    L = []
    for ri in (0, 1):
        L += [f"{ind}if own{ri}:", f"{ind}    ob_ = {base.format(ri=ri)}"]
        for c in range(bucket // 8):
            L += [f"{ind}    if cg + {8 * c} < {n}:",
                  f"{ind}        {arr}[ob_ + cg + {8 * c}] = narrow({acc}{ri}_{c} * {scale}, {arr})"]
    return L


_ARGS = ("do, q, k, v, lse, dl, {outs}, ma, mb, lens_q, lens_k, B, Hq, G, Sq, Sk, D, Dv, qb, qh, "
         "qi, kb, kh, kj, vb, vh, vj, ob, oh, oi, mkind, m0, m1, m2, m3, has_lq, has_lk, causal, "
         "scale, mode, thr, kscale, off_lo, off_hi, key_lo, key_hi")
_SHARED = [f"    sa = cuda.shared.array({T * CHUNK}, F32)",
           f"    sb = cuda.shared.array({T * (CHUNK + 1)}, F32)",
           f"    sv = cuda.shared.array({T * CHUNK}, F32)",
           f"    sp = cuda.shared.array({T * (T + 1)}, F32)",
           f"    sd = cuda.shared.array({T * (T + 1)}, F32)",
           f"    sf = cuda.shared.array({T * (T + 1)}, I32)",
           "    t = cuda.threadIdx.x", "    cg = t % 8", "    rg = t // 8",
           f"    ar0 = 2 * rg * {CHUNK}"]


def dq_source(dtype, DB):
    name = f"attention_dq_tiled_{dtype}_d{DB}"
    L = [f"def {name}({_ARGS.format(outs='dq')}):"] + _SHARED + [
         f"    tiles = (Sq + {T - 1}) // {T}",
         "    bh = cuda.blockIdx.x // tiles", f"    q0 = (cuda.blockIdx.x % tiles) * {T}",
         "    b = bh // Hq", "    h = bh % Hq", "    hk = h // G",
         "    nb = live_keys(lens_k, has_lk, b, min(q0 + 31, Sq - 1), Sk, causal)"]
    for ri in (0, 1):
        L += [f"    i{ri} = q0 + 2 * rg + {ri}", f"    own{ri} = i{ri} < Sq",
              f"    ls{ri} = lse[bh * Sq + i{ri}] if own{ri} else NEG",
              f"    dl{ri} = dl[bh * Sq + i{ri}] if own{ri} else F32(0)",
              f"    n{ri} = live_keys(lens_k, has_lk, b, i{ri}, Sk, causal) if own{ri} and "
              f"(has_lq == 0 or i{ri} < lens_q[b]) and ls{ri} > NEG else 0",
              f"    mo{ri} = b * m0 + h * m1 + i{ri} * m2",
              f"    e{ri} = np.uint64(bh * Sq + i{ri}) * np.uint64(Sk)"]
    L += [f"    g{ri}_{c} = F32(0)" for ri in (0, 1) for c in range(DB // 8)]
    L += [f"    for kt in range((nb + {T - 1}) // {T}):", f"        j0 = kt * {T}"]
    L += _dot_tile("s", "q", "b * qb + h * qh + q0 * qi", "qi", "q0 + rr < Sq", "k",
                   "b * kb + hk * kh + j0 * kj", "kj", "j0 + rr < Sk", "D", " " * 8)
    L += _dot_tile("u", "do", "b * ob + h * oh + q0 * oi", "oi", "q0 + rr < Sq", "v",
                   "b * vb + hk * vh + j0 * vj", "vj", "j0 + rr < Sk", "Dv", " " * 8)
    for ri in (0, 1):
        for u in range(4):
            at = f"(2 * rg + {ri}) * {T + 1} + cg + {8 * u}"
            L += [f"        j = j0 + cg + {8 * u}", "        live = 0", "        ds = F32(0)",
                  f"        if j < n{ri}:",
                  f"            ok, add = bias(ma, mb, mkind, mo{ri} + j * m3)",
                  "            if ok:",
                  "                live = 1",
                  f"                p = math.exp(scale * s{ri}_{u} + add - ls{ri})",
                  f"                kp = keep(e{ri} + np.uint64(j), thr, kscale, off_lo, off_hi, "
                  "key_lo, key_hi)",
                  f"                ds = F32(p * (u{ri}_{u} * kp - dl{ri}))",
                  f"        sd[{at}] = ds", f"        sf[{at}] = live"]
    L += ["        cuda.syncthreads()"]
    L += _accumulate("g", "sd", "k", "b * kb + hk * kh + j0 * kj", "kj", "j0 + rr < Sk", "D",
                     DB, " " * 8)
    L += _store("g", "dq", "b * qb + h * qh + i{ri} * qi", "D", DB, "scale")
    return name, "\n".join(L) + "\n"


def dkv_source(dtype, DB):
    name = f"attention_dkv_tiled_{dtype}_d{DB}"
    L = [f"def {name}({_ARGS.format(outs='dk, dv')}):"] + _SHARED + [
         f"    sl = cuda.shared.array({2 * T}, F32)",
         "    Hk = Hq // G",
         f"    tiles = (Sk + {T - 1}) // {T}",
         "    bh = cuda.blockIdx.x // tiles", f"    j0 = (cuda.blockIdx.x % tiles) * {T}",
         "    b = bh // Hk", "    hk = bh % Hk",
         "    rows = Sq if has_lq == 0 else min(Sq, max(lens_q[b], 0))",
         f"    i_start = (j0 // {T}) * {T} if causal != 0 else 0"]
    for ri in (0, 1):
        L += [f"    kr{ri} = j0 + 2 * rg + {ri}  # this thread's keys", f"    own{ri} = kr{ri} < Sk",
              f"    key{ri} = own{ri} and (has_lk == 0 or kr{ri} < lens_k[b])"]
    L += [f"    g{ri}_{c} = F32(0)" for ri in (0, 1) for c in range(DB // 8)]  # dK
    L += [f"    h{ri}_{c} = F32(0)" for ri in (0, 1) for c in range(DB // 8)]  # dV
    L += ["    for h in range(hk * G, hk * G + G):",
          f"        for i0 in range(i_start, rows, {T}):",
          "            row0 = (b * Hq + h) * Sq + i0",
          f"            if t < {T}:",
          "                sl[t] = lse[row0 + t] if i0 + t < Sq else NEG",
          f"                sl[{T} + t] = dl[row0 + t] if i0 + t < Sq else F32(0)",
          "            cuda.syncthreads()"]
    ind = " " * 12
    L += _dot_tile("s", "k", "b * kb + hk * kh + j0 * kj", "kj", "j0 + rr < Sk", "q",
                   "b * qb + h * qh + i0 * qi", "qi", "i0 + rr < Sq", "D", ind)
    L += _dot_tile("u", "v", "b * vb + hk * vh + j0 * vj", "vj", "j0 + rr < Sk", "do",
                   "b * ob + h * oh + i0 * oi", "oi", "i0 + rr < Sq", "Dv", ind)
    for ri in (0, 1):
        for u in range(4):
            at = f"(2 * rg + {ri}) * {T + 1} + cg + {8 * u}"
            L += [f"{ind}i = i0 + cg + {8 * u}", f"{ind}ls = sl[cg + {8 * u}]",
                  f"{ind}live = 0", f"{ind}pd = F32(0)", f"{ind}ds = F32(0)",
                  f"{ind}if key{ri} and i < rows and (causal == 0 or i >= kr{ri}) and ls > NEG:",
                  f"{ind}    ok, add = bias(ma, mb, mkind, b * m0 + h * m1 + i * m2 + kr{ri} * m3)",
                  f"{ind}    if ok:",
                  f"{ind}        live = 1",
                  f"{ind}        p = math.exp(scale * s{ri}_{u} + add - ls)",
                  f"{ind}        kp = keep(np.uint64(row0 + cg + {8 * u}) * np.uint64(Sk) + "
                  f"np.uint64(kr{ri}), thr, kscale, off_lo, off_hi, key_lo, key_hi)",
                  f"{ind}        pd = widen(narrow(F32(p * kp), dv))",
                  f"{ind}        ds = F32(p * (u{ri}_{u} * kp - sl[{T} + cg + {8 * u}]))",
                  f"{ind}sp[{at}] = pd", f"{ind}sd[{at}] = ds", f"{ind}sf[{at}] = live"]
    L += [f"{ind}cuda.syncthreads()"]
    L += _accumulate("h", "sp", "do", "b * ob + h * oh + i0 * oi", "oi", "i0 + rr < Sq", "Dv",
                     DB, ind)
    L += _accumulate("g", "sd", "q", "b * qb + h * qh + i0 * qi", "qi", "i0 + rr < Sq", "D",
                     DB, ind)
    L += _store("g", "dk", "b * kb + hk * kh + kr{ri} * kj", "D", DB, "scale")
    L += _store("h", "dv", "b * vb + hk * vh + kr{ri} * vj", "Dv", DB, "F32(1)")
    return name, "\n".join(L) + "\n"


BUCKETS = (64, 128)


def _build():
    table = {}
    mul, keep, live_keys, bias, _ = simt._device_functions(float32)
    ns = dict(cuda=cuda, math=math, np=np, F32=float32, I32=int32, NEG=float32(-np.inf),
              mul=mul, keep=keep, live_keys=live_keys, bias=bias, widen=widen, narrow=narrow)
    for dtype in ("float16", "bfloat16", "float32"):
        a = f"{array_type(dtype)}[::1]"
        tail = f"{a}, uint8[::1], " + simt.geometry_types("float32") + ")"
        sigs = {"dq": f"void({a}, {a}, {a}, {a}, float32[::1], float32[::1], {a}, " + tail,
                "dkv": f"void({a}, {a}, {a}, {a}, float32[::1], float32[::1], {a}, {a}, " + tail}
        for which, gen in (("dq", dq_source), ("dkv", dkv_source)):
            for DB in BUCKETS:
                name, src = gen(dtype, DB)
                fn = compile_source(name, src, dict(ns), about={
                    "config": f"{dtype}, head dims <= {DB}: {T} x {T} tiles, {THREADS} threads",
                    "why": "tiled_bwd.py"})
                table[which, dtype, DB] = (Kernel(fn, [sigs[which]]), sigs[which])
    return table


KERNELS = _build()


def usable(dtype, D, Dv):
    """Whether the tiled backward runs a call (tiled.ON; float32 compute, D, Dv <= 128)."""
    from . import tiled
    return tiled.ON and dtype in ("float16", "bfloat16", "float32") and max(D, Dv) <= MAX_DIM


def backward(do, q, k, v, lse, dl, dq, dk, dv, ma, mb, lq, lk, geo, stream):
    """dq a block a 32-query tile, then dk and dv a block a 32-key tile (dl: delta)."""
    B, Hq, G, Sq, Sk, D, Dv = geo[:7]
    DB = next(d for d in BUCKETS if max(D, Dv) <= d)
    dtype = dtype_name(q)
    kern, sig = KERNELS["dq", dtype, DB]
    kern.launch(sig, B * Hq * -(-Sq // T), THREADS, stream, do, q, k, v, lse, dl, dq, ma, mb,
                lq, lk, *geo)
    kern, sig = KERNELS["dkv", dtype, DB]
    kern.launch(sig, B * (Hq // G) * -(-Sk // T), THREADS, stream, do, q, k, v, lse, dl, dk,
                dv, ma, mb, lq, lk, *geo)

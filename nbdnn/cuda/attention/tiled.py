"""Attention's forward on the CUDA cores in tiles (float32 compute: float16 / bfloat16 /
float32 storage, every math mode): simt.py's features and answers, a block a (batch,
head, 32-query tile) instead of a thread a row, so that q, k and v are read once a tile
from shared memory rather than once a row from L1.

Block: 128 threads; thread t owns query rows 2 (t // 8) + {0, 1} of the tile and keys
(t % 8) + 8 u, u < 4, of each 32-key tile: a 2 x 4 register tile of scores, its rows
reduced over the 8 threads that share them (xor shuffles 1, 2, 4). Two passes over the
live key tiles, as simt.py (the same p' = p rounded to o's dtype before p v):

    pass 1   S = scale Q K^T + bias; each row's running max m and sum l    (D-chunks of 64)
    pass 2   S again; P = exp(S - lse) (dropped, rounded) -> shared memory;
             O (2 rows x Dv / 8 columns a thread, registers) += P V          (Dv-chunks of 64)

Shared memory (float32): Q chunk 32 x 64, K chunk 32 x 65 (a padded row: the 8 threads of
a row read 4 keys each without bank conflicts), V chunk 32 x 64, P 32 x 33 = 29 KB. Per
key tile a thread's S costs 8 D multiply-adds for 6 D shared loads (each pass), its P V
8 Dv for 5 Dv: about 2.8 flops a load (simt.py: 2 flops a global load, 3 dot products a
key).

A removed pair (mask, causal, lengths) takes no part: its score is never used, and in
tiles that hold one P V takes a product only where P is live (removed P is stored as
-1, a value no live P has), so a NaN in a v row met only through removed pairs stays out.
"""
import math

import numpy as np
from numba import cuda, float32

from ..runtime.arrays import dtype_name
from ..runtime.codegen import compile_source
from ..runtime.intrinsics import array_type, narrow, widen
from ..runtime.launch import Kernel
from ..runtime.simulator import SIMULATOR
from . import simt

ON = False  # run AR: its GPU tests pass (forward and backward, every feature), memcheck
# and racecheck clean; 1.23 TFLOP/s float32 at D 64 S 1k-2k, 4.4x the exact forward but
# 0.04x PyTorch's 34: off until a design near PyTorch's is worth switching the paths
BQ, BK, CHUNK, THREADS = 32, 32, 64, 128
DV_BUCKETS = (64, 128, 256)  # a kernel per bucket of Dv: its accumulators are registers


def _acc(ri, c):
    return f"o{ri}_{c}"


def _scores(ind):
    """S's 2 x 4 register tile of key tile j0 over D in chunks (both passes)."""
    L = [f"{ind}s0_0 = s0_1 = s0_2 = s0_3 = s1_0 = s1_1 = s1_2 = s1_3 = F32(0)",
         f"{ind}for dc in range(0, D, {CHUNK}):",
         f"{ind}    for e in range(t, {BQ * CHUNK}, {THREADS}):",
         f"{ind}        rr = e // {CHUNK}",
         f"{ind}        d = dc + e % {CHUNK}",
         f"{ind}        sq[e] = widen(q[qbase + rr * qi + d]) if q0 + rr < Sq and d < D else F32(0)",
         f"{ind}        sk[rr * {CHUNK + 1} + e % {CHUNK}] = widen(k[kbase + (j0 + rr) * kj + d]) "
         f"if j0 + rr < Sk and d < D else F32(0)",
         f"{ind}    cuda.syncthreads()",
         f"{ind}    for d in range(min({CHUNK}, D - dc)):",
         f"{ind}        a0 = sq[qr0 + d]",
         f"{ind}        a1 = sq[qr0 + {CHUNK} + d]"]
    for u in range(4):
        L += [f"{ind}        b{u} = sk[(cg + {8 * u}) * {CHUNK + 1} + d]"]
    for ri in (0, 1):
        for u in range(4):
            L += [f"{ind}        s{ri}_{u} += mul(a{ri}, b{u}, mode)"]
    return L + [f"{ind}    cuda.syncthreads()"]


def _reduce(var, kind, ind, warp):
    """var over the 8 threads of a row group: shuffles on a GPU, shared memory in the
    simulator (which has none); kind "max" (NaN wins) or "sum"."""
    def comb(a, b):
        return f"{b} if {b} > {a} or {b} != {b} else {a}" if kind == "max" else f"{a} + {b}"
    if warp:
        return sum(([f"{ind}other = cuda.shfl_xor_sync(FULL, {var}, {sh})",
                     f"{ind}{var} = {comb(var, 'other')}"] for sh in (1, 2, 4)), [])
    return [f"{ind}red[t] = {var}", f"{ind}cuda.syncthreads()", f"{ind}{var} = red[t - cg]",
            f"{ind}for x in range(1, 8):", f"{ind}    other = red[t - cg + x]",
            f"{ind}    {var} = {comb(var, 'other')}", f"{ind}cuda.syncthreads()"]


def _live(ind):
    """x{ri}_{u}: the scaled, biased score of (row ri, key u), z{ri}_{u}: whether it is
    live (row live, key before the row's live count, the mask keeps it)."""
    L = []
    for ri in (0, 1):
        for u in range(4):
            L += [f"{ind}j = j0 + cg + {8 * u}",
                  f"{ind}z{ri}_{u} = False",
                  f"{ind}x{ri}_{u} = NEG",
                  f"{ind}if j < n{ri}:",
                  f"{ind}    ok, add = bias(ma, mb, mkind, mo{ri} + j * m3)",
                  f"{ind}    if ok:",
                  f"{ind}        z{ri}_{u} = True",
                  f"{ind}        x{ri}_{u} = scale * s{ri}_{u} + add"]
    return L


def source(dtype, DVB, warp=not SIMULATOR):
    """(name, source) of the tiled forward for storage dtype and Dv <= DVB; warp: the
    rows' reductions by shuffles (else through shared memory: the simulator)."""
    name = f"attention_fwd_tiled_{dtype}_v{DVB}"
    args = ("q, k, v, o, lse, ma, mb, lens_q, lens_k, B, Hq, G, Sq, Sk, D, Dv, qb, qh, qi, "
            "kb, kh, kj, vb, vh, vj, ob, oh, oi, mkind, m0, m1, m2, m3, has_lq, has_lk, causal, "
            "scale, mode, thr, kscale, off_lo, off_hi, key_lo, key_hi")
    L = [f"def {name}({args}):",
         f"    sq = cuda.shared.array({BQ * CHUNK}, F32)",
         f"    sk = cuda.shared.array({BK * (CHUNK + 1)}, F32)",
         f"    sv = cuda.shared.array({BK * CHUNK}, F32)",
         f"    sp = cuda.shared.array({BQ * (BK + 1)}, F32)"] + \
        ([] if warp else [f"    red = cuda.shared.array({THREADS}, F32)"]) + [
         "    t = cuda.threadIdx.x",
         "    cg = t % 8",
         "    rg = t // 8",
         f"    tiles = (Sq + {BQ - 1}) // {BQ}",
         "    bh = cuda.blockIdx.x // tiles",
         f"    q0 = (cuda.blockIdx.x % tiles) * {BQ}",
         "    b = bh // Hq", "    h = bh % Hq", "    hk = h // G",
         "    qbase = b * qb + h * qh + q0 * qi",
         "    kbase = b * kb + hk * kh",
         "    vbase = b * vb + hk * vh",
         f"    qr0 = 2 * rg * {CHUNK}  # this thread's rows in sq",
         # the block's key range: the live keys of its last row (lengths and causal
         # shrink it monotonically); each row's own count n0 / n1 (0: a dead row)
         f"    nb = live_keys(lens_k, has_lk, b, min(q0 + {BQ - 1}, Sq - 1), Sk, causal)"]
    for ri in (0, 1):
        L += [f"    i{ri} = q0 + 2 * rg + {ri}",
              f"    n{ri} = live_keys(lens_k, has_lk, b, i{ri}, Sk, causal) if i{ri} < Sq and "
              f"(has_lq == 0 or i{ri} < lens_q[b]) else 0",
              f"    mo{ri} = b * m0 + h * m1 + i{ri} * m2",
              f"    m_{ri} = NEG", f"    l_{ri} = F32(0)"]
    L += [f"    for kt in range((nb + {BK - 1}) // {BK}):", f"        j0 = kt * {BK}"]
    L += _scores(" " * 8) + _live(" " * 8)
    for ri in (0, 1):  # the row's tile max (NaN wins), then its running max and sum
        L += [f"        tm = x{ri}_0"] + [
              f"        tm = x{ri}_{u} if x{ri}_{u} > tm or x{ri}_{u} != x{ri}_{u} else tm"
              for u in (1, 2, 3)]
        L += _reduce("tm", "max", " " * 8, warp)
        L += [f"        mn = tm if tm > m_{ri} or tm != tm else m_{ri}",
              "        mr = F32(0) if mn == NEG else mn  # (every lane reduces: no branch)",
              "        ts = " + " + ".join(f"(math.exp(x{ri}_{u} - mr) if z{ri}_{u} else F32(0))"
                                         for u in range(4))]
        L += _reduce("ts", "sum", " " * 8, warp) + [
              "        if mn != NEG:",
              f"            l_{ri} = (l_{ri} * math.exp(m_{ri} - mn) if m_{ri} != NEG else F32(0)) + ts",
              f"            m_{ri} = mn"]
    for ri in (0, 1):
        L += [f"    ls{ri} = m_{ri} + math.log(l_{ri}) if m_{ri} != NEG else NEG",
              f"    e{ri} = np.uint64((b * Hq + h) * Sq + i{ri}) * np.uint64(Sk)  # (dropout's "
              "element of key 0)"]
    L += [f"    {_acc(ri, c)} = F32(0)" for ri in (0, 1) for c in range(DVB // 8)]
    L += [f"    for kt in range((nb + {BK - 1}) // {BK}):", f"        j0 = kt * {BK}"]
    L += _scores(" " * 8) + _live(" " * 8)
    for ri in (0, 1):
        for u in range(4):
            L += ["        p = F32(-1)  # (a removed pair: no product below)",
                  f"        if z{ri}_{u}:",
                  f"            p = F32(math.exp(x{ri}_{u} - ls{ri}) * keep(e{ri} + np.uint64(j0 + cg "
                  f"+ {8 * u}), thr, kscale, off_lo, off_hi, key_lo, key_hi))",
                  "            p = widen(narrow(p, o))  # (p' in o's dtype, as the reference)",
                  f"        sp[(2 * rg + {ri}) * {BK + 1} + cg + {8 * u}] = p"]
    for vc in range(0, DVB, CHUNK):  # (Dv's chunks written out: accumulators by name)
        L += [f"        if {vc} < Dv:",
              f"            for e in range(t, {BK * CHUNK}, {THREADS}):",
              f"                d = {vc} + e % {CHUNK}",
              f"                sv[e] = widen(v[vbase + (j0 + e // {CHUNK}) * vj + d]) "
              f"if j0 + e // {CHUNK} < Sk and d < Dv else F32(0)",
              "            cuda.syncthreads()",
              f"            for c in range({BK}):",
              f"                p0 = sp[2 * rg * {BK + 1} + c]",
              f"                p1 = sp[(2 * rg + 1) * {BK + 1} + c]"]
        for w in range(CHUNK // 8):
            col = vc // 8 + w
            L += [f"                vv = sv[c * {CHUNK} + cg + {8 * w}]"]
            for ri in (0, 1):
                L += [f"                if p{ri} != F32(-1):",
                      f"                    {_acc(ri, col)} += mul(p{ri}, vv, mode)"]
        L += ["            cuda.syncthreads()"]
    L += ["        cuda.syncthreads()"]
    for ri in (0, 1):
        L += [f"    if i{ri} < Sq:",
              f"        dead = m_{ri} == NEG",
              f"        oo = b * ob + h * oh + i{ri} * oi",
              "        if cg == 0:",
              f"            lse[(b * Hq + h) * Sq + i{ri}] = ls{ri}"]
        for c in range(DVB // 8):
            L += [f"        if cg + {8 * c} < Dv:",
                  f"            o[oo + cg + {8 * c}] = narrow(F32(0) if dead else {_acc(ri, c)}, o)"]
    return name, "\n".join(L) + "\n"


def _build():
    table = {}
    mul, keep, live_keys, bias, _ = simt._device_functions(float32)
    for dtype in ("float16", "bfloat16", "float32"):
        a = f"{array_type(dtype)}[::1]"
        sig = f"void({a}, {a}, {a}, {a}, float32[::1], {a}, uint8[::1], " + \
            simt.geometry_types("float32") + ")"
        for DVB in DV_BUCKETS:
            name, src = source(dtype, DVB)
            ns = dict(cuda=cuda, math=math, np=np, F32=float32, NEG=float32(-np.inf),
                      FULL=0xFFFFFFFF, mul=mul, keep=keep, live_keys=live_keys, bias=bias,
                      widen=widen, narrow=narrow)
            fn = compile_source(name, src, ns, about={
                "config": f"{dtype}, Dv <= {DVB}: {BQ} queries x {BK} keys a tile, {THREADS} "
                          "threads, 2 x 4 scores and 2 x Dv/8 outputs a thread",
                "why": "tiled.py"})
            table[dtype, DVB] = (Kernel(fn, [sig]), sig)
    return table


KERNELS = _build()


def usable(dtype, Dv):
    """Whether the tiled forward runs a call (ON; float32 compute)."""
    return ON and dtype in ("float16", "bfloat16", "float32") and Dv <= DV_BUCKETS[-1]


def forward(q, k, v, o, lse, ma, mb, lq, lk, geo, stream):
    """Launch the tiled forward: a block a (batch, head, 32-query tile)."""
    B, Hq, Sq, Dv = geo[0], geo[1], geo[3], geo[6]
    kern, sig = KERNELS[dtype_name(q), next(d for d in DV_BUCKETS if Dv <= d)]
    kern.launch(sig, B * Hq * -(-Sq // BQ), THREADS, stream, q, k, v, o, lse, ma, mb, lq, lk,
                *geo)

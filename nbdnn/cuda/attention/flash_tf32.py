"""float32 attention's forward fused on the tensor cores in the TF32 math modes: mma.sync
m16n8k8 (sm_80 and later), "tf32" one product a term, "3xtf32" three (hi*lo, lo*hi,
hi*hi: float32-level accuracy), FlashAttention-2's online softmax between S = QK^T and
O += PV, no score matrix in memory. PyTorch's float32 SDPA (its memory-efficient CUTLASS
kernel) is 3xTF32 mma.sync the same way: this is the kernel the float32 goal needs
(gemm.py's composed path materialises S: 0.3-0.4x PyTorch).

Block: 128 threads = 4 warps, a 64-query tile (16 rows a warp), over key tiles of BK 32.
Fragments (mma.py's tf32 layout; g = lane >> 2, c = lane & 3):

    S (16 x 8 a key n-tile)  A = Q rows 16w + g (+8), dims 8kk + c (+4), from shared
                             B = K^T: b0 = K[8n + g][8kk + c], b1 = K[8n + g][8kk + c + 4]
                             C: s_n0, s_n1 = S[g][8n + 2c, +1]; s_n2, s_n3 = row g + 8
    O += P V                 A = P straight from S's C fragment, its k order permuted:
                             a0, a1, a2, a3 = s_n0, s_n2, s_n1, s_n3, so k index c is key
                             2c and k index c + 4 is key 2c + 1 (no shuffles); B rows follow:
                             b0 = V[8n + 2c][8dn + g], b1 = V[8n + 2c + 1][8dn + g]

Shared memory (dynamic, float32, rows padded to PD = D + 4 floats, PD = 4 mod 32: every
fragment load above hits 32 distinct banks): Q's 64 rows, then K's and V's 32 rows, each
as a TF32 head (and, 3xtf32, tail: x = hi + lo, both rounded to nearest even as the CPU
reference's split). D 64: 70 KB (3xtf32), D 128: 135 KB.

Per key tile and warp: 4 x D/8 S products and 4 x D/8 O products, each 16 x 8 x 8 (P of
them): 2 x 16 x 32 x D x 2 x P flops from 2 x (16 + 32) x D x P shared loads. Variant 1
(correct first): plain loads after the tile's first barrier (no cp.async), one barrier
pair a tile; blocks of other query tiles on the SM hide the loads' latency (D 64: 70 KB
of shared memory, 3 blocks an SM). Issuing the next tile's loads into registers before
this tile's products was tried and dropped: ptxas gave it 255 registers and spilled
432 B at D 64 (3.9 KB at D 128), LLVM hoisting the loop-invariant part of each
prefetched element's address out of the key loop.

Features: logit caps, ALiBi, causal (top-left, PyTorch's, or bottom-right) and sliding windows
about its diagonal (geometry.py's band: the key tiles before and past a block's bands
are skipped), grouped-query heads,
seq_lens_q / seq_lens_k (keys past a length are zero-filled, never read), both layouts
(strides), masks (simt.py's bias, the additive term scaled into exp2's units) and
dropout (simt.py's keep: nbdnn's Philox stream; l sums p, P V takes p keep / (1 - p)),
each compiled in only for a call that has it; D = Dv a multiple of 8 up to 128. A
removed pair's p is 0 in P V (a NaN in a removed key's v row would reach the row: as on
every tensor-core path); keys past Sk or the length read as 0.

ptxas (sm_90): 72 (D 8) to 168 (D 128, 3xtf32, 32 keys a tile) registers, no spills; 127
at D 64 3xtf32, 153 with a mask and dropout compiled in (192 at D 128); 128 at D 128 with
16 keys a tile (KEY_TILES).
Measured (H200): its GPU tests pass, memcheck and racecheck clean, SASS 192 HMMA, no LDL/STL.
Float32 S 4k, TFLOP/s (x PyTorch's float32 SDPA, 3xTF32 too): 3xtf32 D 64 21.6 (0.61x),
gemm.py's 16.9 (0.48x), causal 19.8 (0.60x) against 9.7; tf32 D 64 33.3 (0.95x), D 128
29.9 (0.65x). 3xtf32 D 128 stays on gemm.py (MAX_D_3X). What it lacks against PyTorch's:
an asynchronous copy pipeline (K and V are loaded, split and stored between two barriers
each tile, their latency hidden only by the SM's other 2-4 blocks).
"""
import math

import numpy as np
from llvmlite import ir
from numba import cuda, types
from numba.cuda import libdevice
from numba.cuda.extending import intrinsic

from ..runtime.launch.codegen import compile_source
from ..runtime.device_code.intrinsics import round_tf32
from ..runtime.launch.kernel import Kernel
from ..runtime.simulator import SIMULATOR
from ..tensorcore.asm import element_pointer, instruction
from ..tensorcore.mma import mma_tf32
from . import flash
from .simt import attention_device_functions

_, _keep, _, _, _bias, *_ = attention_device_functions(types.float32)

Q_RAW = True  # (3xtf32) Q kept in shared memory as float32 and split into head and tail at
# each fragment load, K and V still split once a tile: a third less shared memory (D 128:
# 135 -> 101 KB, 2 blocks an SM rather than 1) for 3 ALU operations a Q value a tile. At
# S 4k: D 64 20.8 -> 21.6 TFLOP/s, D 128 9.8 -> 15.9
KEY_TILES = {}  # (D, P) -> keys a tile, where not config()'s choice (perf/suites/
# attention.py --set sweeps them). 16 keys: half K's and V's shared memory, ptxas 128 registers
# at D 128 (was 154-168). S 4k: tf32 D 64 30.0 -> 33.3, D 128 25.5 -> 29.9; 3xtf32
# D 128 9.8 -> 14.2 (15.9 with Q raw either way), D 64 20.8 -> 20.8 (18.5 with Q raw)
PROMOTE_3X = True  # (3xtf32) each key tile's P V from a zero accumulator, added into O on
# the CUDA cores: the tensor cores' accumulation truncates toward zero at every mma, and
# O's chain runs the length of the keys, 3 x Sk / 8 mmas (perf/RESULTS.md, "3xtf32's lost
# accuracy"); a tile's chain is 3 x BK / 8. Costs 4 registers and D / 2 fadds a thread a tile
MAX_D_3X = 64  # 3xtf32 past this head dim goes to gemm.py where it can: D 128 S 4k 31.4
# TFLOP/s there against 15.9 here; here still for calls gemm.py does not take
BQ, BK, THREADS = 64, 32, 128
MODES = {"tf32": 1, "3xtf32": 3}  # products a term
SIG = ("void(float32[::1], float32[::1], float32[::1], float32[::1], float32[::1], "
       "int64[::1], int64[::1], " + ", ".join(["int64"] * 21) + ", float32, "
       "float32[::1], uint8[::1], int64, int64, int64, int64, int64, "  # the mask
       "uint64, float32, uint64, uint64, uint64, uint64, "  # the dropout (simt.py's keep)
       "float32, int64, int64, float32[::1])")  # the logit cap; ALiBi's code, stride, slopes

bits = instruction("mov.b32 $0, $1;", types.uint32, types.float32,
                   "a float32's bits (a value already rounded to TF32) as mma_tf32 takes them")
as_f32 = instruction("mov.b32 $0, $1;", types.float32, types.uint32, "bits as a float32")


@intrinsic
def lds_bits(typingctx, arr, idx):
    """The bits of float32 arr[idx], read with no wraparound: numba's indexing selects
    idx + len for a negative idx, which keeps LLVM from folding an unrolled load's
    constant into its address, so every load held its own 64-bit address register
    across the key loop (a first version: 255 registers, 3.7 KB spilled at D 64)."""
    def codegen(context, builder, sig, args):
        p = element_pointer(context, builder, sig.args[0], args[0], args[1])
        return builder.load(builder.bitcast(p, ir.PointerType(ir.IntType(32))))
    return types.uint32(arr, types.int64), codegen


def usable(dtype, math_mode, D, Dv, gemm_takes_it=False):
    """float32 in a TF32 mode, D = Dv a multiple of 8 up to 128; 3xtf32 past MAX_D_3X
    only where gemm.py does not take the call (gemm_takes_it)."""
    return not SIMULATOR and dtype == "float32" and math_mode in MODES and D == Dv and D % 8 == 0 and \
        8 <= D <= 128 and not (math_mode == "3xtf32" and D > MAX_D_3X and gemm_takes_it)


def config(D, P):
    """(keys a tile, Q raw): the module's knobs for head dim D and P products a term."""
    return KEY_TILES.get((D, P), 16 if P == 1 and D >= 64 else BK), Q_RAW and P == 3


def shared_bytes(D, P):
    bk, q_raw = config(D, P)
    parts = 2 if P == 3 else 1
    return (BQ * (1 if q_raw else parts) + 2 * bk * parts) * (D + 4) * 4


def source(D, P, masked=False, dropped=False, capped=False, alibi=False):
    """(name, source) of the kernel for head dim D and P products a term (1 or 3), with
    the mask's bias (masked), the dropout's keep factors (dropped), the logit cap
    (capped: flash.capped in exp2's units, cap log2(e) tanh(s scale / cap)) and ALiBi
    (-slope log2(e) |i + d - j| after it) compiled in or out."""
    BK, q_raw = config(D, P)
    NT = BK // 8  # key n-tiles of a tile
    PD, DT = D + 4, D // 8
    parts = ("h", "l") if P == 3 else ("h",)
    base = {}  # shared offsets: Q, K, V heads then tails (Q raw: Q's values, no tail)
    at = 0
    for part in parts:
        for name, rows in (("Q", BQ), ("K", BK), ("V", BK)):
            if not (q_raw and name + part == "Ql"):
                base[name + part] = at
                at += rows * PD
    name = f"attention_flash_tf32_d{D}_{'3x' if P == 3 else '1x'}" \
        f"{'_m' if masked else ''}{'_d' if dropped else ''}{'_c' if capped else ''}" \
        f"{'_l' if alibi else ''}" \
        f"{f'_k{BK}' if BK != 32 else ''}{'_qr' if q_raw else ''}" \
        f"{'_pr' if P == 3 and PROMOTE_3X else ''}"

    def score(n, e):  # accumulator s{n}_{e} as its score in exp2's units (key j)
        s = f"capped(s{n}_{e}, cc2, ccs, ccs2)" if capped else f"s{n}_{e} * scale2"
        r = "a" if e < 2 else "b"
        return f"({s} + nsl * F32(abs(ai_{r} - j)))" if alibi else s

    def split(val, dst, idx):  # a value into its TF32 head (and tail) in shared memory
        if q_raw and dst == "Q":
            return [f"sm[{base['Qh']} + {idx}] = {val}"]
        out = [f"hi = round_tf32({val})", f"sm[{base[dst + 'h']} + {idx}] = hi"]
        if P == 3:
            out.append(f"sm[{base[dst + 'l']} + {idx}] = round_tf32({val} - hi)")
        return out

    # the P products of a term, small ones first: (A's part, B's part)
    terms = [("l", "h"), ("h", "l"), ("h", "h")] if P == 3 else [("h", "h")]

    def products(acc, a, b, at, tensor, off, step):
        """Fragment b of K or V (each part's two registers: shared offsets off and off +
        step past thread base `at`), then the P products acc (4 accumulators) += a b."""
        out = [f"        {b}{part} = (lds_bits(sm, {at} + {base[tensor + part] + off}), "
               f"lds_bits(sm, {at} + {base[tensor + part] + off + step}))" for part in parts]
        c4 = ", ".join(f"{acc}_{e}" for e in range(4))
        return out + [f"        {c4} = mma_tf32({a}{pa}, {b}{pb}, ({c4}))" for pa, pb in terms]

    L = [f"def {name}(q, k, v, o, lse, lens_q, lens_k, Hq, G, Sq, Sk, qb, qh, qi, kb, kh, kj, "
         "vb, vh, vj, ob, oh, oi, has_lq, has_lk, causal, win_lo, win_hi, scale2, ma, mb, mkind, "
         "m0, m1, m2, m3, thr, kscale, off_lo, off_hi, key_lo, key_hi, softcap, alibi, "
         "slope_b, slopes):",
         "    sm = cuda.shared.array(0, F32)",
         "    t = cuda.threadIdx.x", "    lane = t % 32", "    w = t // 32",
         "    g = lane // 4", "    c = lane % 4",
         f"    nqt = (Sq + {BQ - 1}) // {BQ}", "    bh = cuda.blockIdx.x // nqt",
         f"    q0 = (cuda.blockIdx.x % nqt) * {BQ}", "    b = bh // Hq", "    h = bh % Hq",
         "    hk = h // G",
         "    nq = min(max(lens_q[b], 0), Sq) if has_lq != 0 else Sq",
         "    nk = min(max(lens_k[b], 0), Sk) if has_lk != 0 else Sk",
         f"    for x in range(t, {BQ * D}, {THREADS}):",  # Q's tile, split, rows past nq 0
         f"        r = x // {D}", "        val = F32(0)",
         "        if q0 + r < nq:",
         f"            val = q[b * qb + h * qh + (q0 + r) * qi + x % {D}]"]
    L += ["        " + s for s in split("val", "Q", f"r * {PD} + x % {D}")]
    L += ["    ra = q0 + 16 * w + g", "    rb = ra + 8",
          f"    qbase = (16 * w + g) * {PD} + c  # (each fragment load: a base + a constant)",
          f"    kbase = g * {PD} + c", f"    vbase = 2 * c * {PD} + g",
          "    dg = nk - nq if causal == 2 else 0  # (bottom-right: the diagonal's offset)",
          "    lim_a = (max(min(nk, ra + 1 + dg + win_hi), 0) if causal != 0 else nk) "
          "if ra < nq else 0",
          "    lim_b = (max(min(nk, rb + 1 + dg + win_hi), 0) if causal != 0 else nk) "
          "if rb < nq else 0",
          "    lo_a = max(ra + dg + win_lo, 0) if causal != 0 else 0  # (the band's first key)",
          "    lo_b = max(rb + dg + win_lo, 0) if causal != 0 else 0",
          "    wd_a = U64(max(lim_a - lo_a, 0))  # (key j is live where U64(j - lo) < wd)",
          "    wd_b = U64(max(lim_b - lo_b, 0))",
          "    cc2 = F32(2) * scale2 / softcap if softcap > 0 else F32(0)  # (capped's "
          "constants)",
          "    ccs = softcap * LOG2E", "    ccs2 = F32(2) * ccs",
          "    nsl = -slopes[b * slope_b + h] * LOG2E if alibi != 0 else F32(0)  # (ALiBi's)",
          "    adg = nk - nq if alibi == 2 else 0", "    ai_a = ra + adg", "    ai_b = rb + adg",
          "    mo_a = b * m0 + h * m1 + ra * m2  # (the mask's rows: its broadcast strides)",
          "    mo_b = mo_a + 8 * m2",
          "    e_a = U64((b * Hq + h) * Sq + ra) * U64(Sk)  # (the dropout's element of key 0)",
          "    e_b = U64((b * Hq + h) * Sq + rb) * U64(Sk)",
          f"    kend = max(min(nk, q0 + {BQ} + dg + win_hi), 0) if causal != 0 else nk",
          "    if q0 >= nq:", "        kend = 0",
          f"    kbeg = max(q0 + dg + win_lo, 0) // {BK} * {BK} if causal != 0 else 0",
          "    m_a = NEG", "    m_b = NEG", "    l_a = F32(0)", "    l_b = F32(0)"]
    L += [f"    o{dn}_{e} = F32(0)" for dn in range(DT) for e in range(4)]
    L += [f"    for kt in range(kbeg, kend, {BK}):",
          "        cuda.syncthreads()  # (the last tile's reads, or Q's stores, done)"]
    # K and V a loop, not unrolled: unrolled, each element's address stays live (127 ->
    # 255+ registers at D 64)
    L += [f"        for x in range(t, {BK * D}, {THREADS}):",
          f"            r = x // {D}", f"            d = x % {D}",
          "            kv = F32(0)", "            vv = F32(0)", "            if kt + r < nk:",
          "                kv = k[b * kb + hk * kh + (kt + r) * kj + d]",
          "                vv = v[b * vb + hk * vh + (kt + r) * vj + d]"]
    L += ["            " + x for x in split("kv", "K", f"r * {PD} + d")]
    L += ["            " + x for x in split("vv", "V", f"r * {PD} + d")]
    L += ["        cuda.syncthreads()"]
    L += [f"        s{n}_{e} = F32(0)" for n in range(NT) for e in range(4)]
    for kk in range(DT):  # S = Q K^T
        offs = (0, 8 * PD, 4, 8 * PD + 4)
        if q_raw:  # Q's fragment split here: head, then tail
            L += [f"        qv{i} = as_f32(lds_bits(sm, qbase + {base['Qh'] + 8 * kk + off}))"
                  for i, off in enumerate(offs)]
            L += [f"        qh{i} = round_tf32(qv{i})" for i in range(4)]
            L += ["        qah = (" + ", ".join(f"bits(qh{i})" for i in range(4)) + ")",
                  "        qal = (" + ", ".join(f"bits(round_tf32(qv{i} - qh{i}))"
                                             for i in range(4)) + ")"]
        for part in parts if not q_raw else ():
            qa = base["Q" + part] + 8 * kk
            L += ["        qa{} = ({})".format(part, ", ".join(
                f"lds_bits(sm, qbase + {qa + off})" for off in offs))]
        for n in range(NT):
            L += products(f"s{n}", "qa", "kb", "kbase", "K", 8 * n * PD + 8 * kk, 4)
    for r, (lo, hi) in (("a", (0, 2)), ("b", (2, 4))):  # online softmax, rows a and b
        L += [f"        top = m_{r}"]
        for n in range(NT):
            for e in range(lo, hi):
                L += [f"        j = kt + {8 * n} + 2 * c + {e - lo}"]
                if masked:  # (the additive term in exp2's units too)
                    L += [f"        if U64(j - lo_{r}) < wd_{r}:",
                          f"            ok, add = bias(ma, mb, mkind, mo_{r} + j * m3)",
                          f"            s{n}_{e} = {score(n, e)} + add * LOG2E if ok else NEG",
                          "        else:", f"            s{n}_{e} = NEG"]
                else:
                    L += [f"        s{n}_{e} = {score(n, e)} if U64(j - lo_{r}) < wd_{r} "
                          "else NEG"]
                L += [f"        top = fmaxf(top, s{n}_{e})"]
        L += ["        top = fmaxf(top, cuda.shfl_xor_sync(FULL, top, 1))",
              "        top = fmaxf(top, cuda.shfl_xor_sync(FULL, top, 2))",
              f"        alpha = ex2(m_{r} - top) if top != NEG else F32(1)",
              f"        m_{r} = top", f"        l_{r} *= alpha"]
        L += [f"        o{dn}_{e} *= alpha" for dn in range(DT) for e in range(lo, hi)]
        for n in range(NT):
            for e in range(lo, hi):
                L += [f"        s{n}_{e} = F32(0) if s{n}_{e} == NEG else ex2(s{n}_{e} - top)",
                      f"        l_{r} += s{n}_{e}"]
                if dropped:  # (l sums p; P V takes p keep / (1 - p))
                    L += [f"        s{n}_{e} *= keep(e_{r} + U64(kt + {8 * n + e - lo}) + "
                          "U64(2 * c), thr, kscale, off_lo, off_hi, key_lo, key_hi)"]
    promoted = P == 3 and PROMOTE_3X
    for n in range(NT):  # O += P V, P's k order permuted (module docstring)
        pa = f"pa{n}" if promoted else "pa"
        L += [f"        pf{x} = round_tf32(s{n}_{e})" for x, e in enumerate((0, 2, 1, 3))]
        if P == 3:
            L += [f"        {pa}l = (" + ", ".join(
                f"bits(round_tf32(s{n}_{e} - pf{x}))" for x, e in enumerate((0, 2, 1, 3))) + ")"]
        L += [f"        {pa}h = (bits(pf0), bits(pf1), bits(pf2), bits(pf3))"]
        for dn in range(DT if not promoted else 0):
            L += products(f"o{dn}", "pa", "vb", "vbase", "V", 8 * n * PD + 8 * dn, PD)
    for dn in range(DT if promoted else 0):  # the tile's P V from zero, added on the CUDA cores
        L += [f"        t_{e} = F32(0)" for e in range(4)]
        for n in range(NT):
            L += products("t", f"pa{n}", "vb", "vbase", "V", 8 * n * PD + 8 * dn, PD)
        L += [f"        o{dn}_{e} += t_{e}" for e in range(4)]
    for r, (lo, hi) in (("a", (0, 2)), ("b", (2, 4))):  # the rows' sums, lse, o
        row = "ra" if r == "a" else "rb"
        L += [f"    l_{r} += cuda.shfl_xor_sync(FULL, l_{r}, 1)",
              f"    l_{r} += cuda.shfl_xor_sync(FULL, l_{r}, 2)",
              f"    if l_{r} > 0:", f"        inv = F32(1) / l_{r}",
              f"        ls = m_{r} * LN2 + math.log(l_{r})",
              f"    elif l_{r} == 0:  # no live key: o = 0, lse = -inf",
              "        inv = F32(0)", "        ls = NEG",
              "    else:  # a NaN score: a NaN row", f"        inv = l_{r}", f"        ls = l_{r}",
              f"    if {row} < Sq:", f"        at = b * ob + h * oh + {row} * oi + 2 * c"]
        L += [f"        o[at + {8 * dn + e - lo}] = o{dn}_{e} * inv"
              for dn in range(DT) for e in range(lo, hi)]
        L += ["        if c == 0:", f"            lse[(b * Hq + h) * Sq + {row}] = ls"]
    return name, "\n".join(L) + "\n"


_KERNELS = {}


def kernel(D, P, masked=False, dropped=False, capped=False, alibi=False):
    """The Kernel for head dim D, P products a term, the mask, dropout, the logit cap and
    ALiBi compiled in or out, built on first use."""
    key = D, P, masked, dropped, capped, alibi, config(D, P), PROMOTE_3X
    if key not in _KERNELS:
        name, src = source(D, P, masked, dropped, capped, alibi)
        fn = compile_source(name, src, dict(
            cuda=cuda, math=math, F32=types.float32, NEG=types.float32(-np.inf),
            LN2=types.float32(math.log(2)), FULL=0xFFFFFFFF, fmaxf=libdevice.fmaxf, ex2=flash.ex2,
            bits=bits, as_f32=as_f32, lds_bits=lds_bits, round_tf32=round_tf32, mma_tf32=mma_tf32,
            U64=np.uint64, LOG2E=types.float32(math.log2(math.e)), bias=_bias, keep=_keep,
            capped=flash.capped),
            about={
            "config": f"D {D}, {BQ} queries x {config(D, P)[0]} keys a tile, 4 warps, "
                      f"mma.sync m16n8k8 tf32, {P} product(s) a term, Q raw {config(D, P)[1]}",
            "traffic": f"a key tile: {2 * config(D, P)[0] * D * 4} B in, "
                       f"{4 * BQ * config(D, P)[0] * D * P} flops",
            "why": "flash_tf32.py"})
        _KERNELS[key] = Kernel(fn, [SIG], shared_bytes=shared_bytes(D, P))
    return _KERNELS[key]


def forward(q, k, v, o, lse, ma, mb, lq, lk, geo, math_mode, stream):
    """Launch over (batch, head, 64-query tile) blocks (geo: the call's
    geometry.Geometry)."""
    B, Hq, G, Sq, Sk, D = geo[:6]
    P = MODES[math_mode]
    kern = kernel(D, P, geo.masked, geo.dropped, geo.softcap > 0, geo.alibi != 0)
    scale2 = float(geo.scale * math.log2(math.e))
    kern.launch(SIG, B * Hq * -(-Sq // BQ), THREADS, stream, q, k, v, o, lse, lq, lk, Hq, G,
                Sq, Sk, *geo.strides, *geo.lengths, geo.causal, geo.win_lo, geo.win_hi, scale2,
                ma, mb, *geo.mask, *geo.dropout, float(geo.softcap), geo.alibi, geo.slope_b,
                geo.slopes, shmem=shared_bytes(D, P))


def ptx_examples():
    """The shipped block shapes (tests/test_ptx.py compiles them; perf/tools/sass_dump.py
    reads their SASS): D 64 3xtf32 (Q raw, 32-key tiles), D 64 and 128 tf32 (16-key
    tiles); the other head dims differ in counts."""
    kernel(64, 3)
    kernel(64, 1)
    kernel(128, 1)


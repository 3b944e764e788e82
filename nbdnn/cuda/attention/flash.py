"""The tensor-core forward of scaled_dot_product_attention (sm_90: wgmma, TMA, mbarrier),
FlashAttention's algorithm on FA3's Hopper machinery; flash_source.py writes the kernel
and draws its tiles.

Variants F1-F3: one block a (batch, head, 128-query tile), a producer warpgroup
streaming K and V by TMA through STAGES stages, two consumer warpgroups of 64 query rows
computing S = QK^T and O += PV on wgmma with the softmax between them in registers; P
never leaves registers (the accumulator's layout is the next product's A operand). Rows
and keys past the tensor are TMA's zeros, masked where they would count; causal tiles
past a query tile's last row (its diagonal: top-left, or bottom-right at Lk - Lq) are
never loaded (nor, with a sliding window, those before its first row's band).

Where it runs (`usable`): float16 / bfloat16 q, k, v with head dims D = Dv = 64 or 128,
any mask (boolean, or additive in q's dtype), logit caps, ALiBi, dropout where
Sk % 4 == 0 (a Philox call's 4 words are 4 adjacent keys: flash_source.py), a positive
scale, Sq > 16 (fewer queries: decode.py), sm_90; everything else (and the simulator)
runs the other variants (attention/__init__.py). A mask, dropout, a cap and ALiBi are
compiled into kernels of their own (flash_source.source's masked, dropped, capped,
alibi), so a call without them pays nothing.
Causal of either alignment and sliding windows (geometry.py's band: a block loads only
the key tiles its rows' bands meet, and masks the tiles its bands cut), grouped-query
heads, seq_lens_q / seq_lens_k and both layouts run here: BHSD tensors are mapped as
(B*H, S, D), BSHD as (B, S, H*D), so neither is transposed.
"""
import math

import numpy as np
from numba import cuda, types
from numba.cuda import libdevice

from ..runtime.memory.arrays import dtype_name, ptr
from ..runtime.device_code.intrinsics import array_type, widen
from ..runtime.launch.codegen import compile_source
from ..runtime.device import sm_count
from ..runtime.launch.kernel import Kernel
from ..runtime.simulator import SIMULATOR
from ..dropout import philox4x32_10_u32
from ..tensorcore.asm import instruction, smem_address
from ..tensorcore.mma import cvt_bf16x2, cvt_f16x2
from ..tensorcore.tensormap import encoded
from ..tensorcore.tiles import SOURCE_NAMES
from ..tensorcore.tma import bar_arrive, bar_sync, fence_proxy_tensormap_acquire, mbarrier_arrive, \
    mbarrier_arrive_expect_tx, mbarrier_init, mbarrier_try_wait_parity, setmaxnreg_dec, \
    setmaxnreg_inc, tma_load_3d
from ..tensorcore.wgmma import wgmma, wgmma_rs
from . import flash_source as fs

# The consumer loop's variant by head dim (flash_source._consumer_tile):
# - F1: each key tile's S = QK^T, its softmax, then its PV, in turn;
# - F2: tile t's softmax runs while tile t-1's PV is on the tensor cores (FA3's
#   intra-warpgroup pipelining);
# - F3: F2, and the two consumer warpgroups issue their products in turns (named
#   barriers), so one's softmax runs under the other's products (FA3's ping-pong).
# Measured (H200, bf16, TFLOP/s at S 512 / 2k / 16k, non-causal): D 64: F1 216 / 333 / 393,
# F2 202 / 312 / 368, F3 231 / 377 / 443; D 128: F1 316 / 478 / 558, F2 293 / 441 / 511,
# F3 307 / 454 / 533 (causal alike). A first F2 (its PV in a branch, P packed while the
# previous PV was in flight) measured 0.7x F1: ptxas serialised its wgmma (C7513).
VARIANT = {64: "F3", 128: "F1"}
# a block an SM looping over the (batch, head, query tile) tiles, its producer loading
# the next tile while the consumers store (flash_source.source's persistent), variant F1:
# taken by non-causal calls of at most PERSISTENT[D] keys. Measured (H200, bf16, D 128,
# TFLOP/s at S 512 / 2k / 16k): non-causal F1 319 / 485 / 549 -> 354 / 492 / 542
# persistent; causal 194 / 385 / 546 -> 180 / 383 / 392: a static round of tiles over
# the SMs leaves the long causal tiles to few SMs (ordering tiles longest-first across
# heads would lose the K/V reuse in L2 that consecutive tiles of one head give). Measured,
# D 64 non-causal: F3 230 / 376 / 442, F1 persistent 277 / 388 / 425: short tiles gain
# from hiding the store and the next Q load, long ones from F3's overlapped softmax (F3
# persistent spills 276 B and ptxas serialises its wgmma, C7520)
PERSISTENT = {64: 4096, 128: 1 << 62}
TILES = {64: (128, 4), 128: (128, 2)}  # D -> (BN keys a tile, K/V stages)
THREADS, MAX_REGS = 384, 168
KINDS = {"float16": "f16", "bfloat16": "bf16"}


def sig(dtype):
    """The forward's signature for 16-bit dtype: 3 tensor maps, o's 16-bit pairs, lse, the
    lengths, Hq .. total (the band's sides after causal); then a boolean mask's bytes, an
    additive mask (dtype), their strides, the dropout's threshold, factor, offset and
    seed, the logit cap, ALiBi's code, slope stride and slopes (read only by the kernels
    of those features)."""
    return ("void(uint64, uint64, uint64, uint32[::1], float32[::1], int64[::1], int64[::1], "
            "int64, int64, int64, int64, int64, int64, int64, int64, int64, int64, float32, "
            f"int64, int64, int64, int64, {FEATURE_TYPES.format(array_type(dtype))})")


# the features' parameters, every flash kernel's last (flash_bwd's too)
FEATURE_TYPES = "uint8[::1], {}[::1], int64, int64, int64, int64, uint64, float32, uint64, " \
    "uint64, uint64, uint64, float32, int64, int64, float32[::1]"


ex2 = instruction("ex2.approx.ftz.f32 $0, $1;", types.float32, types.float32,
                  "2^x, one MUFU instruction (2 ulp; -inf -> +0, flushes denormals).")
rcp = instruction("rcp.approx.ftz.f32 $0, $1;", types.float32, types.float32,
                  "1 / x, one MUFU instruction (1 ulp; inf -> +0).")


_NEG = types.float32(-np.inf)
_S32, _TWO = np.uint64(32), np.uint64(2)
_U32, _I32 = types.uint32, types.int32


# The features' per-score work as device functions: inlined by NVVM, but one call in the
# generated source instead of a branch a score (numba's control-flow analysis of a
# kernel with thousands of branches exceeds Python's recursion limit).
@cuda.jit(device=True)
def masked_score(s, inside, mb, at):
    """s where the score is inside the live keys and its mask byte attends, else -inf."""
    if inside and mb[at] != 0:
        return s
    return _NEG


@cuda.jit(device=True)
def _draw(g, off_lo, off_hi, key_lo, key_hi):
    """The 4 words of Philox call g (a uint64 counter) of the dropout's stream."""
    return philox4x32_10_u32(_U32(g), _U32(g >> _S32), _U32(off_lo), _U32(off_hi),
                             _U32(key_lo), _U32(key_hi))


@cuda.jit(device=True)
def mask_term(m, isc):
    """An additive mask's value m as the term m / scale (isc) its raw score takes: -inf
    stays -inf; a finite m whose quotient would overflow float32 (bfloat16's lowest, a
    padding mask's) is held at -1e30, so a row of only such values averages its values
    as PyTorch's float32 kernels (and the float64 reference) do instead of vanishing."""
    if m == _NEG:
        return _NEG
    return max(m * isc, types.float32(-1e30))


@cuda.jit(device=True)
def added_term(ma, at, inside, isc):
    """The additive mask's term m / scale of a score inside the live keys, else 0 (the
    element is not read: a key or row past the mask's ends)."""
    if inside:
        return mask_term(widen(ma[at]), isc)
    return types.float32(0)


@cuda.jit(device=True)
def added_score(s, inside, ma, at, isc):
    """s + m / scale (m: the additive mask's value) where the score is inside the live
    keys, else -inf."""
    if inside:
        return s + mask_term(widen(ma[at]), isc)
    return _NEG


@cuda.jit(device=True)
def pair_keep(g, ev, thr, kscale, off_lo, off_hi, key_lo, key_hi):
    """The keep factors (kscale or 0) of a lane's 2 columns on rows r0 and r1 (f0, f1;
    f2, f3) from Philox call g, this lane's row (r0 if ev, else r1): the lane pair
    swaps the words of the other's row (flash_source.py's module docstring)."""
    w0, w1, w2, w3 = _draw(g, off_lo, off_hi, key_lo, key_hi)
    t0 = _U32(cuda.shfl_xor_sync(0xFFFFFFFF, _I32(w2 if ev else w0), 1))
    t1 = _U32(cuda.shfl_xor_sync(0xFFFFFFFF, _I32(w3 if ev else w1), 1))
    z = types.float32(0)
    return (kscale if (w0 if ev else t0) < thr else z, kscale if (w1 if ev else t1) < thr else z,
            kscale if (t0 if ev else w2) < thr else z, kscale if (t1 if ev else w3) < thr else z)


@cuda.jit(device=True)
def pick(w0, w1, w2, w3, n):
    """w_n of four values (n a lane's own: selects, no local array)."""
    return w0 if n == 0 else (w1 if n == 1 else (w2 if n == 2 else w3))


@cuda.jit(device=True)
def quad_keep(g, kl, src1, src2, src3, thr, kscale, off_lo, off_hi, key_lo, key_hi):
    """The keep factors of a dkv lane's 4 pairs (query e, key row rr) = (x % 2, x // 2),
    x = 0..3, from the 4 lanes of its key group, lane kl's Philox call g being pair kl's
    (flash_bwd_source.py's module docstring): in round t this lane reads word kl of the
    call of lane (kl + t) % 4 (src_t), which sends word (its kl - t) % 4."""
    w0, w1, w2, w3 = _draw(g, off_lo, off_hi, key_lo, key_hi)
    v0 = pick(w0, w1, w2, w3, kl)
    v1 = _U32(cuda.shfl_sync(0xFFFFFFFF, _I32(pick(w0, w1, w2, w3, (kl - 1) & 3)), src1))
    v2 = _U32(cuda.shfl_sync(0xFFFFFFFF, _I32(pick(w0, w1, w2, w3, (kl - 2) & 3)), src2))
    v3 = _U32(cuda.shfl_sync(0xFFFFFFFF, _I32(pick(w0, w1, w2, w3, (kl - 3) & 3)), src3))
    z = types.float32(0)
    return (kscale if pick(v0, v1, v2, v3, (0 - kl) & 3) < thr else z,
            kscale if pick(v0, v1, v2, v3, (1 - kl) & 3) < thr else z,
            kscale if pick(v0, v1, v2, v3, (2 - kl) & 3) < thr else z,
            kscale if pick(v0, v1, v2, v3, (3 - kl) & 3) < thr else z)


@cuda.jit(device=True)
def capped(s, c2, cs, cs2):
    """Raw score s capped in its own units: cs tanh(y), y = s c2 / (2 log2(e)), as
    cs - cs2 / (1 + 2^(s c2)) (cs2 = 2 cs; flash_source.cap_lines): -cs .. cs, NaN
    stays NaN."""
    return cs - cs2 * rcp(types.float32(1) + ex2(s * c2))


@cuda.jit(device=True)
def sel(c, a, b):
    """a where c holds, else b: the generated kernels' conditional expressions whose arms
    are safe to evaluate both, as a call (NVVM inlines it: a select). numba's IR makes
    each conditional expression two blocks and a phi variable, and its SSA
    reconstruction and liveness passes cost blocks times variables: per-score ones made
    numba's share of the JIT (a 2-core host, compile_ptx) 27-37 s for the D 64 forward,
    11-36 s for the backward kernels; as calls 5-10 s, with the loops' PTX unchanged in
    the forward, fewer branches in the backward's, and ptxas's registers and spills as
    they were."""
    return a if c else b


def namespace(kind):
    """The names the generated attention kernels bind (this forward's and flash_bwd's),
    but their wgmma shapes."""
    return dict(SOURCE_NAMES, I=types.int64, I32=types.int32, U32=types.uint32,
                F32=types.float32, NEG=types.float32(-np.inf), LN2=types.float32(math.log(2)),
                FULL=0xFFFFFFFF, math=math, fmaxf=libdevice.fmaxf, ex2=ex2, rcp=rcp,
                capped=capped,
                U64=types.uint64, TWO=_TWO, masked_score=masked_score,
                added_score=added_score, added_term=added_term, mask_term=mask_term,
                pair_keep=pair_keep,
                quad_keep=quad_keep, widen=widen, sel=sel,
                LOG2E=types.float32(math.log2(math.e)),
                cvt=cvt_bf16x2 if kind == "bf16" else cvt_f16x2,
                mbarrier_arrive=mbarrier_arrive, tma_load_3d=tma_load_3d,
                setmaxnreg_dec=setmaxnreg_dec, setmaxnreg_inc=setmaxnreg_inc,
                bar_sync=bar_sync, bar_arrive=bar_arrive,
                fence_proxy_tensormap_acquire=fence_proxy_tensormap_acquire,
                mbarrier_init=mbarrier_init, smem_address=smem_address,
                mbarrier_arrive_expect_tx=mbarrier_arrive_expect_tx,
                mbarrier_try_wait_parity=mbarrier_try_wait_parity)


def kernel(dtype, D, variant=None, persistent=False, masked=0, dropped=False, capped=False,
           alibi=False):
    """The forward Kernel for dtype, head dim D (TILES), variant (VARIANT[D] unless
    given), persistence, the mask's kind (0 none, 1 boolean, 2 additive), dropout, the
    logit cap and ALiBi, built on first use."""
    variant = variant or VARIANT[D]
    key = dtype, D, variant, persistent, masked, dropped, capped, alibi
    if key not in _KERNELS:
        kind = KINDS[dtype]
        BN, stages = TILES[D]
        name, src = fs.source(kind, D, BN, stages, variant != "F1", variant == "F3", persistent,
                              masked, dropped, capped, alibi)
        ns = dict(namespace(kind), mma_qk=wgmma(BN, kind), mma_pv=wgmma_rs(D, kind, 1))
        shmem = fs.shared_bytes(D, BN, stages)
        fn = compile_source(name, src, ns, about={
            "config": f"{dtype}, D {D}: {fs.BM} queries x {BN} keys a tile, {stages} K/V "
                      f"stages, 1 producer + 2 consumer warpgroups, wgmma m64n{BN}k16 (S) "
                      f"and m64n{D}k16 with P in registers (O)",
            "traffic": f"a key tile: {4 * BN * D} B in, {4 * fs.BM * BN * D} flops",
            "why": f"variant {variant}{', persistent' if persistent else ''}"
                   f"{('', ', a boolean mask', ', an additive mask')[masked]}"
                   f"{', dropout' if dropped else ''}{', a logit cap' if capped else ''}"
                   f"{', ALiBi' if alibi else ''} "
                   "(flash.py: VARIANT, PERSISTENT)"})
        _KERNELS[key] = Kernel(fn, [sig(dtype)], arch="sm_90a", shared_bytes=shmem,
                                    max_registers=MAX_REGS)
    return _KERNELS[key]


_KERNELS = {}


def takes(dtype, geo):
    """Whether the kernels' features cover the call (geo: geometry.Geometry): 16-bit
    data, D = Dv in TILES, any mask, dropout only where Sk % 4 == 0, a positive scale;
    any band (causal of either alignment, sliding windows), a logit cap, ALiBi."""
    return dtype in KINDS and geo.D == geo.Dv and geo.D in TILES and \
        (not geo.dropped or geo.Sk % 4 == 0) and geo.scale > 0


def fits(q, k, v, geo):
    """Whether the tensor-core kernels (this forward, flash_bwd's) can run the call: takes,
    on sm_90, with TMA's 16-byte aligned bases (row strides are D * 2 bytes)."""
    from ..matmul import tensor_cores
    return not SIMULATOR and takes(dtype_name(q), geo) and tensor_cores() and \
        all(ptr(t) % 16 == 0 for t in (q, k, v))


def usable(q, k, v, geo):
    """Whether this forward runs the call (module docstring): more than 16 queries."""
    return geo.Sq > 16 and fits(q, k, v, geo)


def features(geo, mb, ma):
    """(the mask's kind, dropped, capped, alibi) of the call and the kernels' trailing
    arguments: the boolean mask (mb) and the additive one (ma; stand-ins where absent),
    their strides, the dropout's stream, the logit cap, ALiBi's code, stride, slopes."""
    return (geo.mask_kind, geo.dropped, geo.softcap > 0, geo.alibi != 0), \
        (mb, ma, *geo.mask[1:], *geo.dropout, float(geo.softcap), geo.alibi, geo.slope_b,
         geo.slopes)


def forward(q, k, v, o, lse, lq, lk, mb, ma, geo, layout, stream):
    """Launch the kernel (geo: the call's geometry.Geometry; mb, ma: the boolean and the
    additive mask, or stand-ins the kernel does not read)."""
    B, Hq, G, Sq, Sk, D = geo[:6]
    ob, oh, orow = geo.o_strides
    causal, scale, (has_lq, has_lk) = geo.causal, geo.scale, geo.lengths
    dtype = dtype_name(q)
    Hk = Hq // G
    bhsd = layout == "BHSD"
    shapes = ((B * Hq, Sq, D), (B * Hk, Sk, D)) if bhsd else ((B, Sq, Hq * D), (B, Sk, Hk * D))
    BN = TILES[D][0]
    maps = [encoded(ptr(t), shp, dtype, (1, rows, 64), "128B", stream, t)
            for t, shp, rows in ((q, shapes[0], fs.BM), (k, shapes[1], BN), (v, shapes[1], BN))]
    persistent = not causal and Sk <= PERSISTENT[D] and not geo.dropped  # (a persistent
    # tile loop with dropout's draws spills 150-230 B; the plain loop 16-28 B)
    feat, tail = features(geo, mb, ma)
    kern = kernel(dtype, D, "F1" if persistent else None, persistent, *feat)
    total = B * Hq * -(-Sq // fs.BM)
    grid = min(total, sm_count()) if persistent else total  # (one block an SM fits)
    kern.launch(kern.sigs[0], grid, THREADS, stream, *(m[0] for m in maps),
                (ptr(o), B * Hq * Sq * D // 2), lse, lq, lk, Hq, G, Sq, Sk, has_lq, has_lk,
                causal, geo.win_lo, geo.win_hi, int(bhsd), float(scale * math.log2(math.e)), ob,
                oh, orow, total, *tail,
                shmem=kern.shared_bytes, owners=tuple(m[1] for m in maps) + (o,))


def ptx_examples():
    """Both head dims in bfloat16, the three variants, both head dims persistent, a
    boolean mask with dropout and a logit cap (F3), an additive mask with ALiBi (F1
    persistent):
    every feature's lines, each feature apart from another once (tests/test_ptx.py
    compiles them for sm_90a; float16's kernels differ only in their conversions' names,
    and a compile costs CI 20-40 s)."""
    for D in (64, 128):
        kernel("bfloat16", D)
    for variant in ("F1", "F2", "F3"):
        kernel("bfloat16", 128, variant)
    for D in (64, 128):
        kernel("bfloat16", D, "F1", True)
    kernel("bfloat16", 64, None, False, 1, True, True)  # (the most registers)
    kernel("bfloat16", 128, None, True, 2, False, False, True)

"""The tensor-core forward of scaled_dot_product_attention (sm_90: wgmma, TMA, mbarrier),
FlashAttention's algorithm on FA3's Hopper machinery; flash_source.py writes the kernel
and draws its tiles.

Variants F1-F3: one block a (batch, head, 128-query tile), a producer warpgroup
streaming K and V by TMA through STAGES stages, two consumer warpgroups of 64 query rows
computing S = QK^T and O += PV on wgmma with the softmax between them in registers; P
never leaves registers (the accumulator's layout is the next product's A operand). Rows
and keys past the tensor are TMA's zeros, masked where they would count; causal tiles
past a query tile's last row are never loaded.

Where it runs (`usable`): float16 / bfloat16 q, k, v with head dims D = Dv = 64 or 128,
no attn_mask, no dropout, a positive scale, Sq > 16 (fewer queries: decode.py), sm_90;
everything else (and the simulator) runs the other variants (attention/__init__.py).
Causal, grouped-query heads, seq_lens_q / seq_lens_k and both layouts run here: BHSD tensors are mapped as (B*H,
S, D), BSHD as (B, S, H*D), so neither is transposed.
"""
import math

import numpy as np
from numba import types
from numba.cuda import libdevice

from ..runtime.memory.arrays import dtype_name, ptr
from ..runtime.launch.codegen import compile_source
from ..runtime.device import sm_count
from ..runtime.launch.kernel import Kernel
from ..runtime.simulator import SIMULATOR
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
SIG = ("void(uint64, uint64, uint64, uint32[::1], float32[::1], int64[::1], int64[::1], "
       "int64, int64, int64, int64, int64, int64, int64, int64, float32, int64, int64, int64, "
       "int64)")


ex2 = instruction("ex2.approx.ftz.f32 $0, $1;", types.float32, types.float32,
                  "2^x, one MUFU instruction (2 ulp; -inf -> +0, flushes denormals).")


def namespace(kind):
    """The names the generated attention kernels bind (this forward's and flash_bwd's),
    but their wgmma shapes."""
    return dict(SOURCE_NAMES, I=types.int64, I32=types.int32, U32=types.uint32,
                F32=types.float32, NEG=types.float32(-np.inf), LN2=types.float32(math.log(2)),
                FULL=0xFFFFFFFF, math=math, fmaxf=libdevice.fmaxf, ex2=ex2,
                cvt=cvt_bf16x2 if kind == "bf16" else cvt_f16x2,
                mbarrier_arrive=mbarrier_arrive, tma_load_3d=tma_load_3d,
                setmaxnreg_dec=setmaxnreg_dec, setmaxnreg_inc=setmaxnreg_inc,
                bar_sync=bar_sync, bar_arrive=bar_arrive,
                fence_proxy_tensormap_acquire=fence_proxy_tensormap_acquire,
                mbarrier_init=mbarrier_init, smem_address=smem_address,
                mbarrier_arrive_expect_tx=mbarrier_arrive_expect_tx,
                mbarrier_try_wait_parity=mbarrier_try_wait_parity)


def kernel(dtype, D, variant=None, persistent=False):
    """The forward Kernel for dtype, head dim D (TILES), variant (VARIANT[D] unless
    given) and persistence, built on first use."""
    variant = variant or VARIANT[D]
    key = dtype, D, variant, persistent
    if key not in _KERNELS:
        kind = KINDS[dtype]
        BN, stages = TILES[D]
        name, src = fs.source(kind, D, BN, stages, variant != "F1", variant == "F3", persistent)
        ns = dict(namespace(kind), mma_qk=wgmma(BN, kind), mma_pv=wgmma_rs(D, kind, 1))
        shmem = fs.shared_bytes(D, BN, stages)
        fn = compile_source(name, src, ns, about={
            "config": f"{dtype}, D {D}: {fs.BM} queries x {BN} keys a tile, {stages} K/V "
                      f"stages, 1 producer + 2 consumer warpgroups, wgmma m64n{BN}k16 (S) "
                      f"and m64n{D}k16 with P in registers (O)",
            "traffic": f"a key tile: {4 * BN * D} B in, {4 * fs.BM * BN * D} flops",
            "why": f"variant {variant}{', persistent' if persistent else ''} (flash.py: "
                   "VARIANT, PERSISTENT)"})
        _KERNELS[key] = Kernel(fn, [SIG], arch="sm_90a", shared_bytes=shmem,
                                    max_registers=MAX_REGS)
    return _KERNELS[key]


_KERNELS = {}


def fits(q, k, v, attn_mask, dropout_p, scale, D, Dv):
    """Whether the tensor-core kernels (this forward, flash_bwd's) can run the call: 16-bit
    data, D = Dv in TILES, no mask, no dropout, a positive scale, sm_90, TMA's 16-byte
    aligned bases (row strides are D * 2 bytes)."""
    from ..matmul import tensor_cores
    return not SIMULATOR and dtype_name(q) in KINDS and D == Dv and D in TILES and \
        attn_mask is None and dropout_p == 0 and scale > 0 and tensor_cores() and \
        all(ptr(t) % 16 == 0 for t in (q, k, v))


def usable(q, k, v, attn_mask, dropout_p, scale, Sq, D, Dv):
    """Whether this forward runs the call (module docstring): more than 16 queries."""
    return Sq > 16 and fits(q, k, v, attn_mask, dropout_p, scale, D, Dv)


def forward(q, k, v, o, lse, lq, lk, geo, layout, stream):
    """Launch the kernel (geo: the call's geometry.Geometry)."""
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
    persistent = not causal and Sk <= PERSISTENT[D]
    kern = kernel(dtype, D, "F1" if persistent else None, persistent)
    total = B * Hq * -(-Sq // fs.BM)
    grid = min(total, sm_count()) if persistent else total  # (one block an SM fits)
    kern.launch(SIG, grid, THREADS, stream, *(m[0] for m in maps),
                (ptr(o), B * Hq * Sq * D // 2), lse, lq, lk, Hq, G, Sq, Sk, has_lq, has_lk,
                causal, int(bhsd), float(scale * math.log2(math.e)), ob, oh, orow, total,
                shmem=kern.shared_bytes, owners=tuple(m[1] for m in maps) + (o,))


def ptx_examples():
    """Both head dims in bfloat16, the three variants, and both head dims persistent
    (tests/test_ptx.py compiles them for sm_90a; float16's kernels differ only
    in their conversions' names, and a compile costs CI 20-40 s)."""
    for D in (64, 128):
        kernel("bfloat16", D)
    for variant in ("F1", "F2", "F3"):
        kernel("bfloat16", 128, variant)
    for D in (64, 128):
        kernel("bfloat16", D, "F1", True)

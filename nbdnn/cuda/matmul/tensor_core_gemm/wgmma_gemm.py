"""Matmul on the tensor cores (sm_90a): wgmma fed by TMA, warp-specialised.

C[z] (M x N) = epilogue(op(A[za]) @ op(B[zb])), 16-bit A and B (float16 or bfloat16),
float32 accumulation, C in the inputs' dtype; z and the tile from a persistent block's
tile index (tile_order.py), (za, zb) = offs[2z:2z+2] (the batch-broadcast table). Either
operand may be K-major (rows of K contiguous: a plain A, a transposed B) or MN-major (a
transposed A, a plain B): TMA loads both into 128-byte-swizzled shared memory and
wgmma reads either major from its descriptors.

Variant T1 (0.87-0.99x cuBLAS at 4096 and 8192): K-major operands only, blocks
in row order. T2 (this file) adds both majors, batches, the fused epilogue, a grouped
tile order (GROUP_M: 0.95 against 0.90x at 8192) and a persistent grid
(PERSISTENT: the producer fills the next tile's stages during the epilogue). Dropped:
one wgmma batch left in flight a k-tile (CUTLASS's habit): 4-12% slower. Convolution:
the same kernel with wgmma_im2col.py's operands (conv=1, or 2: a convolution's epilogue).

A block computes a BM x BN = 128 x 256 tile of C with three warpgroups (384 threads):

    warpgroup 0, producer    one thread: for each k-tile of BK = 64, wait until stage
                             s = kt % S is free (empty[s]), announce 48 KB on full[s]
                             and issue the TMA loads (K-major: one box a side; MN-major:
                             boxes of 64 M/N x 64 K, two for A, four for B).
                             setmaxnreg.dec to 40 registers.
    warpgroups 1, 2,         each owns 64 rows of the tile. For each k-tile: wait full[s],
    consumers                four wgmma m64n256k16, commit, wait, release the stage (one
                             arrive a warpgroup: empty[s] counts 2). setmaxnreg.inc to 232.
    epilogue                 each consumer applies bias, the activation and alpha/beta to
                             its 64 x 256 accumulators in registers, packs pairs
                             (cvt.rn.{f16,bf16}x2) into staging tiles that TMA stores
                             (staged_store.py; TMA_STORE), or stores 4-byte pairs
                             straight to C, bounds-checked (beta, odd N).

Shared memory of a stage, the loads and the descriptors: wgmma_stage.py (a 64 x 256
tile for skinny M: the consumers split the columns, SKINNY_TILE).

S = 4 stages of A 16 KB + B 32 KB = 192 KB; the 2 S mbarriers are static. Registers:
384 threads at the launch's 168 (65 536 / 384), then 40 / 232 / 232 after setmaxnreg.

Per k-tile a block loads (128 + 256) x 64 x 2 = 48 KB and does 2 x 128 x 256 x 64 =
4.2 MFLOP: 85 flop a byte from L2 (the H200's 16-bit ridge is ~206 flop a byte of
DRAM; neighbouring tiles share A and B through the 60 MB L2).

Tails: TMA fills out-of-bounds box elements with zeros (M, N and K tails cost nothing
in the main loop); the epilogue skips rows >= M and columns >= N. Limits (`usable`
checks them): each operand's contiguous extent a multiple of 8 and its address 16-byte
aligned (TMA's 16-byte strides; matmul's variant wgmma_padded copies an operand that is
not into rows of a padded pitch, strided.padded_rows, and passes dims), K > 0. 16-bit C
of odd N, or only 2-byte aligned, is stored an element at a time (odd; pairs.py).
"""
import functools
import math

import numpy as np

from ... import activation as _act
from ...runtime.memory.arrays import dtype_name, empty, ptr
from ...runtime.launch.codegen import compile_source
from ...runtime.device import sm_count
from ...runtime.launch.kernel import Kernel
from ...tensorcore.tensormap import encoded
from ..batches import table as batch_table
from .epilogue import staged_store as staged
from .wgmma_params import namespace, pairs_fit, signature, slot_words, \
    usable  # noqa: F401  (the front end asks wgmma_gemm.usable)
from .split_k import split, splitk_sum, tile_width
from . import wgmma_stage as ws
from .wgmma_source import BK_OF, source  # noqa: F401  (tests read W.source)
from .wgmma_stage import BK, BOX, MAX_SHARED

BM = 128                                  # the tile's rows (64: SKINNY_TILE)
# (BN, STAGES[, BM]): the tile's width, the pipeline's depth (and rows). Shipped: 256 x 4;
# 128 with up to 6 stages gives twice the tiles of a one-wave problem, for
# docs/decisions.md "wgmma_tiles"'s sweep (256 x 4 best or tied but at one shape)
TILE = (256, 4)
# a 64 x 256 tile for M <= 64 (the consumers split its columns; 40 KB a stage, so one
# more stage in flight: what a skinny call's bandwidth needs; 4 beside TMA stores).
# None: TILE everywhere. Measured (H200, bf16, x cuBLAS): alone it changed nothing (64 x
# 4096^2 0.61 -> 0.60), with TMA_STORE_F32 and LEAN_SETUP it gives their sum and more:
# 64 x 4096^2 0.61 -> 0.72, 64 x 8192^2 0.60 -> 0.72 (docs/decisions.md "skinny_gemm").
SKINNY = (256, 5, 64)
SKINNY_TILE = SKINNY
# M (all of a's rows) up to which SKINNY_TILE serves. Measured (x cuBLAS), 64 -> 128: 128
# x 4096 x 4096 0.64 -> 0.68, 128 x 256 x 64 0.60 -> 0.65; 256 lost at 256 x 4096 x 8192.
SKINNY_ROWS = 128
# 3xtf32's k-tile products added on the CUDA cores (promote): a consumer's columns at most
# (its two accumulators, 2 x 64 registers at 128: the 256-wide tile's 2 x 128 would spill)
PROMOTE_COLUMNS = 128
# Tried and removed (docs/decisions.md "cluster_split"): split-K's chunks of a 64-row tile
# reduced in a thread-block cluster through distributed shared memory.


def shared_bytes(bn, stages, store=False, bm=BM):
    """Dynamic shared memory of a block (wgmma_stage.shared_bytes; store: TMA stores'
    staging tiles)."""
    return ws.shared_bytes(bn, stages, staged.STAGING_BYTES if store else 0, bm)


THREADS, MAX_REGS = 384, 168
KINDS = {"float16": "f16", "bfloat16": "bf16", "float32": "tf32"}  # (float32: math tf32)
# the TMA element type of tf32 operands: TFLOAT32 rounds float32 to nearest even on the
# way in, FLOAT32 lets the tensor cores truncate (docs/decisions.md "tf32_gemm")
TF32_MAP = "tfloat32"
GROUP_M = 8      # tile rows of a group in the block order (1: row order, as T1)
PERSISTENT = True  # one block an SM looping over tiles (False: a block a tile, as T1)
# each block makes its two tensor maps from address-free templates (encoded once per
# geometry) and a's and b's addresses, in a workspace slot: no encode or map upload a
# new address, and a plan replays the call (False: maps encoded per address on the
# host, the call never planned). Measured (H200): a bf16 256^3 call costs the host 10 us
# planned against 49-54 us with host maps (torch.matmul 11 us), the same GPU time.
OWN_MAPS = True
# C leaves through shared memory and TMA stores where it can (staged_store.py: 16-bit C,
# no beta, not split-K, N % 8 == 0); False: every thread stores 4-byte pairs. Measured
# (H200, bf16, x cuBLAS, direct -> TMA stores): 4096^3 0.87-0.90 -> 0.93-0.94, 4000^3
# 0.81-0.85 -> 0.91-0.93, 512 x 8192 x 1024 0.66 -> 0.86 (perf/RESULTS.md).
TMA_STORE = True
# ... and float32 C the same way (the tf32 kernels' C, split-K's chunks: 64 x 32 float32
# a staging tile). Measured (bf16 split-K, x cuBLAS): 128 x 4096^2 0.53 -> 0.64.
TMA_STORE_F32 = True
# the producer's tile setup in 32 bits, no batch-table read for one matrix
# (tile_order.py: a timeline put 1.8 us before a block's first TMA copy). # one 128 x 256 tile 6.3 -> 5.3 us of kernel, 512 x 8192 x 1024 0.85 -> 0.90x cuBLAS.
LEAN_SETUP = True
TEMPLATE_ADDRESS = 1 << 20   # the templates' base (replaced in the kernel; 16-B aligned)
# Tried and removed: a consumer keeping one k-tile's wgmma group in flight
# while it issues the next (wait_group 1, CUTLASS's mainloop) measured 0.97-1.04x, geomean
# 1.00x, over ResNet-50's 14 bf16 layers in all three directions: the other consumer
# warpgroup's group already fills the tensor pipe between one's groups.


@functools.lru_cache(maxsize=None)
def kernel(dtype, a_k=True, b_k=True, bias=False, act=None, beta=False, partial=False,
           own_maps=False, tile=None, store=False, lean=False, conv=False, promote=False,
           odd=False):
    """The Kernel for dtype "float16" / "bfloat16" / "float32" (its tf32 modes, operands
    K-major only), the operand majors and the epilogue (built on first use: a variant
    compiles in seconds); partial: split-K's chunk kernel (c a float32 workspace);
    own_maps: the blocks make their tensor maps (OWN_MAPS); tile: (BN, STAGES[, BM]);
    store: C through TMA stores (TMA_STORE); conv: a convolution's operands (wgmma_im2col.py; host maps), 2
    with a convolution's epilogue order (wgmma_source.source); promote (float32's
    3xtf32): a k-tile's product added into the accumulators on the CUDA cores, at most
    128 columns a consumer (wgmma_source.source); odd: 16-bit C an element a store (any
    N; the direct epilogue of a GEMM's finished C only)."""
    kind = KINDS[dtype]
    if odd and (kind == "tf32" or partial or store or conv):
        raise ValueError("wgmma GEMM: odd (16-bit C an element a store) is the direct "
                         "epilogue of a 16-bit GEMM's finished C")
    bn, stages, bm = tile = (tuple(tile or TILE) + (BM,))[:3]
    if promote and (kind != "tf32" or ws.consumer_columns(bn, bm) > PROMOTE_COLUMNS):
        raise ValueError(f"wgmma GEMM: promote is for tf32 with at most {PROMOTE_COLUMNS} "
                         f"columns a consumer; got {dtype}, tile {bm}x{bn}")
    shmem = shared_bytes(bn, stages, store, bm)
    if bn not in (64, 128, 192, 256) or bm not in (64, 128) or shmem > MAX_SHARED or \
            conv and (own_maps or a_k != (conv != 3) or conv == 3 and b_k or
                      kind == "tf32" and (conv != 1 or not b_k)):
        raise ValueError(f"wgmma GEMM tile {bm}x{bn}, {stages} stages: BN "
                         f"64-256, BM 64 or 128, {shmem} B of shared memory (at most "
                         f"{MAX_SHARED}), conv with host maps (tf32: the GEMM's epilogue order and a "
                         f"K-major B only)")
    name, src = source(kind, a_k, b_k, bias, act, beta, partial, own_maps, tile, store, lean,
                       conv, promote, odd)
    nw = ws.consumer_columns(bn, bm)
    ns = namespace(kind, nw, a_k, b_k, _act.device_functions(np.float32)[act][0] if act
                   else None)
    bk = BK_OF[kind]
    fn = compile_source(name, src, ns, about={
        "config": f"{dtype}: tile {bm}x{bn}x{bk}, {stages} stages, 1 producer + 2 consumer "
                  f"warpgroups, wgmma m64n{nw}k{bk // 4}, TMA 128-byte swizzle, A "
                  f"{'K' if a_k else 'MN'}-major, B {'K' if b_k else 'MN'}-major",
        "epilogue": f"bias {bias}, activation {act}, beta {beta}",
        "traffic": f"a k-tile: {ws.stage_bytes(bn, bm)} B in, {2 * bm * bn * bk} flops",
        "why": "variant T2 (module docstring)"})
    return Kernel(fn, [signature(kind, partial, own_maps, store,
                                 conv == 2 and beta and not partial, odd)],
                  arch="sm_90a",
                  shared_bytes=shmem, max_registers=MAX_REGS)


def ptx_examples():
    """One kernel of each code path (tests/test_ptx.py compiles them; the tensor-core
    ones for sm_90a): bfloat16 in every operand major, float16 K-major (the dtypes
    differ only in names; a kernel costs CI 10-25 s), a full epilogue in 16 bits (beta:
    direct stores) and in tf32, split-K's chunk kernel and every dtype's ordered sum, host
    tensor maps (the convolution's im2col operands, a 64-wide tile; a filter gradient's;
    a data gradient's filter as stored), 16-bit C of odd width,
    the other stores (TMA_STORE_F32), the other tile setup, the skinny tile (a TMA-store
    epilogue, an MN-major A split-K), and the 192-wide tile."""
    om, st, ln = OWN_MAPS, TMA_STORE, LEAN_SETUP  # what gemm() uses; one of each other kind
    f32 = st and TMA_STORE_F32  # (float32 C staged: tf32's C, split-K's chunks)
    ship = dict(own_maps=om, lean=ln)
    for a_k in (True, False):
        for b_k in (True, False):
            kernel("bfloat16", a_k, b_k, store=st, **ship)
    kernel("float16", True, True, store=st, **ship)
    kernel("bfloat16", True, False, True, "gelu", True, **ship)  # beta: direct stores
    kernel("bfloat16", True, True, partial=True, store=f32, **ship)
    kernel("float32", True, True, True, "gelu", True, **ship)  # tf32 with beta: direct
    kernel("float32", True, True, True, store=f32, **ship)
    kernel("bfloat16", True, True, True, "relu", True, tile=(64, 6), store=st, lean=ln,
           conv=2)  # (and a convolution's z, read in the staged epilogue)
    kernel("bfloat16", False, False, partial=True, lean=ln, conv=3)  # (a filter gradient)
    kernel("bfloat16", True, False, store=st, lean=ln, tile=(192, 4), conv=1)  # (a data
    # gradient's filter as stored: B MN-major)
    kernel("float32", True, True, True, "relu", store=f32, lean=ln, conv=1)  # (tf32 conv)
    kernel("float32", True, True, store=f32, tile=(128, 6), promote=True, **ship)  # (3xtf32)
    kernel("float32", True, True, partial=True, store=f32, tile=(256, 4, 64), promote=True,
           **ship)  # (3xtf32 split-K, skinny: 128 columns a consumer)
    kernel("bfloat16", True, False, own_maps=om, store=st, lean=not ln)
    kernel("bfloat16", True, True, partial=True, store=not f32, **ship)
    kernel("bfloat16", True, False, True, "relu", True, odd=True, **ship)  # (odd N: C an
    # element a store, beta's old C read likewise)
    kernel("bfloat16", True, False, True, "gelu", tile=(256, 4, 64), store=st, **ship)
    kernel("bfloat16", False, True, partial=True, tile=(256, 4, 64), store=f32, **ship)
    kernel("bfloat16", True, False, tile=(192, 4), store=st, **ship)  # (split_k.WIDTHS)
    for dtype in KINDS:
        splitk_sum(dtype)


def gemm(a, b, c, trans_a, trans_b, bias, act, coef, alpha, beta, stream, promote=False,
         dims=None):
    """c = alpha * act(op(a) @ op(b) + bias) + beta * c on the tensor cores. a, b, c, bias:
    C-contiguous device arrays of one dtype, 16-bit or float32 (tf32: operands already
    rounded, tf32_parts.py); shapes checked by the front end, `usable` true; c (batch...,
    M, N). promote (float32's 3xtf32): each k-tile's product added into float32
    accumulators on the CUDA cores (the kernel's promote), on tiles of at most
    PROMOTE_COLUMNS columns a consumer (the registers of the second accumulator).
    dims: the product's (M, N, K) where an operand's rows are wider than its
    contiguous extent (padded_rows' copies: the pad is zeros, and the tensor maps
    stride over the stored rows); 16-bit C of odd N (or 2-byte aligned) is stored an
    element at a time (kernel's odd)."""
    from ....arrays import capture_state
    plan = capture_state.__dict__.get("plan")
    if plan is not None and not OWN_MAPS:  # a tensor map holds its tensor's address: a
        plan.impure()                      # replay with other arrays would read those
    dtype = dtype_name(a)
    kind = KINDS[dtype]
    bk, mdt = BK_OF[kind], TF32_MAP if kind == "tf32" else dtype
    ash, bsh = tuple(int(s) for s in a.shape), tuple(int(s) for s in b.shape)
    M, K = (ash[-1], ash[-2]) if trans_a else (ash[-2], ash[-1])
    N = bsh[-2] if trans_b else bsh[-1]
    if dims is not None:
        M, N, K = dims
    na, nb_ = math.prod(ash[:-2]), math.prod(bsh[:-2])
    batch = ash[:-2] if ash[:-2] == bsh[:-2] else tuple(np.broadcast_shapes(ash[:-2], bsh[:-2]))
    nz = math.prod(batch)
    rows_a, a_batch, b_batch = M, ash[:-2], bsh[:-2]
    if nb_ == 1 and not trans_a and nz == na:  # one b: a's matrices stack into one of nz M rows
        rows_a, na, nz, batch, a_batch, b_batch = nz * M, 1, 1, (), (), ()
    tile = SKINNY_TILE if SKINNY_TILE and rows_a <= SKINNY_ROWS else TILE
    width = TILE[0] if tile is not TILE else tile_width(-(-rows_a // BM), N, nz)
    tile = tile if width == TILE[0] else (width, 5 if width == 192 else 6)  # (40 KB a
    # stage at 192 wide; 128 and 64: split_k.NARROW)
    if promote and ws.consumer_columns(tile[0], (tuple(tile) + (BM,))[2]) > PROMOTE_COLUMNS:
        tile = (PROMOTE_COLUMNS, 6)
    bn, bm = tile[0], (tuple(tile) + (BM,))[2]
    # tensor maps (matrices, rows, contiguous extent), boxes (1, rows, 128 B of k) K-major
    # or (1, 64 k, 64 m/n) MN-major (16-bit only)
    at, bt = (TEMPLATE_ADDRESS, TEMPLATE_ADDRESS) if OWN_MAPS else (ptr(a), ptr(b))
    # (each map's contiguous extent the stored rows': dims' padded copies)
    ma = encoded(at, (na, K, ash[-1]) if trans_a else (na, rows_a, ash[-1]), mdt,
                 (1, BK, BOX) if trans_a else (1, bm, bk), "128B", stream, c)
    mb = encoded(bt, (nb_, N, bsh[-1]) if trans_b else (nb_, K, bsh[-1]), mdt,
                 (1, bn, bk) if trans_b else (1, BK, BOX), "128B", stream, c)
    offs = batch_table(a_batch, b_batch, batch, dtype=np.int32)
    tiles = -(-rows_a // bm) * -(-N // bn) * nz
    splits, chunk = split(tiles, K, bk)
    # the maps, and the arrays the kernel reads through them or through raw pointers: a
    # graph keeps them alive, and a traced run (runtime/memory/reuse.py) sees their last use
    owners = (ma[1], mb[1], c, a, b) + ((bias,) if bias is not None else ())
    bias_arg = (ptr(bias), N) if bias is not None else (ptr(c), 1)
    grid = min(tiles * splits, sm_count()) if PERSISTENT else tiles * splits
    total = nz * rows_a * N
    partial = splits > 1
    out = empty(c, (splits * total,), "float32") if partial else c  # (split-K: the chunks)
    store = TMA_STORE and staged.usable(
        kind, partial, beta != 0, N, ptr(out), TMA_STORE_F32, ws.consumer_columns(bn, bm))
    stages = tile[1]
    while shared_bytes(bn, stages, store, bm) > MAX_SHARED:  # (the staging tiles beside)
        stages -= 1
    tile = (bn, stages) if bm == BM else (bn, stages, bm)
    shmem = shared_bytes(bn, stages, store, bm)
    epilogue = (False, None, False) if partial else (bias is not None, act, beta != 0)
    odd = kind != "tf32" and not partial and not store and not pairs_fit(c, N)
    k = kernel(dtype, not trans_a, bool(trans_b), *epilogue, partial=partial,
               own_maps=OWN_MAPS, tile=tile, store=store, lean=LEAN_SETUP, promote=promote,
               odd=odd)
    encs = (ma, mb)
    if store:  # C's map: (matrices [x chunks], rows, N), 64-row x 128-byte boxes
        f32 = kind == "tf32" or partial
        encs += (encoded(TEMPLATE_ADDRESS if OWN_MAPS else ptr(out), (nz * splits, rows_a, N),
                         "float32" if f32 else dtype, (1, 64, staged.columns(f32)), "128B",
                         stream, c),)
        owners += (encs[2][1],)
    maps = tuple(m[0] for m in encs)
    if OWN_MAPS:  # the templates, a, b, the blocks' map slots (128 B a map)
        slots = empty(c, (slot_words(store) * grid,), "int64")
        maps = tuple(m[1] for m in encs) + ((ptr(a), math.prod(ash)),
                                            (ptr(b), math.prod(bsh)), slots)
        owners += (slots,)
    if not partial:
        k.launch(k.sigs[0], grid, THREADS, stream, *maps,
                 (ptr(c), total if kind == "tf32" or odd else total // 2), bias_arg, offs, rows_a,
                 N, K, nz, GROUP_M, alpha, beta, coef, chunk, shmem=shmem, owners=owners)
        return c
    k.launch(k.sigs[0], grid, THREADS, stream, *maps, out, bias_arg, offs, rows_a, N,
             K, nz, GROUP_M, 1.0, 0.0, 0.0, chunk, shmem=shmem, owners=owners)
    ks, sig = splitk_sum(dtype)
    ks.launch(sig, -(-total // 256), 256, stream, out, (ptr(c), total), bias_arg, splits, total,
              N, int(bias is not None), -1 if act is None else _act.MODES.index(act), coef,
              alpha, beta, owners=owners)
    return c

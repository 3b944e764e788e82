"""The Tensor Memory Accelerator and its synchronisation (sm_90a): mbarriers, TMA bulk
tensor copies, the async-proxy fences and setmaxnreg.

A TMA copy moves a box of a tensor between global and shared memory with no thread
doing the addressing: one thread issues it with the address of a 128-byte tensor map
(tensormap.py builds it on the host) and box coordinates (innermost first). A load
completes on an mbarrier in shared memory: the issuing thread announces the bytes it
expects (mbarrier_arrive_expect_tx), every consumer spins on mbarrier_try_wait_parity
for the phase (0, 1, 0, ...: a stage's barrier flips each time it completes). Out of
bounds elements of a box load as zeros: tiles past a matrix's edge need no masking.

Fences: shared memory written by ordinary stores and then read by TMA or wgmma (the
"async proxy") needs fence_proxy_async() in the writing thread before the barrier; an
initialised mbarrier needs it too before TMA signals it. A tensor map in global memory
(numba cannot pass it as a __grid_constant__ parameter) needs
fence_proxy_tensormap_acquire(ptr) once before its first use. A kernel can also make
its own maps from an address-free template (CUTLASS's habit for grouped GEMM): copy the
template to shared memory, tensormap_replace_address, tensormap_copy_release to a
global slot of its own, then acquire it; the host then encodes nothing per address.
"""
from llvmlite import ir
from numba import types
from numba.cuda.extending import intrinsic

from .asm import I32, inline_asm, literal_statement, statement

fence_proxy_async = statement("fence.proxy.async.shared::cta;",
                              "Make this thread's shared-memory stores visible to TMA and "
                              "wgmma.")
bulk_commit = statement("cp.async.bulk.commit_group;", "Close the group of TMA stores.")
bulk_wait_read = literal_statement("cp.async.bulk.wait_group.read %d;",
                                   "Wait until at most N TMA-store groups still read shared "
                                   "memory (their sources may then be overwritten).")
bulk_wait = literal_statement("cp.async.bulk.wait_group %d;",
                              "Wait until at most N TMA-store groups are still in flight "
                              "(their global writes done too: before a kernel ends).")
setmaxnreg_inc = literal_statement("setmaxnreg.inc.sync.aligned.u32 %d;",
                                   "Raise this warpgroup's register limit to N (a consumer).")
setmaxnreg_dec = literal_statement("setmaxnreg.dec.sync.aligned.u32 %d;",
                                   "Lower this warpgroup's register limit to N (a producer).")


def _emit(text, cons, ret=None):
    """The codegen of an intrinsic that passes its arguments to `text` in order."""
    def codegen(context, builder, sig, args):
        return inline_asm(builder, ret or ir.VoidType(), list(args), text, cons)
    return codegen


u32, u64, i32 = types.uint32, types.uint64, types.int32
_INIT = "mbarrier.init.shared::cta.b64 [$0], $1;"
_ARRIVE = "mbarrier.arrive.shared::cta.b64 _, [$0];"
_EXPECT = "mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;"
_TRY_WAIT = ("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2;\n"
             "selp.u32 $0, 1, 0, p;\n}")
_ACQUIRE = "fence.proxy.tensormap::generic.acquire.gpu [$0], 128;"
_LOAD = "cp.async.bulk.tensor.{n}d.shared::cluster.global.mbarrier::complete_tx::bytes " \
    "[$0], [$1, {{{coords}}}], [${bar}];"
_LOAD_2D = _LOAD.format(n=2, coords="$2, $3", bar=4)
_LOAD_3D = _LOAD.format(n=3, coords="$2, $3, $4", bar=5)
# im2col mode (tensormap.encoded_im2col's maps): coordinates of the column's first
# pixel's window corner, innermost first (c, w[, h], n), then the filter tap's 16-bit
# offsets (w[, h]) after the mbarrier
_IM2COL = "cp.async.bulk.tensor.{n}d.shared::cluster.global.im2col.mbarrier::complete_tx" \
    "::bytes [$0], [$1, {{{coords}}}], [${bar}], {{{offs}}};"
_IM2COL_3D = _IM2COL.format(n=3, coords="$2, $3, $4", bar=6, offs="$5")
_IM2COL_4D = _IM2COL.format(n=4, coords="$2, $3, $4, $5", bar=8, offs="$6, $7")
_STORE_2D = "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [$0, {$1, $2}], [$3];"
_STORE_3D = "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [$0, {$1, $2, $3}], [$4];"
_ST_SHARED = "st.shared.b32 [$0], $1;"
_ST_SHARED_V2F = "st.shared.v2.f32 [$0], {$1, $2};"
_ST_SHARED_V4F = "st.shared.v4.f32 [$0], {$1, $2, $3, $4};"
_BAR_SYNC = "bar.sync $0, $1;"
_BAR_ARRIVE = "bar.arrive $0, $1;"
_REPLACE = "tensormap.replace.tile.global_address.shared::cta.b1024.b64 [$0], $1;"
_COPY_RELEASE = "tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu" \
    ".sync.aligned [$0], [$1], 128;"


@intrinsic
def mbarrier_init(typingctx, bar, count):
    """Initialise the mbarrier at .shared address `bar` for `count` arrivals a phase."""
    return types.void(u32, u32), _emit(_INIT, "r,r,~{memory}")


@intrinsic
def mbarrier_arrive(typingctx, bar):
    """Arrive once on the mbarrier at `bar`."""
    return types.void(u32), _emit(_ARRIVE, "r,~{memory}")


@intrinsic
def mbarrier_arrive_expect_tx(typingctx, bar, nbytes):
    """Arrive and announce `nbytes` that TMA copies will complete on this barrier."""
    return types.void(u32, u32), _emit(_EXPECT, "r,r,~{memory}")


@intrinsic
def mbarrier_try_wait_parity(typingctx, bar, parity):
    """1 once the barrier's phase of this parity has completed (spin on it), else 0."""
    return u32(u32, u32), _emit(_TRY_WAIT, "=r,r,r,~{memory}", I32)


@intrinsic
def fence_proxy_tensormap_acquire(typingctx, tmap):
    """Acquire a tensor map written to global memory before TMA reads it."""
    return types.void(u64), _emit(_ACQUIRE, "l,~{memory}")


@intrinsic
def tma_load_2d(typingctx, dst, tmap, x, y, bar):
    """Load the box at (x, y) (innermost first) of tensor map `tmap` (a global address)
    into shared memory at .shared address `dst`, completing on the mbarrier at `bar`."""
    return types.void(u32, u64, i32, i32, u32), _emit(_LOAD_2D, "r,l,r,r,r,~{memory}")


@intrinsic
def tma_load_3d(typingctx, dst, tmap, x, y, z, bar):
    """As tma_load_2d for the 3-d box at (x, y, z)."""
    return types.void(u32, u64, i32, i32, i32, u32), _emit(_LOAD_3D, "r,l,r,r,r,r,~{memory}")


@intrinsic
def tma_load_im2col_3d(typingctx, dst, tmap, c, w, n, off_w, bar):
    """Load one im2col column through an im2col map of an (N, W, C) tensor: the map's
    pixels-per-column pixels from the one whose window corner is (n, w), walking w by
    the map's stride inside its bounding box and on into the next n, each at filter
    offset off_w (uint16), channels c .. c + channels-per-pixel; zeros outside the
    tensor. Completes on the mbarrier at `bar`."""
    return types.void(u32, u64, i32, i32, i32, types.uint16, u32), \
        _emit(_IM2COL_3D, "r,l,r,r,r,h,r,~{memory}")


@intrinsic
def tma_load_im2col_4d(typingctx, dst, tmap, c, w, h, n, off_w, off_h, bar):
    """As tma_load_im2col_3d for an (N, H, W, C) tensor: the walk goes along w, then h,
    then n; the tap's offsets (off_w, off_h)."""
    return types.void(u32, u64, i32, i32, i32, i32, types.uint16, types.uint16, u32), \
        _emit(_IM2COL_4D, "r,l,r,r,r,r,h,h,r,~{memory}")


@intrinsic
def tma_store_2d(typingctx, tmap, x, y, src):
    """Store shared memory at `src` to the box at (x, y) of `tmap` (elements past the
    tensor's edge are not written); then bulk_commit, and bulk_wait_read before src is
    overwritten."""
    return types.void(u64, i32, i32, u32), _emit(_STORE_2D, "l,r,r,r,~{memory}")


@intrinsic
def tma_store_3d(typingctx, tmap, x, y, z, src):
    """As tma_store_2d for the 3-d box at (x, y, z)."""
    return types.void(u64, i32, i32, i32, u32), _emit(_STORE_3D, "l,r,r,r,r,~{memory}")


@intrinsic
def st_shared_u32(typingctx, addr, value):
    """Store 4 bytes to .shared address `addr` (a TMA store's staging tile: the swizzled
    address is computed, not an array index)."""
    return types.void(u32, u32), _emit(_ST_SHARED, "r,r,~{memory}")


@intrinsic
def st_shared_v2_f32(typingctx, addr, x, y):
    """Store two float32 (8 bytes, 8-byte aligned) to .shared address `addr` (a float32
    TMA store's staging tile)."""
    return types.void(u32, types.float32, types.float32), _emit(_ST_SHARED_V2F, "r,f,f,~{memory}")


@intrinsic
def st_shared_v4_f32(typingctx, addr, x, y, z, w):
    """Store four float32 (16 bytes, 16-byte aligned) to .shared address `addr`."""
    f = types.float32
    return types.void(u32, f, f, f, f), _emit(_ST_SHARED_V4F, "r,f,f,f,f,~{memory}")


@intrinsic
def bar_sync(typingctx, barrier, count):
    """Named barrier `barrier` (1-15; 0 is syncthreads') for `count` threads (a multiple
    of 32): one warpgroup waits for its own 128 threads, not the block."""
    return types.void(u32, u32), _emit(_BAR_SYNC, "r,r,~{memory}")


@intrinsic
def bar_arrive(typingctx, barrier, count):
    """Arrive at named barrier `barrier` for `count` threads without waiting: with
    bar_sync by another warpgroup, one warpgroup signals the other (FA3's ping-pong)."""
    return types.void(u32, u32), _emit(_BAR_ARRIVE, "r,r,~{memory}")


@intrinsic
def tensormap_replace_address(typingctx, smap, address):
    """Set the base address of the tensor map held at .shared `smap` (its 128 bytes
    copied there, 128-byte aligned) to the global `address`."""
    return types.void(u32, u64), _emit(_REPLACE, "r,l,~{memory}")


@intrinsic
def tensormap_copy_release(typingctx, gmap, smap):
    """Copy the tensor map at .shared `smap` to global `gmap` (128-byte aligned) and
    release it to the tensor-map proxy at GPU scope; every lane of the warp executes
    it together (.sync.aligned). The TMA-issuing thread then acquires it
    (fence_proxy_tensormap_acquire) before its first copy through it."""
    return types.void(u64, u32), _emit(_COPY_RELEASE, "l,r,~{memory}")


for _f, _t in ((mbarrier_init, _INIT), (mbarrier_arrive, _ARRIVE),
               (mbarrier_arrive_expect_tx, _EXPECT), (mbarrier_try_wait_parity, _TRY_WAIT),
               (fence_proxy_tensormap_acquire, _ACQUIRE), (tma_load_2d, _LOAD_2D),
               (tma_load_3d, _LOAD_3D), (tma_load_im2col_3d, _IM2COL_3D),
               (tma_load_im2col_4d, _IM2COL_4D), (tma_store_2d, _STORE_2D), (tma_store_3d, _STORE_3D),
               (st_shared_u32, _ST_SHARED), (st_shared_v2_f32, _ST_SHARED_V2F),
               (st_shared_v4_f32, _ST_SHARED_V4F),
               (bar_sync, _BAR_SYNC), (bar_arrive, _BAR_ARRIVE),
               (tensormap_replace_address, _REPLACE), (tensormap_copy_release, _COPY_RELEASE)):
    _f.__doc__ += f"\n\nPTX: `{_t}`"

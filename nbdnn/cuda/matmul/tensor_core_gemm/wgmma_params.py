"""The wgmma GEMM kernel's parameters (wgmma_gemm.py): its signatures, the names its
generated source binds, and the prologue of blocks that make their own tensor maps
(wgmma_gemm.OWN_MAPS).

Own maps: the host encodes each operand's tensor map once per geometry at a stand-in
address (a template); the kernel takes the two templates, a and b, and a workspace of
two 128-byte slots a block. Warp 0 of each block copies the templates to shared
memory, sets their base addresses (tensormap.replace), and copies them to its slots
released to the tensor-map proxy (tensormap.cp_fenceproxy); the producer acquires them
(fence.proxy.tensormap) before its first TMA copy. So a call with new tensors encodes
and uploads nothing, and an eager call plan can replay it (its pointers move; host-
encoded maps hold addresses, which made those calls unplannable).
"""

from numba import types

from ...runtime.memory.arrays import dtype_name, ptr
from ...tensorcore import cluster
from ...tensorcore.asm import gmem_address
from ...tensorcore.mma import cvt_bf16x2, cvt_f16x2, unpack_bf16x2, unpack_f16x2, \
    widen_bf16, widen_f16
from ...tensorcore.tiles import SOURCE_NAMES
from ...tensorcore.tma import bar_sync, bulk_commit, bulk_wait, bulk_wait_read, \
    mbarrier_arrive, setmaxnreg_dec, setmaxnreg_inc, st_shared_u32, st_shared_v2_f32, \
    st_shared_v4_f32, tensormap_copy_release, tensormap_replace_address, tma_load_3d, \
    tma_load_im2col_4d, tma_store_3d
from ...tensorcore.wgmma import wgmma

SIG = ("void(uint64, uint64, uint32[::1], uint16[::1], int32[::1], int64, int64, int64, "
       "int64, int64, float32, float32, float32, int64)")
SIG_PARTIAL = SIG.replace("uint32[::1]", "float32[::1]")
SIG_TF32 = SIG_PARTIAL.replace("uint16[::1]", "float32[::1]")  # (c and bias float32)


def signature(kind, partial, own_maps=False, store=False, z=False, odd=False):
    """The kernel's one signature: c packed 16-bit pairs (uint32; odd: 16-bit elements,
    uint16), bias 16-bit bits;
    partial (split-K's chunks) and tf32: c float32; tf32: bias float32. store (TMA
    stores of C, staged_store.py): a third map, C's. own_maps: the map addresses become
    the templates, then a, b and the blocks' map slots. z: a convolution's z after c
    (16-bit pairs, as c)."""
    sig = SIG_TF32 if kind == "tf32" else SIG_PARTIAL if partial else SIG
    if odd:
        sig = sig.replace("uint32[::1]", "uint16[::1]", 1)
    if z:
        sig = sig.replace("uint32[::1], ", "uint32[::1], uint32[::1], ", 1)
    maps = "uint64, uint64, uint64, " if store else "uint64, uint64, "
    if own_maps:
        t = "float32" if kind == "tf32" else "uint16"
        return sig.replace("void(uint64, uint64, ", "void(" + maps.replace("uint64", "uint64[::1]")
                           + f"{t}[::1], {t}[::1], int64[::1], ")
    return sig.replace("void(uint64, uint64, ", "void(" + maps)


def slot_words(store):
    """uint64 words of a block's map slots: 16 (128 B) a map."""
    return 48 if store else 32


def own_maps_lines(store=False):
    """Own maps' prologue: warp 0 copies the templates (16 x 8 B each) to shared memory,
    lane 0 sets their base addresses to a's, b's (and c's), and the warp copies them to
    this block's slots, released to the tensor-map proxy (map_a, map_b, map_c: their
    global addresses; the threads that issue TMA through them acquire them below)."""
    n = slot_words(store)
    L = [f"    own = cuda.shared.array({n}, types.uint64, alignment=128)",
         "    if tid < 32:",
         "        own[tid] = tmpl_a[tid] if tid < 16 else tmpl_b[tid - 16]"] + \
        (["        if tid < 16:", "            own[32 + tid] = tmpl_c[tid]"] if store else []) + [
         "        cuda.syncwarp()",
         "        if tid == 0:",
         "            tensormap_replace_address(smem_address(own, 0), gmem_address(a, 0))",
         "            tensormap_replace_address(smem_address(own, 16), gmem_address(b, 0))"] + \
        (["            tensormap_replace_address(smem_address(own, 32), gmem_address(c, 0))"]
         if store else []) + [
         "        cuda.syncwarp()",
         f"        slot = gmem_address(slots, {n} * cuda.blockIdx.x)",
         "        tensormap_copy_release(slot, smem_address(own, 0))",
         "        tensormap_copy_release(slot + 128, smem_address(own, 16))"] + \
        (["        tensormap_copy_release(slot + 256, smem_address(own, 32))"] if store else [])
    return L


def map_lines(own_maps, indent, store=False, names=("map_a", "map_b")):
    """Own maps: the thread about to use a map computes its address (no other thread
    keeps it live): map_a and map_b (the producer), or map_c (+256 B; a consumer)."""
    if not own_maps:
        return []
    slot = f"gmem_address(slots, {slot_words(store)} * cuda.blockIdx.x)"
    if names == ("map_c",):
        return [f"{indent}map_c = {slot} + 256"]
    return [f"{indent}map_a = {slot}", f"{indent}map_b = map_a + 128"]


def namespace(kind, nw, a_k, b_k, act_f):
    """The names the generated kernel binds: the intrinsics, the wgmma of a consumer's
    nw columns for the operand majors, kind's conversions, the fused activation."""
    bf = kind == "bf16"
    return dict(SOURCE_NAMES, I=types.int64, I32=types.int32, U32=types.uint32, U16=types.uint16,
                tma_load_im2col_4d=tma_load_im2col_4d,
                F32=types.float32, mma=wgmma(nw, kind, int(not b_k), int(not a_k)),
                mbarrier_arrive=mbarrier_arrive, tma_load_3d=tma_load_3d,
                setmaxnreg_dec=setmaxnreg_dec, setmaxnreg_inc=setmaxnreg_inc,
                gmem_address=gmem_address, tensormap_replace_address=tensormap_replace_address,
                tensormap_copy_release=tensormap_copy_release, tma_store_3d=tma_store_3d,
                st_shared_u32=st_shared_u32, st_shared_v2_f32=st_shared_v2_f32,
                st_shared_v4_f32=st_shared_v4_f32, bar_sync=bar_sync, bulk_commit=bulk_commit,
                bulk_wait_read=bulk_wait_read, bulk_wait=bulk_wait,
                cvt=cvt_bf16x2 if bf else cvt_f16x2,
                widen=widen_bf16 if bf else widen_f16 if kind == "f16" else types.float32,
                unpack=unpack_bf16x2 if bf else unpack_f16x2, act_f=act_f,
                **{n: getattr(cluster, n) for n in (
                    "cluster_dims", "barrier_cluster_arrive", "barrier_cluster_wait",
                    "fence_mbarrier_init_cluster", "mapa_shared", "ld_shared_cluster_v4_f32",
                    "mbarrier_arrive_cluster", "mbarrier_try_wait_parity_cluster")})


def usable(a, b, c, trans_a, trans_b, M, N, K, odd=False):
    """Whether this kernel can run op(a) @ op(b) into c (sm_90 checked by the caller):
    TMA needs 16-byte row strides and 16-byte aligned bases; 16-bit C even N and 4-byte
    alignment (pair stores), or odd: any N and C (its elements stored one by one); tf32
    (float32) both operands K-major."""
    if dtype_name(a) == "float32":
        return K > 0 and not trans_a and trans_b and K % 4 == 0 and ptr(a) % 16 == 0 and \
            ptr(b) % 16 == 0
    return K > 0 and operands_aligned(a, b, trans_a, trans_b, M, N, K) and \
        (odd or pairs_fit(c, N))


def operands_aligned(a, b, trans_a, trans_b, M, N, K):
    """Both 16-bit operands' rows 16-byte multiples and bases 16-byte aligned (TMA)."""
    inner_a, inner_b = (M if trans_a else K), (K if trans_b else N)
    return inner_a % 8 == 0 and inner_b % 8 == 0 and ptr(a) % 16 == 0 and ptr(b) % 16 == 0


def pairs_fit(c, N):
    """16-bit C can be stored as 4-byte pairs: N even, C 4-byte aligned."""
    return N % 2 == 0 and ptr(c) % 4 == 0

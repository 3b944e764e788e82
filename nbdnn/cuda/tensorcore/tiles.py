"""One-tile kernels that use every tensor-core intrinsic: the PTX test compiles them
(ptx_examples), tests/test_tensorcore.py runs them on a GPU against NumPy. They are the
smallest correct use of each piece, the pattern the GEMM, convolution and attention
kernels build on; none is fast.

- mma_tile_f16 / _bf16 (one warp): A 16x16 and B^T 8x16 (16-bit bits as uint16) by
  cp.async into shared memory, ldmatrix.x4 / .x2, one mma.sync m16n8k16 -> D 16x8 f32.
- mma_tile_tf32 (one warp): A 16x8, B^T 8x8 float32 from global into the fragment
  layout (mma.py), cvt to tf32, one mma.sync m16n8k8.
- wgmma_tile_<kind>_n<N> (one warpgroup): A 64xK and B^T NxK in core-matrix order
  (no swizzle; K = 16, tf32 8) copied to shared memory, one wgmma -> D 64xN.
- tma_wgmma_tile_<kind>_n<N> (one warpgroup): A 64x64 and B^T Nx64 (K-major) loaded by
  TMA with the 128-byte swizzle, then four k-steps of wgmma m64nNk16 whose descriptors
  advance 32 bytes along K inside the swizzled rows: the main loop of a GEMM stage.
- tma_copy (one thread issues): a box loaded by TMA into shared memory, stored by TMA
  into another tensor.
- cluster_swap (clusters of 2 blocks of 32 threads, the shape fixed at compile time):
  each block stages its 32 values in shared memory, and after a cluster barrier reads
  its partner's through distributed shared memory (mapa + ld.shared::cluster).
"""
from numba import cuda, types

from ..runtime.launch.codegen import compile_source
from ..runtime.launch.kernel import Kernel
from .asm import smem_address
from .cluster import barrier_cluster_arrive, barrier_cluster_wait, cluster_ctarank, \
    cluster_dims, ld_shared_cluster_f32, mapa_shared
from .copy import cp_async_16, cp_async_commit, cp_async_wait_all
from .mma import cvt_tf32, ldmatrix_x2, ldmatrix_x4, mma_bf16, mma_f16, mma_tf32
from .tma import bulk_commit, bulk_wait_read, fence_proxy_async, \
    fence_proxy_tensormap_acquire, mbarrier_arrive_expect_tx, mbarrier_init, \
    mbarrier_try_wait_parity, tma_load_2d, tma_store_2d
from .wgmma import SWIZZLE, descriptor, wgmma, wgmma_commit, wgmma_fence, wgmma_wait

u16, f32 = types.uint16, types.float32
SIG_16 = "void(uint16[::1], uint16[::1], float32[::1])"
SIG_32 = "void(float32[::1], float32[::1], float32[::1])"


def _mma_16bit(mma):
    def mma_tile(a, bt, d):
        """a: A 16x16, bt: B^T 8x16 (rows n, k contiguous), d: D 16x8; one warp."""
        sa = cuda.shared.array(256, u16, alignment=16)
        sb = cuda.shared.array(128, u16, alignment=16)
        lane = cuda.threadIdx.x
        cp_async_16(sa, 8 * lane, a, 8 * lane)          # 32 lanes x 16 B = A
        if lane < 16:
            cp_async_16(sb, 8 * lane, bt, 8 * lane)     # 16 lanes x 16 B = B^T
        cp_async_commit()
        cp_async_wait_all()
        cuda.syncwarp()
        m = lane // 8  # the matrix this lane addresses: rows (m % 2) * 8.., cols (m // 2) * 8..
        af = ldmatrix_x4(sa, ((m % 2) * 8 + lane % 8) * 16 + (m // 2) * 8)
        bf = ldmatrix_x2(sb, (lane % 8) * 16 + ((lane // 8) % 2) * 8)
        c = mma(af, bf, (f32(0), f32(0), f32(0), f32(0)))
        g, t = lane // 4, lane % 4
        d[g * 8 + 2 * t] = c[0]
        d[g * 8 + 2 * t + 1] = c[1]
        d[(g + 8) * 8 + 2 * t] = c[2]
        d[(g + 8) * 8 + 2 * t + 1] = c[3]
    return mma_tile


def mma_tile_tf32(a, bt, d):
    """a: A 16x8, bt: B^T 8x8 float32, d: D 16x8; one warp, fragments from global."""
    lane = cuda.threadIdx.x
    g, t = lane // 4, lane % 4
    af = (cvt_tf32(a[g * 8 + t]), cvt_tf32(a[(g + 8) * 8 + t]), cvt_tf32(a[g * 8 + t + 4]),
          cvt_tf32(a[(g + 8) * 8 + t + 4]))
    bf = (cvt_tf32(bt[g * 8 + t]), cvt_tf32(bt[g * 8 + t + 4]))
    c = mma_tf32(af, bf, (f32(0), f32(0), f32(0), f32(0)))
    d[g * 8 + 2 * t] = c[0]
    d[g * 8 + 2 * t + 1] = c[1]
    d[(g + 8) * 8 + 2 * t] = c[2]
    d[(g + 8) * 8 + 2 * t + 1] = c[3]


def _store_lines(N, ind="    "):
    """Generated stores of the accumulators d (64xN row-major at d_out, layout in wgmma.py)."""
    lines = [f"{ind}i = cuda.threadIdx.x", f"{ind}r = 16 * (i // 32) + (i % 32) // 4",
             f"{ind}c = 2 * (i % 4)"]
    for j in range(N // 8):
        lines += [f"{ind}d_out[r * {N} + c + {8 * j}] = d[{4 * j}]",
                  f"{ind}d_out[r * {N} + c + {8 * j + 1}] = d[{4 * j + 1}]",
                  f"{ind}d_out[(r + 8) * {N} + c + {8 * j}] = d[{4 * j + 2}]",
                  f"{ind}d_out[(r + 8) * {N} + c + {8 * j + 1}] = d[{4 * j + 3}]"]
    return lines


def _wgmma_source(N, kind):
    """One wgmma from core-matrix-ordered operands (no swizzle): 2 core matrices along K,
    so the leading byte offset is 128 and the stride byte offset 256."""
    elem = "u16" if kind != "tf32" else "f32"
    per_row = 16 if kind != "tf32" else 8  # elements of K a row
    name = f"wgmma_tile_{kind}_n{N}"
    src = [f"def {name}(a, bt, d_out):",
           f"    sa = cuda.shared.array({64 * per_row}, {elem}, alignment=128)",
           f"    sb = cuda.shared.array({N * per_row}, {elem}, alignment=128)",
           f"    for k in range(cuda.threadIdx.x, {64 * per_row}, 128):", "        sa[k] = a[k]",
           f"    for k in range(cuda.threadIdx.x, {N * per_row}, 128):", "        sb[k] = bt[k]",
           "    fence_proxy_async()", "    cuda.syncthreads()",
           "    da = descriptor(smem_address(sa, 0), 128, 256, 0)",
           "    db = descriptor(smem_address(sb, 0), 128, 256, 0)",
           "    d = (" + "f32(0), " * (N // 2) + ")", "    wgmma_fence()",
           "    d = mma(da, db, d, 0)", "    wgmma_commit()", "    wgmma_wait(0)"]
    return name, "\n".join(src + _store_lines(N)) + "\n"


def _tma_wgmma_source(N, kind):
    """A 64x64 and B^T Nx64 by TMA (128-byte swizzle: a row of 64 16-bit values is one
    128-byte swizzled row; 8 rows an atom, so the stride byte offset is 1024), then four
    wgmma k-steps, the descriptor's address advanced 32 bytes (16 elements) a step."""
    name = f"tma_wgmma_tile_{kind}_n{N}"
    src = [f"def {name}(map_a, map_b, d_out):",
           "    sa = cuda.shared.array(4096, u16, alignment=1024)",
           f"    sb = cuda.shared.array({N * 64}, u16, alignment=1024)",
           "    bar = cuda.shared.array(1, types.uint64, alignment=8)",
           "    b = smem_address(bar, 0)",
           "    if cuda.threadIdx.x == 0:",
           "        fence_proxy_tensormap_acquire(map_a)",
           "        fence_proxy_tensormap_acquire(map_b)",
           "        mbarrier_init(b, 1)", "        fence_proxy_async()",
           "    cuda.syncthreads()",
           "    if cuda.threadIdx.x == 0:",
           f"        mbarrier_arrive_expect_tx(b, {(64 + N) * 128})",
           "        tma_load_2d(smem_address(sa, 0), map_a, 0, 0, b)",
           "        tma_load_2d(smem_address(sb, 0), map_b, 0, 0, b)",
           "    while mbarrier_try_wait_parity(b, 0) == 0:", "        pass",
           "    d = (" + "f32(0), " * (N // 2) + ")", "    wgmma_fence()"]
    for ks in range(4):
        src += [f"    da = descriptor(smem_address(sa, 0) + {32 * ks}, 16, 1024, SW128)",
                f"    db = descriptor(smem_address(sb, 0) + {32 * ks}, 16, 1024, SW128)",
                f"    d = mma(da, db, d, {int(ks > 0)})"]
    src += ["    wgmma_commit()", "    wgmma_wait(0)"]
    return name, "\n".join(src + _store_lines(N)) + "\n"


def tma_copy(map_src, map_dst, x, y):
    """The 64x16 16-bit box at (x, y) of map_src, through shared memory, to map_dst."""
    s = cuda.shared.array(1024, u16, alignment=128)
    bar = cuda.shared.array(1, types.uint64, alignment=8)
    b = smem_address(bar, 0)
    if cuda.threadIdx.x == 0:
        fence_proxy_tensormap_acquire(map_src)
        fence_proxy_tensormap_acquire(map_dst)
        mbarrier_init(b, 1)
        fence_proxy_async()
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        mbarrier_arrive_expect_tx(b, 2048)
        tma_load_2d(smem_address(s, 0), map_src, x, y, b)
    while mbarrier_try_wait_parity(b, 0) == 0:
        pass
    if cuda.threadIdx.x == 0:
        tma_store_2d(map_dst, x, y, smem_address(s, 0))
        bulk_commit()
        bulk_wait_read(0)


def cluster_swap(x, y):
    """y[32 b + t] = x[32 (b ^ 1) + t] for block b of a 2-block cluster: the partner's
    value, read from its shared memory. x, y: 32 values a block."""
    cluster_dims(2, 1, 1)
    s = cuda.shared.array(32, f32)
    t = cuda.threadIdx.x
    b = cuda.blockIdx.x
    s[t] = x[32 * b + t]
    barrier_cluster_arrive()  # (release: s written; acquire below: the partner's too)
    barrier_cluster_wait()
    y[32 * b + t] = ld_shared_cluster_f32(mapa_shared(smem_address(s, t),
                                                      cluster_ctarank() ^ 1))
    barrier_cluster_arrive()  # the partner has read s before this block exits
    barrier_cluster_wait()


# the names generated tensor-core sources run in (matmul/tensor_core_gemm/wgmma_gemm.py adds its own)
SOURCE_NAMES = {"cuda": cuda, "types": types, "u16": u16, "f32": f32, "smem_address": smem_address,
       "descriptor": descriptor, "wgmma_fence": wgmma_fence, "wgmma_commit": wgmma_commit,
       "wgmma_wait": wgmma_wait, "fence_proxy_async": fence_proxy_async,
       "fence_proxy_tensormap_acquire": fence_proxy_tensormap_acquire,
       "mbarrier_init": mbarrier_init, "mbarrier_arrive_expect_tx": mbarrier_arrive_expect_tx,
       "mbarrier_try_wait_parity": mbarrier_try_wait_parity, "tma_load_2d": tma_load_2d,
       "SW128": SWIZZLE["128B"]}
WGMMA_N = (8, 64, 256)
KERNELS = {}


def _build():
    KERNELS["mma_tile_f16"] = Kernel(_mma_16bit(mma_f16), [SIG_16])
    KERNELS["mma_tile_bf16"] = Kernel(_mma_16bit(mma_bf16), [SIG_16])
    KERNELS["mma_tile_tf32"] = Kernel(mma_tile_tf32, [SIG_32])
    for kind in ("f16", "bf16", "tf32"):
        for N in WGMMA_N:
            name, src = _wgmma_source(N, kind)
            fn = compile_source(name, src, dict(SOURCE_NAMES, mma=wgmma(N, kind)), about={
                "what": f"one wgmma m64n{N} {kind} from core-matrix-ordered shared memory"})
            KERNELS[name] = Kernel(fn, [SIG_32 if kind == "tf32" else SIG_16], arch="sm_90a")
    for kind in ("f16", "bf16"):
        for N in (64, 256):
            name, src = _tma_wgmma_source(N, kind)
            fn = compile_source(name, src, dict(SOURCE_NAMES, mma=wgmma(N, kind)), about={
                "what": f"TMA (128-byte swizzle) then 4 wgmma k-steps, m64n{N}k64 {kind}"})
            KERNELS[name] = Kernel(fn, ["void(uint64, uint64, float32[::1])"], arch="sm_90a")
    KERNELS["tma_copy"] = Kernel(tma_copy, ["void(uint64, uint64, int32, int32)"],
                                 arch="sm_90a")
    KERNELS["cluster_swap"] = Kernel(cluster_swap, ["void(float32[::1], float32[::1])"],
                                     arch="sm_90a")
    return KERNELS


def kernels():
    """Every tile kernel by name, built on first use."""
    return KERNELS or _build()


ptx_examples = kernels  # (tests/test_ptx.py compiles what this registers)

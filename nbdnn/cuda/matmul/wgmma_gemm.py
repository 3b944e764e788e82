"""Matmul on the tensor cores (sm_90a): wgmma fed by TMA, warp-specialised.

Variant T1, `wgmma_gemm_<f16|bf16>`: C (M x N) = alpha * A (M x K) @ Bt (N x K)^T, with
16-bit A and Bt (float16 or bfloat16, both K-major: rows of K contiguous), float32
accumulation, C in the inputs' dtype. Not yet wired into nbdnn.matmul (issue 23): the
GPU tests and perf/experiments/wgmma_gemm.py drive it directly.

A block computes a BM x BN = 128 x 256 tile of C with three warpgroups (384 threads):

    warpgroup 0, producer    one thread: for each k-tile of BK = 64, wait until stage
                             s = kt % S is free (empty[s]), announce 48 KB on full[s]
                             and issue two TMA loads: A 128 x 64 (16 KB), Bt 256 x 64
                             (32 KB), 128-byte swizzle. setmaxnreg.dec to 40 registers.
    warpgroups 1, 2,         each owns 64 rows of the tile. For each k-tile: wait full[s],
    consumers                four wgmma m64n256k16 (the descriptors step 32 bytes along K
                             inside the swizzled 128-byte rows), commit, wait, release the
                             stage (one arrive a warpgroup: empty[s] counts 2).
                             setmaxnreg.inc to 232 (128 accumulators a thread).
    epilogue                 each consumer scales its 64 x 256 accumulators by alpha,
                             packs pairs (cvt.rn.{f16,bf16}x2) and stores 4 bytes at a
                             time straight to C, rows and columns bounds-checked.

Shared memory (dynamic, 1024-byte aligned for the swizzle atom): S = 4 stages of
A 16 KB + Bt 32 KB = 192 KB; the 2 S mbarriers are static. Registers: 384 threads at
the launch's 168 (65 536 / 384), then 40 / 232 / 232 after setmaxnreg.

Per k-tile a block loads (128 + 256) x 64 x 2 = 48 KB and does 2 x 128 x 256 x 64 =
4.2 MFLOP: 85 flop a byte from L2 (the H200's 16-bit ridge is ~206 flop a byte of
DRAM; neighbouring tiles share A and Bt through the 60 MB L2).

Tails: TMA fills out-of-bounds box elements with zeros (M, N and K tails cost nothing
in the main loop); the epilogue skips rows >= M and columns >= N. Limits (the
launcher's callers check them): K % 8 == 0 (TMA wants 16-byte row strides), N even
(pair stores), 16-byte aligned A and Bt.
"""
import functools

from numba import types

from ..runtime.codegen import compile_source
from ..runtime.launch import Kernel
from ..tensorcore.mma import cvt_bf16x2, cvt_f16x2
from ..tensorcore.tensormap import tensor_map
from ..tensorcore.tiles import SOURCE_NAMES
from ..tensorcore.tma import mbarrier_arrive, setmaxnreg_dec, setmaxnreg_inc
from ..tensorcore.wgmma import wgmma

BM, BN, BK, STAGES = 128, 256, 64, 4
A_BYTES, B_BYTES = BM * BK * 2, BN * BK * 2
STAGE_BYTES = A_BYTES + B_BYTES
SHARED = STAGES * STAGE_BYTES + 1024           # + the alignment slack
THREADS, MAX_REGS = 384, 168
KINDS = {"float16": "f16", "bfloat16": "bf16"}


def source(kind):
    """The kernel's source for kind "f16" or "bf16" (the epilogue's stores written out:
    accumulator j of a thread is literal, so the 128 stay in registers)."""
    name = f"wgmma_gemm_{kind}"
    # (the 128 zeros in a device function of their own: numba's bytecode peephole for
    # long tuple literals fails inside the kernel's branches)
    L = ["@cuda.jit(device=True)", "def zero_acc():",
         "    return (" + "F32(0), " * (BN // 2) + ")", "", "",
         f"def {name}(map_a, map_b, c, M, N, K, alpha):",
         "    smem = cuda.shared.array(0, types.uint8)",
         f"    bars = cuda.shared.array({2 * STAGES}, types.uint64, alignment=8)",
         "    tid = cuda.threadIdx.x",
         "    wg = tid // 128",
         "    base = (I(smem_address(smem, 0)) + 1023) & ~1023  # the swizzle atom's alignment",
         "    full0 = I(smem_address(bars, 0))             # full[s] at +8 s, empty[s] at +8 (S + s)",
         f"    empty0 = full0 + {8 * STAGES}",
         f"    m0 = cuda.blockIdx.y * {BM}",
         f"    n0 = cuda.blockIdx.x * {BN}",
         f"    ktiles = (K + {BK - 1}) // {BK}",
         "    if tid == 0:",
         "        fence_proxy_tensormap_acquire(map_a)",
         "        fence_proxy_tensormap_acquire(map_b)",
         f"        for s in range({STAGES}):",
         "            mbarrier_init(U32(full0 + 8 * s), 1)",
         "            mbarrier_init(U32(empty0 + 8 * s), 2)",
         "        fence_proxy_async()  # the initialised barriers, visible to TMA",
         "    cuda.syncthreads()",
         "    if wg == 0:",
         "        setmaxnreg_dec(40)",
         "        if tid == 0:",
         "            for kt in range(ktiles):",
         f"                s = kt % {STAGES}",
         f"                ph = (kt // {STAGES}) & 1",
         "                while mbarrier_try_wait_parity(U32(empty0 + 8 * s), U32(ph ^ 1)) == 0:",
         "                    pass",
         f"                mbarrier_arrive_expect_tx(U32(full0 + 8 * s), {STAGE_BYTES})",
         f"                sa = base + s * {STAGE_BYTES}",
         f"                tma_load_2d(U32(sa), map_a, I32(kt * {BK}), I32(m0), U32(full0 + 8 * s))",
         f"                tma_load_2d(U32(sa + {A_BYTES}), map_b, I32(kt * {BK}), I32(n0), "
         "U32(full0 + 8 * s))",
         "    else:",
         "        setmaxnreg_inc(232)",
         "        w = wg - 1",
         "        d = zero_acc()",
         "        for kt in range(ktiles):",
         f"            s = kt % {STAGES}",
         f"            ph = (kt // {STAGES}) & 1",
         "            while mbarrier_try_wait_parity(U32(full0 + 8 * s), U32(ph)) == 0:",
         "                pass",
         f"            sa = base + s * {STAGE_BYTES} + w * {64 * BK * 2}",
         f"            sb = base + s * {STAGE_BYTES} + {A_BYTES}",
         "            wgmma_fence()"]
    for ks in range(BK // 16):  # 16 elements of K = 32 bytes of a swizzled row
        L += [f"            d = mma(descriptor(sa + {32 * ks}, 16, 1024, SW128), "
              f"descriptor(sb + {32 * ks}, 16, 1024, SW128), d, 1)"]
    L += ["            wgmma_commit()", "            wgmma_wait(0)",
          "            if tid % 128 == 0:", "                mbarrier_arrive(U32(empty0 + 8 * s))",
          "        i = tid % 128",
          "        r = m0 + w * 64 + 16 * (i // 32) + (i % 32) // 4",
          "        cb = n0 + 2 * (i % 4)",
          "        a = F32(alpha)"]
    for j in range(BN // 8):
        for half, rr in ((0, "r"), (2, "(r + 8)")):
            L += [f"        if {rr} < M and cb + {8 * j} < N:",
                  f"            c[({rr} * N + cb + {8 * j}) // 2] = cvt(a * d[{4 * j + half}], "
                  f"a * d[{4 * j + half + 1}])"]
    return name, "\n".join(L) + "\n"


@functools.lru_cache(maxsize=None)
def kernel(dtype):
    """(Kernel, signature) for dtype "float16" or "bfloat16"."""
    kind = KINDS[dtype]
    name, src = source(kind)
    ns = dict(SOURCE_NAMES, I=types.int64, I32=types.int32, U32=types.uint32,
              F32=types.float32, mma=wgmma(BN, kind), mbarrier_arrive=mbarrier_arrive,
              setmaxnreg_dec=setmaxnreg_dec, setmaxnreg_inc=setmaxnreg_inc,
              cvt=cvt_bf16x2 if kind == "bf16" else cvt_f16x2)
    fn = compile_source(name, src, ns, about={
        "config": f"{dtype}: tile {BM}x{BN}x{BK}, {STAGES} stages, 1 producer + 2 consumer "
                  "warpgroups, wgmma m64n256k16, TMA 128-byte swizzle",
        "traffic": f"a k-tile: {STAGE_BYTES} B in, {2 * BM * BN * BK} flops",
        "why": "variant T1 (module docstring): the first tensor-core GEMM"})
    sig = "void(uint64, uint64, uint32[::1], int64, int64, int64, float32)"
    return Kernel(fn, [sig], arch="sm_90a", shared_bytes=SHARED, max_registers=MAX_REGS), sig


def ptx_examples():
    """Both dtypes' kernels (tests/test_ptx.py compiles them for sm_90a)."""
    for dtype in KINDS:
        kernel(dtype)


def gemm(a, bt, c32, M, N, K, alpha, dtype, stream=0):
    """c = alpha * a @ bt^T: a (M, K) and bt (N, K) C-contiguous 16-bit device arrays of
    `dtype`; c32 the (M, N) output viewed as M * N / 2 uint32. K % 8 == 0, N even."""
    from ..runtime.arrays import ptr
    tmap_a = tensor_map(ptr(a), (M, K), dtype, (BM, BK), "128B")
    tmap_b = tensor_map(ptr(bt), (N, K), dtype, (BN, BK), "128B")
    k, sig = kernel(dtype)
    k.launch(sig, (-(-N // BN), -(-M // BM), 1), THREADS, stream, tmap_a, tmap_b, c32, M, N,
             K, alpha, shmem=SHARED)

"""Matmul on the tensor cores of sm_80-sm_89 (Ampere, Ada): mma.sync + ldmatrix +
cp.async, for float16 / bfloat16 where wgmma (wgmma_gemm.py, sm_90) does not exist.

C[z] (M x N) = epilogue(op(A[za]) @ op(B[zb])) with float32 accumulation, the same
contract, operand majors, batch table and fused epilogue as wgmma_gemm (its `usable`
limits too: 16-byte rows and bases, N even). Variant M1, correct first:

    block   BM x BN = 128 x 128 of C, 8 warps (256 threads) as 2 (m) x 4 (n), each a
            64 x 32 warp tile = 4 x 4 mma.m16n8k16 tiles (64 float32 accumulators a thread)
    stages  2 (double buffer): while stage s is multiplied, cp.async fills stage s ^ 1
            with the next BK = 32 of K; one commit group a k-tile, wait_group 1
    smem    each operand stored in its global major, rows padded so that the 8 rows an
            ldmatrix reads fall in distinct banks:
              K-major  (rows m or n, 32 k):  pitch 40 elements (80 B)   128 x 40 x 2 B
              MN-major (rows k, 128 m or n): pitch 136 elements (272 B)  32 x 136 x 2 B
            A stage 10.0 / 8.5 KB, B the same: at most 40 KB (static, under 48 KB)
    loads   16-byte cp.async chunks, 2 a thread an operand a k-tile; out-of-bounds
            chunks zero-filled (src_bytes 0: rows past M or N, k past K; K and the
            MN-major inner extent are multiples of 8, so a chunk is all in or all out)
    frags   ldmatrix.x4 (K-major A, B^T) or ldmatrix.x4.trans (MN-major): an A 16x16
            tile, or two B 16x8 tiles, a call (mma.py's fragment layouts)

Traffic a block a k-tile: (128 + 128) x 32 x 2 B = 16 KB in, 2 x 128 x 128 x 32 =
1 MFLOP: 64 flop a byte of L2. Not yet measured (no sm_80-89 GPU here; on an sm_90
GPU `nbdnn.cuda.matmul.forced("mma_sync")` runs it, and its GPU test does).
"""
import functools
import math

import numpy as np
from numba import types

from ... import activation as _act
from ...runtime.memory.arrays import dtype_name, ptr
from ...runtime.launch.codegen import compile_source
from ...runtime.launch.kernel import Kernel
from ...tensorcore.copy import cp_async_16_zfill, cp_async_commit, cp_async_wait
from ...tensorcore.mma import cvt_bf16x2, cvt_f16x2, ldmatrix_x4, ldmatrix_x4_trans, \
    mma_bf16, mma_f16, unpack_bf16x2, unpack_f16x2, widen_bf16, widen_f16
from ..batches import table as batch_table
from .epilogue.pairs import pair_lines

BM, BN, BK, THREADS = 128, 128, 32, 256
WM, WN = 2, 4                      # warps along m and n
MT, NT = BM // WM // 16, BN // WN // 8  # mma tiles a warp: 4 (m16) x 4 (n8)
PK, PMN = BK + 8, BM + 8           # padded pitches: K-major rows, MN-major rows
KINDS = {"float16": "f16", "bfloat16": "bf16"}
SIG = ("void(uint16[::1], uint16[::1], uint32[::1], uint16[::1], int32[::1], int64, int64, "
       "int64, int64, float32, float32, float32)")


def _tile_elems(k_major):
    return (BM * PK) if k_major else (BK * PMN)


def _loads(side, k_major):
    """Lines: this thread's two 16-byte chunks of one operand's k-tile kt into stage
    `st` (rows past R / k past K zero-filled, their source clamped to the base)."""
    arr, off, rows_total, r0 = ("a", "ao", "M", "m0") if side == "a" else ("b", "bo", "N", "n0")
    sm, size = ("sa", _tile_elems(k_major)) if side == "a" else ("sb", _tile_elems(k_major))
    L = []
    for i in range(2):
        q = f"(tid + {i * THREADS})"
        if k_major:   # tile rows: 128 m/n, 4 chunks of 8 k each
            L += [f"row = {r0} + {q} // 4", f"kg = k0 + ({q} % 4) * 8",
                  f"ok = row < {rows_total} and kg < K",
                  f"src = {off} + (row * K + kg if ok else 0)",
                  f"dst = st * {size} + ({q} // 4) * {PK} + ({q} % 4) * 8"]
        else:         # tile rows: 32 k, 16 chunks of 8 m/n each
            L += [f"kg = k0 + {q} // 16", f"col = {r0} + ({q} % 16) * 8",
                  f"ok = kg < K and col < {rows_total}",
                  f"src = {off} + (kg * {rows_total} + col if ok else 0)",
                  f"dst = st * {size} + ({q} // 16) * {PMN} + ({q} % 16) * 8"]
        L += [f"cp_async_16_zfill({sm}, dst, {arr}, src, U32(16 if ok else 0))"]
    return L


def _fragments(side, k_major):
    """Lines: this warp's fragments of k-step kk (0 or 16) from stage `st`: A as
    af{mt} (4 x uint32), B as bf{nt} (2 x uint32)."""
    L = []
    if side == "a":
        for mt in range(MT):
            m = f"wm * {MT * 16} + {mt * 16}"
            if k_major:  # matrix i = lane // 8: rows m + (i % 2) 8, k + (i // 2) 8
                idx = (f"st * {BM * PK} + ({m} + (lane // 8) % 2 * 8 + lane % 8) * {PK} + "
                       f"kk + lane // 16 * 8")
                L += [f"af{mt} = ldmatrix_x4(sa, {idx})"]
            else:        # stored rows k: matrix i at k + (i // 2) 8, m + (i % 2) 8
                idx = (f"st * {BK * PMN} + (kk + lane // 16 * 8 + lane % 8) * {PMN} + "
                       f"{m} + (lane // 8) % 2 * 8")
                L += [f"af{mt} = ldmatrix_x4_trans(sa, {idx})"]
        return L
    for p in range(NT // 2):  # two n8 tiles a call: matrices (n, k lo), (n, k hi), (n+8, ..)
        n = f"wn * {NT * 8} + {p * 16}"
        if k_major:   # stored rows n: matrix i at n + (i // 2) 8, k + (i % 2) 8
            idx = (f"st * {BN * PK} + ({n} + lane // 16 * 8 + lane % 8) * {PK} + "
                   f"kk + (lane // 8) % 2 * 8")
            L += [f"rb = ldmatrix_x4(sb, {idx})"]
        else:         # stored rows k: matrix i at k + (i % 2) 8, n + (i // 2) 8
            idx = (f"st * {BK * PMN} + (kk + (lane // 8) % 2 * 8 + lane % 8) * {PMN} + "
                   f"{n} + lane // 16 * 8")
            L += [f"rb = ldmatrix_x4_trans(sb, {idx})"]
        L += [f"bf{2 * p} = (rb[0], rb[1])", f"bf{2 * p + 1} = (rb[2], rb[3])"]
    return L


def source(kind, a_k, b_k, bias, act, beta):
    """(name, source) of the kernel for kind "f16"/"bf16", operand majors (a_k, b_k:
    K-major or not) and the epilogue (bias, activation, beta: as wgmma_gemm.source)."""
    epi = ("_b" if bias else "") + (f"_{act}" if act else "") + ("_beta" if beta else "")
    name = f"mma_gemm_{kind}_{'k' if a_k else 'm'}{'k' if b_k else 'm'}{epi}"
    acc = [(mt, nt) for mt in range(MT) for nt in range(NT)]
    L = [f"def {name}(a, b, c, bias, offs, M, N, K, nz, alpha, beta, coef):",
         f"    sa = cuda.shared.array({2 * _tile_elems(a_k)}, types.uint16, alignment=16)",
         f"    sb = cuda.shared.array({2 * _tile_elems(b_k)}, types.uint16, alignment=16)",
         "    tid = cuda.threadIdx.x",
         "    lane = tid % 32",
         "    wm = (tid // 32) // 4",
         "    wn = (tid // 32) % 4",
         f"    tn = (N + {BN - 1}) // {BN}",
         f"    m0 = (cuda.blockIdx.x // tn) * {BM}",
         f"    n0 = (cuda.blockIdx.x % tn) * {BN}",
         "    z = cuda.blockIdx.y",
         "    ao = I(offs[2 * z]) * M * K",
         "    bo = I(offs[2 * z + 1]) * K * N",
         "    coff = I(z) * M * N",
         f"    ktiles = (K + {BK - 1}) // {BK}"]
    L += [f"    d{mt}_{nt} = (F32(0), F32(0), F32(0), F32(0))" for mt, nt in acc]
    L += ["    st = 0", "    k0 = 0"] + ["    " + x for x in _loads("a", a_k) + _loads("b", b_k)]
    L += ["    cp_async_commit()",
          "    for kt in range(ktiles):",
          "        st = kt % 2",
          "        if kt + 1 < ktiles:  # the next k-tile into the other stage",
          "            st = (kt + 1) % 2",
          f"            k0 = (kt + 1) * {BK}"]
    L += ["            " + x for x in _loads("a", a_k) + _loads("b", b_k)]
    L += ["            st = kt % 2",
          "        cp_async_commit()  # (empty on the last k-tile: the count stays simple)",
          "        cp_async_wait(1)   # k-tile kt has landed (all but the newest group)",
          "        cuda.syncthreads()"]
    for kk in (0, 16):
        L += [f"        kk = {kk}"] + ["        " + x for x in _fragments("a", a_k) +
                                       _fragments("b", b_k)]
        L += [f"        d{mt}_{nt} = mma(af{mt}, bf{nt}, d{mt}_{nt})" for mt, nt in acc]
    L += ["        cuda.syncthreads()  # stage kt is refilled by the next iteration",
          "    a = F32(alpha)", "    bt = F32(beta)", "    cf = F32(coef)",
          f"    r = m0 + wm * {MT * 16} + lane // 4",
          f"    cb = n0 + wn * {NT * 8} + 2 * (lane % 4)"]
    for nt in range(NT):  # column pair nt: rows r + 16 mt and r + 16 mt + 8
        rows = []
        for mt in range(MT):
            rows += [(f"(r + {16 * mt})", f"d{mt}_{nt}[0]", f"d{mt}_{nt}[1]"),
                     (f"(r + {16 * mt + 8})", f"d{mt}_{nt}[2]", f"d{mt}_{nt}[3]")]
        L += ["    " + x for x in pair_lines(f"cb + {8 * nt}", rows, False, bias, act, beta)]
    return name, "\n".join(L) + "\n"


@functools.lru_cache(maxsize=None)
def kernel(dtype, a_k=True, b_k=True, bias=False, act=None, beta=False):
    """The Kernel for dtype "float16" / "bfloat16", the operand majors and the epilogue
    (built on first use)."""
    from numba import cuda
    kind = KINDS[dtype]
    name, src = source(kind, a_k, b_k, bias, act, beta)
    bf = kind == "bf16"
    ns = dict(cuda=cuda, types=types, I=types.int64, U32=types.uint32, F32=types.float32,
              cp_async_16_zfill=cp_async_16_zfill, cp_async_commit=cp_async_commit,
              cp_async_wait=cp_async_wait, ldmatrix_x4=ldmatrix_x4,
              ldmatrix_x4_trans=ldmatrix_x4_trans, mma=mma_bf16 if bf else mma_f16,
              cvt=cvt_bf16x2 if bf else cvt_f16x2, widen=widen_bf16 if bf else widen_f16,
              unpack=unpack_bf16x2 if bf else unpack_f16x2,
              act_f=_act.device_functions(np.float32)[act][0] if act else None)
    fn = compile_source(name, src, ns, about={
        "config": f"{dtype}: tile {BM}x{BN}x{BK}, 2 stages, 8 warps of 64x32, mma.m16n8k16, "
                  f"A {'K' if a_k else 'MN'}-major, B {'K' if b_k else 'MN'}-major",
        "epilogue": f"bias {bias}, activation {act}, beta {beta}",
        "traffic": f"a k-tile: {(BM + BN) * BK * 2} B in, {2 * BM * BN * BK} flops",
        "why": "variant M1 (module docstring): tensor cores before sm_90"})
    return Kernel(fn, [SIG])


def ptx_examples():
    """Every operand major in bfloat16, float16 K-major, one full epilogue (the PTX
    test compiles them for sm_80 and sm_90)."""
    for a_k in (True, False):
        for b_k in (True, False):
            kernel("bfloat16", a_k, b_k)
    kernel("float16", True, True)
    kernel("bfloat16", True, False, True, "gelu", True)


def gemm(a, b, c, trans_a, trans_b, bias, act, coef, alpha, beta, stream):
    """c = alpha * act(op(a) @ op(b) + bias) + beta * c; 16-bit C-contiguous device
    arrays, wgmma_gemm.usable true (its limits are this kernel's); c (batch..., M, N)."""
    dtype = dtype_name(a)
    ash, bsh = tuple(int(s) for s in a.shape), tuple(int(s) for s in b.shape)
    M, K = (ash[-1], ash[-2]) if trans_a else (ash[-2], ash[-1])
    N = bsh[-2] if trans_b else bsh[-1]
    batch = ash[:-2] if ash[:-2] == bsh[:-2] else tuple(np.broadcast_shapes(ash[:-2], bsh[:-2]))
    nz = math.prod(batch)
    offs = batch_table(ash[:-2], bsh[:-2], batch, dtype=np.int32)
    k = kernel(dtype, not trans_a, bool(trans_b), bias is not None, act, beta != 0)
    tiles = -(-M // BM) * -(-N // BN)
    k.launch(SIG, (tiles, nz, 1), THREADS, stream, (ptr(a), math.prod(ash)),
             (ptr(b), math.prod(bsh)), (ptr(c), nz * M * N // 2),
             (ptr(bias), N) if bias is not None else (ptr(c), 1), offs, M, N, K, nz, alpha,
             beta, coef, owners=(a, b, c) + ((bias,) if bias is not None else ()))
    return c

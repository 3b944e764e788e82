"""Operands for float32's TF32 math modes (nbdnn/_math_mode.py), K-major, for the
tensor cores and the CUDA cores alike.

"tf32" multiplies TF32-rounded copies of A and B (to nearest, ties to even, as TMA
rounds: on the tensor cores an operand that is already K-major skips this pass); "3xtf32" multiplies
[hi(A), hi(A), lo(A)] by [hi(B); lo(B); hi(B)] concatenated along K: one GEMM over 3 K
whose sum is hi*hi + hi*lo + lo*hi, the three products the CPU reference sums (both
are float32 accumulations of the same terms, in another order). The GEMM, its split-K
and its epilogue run unchanged over the rewritten operands.

Layout. x holds op(x) as (nmat, R, K) when its reduction axis is the last (K-major: a
plain A, a transposed B), else as (nmat, K, R) (MN-major: a transposed A, a plain B).
The kernel writes (nmat, R, P * Kp), always K-major: part j of a row (Kp elements) is
lo(x) where bit j of `code` is set, else hi(x); Kp = K rounded up to KPAD, the padding
zeros. K-major rows are what wgmma takes for tf32 (no transpose bits for 32-bit
operands, PTX ISA 9.7.15.5.1) and KPAD x 4 = 16 bytes what TMA needs of a row stride;
zeros times zeros add nothing to the product.

A block moves T x T tiles (rows r, k) through shared memory: read along x's contiguous
axis (k when K-major, r when MN-major), written along k: both coalesced, so the
transpose costs no more than the copy. Traffic: 4 B read and 4 P written an element
(tf32: 8 B, 3xtf32: 16 B; 4096^2: 0.13 / 0.27 GB, 35-70 us at 3.8 TB/s). Measured
measured the first version at 0.72 TB/s (a branch around each load: one load in flight
a thread); the second (unconditional loads, 32 x 32 tiles) at 0.90-0.95 TB/s:
4 elements a thread behind three int64 divisions that found its tile. This one takes
its tile from a 3-D grid (no division) and moves 64 x 64 tiles, 16 loads a thread
issued back to back before any shared store.
"""
import functools
import math

from numba import cuda, float32

from ..runtime.memory.arrays import empty, vector_aligned
from ..runtime.device_code.intrinsics import load4, round_tf32, store4
from ..runtime.launch.kernel import Kernel
from ..runtime.simulator import SIMULATOR

PARTS = {"tf32": ((1, 0), (1, 0)), "3xtf32": ((3, 0b100), (3, 0b010))}  # (P, code): A, B
KPAD = 4
# block (BX, ROWS); a tile T x T, T = BX * CPT: a thread moves CPT columns x RPT rows
BX, ROWS, CPT = (2, 2, 2) if SIMULATOR else (32, 8, 2)
T = BX * CPT                                  # 64: 16 loads in flight a thread
RPT = T // ROWS                               # tile rows a thread
VPT = RPT * CPT                               # values a thread
TILE = (T, T + 1)                             # (+1 column: no shared-memory bank conflicts)


def _make(k_major):
    """The kernel for one operand layout (k_major a compile-time constant: one index
    expression a load, no selects between the two)."""

    def tile_parts(x, out, tile, z, r0, k0, R, K, Kp, P, code):
        """Tile (r0.., k0..) of matrix z: loaded along x's contiguous axis, written
        along k."""
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        # every load unconditional (a tap past the edge reads element 0, then counts
        # as zero) and the loops of constant count: the VPT loads issue back to back
        # (a branch around each load, one in flight a thread, 0.72 TB/s)
        vals = cuda.local.array(VPT, float32)
        for j in range(RPT):
            for u in range(CPT):
                i = ty + j * ROWS                   # along x's strided axis
                c = tx + u * BX                     # along x's contiguous axis
                if k_major:                         # x[z, r0 + i, k0 + c]
                    r, k = r0 + i, k0 + c
                    src = (z * R + r) * K + k
                else:                               # x[z, k0 + i, r0 + c]
                    r, k = r0 + c, k0 + i
                    src = (z * K + k) * R + r
                ok = r < R and k < K
                v = x[src if ok else 0]
                vals[j * CPT + u] = v if ok else float32(0)
        for j in range(RPT):
            for u in range(CPT):
                i = ty + j * ROWS
                c = tx + u * BX
                if k_major:
                    tile[i, c] = vals[j * CPT + u]
                else:
                    tile[c, i] = vals[j * CPT + u]
        cuda.syncthreads()
        for j in range(RPT):
            for u in range(CPT):
                i = ty + j * ROWS
                c = tx + u * BX
                r, k = r0 + i, k0 + c
                if r < R and k < Kp:
                    v = tile[i, c]
                    hi = round_tf32(v)
                    lo = round_tf32(v - hi)
                    dst = (z * R + r) * P * Kp + k
                    for q in range(P):
                        out[dst + q * Kp] = lo if (code >> q) & 1 else hi
        cuda.syncthreads()

    if not SIMULATOR:
        tile_parts = cuda.jit(device=True, inline=True)(tile_parts)

    def tf32_parts(x, out, nmat, R, K, Kp, P, code):
        # grid (k tiles, r tiles, matrices), the last two looped past 65535: no
        # division (a version found its tile by three int64 divisions a thread,
        # ~80 instructions each, against its 4 elements: 0.90-0.95 TB/s)
        tile = cuda.shared.array(TILE, float32)   # tile[r][k]
        k0 = cuda.blockIdx.x * T
        for z in range(cuda.blockIdx.z, nmat, cuda.gridDim.z):
            for r0 in range(cuda.blockIdx.y * T, R, cuda.gridDim.y * T):
                tile_parts(x, out, tile, z, r0, k0, R, K, Kp, P, code)
    return tf32_parts


# Variant 4 (VECTOR; on, H200: the pass of both 4096^2 operands 0.192 ->
# 0.088 ms, 8192^2 0.751 -> 0.323; "tf32" with a plain b 0.82 -> 0.92x cuBLAS TF32 at
# 4096^3, 0.92 -> 0.96 at 8192^3, docs/decisions.md "tf32_gemm"):
# the same 64 x 64 tiles moved 16 bytes at a time, a thread's 4 loads and P stores of
# float4 groups a pass (ld/st.global.v4.f32) where variant 3 moves 4 bytes an
# instruction: a quarter of the memory instructions for the same bytes. Needs x's
# contiguous extent (K when K-major, R when MN-major) a multiple of 4 and x 16-byte
# aligned (out always is: Kp % 4 == 0). Block (VX, VY): VX float4 groups along a tile
# row, VY rows a pass, TV // VY passes.
VECTOR = True
VX, VY = (2, 2) if SIMULATOR else (16, 16)
TV = 4 * VX                                   # 64: the tile's side
PASSES = TV // VY                             # 4 float4 loads in flight a thread
TILE_V4 = (TV, TV + 1)                        # tile[r][k] (+1 column: the banks)
VALS_V4 = 4 * PASSES                          # values a thread


def _make_vector(k_major):
    """Variant 4's kernel for one operand layout (k_major a compile-time constant)."""

    def tile_parts_v4(x, out, tile, z, r0, k0, R, K, Kp, P, code):
        """Tile (r0.., k0..) of matrix z: float4 groups loaded along x's contiguous
        axis, written along k; tile[r][k] either way."""
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        vals = cuda.local.array(VALS_V4, float32)
        for j in range(PASSES):                  # (constant count: loads back to back)
            i = ty + j * VY                      # along x's strided axis
            if k_major:                          # x[z, r0 + i, k0 + 4 tx ..]
                r, k = r0 + i, k0 + 4 * tx
                src = ((z * R + r) * K + k) // 4
            else:                                # x[z, k0 + i, r0 + 4 tx ..]
                r, k = r0 + 4 * tx, k0 + i
                src = ((z * K + k) * R + r) // 4
            ok = r < R and k < K                 # (extent % 4 == 0: a group is in or out)
            v0, v1, v2, v3 = load4(x, src if ok else 0)
            vals[4 * j] = v0 if ok else float32(0)
            vals[4 * j + 1] = v1 if ok else float32(0)
            vals[4 * j + 2] = v2 if ok else float32(0)
            vals[4 * j + 3] = v3 if ok else float32(0)
        for j in range(PASSES):
            i = ty + j * VY
            for q in range(4):
                if k_major:
                    tile[i, 4 * tx + q] = vals[4 * j + q]
                else:
                    tile[4 * tx + q, i] = vals[4 * j + q]
        cuda.syncthreads()
        for j in range(PASSES):
            i = ty + j * VY
            r, k = r0 + i, k0 + 4 * tx
            if r < R and k < Kp:
                h0 = round_tf32(tile[i, 4 * tx])
                h1 = round_tf32(tile[i, 4 * tx + 1])
                h2 = round_tf32(tile[i, 4 * tx + 2])
                h3 = round_tf32(tile[i, 4 * tx + 3])
                dst = ((z * R + r) * P * Kp + k) // 4
                for q in range(P):
                    if (code >> q) & 1:
                        store4(out, dst + q * (Kp // 4), (
                            round_tf32(tile[i, 4 * tx] - h0), round_tf32(tile[i, 4 * tx + 1] - h1),
                            round_tf32(tile[i, 4 * tx + 2] - h2),
                            round_tf32(tile[i, 4 * tx + 3] - h3)))
                    else:
                        store4(out, dst + q * (Kp // 4), (h0, h1, h2, h3))
        cuda.syncthreads()

    if not SIMULATOR:
        tile_parts_v4 = cuda.jit(device=True, inline=True)(tile_parts_v4)

    def tf32_parts_v4(x, out, nmat, R, K, Kp, P, code):
        tile = cuda.shared.array(TILE_V4, float32)
        k0 = cuda.blockIdx.x * TV
        for z in range(cuda.blockIdx.z, nmat, cuda.gridDim.z):
            for r0 in range(cuda.blockIdx.y * TV, R, cuda.gridDim.y * TV):
                tile_parts_v4(x, out, tile, z, r0, k0, R, K, Kp, P, code)
    return tf32_parts_v4


@functools.lru_cache(maxsize=None)
def _kernel(k_major, vector=False):
    if vector:
        opts = {} if SIMULATOR else {"max_registers": 80}
        k = Kernel(_make_vector(k_major), [
            "void(float32[::1], float32[::1], int64, int64, int64, int64, int64, int64)"], **opts)
        k.name = f"tf32_parts_v4_{'k' if k_major else 'mn'}"
        return k
    return _kernel_v3(k_major)


def _kernel_v3(k_major):
    # registers (nvJitLink, sm_90): uncapped 114 (K-major) / 134 (MN-major), one or two
    # blocks an SM; capped at 80 / 96 without spilling (MN-major at 80 spills 16 B):
    # three / two blocks of 256, 48 / 32 KiB of loads in flight an SM
    opts = {} if SIMULATOR else {"max_registers": 80 if k_major else 96}
    k = Kernel(_make(k_major), ["void(float32[::1], float32[::1], int64, int64, int64, int64, "
                                "int64, int64)"], **opts)
    k.name = f"tf32_parts_{'k' if k_major else 'mn'}"
    return k


def ptx_examples():
    _kernel(True), _kernel(False), _kernel(True, True), _kernel(False, True)


def operand(x, k_axis_last, which, mode, stream):
    """x (..., R0, C0) float32, C-contiguous, rewritten for `mode` as (..., R, P Kp),
    K-major: k_axis_last when x's reduction axis is its last (then R = R0), else the
    one before (R = C0); which: 0 for A's parts, 1 for B's. The caller multiplies the
    result as a plain A or a transposed B."""
    P, code = PARTS[mode][which]
    shape = tuple(int(s) for s in x.shape)
    K, R = (shape[-1], shape[-2]) if k_axis_last else (shape[-2], shape[-1])
    Kp = -(-K // KPAD) * KPAD
    nmat = math.prod(shape[:-2])
    out = empty(x, shape[:-2] + (R, P * Kp), "float32")
    if nmat and R and Kp:
        vec = VECTOR and (K if k_axis_last else R) % 4 == 0 and vector_aligned(x, out)
        k = _kernel(bool(k_axis_last), vec)
        t, block = (TV, (VX, VY, 1)) if vec else (T, (BX, ROWS, 1))
        grid = (-(-Kp // t), min(-(-R // t), 65535), min(nmat, 65535))
        k.launch(k.sigs[0], grid, block, stream, x.reshape(math.prod(shape)),
                 out.reshape(nmat * R * P * Kp), nmat, R, K, Kp, P, code)
    return out

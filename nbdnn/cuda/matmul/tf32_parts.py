"""Operands for float32's TF32 math modes (nbdnn/ops/math_mode.py), K-major, for the
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
(tf32: 8 B, 3xtf32: 16 B; 4096^2: 0.13 / 0.27 GB, 35-70 us at 3.8 TB/s). Run AE
measured the first version at 0.72 TB/s (a branch around each load: one load in flight
a thread); this one loads unconditionally, RPT loads back to back (PTX: 8 ld.global
then 8 st.shared, 56 registers, no local memory), not yet timed on a GPU.
"""
import functools
import math

from numba import cuda, float32

from ..runtime.arrays import empty
from ..runtime.intrinsics import round_tf32
from ..runtime.launch import Kernel
from ..runtime.simulator import SIMULATOR

PARTS = {"tf32": ((1, 0), (1, 0)), "3xtf32": ((3, 0b100), (3, 0b010))}  # (P, code): A, B
KPAD = 4
T, ROWS = (4, 2) if SIMULATOR else (32, 8)   # tile edge; block (T, ROWS): T / ROWS rows each
TILE = (T, T + 1)                             # (+1 column: no shared-memory bank conflicts)
RPT = T // ROWS                               # tile rows a thread
MAX_GRID = 65535 * 16


def tf32_parts(x, out, nmat, R, K, Kp, P, code, k_major):
    tile = cuda.shared.array(TILE, float32)   # tile[r][k]
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    tr = (R + T - 1) // T
    tk = (Kp + T - 1) // T
    for t in range(cuda.blockIdx.x, nmat * tr * tk, cuda.gridDim.x):
        z = t // (tr * tk)
        r0 = ((t // tk) % tr) * T
        k0 = (t % tk) * T
        # every load unconditional (a tap past the edge reads element 0, then counts
        # as zero) and the loop a constant count: the RPT loads issue back to back
        # (run AE: a branch around each load left one in flight a thread, 0.72 TB/s)
        vals = cuda.local.array(RPT, float32)
        for j in range(RPT):
            i = ty + j * ROWS
            r = r0 + (i if k_major != 0 else tx)     # K-major: x[z, r0 + i, k0 + tx]
            k = k0 + (tx if k_major != 0 else i)     # MN-major: x[z, k0 + i, r0 + tx]
            ok = r < R and k < K
            src = (z * R + r) * K + k if k_major != 0 else (z * K + k) * R + r
            v = x[src if ok else 0]
            vals[j] = v if ok else float32(0)
        for j in range(RPT):
            i = ty + j * ROWS
            tile[i if k_major != 0 else tx, tx if k_major != 0 else i] = vals[j]
        cuda.syncthreads()
        for i in range(ty, T, ROWS):
            r, k = r0 + i, k0 + tx
            if r < R and k < Kp:
                v = tile[i, tx]
                hi = round_tf32(v)
                lo = round_tf32(v - hi)
                dst = (z * R + r) * P * Kp + k
                for j in range(P):
                    out[dst + j * Kp] = lo if (code >> j) & 1 else hi
        cuda.syncthreads()


@functools.lru_cache(maxsize=None)
def _kernel():
    return Kernel(tf32_parts, ["void(float32[::1], float32[::1], int64, int64, int64, int64, "
                               "int64, int64, int64)"])


def ptx_examples():
    _kernel()


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
    tiles = nmat * -(-R // T) * -(-Kp // T)
    if tiles:
        k = _kernel()
        k.launch(k.sigs[0], min(tiles, MAX_GRID), (T, ROWS, 1), stream, x.reshape(math.prod(shape)),
                 out.reshape(nmat * R * P * Kp), nmat, R, K, Kp, P, code, int(k_axis_last))
    return out

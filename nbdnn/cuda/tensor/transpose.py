"""The transpose of two axes through shared-memory tiles, for transform_tensor's
commonest permutations: x viewed as (B, A, M, C) -> y (B, C, M, A), C x's last axis
(after merging the axes the permutation keeps together). It covers NCHW <-> NHWC
(B = N, A = C, M = 1, C = H*W), a matrix transpose, and a filter's channels swapped
around its taps ((G, K/g, taps, C/g) -> (G, C/g, taps, K/g): a stride-1 data
gradient's flipped filter, conv's data variant as_forward).

The general transform kernel gathers one element a thread in y's order: its writes
are coalesced, its reads stride by A*M*C elements, so each warp's 32 reads touch 32
sectors for 2-4 useful bytes each (a training-step profile: 370 filter
transposes, 2.21 ms). Here a block moves a T x T tile of (A, C) for one (b, m): warp
rows read T consecutive elements of a C-row of x and write T consecutive elements of
an A-row of y, both coalesced; the tile lives in shared memory padded to T + 1 columns
(a column read touches T different banks for 4-byte elements). Traffic: n s bytes read,
n s written, no flops. Pure data movement: each dtype moves as its own type (bfloat16
as its uint16 bits), alpha 1 and beta 0 only (else the general kernel).

Grid: (tiles of (A, C), min(B * M, MAX_GRID_Y)); blocks loop over (b, m) past it.
"""
import functools
import math

from numba import cuda, types

from ..runtime.memory.arrays import dtype_name
from ..runtime.device_code.intrinsics import array_type
from ..runtime.launch.kernel import Kernel
from ..runtime.simulator import SIMULATOR

T, ROWS = (8, 2) if SIMULATOR else (32, 8)  # tile side, warp rows a block (T x ROWS threads)
TILE = (T, T + 1)  # the shared tile, a padding column (a constant tuple for numba)
MIN_SIDE = 16  # A and C at least this: narrower ones stay on the general kernel
MAX_GRID_Y = 65535  # (b, m) pairs a launch's grid rows; blocks loop past it
TYPES = {"float16": types.float16, "bfloat16": types.uint16, "float32": types.float32,
         "float64": types.float64}


def _kernel(elem):
    def transpose_tiles(x, y, A, M, C, tiles_c, bm_total):
        # x: (B, A, M, C) C-contiguous; y: (B, C, M, A); tile[a][c] of this block's (b, m)
        tile = cuda.shared.array(TILE, elem)
        a0 = (cuda.blockIdx.x // tiles_c) * T
        c0 = (cuda.blockIdx.x % tiles_c) * T
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        bm = cuda.blockIdx.y
        while bm < bm_total:
            b, m = bm // M, bm % M
            for j in range(ty, T, ROWS):  # read: consecutive c across a warp row
                a, c = a0 + j, c0 + tx
                if a < A and c < C:
                    tile[j, tx] = x[((b * A + a) * M + m) * C + c]
            cuda.syncthreads()
            for j in range(ty, T, ROWS):  # write: consecutive a across a warp row
                c, a = c0 + j, a0 + tx
                if a < A and c < C:
                    y[((b * C + c) * M + m) * A + a] = tile[tx, j]
            cuda.syncthreads()  # (the tile is refilled for the next (b, m))
            bm += cuda.gridDim.y
    return transpose_tiles


@functools.lru_cache(maxsize=None)
def kernel(dtype):
    t = array_type(dtype)
    sig = f"void({t}[::1], {t}[::1], int64, int64, int64, int64, int64)"
    k = Kernel(_kernel(TYPES[dtype]), [sig])
    k.name = f"_transpose_tiles_{dtype}"
    return k, sig


def reduced(shape, perm):
    """(B, A, M, C) when x viewed as `shape`, permuted by `perm`, is a swap of two axes
    the last of which is x's last (size-1 axes dropped, axes that stay neighbours
    merged); None otherwise."""
    keep = [k for k in range(len(shape)) if shape[k] != 1]
    p = [keep.index(k) for k in perm if shape[k] != 1]
    dims = [shape[k] for k in keep]
    groups = []  # runs of x's axes that stay together in y's order
    for k in p:
        if groups and groups[-1][-1] + 1 == k:
            groups[-1].append(k)
        else:
            groups.append([k])
    order = sorted(range(len(groups)), key=lambda i: groups[i][0])  # x's order
    sizes = [math.prod(dims[k] for k in g) for g in groups]
    q = [order.index(i) for i in range(len(groups))]  # y's axes as x's merged axes
    n = len(q)
    if n < 2 or q[-1] == n - 1:
        return None
    i = q[-1]  # y's last axis is x's merged axis i; x's last must sit at y's axis i
    if q[i] != n - 1 or any(q[k] != k for k in range(n) if k not in (i, n - 1)):
        return None
    xs = [sizes[order[k]] for k in range(n)]  # merged sizes in x's order
    return math.prod(xs[:i]), xs[i], math.prod(xs[i + 1:n - 1]), xs[n - 1]


def usable(dtype, dims, alpha, beta):
    return dims is not None and dtype in TYPES and (alpha, beta) == (1, 0) and \
        min(dims[1], dims[3]) >= MIN_SIDE


def transpose(x, y, dims, stream):
    """y = x viewed as (B, A, M, C) with A and C swapped (dims from `reduced`)."""
    B, A, M, C = dims
    k, sig = kernel(dtype_name(x))
    tiles_c = -(-C // T)
    k.launch(sig, (-(-A // T) * tiles_c, min(B * M, MAX_GRID_Y), 1), (T, ROWS, 1), stream, x, y,
             A, M, C, tiles_c, B * M)
    return y


def ptx_examples():
    """Every dtype's kernel (tests/test_ptx.py compiles them)."""
    for dtype in TYPES:
        kernel(dtype)

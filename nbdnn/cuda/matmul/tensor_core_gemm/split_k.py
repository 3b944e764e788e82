"""How the tensor-core GEMM's work is cut for the SMs (wgmma_gemm.py): the tile width
(tile_width, below) and deterministic split-K. When a product's
tiles fill fewer than SPLIT_FILL of the SMs (skinny M, few tiles), its reduction is cut
into chunks of at least MIN_CHUNK (a multiple of the kernel's BK), the chunk kernel
writes each chunk's float32 sums to a workspace (splits x M x N x 4 B), and splitk_sum
adds them in chunk order with the epilogue: the same sum in the same order on every
run, no atomics. M = 64 from 0.23-0.36x cuBLAS to 0.55-0.61x; M = 256,
K = 8192 from 0.42x to 0.45x (perf/RESULTS.md). Measured (docs/decisions.md "skinny_gemm",
kernel times under CUPTI): chunks of at least 1024 rather than 512 beat more, shorter
ones where they differ (64 x 4096 x 4096: 4 chunks 0.61x, 8 chunks 0.57x; M = 128:
0.53x against 0.42x): a block pays a fixed ~4 us (one 128 x 256 tile of one k-tile
takes 6.3 us, cuBLAS's 2.0) that short chunks repeat, and the sum reads fewer chunks."""
import functools
import inspect

import numpy as np
from numba import cuda

from ... import activation as _act
from ...runtime.launch.codegen import compile_source
from ...runtime.device import sm_count
from ...runtime.device_code.intrinsics import array_type, narrow, widen
from ...runtime.launch.kernel import Kernel

SPLIT_FILL, MIN_CHUNK, MAX_SPLITS = 0.5, 1024, 16
# ... up to WIDE_SPLITS chunks where a long reduction has few tiles (a convolution's
# filter gradient: 64 x 576 outputs summed over 100352 positions, 3 tiles; 16 chunks
# kept 48 of 132 SMs busy), while the float32 chunks (128 KB a 128 x 256 tile) stay
# within SPLIT_BYTES.
WIDE_SPLITS, SPLIT_BYTES = 128, 32 << 20
# chunks a tile: enough to fill the SMs (False: 32 tiles on 132 SMs take 5, 160 blocks,
# so 28 SMs run two) or as many as one wave holds (True: 4, 128 blocks, each chunk 5/4
# as long). Measured (H200, bf16, x cuBLAS, docs/decisions.md "skinny_gemm"): 256 x 4096
# x 8192 0.61 -> 0.81, 64 x 8192 x 8192 0.72 -> 0.82, the other shapes unchanged.
ONE_WAVE = True
# The widths a 128-row tile may take (wgmma_gemm.gemm picks by tile_width). A grid a
# little over one wave of 256-wide tiles leaves SMs idle: 1000 x 3000 has 96 such tiles
# on 132 SMs, but 128 of 192 columns, one wave of 3/4 the work a tile. Measured (x
# cuBLAS): 1000 x 3000 x 2040 0.64 -> 0.66, 256 x 4096 x 8192 0.61 -> 0.80 (its 44
# tiles split 3 ways fill 132 SMs), one 128 x 256 x 64 tile 0.60 -> 0.63.
WIDTHS = (256, 192)
#... and for narrow N (a 1x1 convolution's 64-256 filters: a N = 64 took a
# 192-wide tile, 2/3 of it idle, 0.57x cuDNN) 128 and 64 too, ranked by waves x (BM +
# width): a k-tile's loads (BM + width rows of 128 B) bound the narrow tiles. Measured
# (H200, perf/suites/conv.py bf16 NHWC, batch 32, x cuDNN, graph replay): ResNet-50's
# 1x1 layers 0.62 -> 0.82 (64 -> 64), 0.70 -> 0.89 (256 -> 64), 0.53 -> 0.60 (2048 ->
# 512), geomean of the nine 0.76 -> 0.81; the tests ran both ways.
NARROW = True


def tile_width(row_tiles, N, nz, bm=128):
    """The width of WIDTHS whose waves x width (the time of the last wave's tiles, for
    a persistent grid of equal tiles) is least, the widest on a tie; NARROW: of WIDTHS,
    128 and 64 by waves x (bm + width)."""
    sm = sm_count()
    widths, extra = (WIDTHS + (128, 64), bm) if NARROW else (WIDTHS, 0)
    return min(widths, key=lambda bn: (-(-row_tiles * -(-N // bn) * nz // sm) * (extra + bn),
                                       -bn))


def split(tiles, K, BK):
    """(chunks, chunk length) of the reduction for a grid of `tiles` whose kernel steps
    BK along K: one chunk of all of K (rounded up to BK) unless the tiles fill fewer
    than SPLIT_FILL of the SMs;
    then enough chunks of at least MIN_CHUNK to fill them (ONE_WAVE: as many as one wave
    holds), at most MAX_SPLITS, or WIDE_SPLITS as SPLIT_BYTES allows."""
    whole = -(-K // BK) * BK
    sm = sm_count()
    if tiles >= SPLIT_FILL * sm or K < 2 * MIN_CHUNK:
        return 1, whole
    most = max(MAX_SPLITS, min(WIDE_SPLITS, SPLIT_BYTES // (tiles * 128 * 256 * 4)))
    n = max(1, min(sm // tiles if ONE_WAVE else -(-sm // tiles), K // MIN_CHUNK, most))
    chunk = -(-K // (n * BK)) * BK
    return -(-K // chunk), chunk


def _splitk_sum(ws, c, bias, splits, total, N, has_bias, act, coef, alpha, beta):
    """c[i] = alpha * act(sum over chunks s of ws[s * total + i] + bias[i % N]) + beta *
    c[i], the chunks added in order (deterministic); c 16-bit or float32 (tf32).
    (Compiled from this source by splitk_sum, whose namespace binds widen / narrow,
    runtime/device_code/intrinsics.py, and act_fn, the fused activation.)"""
    i = cuda.grid(1)
    if i < total:
        acc = ws[i]
        for s in range(1, splits):
            acc += ws[s * total + i]
        if has_bias != 0:
            acc += widen(bias[i % N])
        if act >= 0:
            acc = act_fn(acc, act, coef)
        acc = alpha * acc
        if beta != 0:
            acc += beta * widen(c[i])
        c[i] = narrow(acc, c)


@functools.lru_cache(maxsize=None)
def splitk_sum(dtype):
    """The (Kernel, signature) adding split-K's chunks for output dtype `dtype`."""
    t = array_type(dtype)
    ns = {"cuda": cuda, "act_fn": _act.fused(np.float32), "widen": widen, "narrow": narrow}
    fn = compile_source("_splitk_sum", inspect.getsource(_splitk_sum), ns,
                        label=f"splitk_sum_{dtype}", about={
        "what": f"split-K's ordered sum of float32 chunks and the epilogue, {dtype} out",
        "traffic": "splits x 4 B read, 2 B written (+2 read with beta) an element"})
    sig = (f"void(float32[::1], {t}[::1], {t}[::1], int64, int64, int64, int64, int64, "
           "float32, float32, float32)")
    return Kernel(fn, [sig]), sig

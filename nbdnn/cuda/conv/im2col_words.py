"""im2col for 2-d channels-last convolutions of one group, moving whole words: the
"gemm" algorithm's columns (conv/gemm.py) for the backward filter pass and forward.

    cols[m, kx] = x[n, oy sh - qh + r dh, ox sw - qw + s dw, c]   (0 outside x)
                  m = (n, oy, ox), kx = (r, s, c) taps-major (flipped in mode
                  "convolution"), 0 for kx >= R S C (the row padded to `row` columns)

The general kernel (gemm.py's conv_im2col) moves one element a thread and splits its
flat index five ways in 64-bit arithmetic. Channels-last, a pixel's C channels are
contiguous in x and in a column row, so this one moves a word of several channels:
8 bytes (4 bf16/fp16 channels, 2 float32) when C and the row are multiples of it, else
4 or 2, each thread's index split once a word. A profile (ResNet-50 bf16
training step, batch 32, H200) had the element kernel at 10.5 ms over 20 calls, 16%
of the step; bytes moved a word: its read (cached: neighbouring taps overlap) and its
write, M x row x itemsize in all.
"""
import numpy as np
from numba import cuda

from ..runtime.memory.arrays import dtype_name, empty, ptr, size
from ..runtime.launch.kernel import Kernel
from ..runtime.simulator import SIMULATOR
from ..runtime.device_code.stencil import I64 as I, U, U32, div, magic_args
from .im2col_rows import tap_of


BLOCK = 64 if SIMULATOR else 256
WORDS = {8: "uint64", 4: "uint32", 2: "uint16"}


def conv_im2col_words(x, cols, N, H, W, C, R, S, PH, PW, sh, sw, qh, qw, dh, dw, flip, row):
    # x (N, H, W, C) and cols (M, row) as words: C and row count words
    total = N * PH * PW * row
    KC = R * S * C
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    step = cuda.gridDim.x * cuda.blockDim.x
    while i < total:
        m = i // row
        kx = i - m * row
        inside = False
        at = 0
        if kx < KC:
            tap = kx // C
            c = kx - tap * C
            r = tap // S
            s = tap - r * S
            if flip:
                r, s = R - 1 - r, S - 1 - s
            n = m // (PH * PW)
            p = m - n * (PH * PW)
            oy = p // PW
            ih = oy * sh - qh + r * dh
            iw = (p - oy * PW) * sw - qw + s * dw
            inside = 0 <= ih < H and 0 <= iw < W
            at = ((n * H + ih) * W + iw) * C + c
        if inside:
            cols[i] = x[at]
        else:  # (no variable holds the word: numba would unify 0 and a uint64 to float)
            cols[i] = 0
        i += step


def conv_im2col_words32(x, cols, H, W, C, R, S, PP, PW, sh, sw, qh, qw, dh, dw, flip, row,
                        total, m_row, s_row, m_C, s_C, m_S, s_S, m_PP, s_PP, m_PW, s_PW):
    # conv_im2col_words for fewer than 2**31 words: one thread a word, every index split
    # a multiply-high by a magic number (runtime/device_code/stencil.py: 3 instructions where a
    # 64-bit division takes ~70), 32-bit offsets; PP = PH PW
    i = U32(cuda.blockIdx.x) * U32(cuda.blockDim.x) + U32(cuda.threadIdx.x)
    if i < total:
        m = div(i, m_row, s_row)
        kx = U32(i - m * row)
        inside = False
        at = U32(0)
        if kx < R * S * C:
            r, s, c = tap_of(kx, R, S, C, flip, m_C, s_C, m_S, s_S)
            n = div(m, m_PP, s_PP)
            p = U32(m - n * PP)
            oy = div(p, m_PW, s_PW)
            ih = I(oy) * sh - qh + I(r) * dh
            iw = I(p - oy * PW) * sw - qw + I(s) * dw
            inside = 0 <= ih < H and 0 <= iw < W
            at = U32(((n * H + ih) * W + iw) * C + c)
        if inside:
            cols[U(i)] = x[U(at)]
        else:
            cols[U(i)] = 0


_SIGS = {b: f"void({t}[::1], {t}[::1], {', '.join(['int64'] * 16)})" for b, t in WORDS.items()}
_kernel = Kernel(conv_im2col_words, list(_SIGS.values()))
_SIGS32 = {b: f"void({t}[::1], {t}[::1], {', '.join(['int64'] * 26)})"
           for b, t in WORDS.items()}
_kernel32 = Kernel(conv_im2col_words32, list(_SIGS32.values()))
# The 32-bit kernel: a profile had conv_im2col_words at 2.19 ms over 3 calls of
# the training step, most of it the stem's 61 M two-byte words, each split with five
# 64-bit divisions; measured (H200, on): conv_im2col_words32 0.71 ms. Off: the 64-bit
# kernel (used anyway where an offset passes 2**31).
MAGIC_INDEX = True


def usable(g):
    """2-d (or 1-d: `planar`) channels-last with one group (ConvGeometry g)."""
    return g.last and g.G == 1 and g.planar


def columns(x, g, row, stream):
    """x's im2col columns (1, M, row) for ConvGeometry g (`usable`), row >= R S C with
    zero columns past it."""
    dtype = dtype_name(x)
    item = 2 if dtype in ("float16", "bfloat16") else np.dtype(dtype).itemsize
    M = g.N * g.PH * g.PW
    cols = empty(x, (1, M, row), dtype)
    word = next(b for b in (8, 4, 2) if b == item or b > item and (g.C * item) % b == 0 and
                (row * item) % b == 0 and (SIMULATOR or ptr(x) % b == 0 and ptr(cols) % b == 0))
    k = word // item  # channels a word
    args = (g.N, g.H, g.W, g.C // k, g.R, g.S, g.PH, g.PW, g.sh, g.sw, g.qh, g.qw, g.dh,
            g.dw, g.flip, row // k)
    total = M * row // k
    if total == 0:
        return cols
    if MAGIC_INDEX and size(x) // k < 2 ** 31 and total < 2 ** 31:
        sig = _SIGS32[word]
        args = (g.H, g.W, g.C // k, g.R, g.S, g.PH * g.PW, g.PW, g.sh, g.sw, g.qh, g.qw, g.dh,
                g.dw, g.flip, row // k, total) + magic_args(row // k, g.C // k, g.S,
                                                            g.PH * g.PW, g.PW)
        arrays = (x.reshape(size(x)).view(WORDS[word]), cols.reshape(M * row).view(
            WORDS[word])) if SIMULATOR else ((ptr(x), size(x) // k), (ptr(cols), total))
        _kernel32.launch(sig, -(-total // BLOCK), BLOCK, stream, *arrays, *args,
                         **({} if SIMULATOR else {"owners": (x, cols)}))
        return cols
    grid = min(-(-total // BLOCK), 65535 * 8)
    sig = _SIGS[word]
    if SIMULATOR:  # (no raw pointers there: views of the same memory)
        _kernel.launch(sig, grid, BLOCK, stream, x.reshape(size(x)).view(WORDS[word]),
                       cols.reshape(M * row).view(WORDS[word]), *args)
        return cols
    _kernel.launch(sig, grid, BLOCK, stream, (ptr(x), size(x) // k), (ptr(cols), total),
                   *args, owners=(x, cols))
    return cols


# A 16-bit channels-last forward whose C is no multiple of 8 (ResNet's stem: 3) cannot
# use TMA (16-byte pixel rows): conv's variant stem_words runs it as explicit columns
# padded to a 16-byte row and the tensor-core GEMM with its fused epilogue (bias,
# activation), the filters padded alike (gemm.filter_rows). The SIMT implicit GEMM ran the
# stem at 0.49x cuDNN (0.46 ms at batch 32).


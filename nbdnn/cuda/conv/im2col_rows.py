"""im2col for narrow-channel 2-d channels-last convolutions of one group (ResNet's stem:
3 channels, 7x7 at stride 2) through shared memory: the columns of im2col_words.py
(its docstring has the layout), built one output row at a time.

im2col_words moves one word a thread, and with 3 bf16 channels a word is one 2-byte
element: the stem's 61 M of them, each thread splitting its index five ways (a
profile, H200, batch 32: 356 us, where writing the 122 MB of columns takes ~40). Here a
block owns one output row (n, oy): PW output positions, PW x row column elements,
contiguous in cols. It stages the R input rows its windows read (rows oy sh - qh + r dh)
over the Wp input columns they span, zeros outside x, in shared memory (coalesced
loads; the stem: 7 x 229 x 3 elements, 9.6 KB), then writes its columns in order, each
element from shared memory (coalesced stores, 2 magic divisions an element).

    xs[r, wq, c] = x[n, oy sh - qh + r dh, wq - qw, c]      (R, Wp, C), Wp = (PW - 1) sw
                                                            + (S - 1) dw + 1
    cols[(n, oy, ox), (r, s, c)] = xs[r, ox sw + s dw, c]   (flipped taps in mode
                                                            "convolution")

Traffic a block: R Wp C elements read (x: each read R/sh times over by the blocks of
neighbouring rows, from L2), PW row written. Elements move as their bits (uint16 for
16-bit types). Used where a word is narrower than 8 bytes (im2col_words would move
elements one by one) and the staged rows fit MAX_SHARED.
"""
import functools

from numba import cuda, types

from ..runtime.memory.arrays import ptr, size
from ..runtime.launch.kernel import Kernel
from ..runtime.simulator import SIMULATOR
from ..runtime.device_code.stencil import I64 as I, U, U32, div, magic_args

BLOCK = 32 if SIMULATOR else 256
MAX_SHARED = 48 * 1024  # bytes of staged rows (no opt-in to more)
TYPES = {2: types.uint16, 4: types.uint32, 8: types.uint64}
WORDS = {2: "uint16", 4: "uint32", 8: "uint64"}
# Measured against im2col_words (H200, ResNet-50's stem, C = 3, bf16 NHWC, batch 32,
# graph replay, with col2im_rows against col2im): forward 1.48x, filter gradient 1.55x,
# data gradient 3.58x the speed.


def tap_of(kx, R, S, C, flip, m_C, s_C, m_S, s_S):
    """(r, s, c) of column kx = (r, s, c) taps-major (flipped taps in mode
    "convolution"), split by multiply-high (runtime/device_code/stencil.py); im2col_words' too."""
    tap = div(kx, m_C, s_C)
    c = U32(kx - tap * C)
    r = div(tap, m_S, s_S)
    s = U32(tap - r * S)
    if flip:
        r, s = U32(R - 1 - r), U32(S - 1 - s)
    return r, s, c


if not SIMULATOR:
    tap_of = cuda.jit(device=True, inline=True)(tap_of)


def _kernel(elem):
    def conv_im2col_rows(x, cols, H, W, C, R, S, PH, PW, sh, sw, qh, qw, dh, dw, flip, row,
                         KC, Wp, m_WpC, s_WpC, m_C, s_C, m_row, s_row, m_S, s_S, m_PH, s_PH):
        xs = cuda.shared.array(0, elem)
        b = U32(cuda.blockIdx.x)  # this block's output row (n, oy)
        n = div(b, m_PH, s_PH)
        oy = U32(b - n * PH)
        t, nt = U32(cuda.threadIdx.x), U32(cuda.blockDim.x)
        WpC = Wp * C
        e = t
        while e < R * WpC:  # stage: coalesced, one element a thread a pass
            r = div(e, m_WpC, s_WpC)
            rem = U32(e - r * WpC)
            wq = div(rem, m_C, s_C)
            ih = I(oy) * sh - qh + I(r) * dh
            iw = I(wq) - qw
            if 0 <= ih < H and 0 <= iw < W:
                xs[e] = x[U(((I(n) * H + ih) * W + iw) * C + I(rem - wq * C))]
            else:
                xs[e] = 0
            e += nt
        cuda.syncthreads()
        base = U(b) * U(PW * row)
        e = t
        while e < PW * row:  # write: the row's columns in order
            ox = div(e, m_row, s_row)
            kx = U32(e - ox * row)
            if kx < KC:
                r, s, c = tap_of(kx, R, S, C, flip, m_C, s_C, m_S, s_S)
                cols[base + U(e)] = xs[(r * Wp + ox * sw + s * dw) * C + c]
            else:
                cols[base + U(e)] = 0
            e += nt
    return conv_im2col_rows


@functools.lru_cache(maxsize=None)
def kernel(item):
    t = WORDS[item]
    sig = f"void({t}[::1], {t}[::1], {', '.join(['int64'] * 27)})"
    k = Kernel(_kernel(TYPES[item]), [sig])
    k.name = "conv_im2col_rows"
    return k, sig


def staged_width(g):
    """Wp: the input columns one output row's windows span."""
    return (g.PW - 1) * g.sw + (g.S - 1) * g.dw + 1


def usable(g, row, item):
    """A word narrower than 8 bytes (C item not a multiple of 8), the staged rows
    within MAX_SHARED and the indices within 32 bits (ConvGeometry g; im2col_words.usable
    holds)."""
    wp = staged_width(g)
    return (g.C * item) % 8 != 0 and g.R * wp * g.C * item <= MAX_SHARED and \
        g.N * g.PH < 2 ** 31 and g.PW * row < 2 ** 31


def columns(x, cols, g, row, item, stream):
    """Fill cols (1, M, row) from x (`usable`)."""
    wp = staged_width(g)
    k, sig = kernel(item)
    args = (g.H, g.W, g.C, g.R, g.S, g.PH, g.PW, g.sh, g.sw, g.qh, g.qw, g.dh, g.dw,
            g.flip, row, g.R * g.S * g.C, wp) + magic_args(wp * g.C, g.C, row, g.S, g.PH)
    arrays = (x.reshape(size(x)).view(WORDS[item]), cols.reshape(size(cols)).view(
        WORDS[item])) if SIMULATOR else ((ptr(x), size(x)), (ptr(cols), size(cols)))
    k.launch(sig, g.N * g.PH, BLOCK, stream, *arrays, *args, shmem=g.R * wp * g.C * item,
             **({} if SIMULATOR else {"owners": (x, cols)}))


def ptx_examples():
    """Each element size's kernel (tests/test_ptx.py compiles them)."""
    for item in TYPES:
        kernel(item)

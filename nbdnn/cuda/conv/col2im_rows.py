"""col2im for narrow-channel 2-d channels-last convolutions of one group (ResNet's
stem: 3 channels, 7x7 at stride 2), a block an input row: the "gemm" algorithm's data
gradient (conv/gemm.py backward_data; col2im_quads.py has the formula) for C % 4 != 0,
where col2im_quads cannot take four channels a thread and the general conv_col2im
splits a 64-bit index and divides by the strides at every tap of every element (a
profile, H200, batch 32: the stem's col2im 1235 us, its SIMT GEMM 849 us, cuDNN's
whole data gradient 420 us).

Block (n, ih) finds the filter rows that land on its row (ih + qh = oy sh + r dh: at
most ceil(R / (sh / gcd(sh, dh))) of them, 4 for the stem) and stages, for each, the
columns of output row oy that tap row reads: PW positions x S C elements, widened to
the compute type, in shared memory (the stem: 4 x 112 x 21 float32, 37 KB; each
element of dcols read by exactly one block, 42-byte runs). Then each thread sums its
(iw, c) elements over the staged rows and their landing columns in tap order (r, then
s: col2im_quads' order, no atomics).

    st[j, ox, (s, c)] = dcols[(n, oy_j, ox), (r_j, s, c)]     (landing rows j, PW, S C)
    dx[n, ih, iw, c]  = alpha * sum over j, s landing (iw + qw = ox sw + s dw) of
                        st[j, ox, (s, c)] + beta * dx            (flipped taps: mode
                                                                   "convolution")

dcols may be padded to `row` >= R S C columns (the tensor-core GEMM's 16-byte rows:
conv/gemm.py makes them from filter_rows). Traffic: dcols read once,
dx written once (read once more with beta).
"""
import math

from numba import cuda, int32

from ..runtime.memory.arrays import dtype_name
from ..runtime.device_code.intrinsics import narrow, widen
from ..runtime.simulator import SIMULATOR
from ..runtime.device_code.stencil import I64 as I, U, U32, div, magic_args
from .col2im_quads import typed_kernels

BLOCK = 32 if SIMULATOR else 256
MAX_SHARED = 48 * 1024  # bytes of staged columns (no opt-in to more)
MAX_ROWS = 32           # filter rows R the landing table holds
# Measured against col2im (H200, ResNet-50's stem, bf16 NHWC, batch 32, with
# im2col_rows): the data gradient 2.03 -> 0.57 ms, 3.58x.


def _kernel(CT):
    ZERO = CT(0)

    def conv_col2im_rows(dcols, dx, H, W, C, R, S, PH, PW, sh, sw, qh, qw, dh, dw, flip,
                         row, m_H, s_H, m_sh, s_sh, m_sw, s_sw, m_C, s_C, m_SC, s_SC, m_PWSC,
                         s_PWSC, alpha, beta):
        st = cuda.shared.array(0, CT)
        tap_r = cuda.shared.array(MAX_ROWS, int32)   # landing filter rows (as stored)
        tap_oy = cuda.shared.array(MAX_ROWS, int32)  # and their output rows
        count = cuda.shared.array(1, int32)
        b = U32(cuda.blockIdx.x)  # this block's input row (n, ih)
        n = div(b, m_H, s_H)
        ih = U32(b - n * H)
        t, nt = U32(cuda.threadIdx.x), U32(cuda.blockDim.x)
        if t == 0:
            k = 0
            for r in range(R):
                u = I(ih) + qh - r * dh  # = oy sh where tap row r lands
                if u >= 0:
                    oy = div(u, m_sh, s_sh)
                    if oy * sh == u and oy < PH:
                        tap_r[k] = R - 1 - r if flip else r
                        tap_oy[k] = oy
                        k += 1
            count[0] = k
        cuda.syncthreads()
        k = count[0]
        SC = S * C
        PWSC = PW * SC
        e = t
        while e < k * PWSC:  # stage: runs of S C elements, one a thread a pass
            j = div(e, m_PWSC, s_PWSC)
            rem = U32(e - j * PWSC)
            ox = div(rem, m_SC, s_SC)
            at = (I(n) * PH + tap_oy[j]) * PW + I(ox)
            st[e] = widen(dcols[U(at * row + tap_r[j] * SC + I(rem - ox * SC))])
            e += nt
        cuda.syncthreads()
        e = t
        while e < W * C:  # sum: this row's (iw, c) elements
            iw = div(e, m_C, s_C)
            c = U32(e - iw * C)
            acc = ZERO
            for j in range(k):
                for s in range(S):
                    v = I(iw) + qw - s * dw  # = ox sw where tap column s lands
                    if v >= 0:
                        ox = div(v, m_sw, s_sw)
                        if ox * sw == v and ox < PW:
                            fs = S - 1 - s if flip else s
                            acc += st[(j * PW + ox) * SC + fs * C + c]
            o = U(b) * U(W * C) + U(e)
            acc = alpha * acc
            if beta != ZERO:
                acc += beta * widen(dx[o])
            dx[o] = narrow(acc, dx)
            e += nt

    return conv_col2im_rows


_KERNELS = typed_kernels(_kernel, 27, "conv_col2im_rows")


def landing_rows(g):
    """The most filter rows that land on one input row: every dh-th row of R whose
    offset r dh is one residue mod sh, at most ceil(R / (sh / gcd(sh, dh)))."""
    return -(-g.R // (g.sh // math.gcd(g.sh, g.dh)))


def usable(g, dtype, dx_size, dcols_size):
    """2-d (or 1-d) channels-last with one group, C % 4 != 0 (col2im_quads takes
    the rest), R within MAX_ROWS, the staged columns within MAX_SHARED, 32-bit sizes."""
    csize = 8 if dtype == "float64" else 4
    return g.last and g.G == 1 and g.planar and g.C % 4 != 0 and \
        g.R <= MAX_ROWS and landing_rows(g) * g.PW * g.S * g.C * csize <= MAX_SHARED and \
        max(dx_size, dcols_size) < 2 ** 31


def col2im(dcols, dx, g, row, alpha, beta, stream):
    """dx (N, H, W, C) from dcols (M, row) for ConvGeometry g (`usable`)."""
    k, sig = _KERNELS[dtype_name(dx)]
    csize = 8 if dtype_name(dx) == "float64" else 4
    SC = g.S * g.C
    k.launch(sig, g.N * g.H, BLOCK, stream, dcols, dx, g.H, g.W, g.C, g.R, g.S, g.PH, g.PW,
             g.sh, g.sw, g.qh, g.qw, g.dh, g.dw, g.flip, row,
             *magic_args(g.H, g.sh, g.sw, g.C, SC, g.PW * SC), alpha, beta,
             shmem=landing_rows(g) * g.PW * SC * csize)
    return dx


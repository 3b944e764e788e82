"""col2im for 2-d channels-last convolutions of one group, four channels a thread: the
"gemm" algorithm's data gradient (conv/gemm.py backward_data) gathers dx from the GEMM's
columns,

    dx[n, ih, iw, c] = sum over taps (r, s) landing on (ih, iw) of dcols[m, kx]
                       ih + qh = oy sh + r dh, iw + qw = ox sw + s dw,
                       m = (n, oy, ox), kx = (r, s, c) taps-major (flipped in mode
                       "convolution")

in tap order (no atomics: deterministic). The general kernel (gemm.py's conv_col2im)
moves one element a thread, splits its flat index five ways in 64-bit arithmetic and
divides by the runtime strides at every tap. Here a thread owns four neighbouring
channels of one pixel (C % 4 == 0): one index split for four outputs, the splits
multiply-high by magic numbers (runtime/device_code/stencil.py), a tap row's landing found once
per row (a multiply-high by the stride's magic number and one test), 32-bit offsets
(fewer than 2**31 elements in dx and in dcols). A profile (ResNet-50 bf16
training step, batch 32, H200) had conv_col2im at 2.95 ms over the 6 stride-2 data
gradients, 13.6% of the step. Traffic: dcols read once (M x R S C, each element landing
on one dx element), dx written once (read once more with beta).
"""
from numba import cuda, float32, float64

from ..runtime.memory.arrays import dtype_name
from ..runtime.device_code.intrinsics import array_type, narrow, widen
from ..runtime.launch.kernel import Kernel
from ..runtime.simulator import SIMULATOR
from ..runtime.device_code.stencil import I64 as I, U, U32, div, magic_args
from ..._vocab import BF16_DTYPES

BLOCK = 64 if SIMULATOR else 256
# Measured (H200): the training step's six stride-2 data gradients fell out of the
# profile's top 20, from 2.95 ms through col2im.


def usable(g, dx_size, dcols_size):
    """2-d (or 1-d) channels-last, one group, C % 4 == 0, 32-bit sizes."""
    return g.last and g.G == 1 and g.planar and g.C % 4 == 0 and \
        max(dx_size, dcols_size) < 2 ** 31


def _kernel(CT):
    ZERO = CT(0)

    def conv_col2im_quads(dcols, dx, H, W, C, R, S, PH, PW, sh, sw, qh, qw, dh, dw, flip,
                          total, m_C4, s_C4, m_W, s_W, m_H, s_H, m_sh, s_sh, m_sw, s_sw,
                          alpha, beta):
        # thread i: channels 4 cq .. 4 cq + 3 of pixel (n, ih, iw); total = N H W C / 4
        i = U32(cuda.blockIdx.x) * U32(cuda.blockDim.x) + U32(cuda.threadIdx.x)
        if i < total:
            C4 = C // 4
            q = div(i, m_C4, s_C4)
            c = U32(i - q * C4) * 4
            rw = div(q, m_W, s_W)
            iw = U32(q - rw * W)
            n = div(rw, m_H, s_H)
            ih = U32(rw - n * H)
            a0, a1, a2, a3 = ZERO, ZERO, ZERO, ZERO
            for r in range(R):
                u = I(ih) + qh - r * dh  # = oy sh when tap row r lands
                oy = div(u if u >= 0 else 0, m_sh, s_sh)
                if u >= 0 and oy * sh == u and oy < PH:
                    fr = R - 1 - r if flip else r
                    for s in range(S):
                        v = I(iw) + qw - s * dw
                        ox = div(v if v >= 0 else 0, m_sw, s_sw)
                        if v >= 0 and ox * sw == v and ox < PW:
                            fs = S - 1 - s if flip else s
                            at = U32(((n * PH + oy) * PW + ox) * (R * S * C) +
                                     (fr * S + fs) * C + c)
                            a0 += widen(dcols[U(at)])
                            a1 += widen(dcols[U(at + 1)])
                            a2 += widen(dcols[U(at + 2)])
                            a3 += widen(dcols[U(at + 3)])
            o = U32(i * 4)
            a0, a1, a2, a3 = alpha * a0, alpha * a1, alpha * a2, alpha * a3
            if beta != ZERO:
                a0 += beta * widen(dx[U(o)])
                a1 += beta * widen(dx[U(o + 1)])
                a2 += beta * widen(dx[U(o + 2)])
                a3 += beta * widen(dx[U(o + 3)])
            dx[U(o)], dx[U(o + 1)] = narrow(a0, dx), narrow(a1, dx)
            dx[U(o + 2)], dx[U(o + 3)] = narrow(a2, dx), narrow(a3, dx)

    return conv_col2im_quads


def typed_kernels(make, ints, name=None):
    """{dtype: (Kernel, signature)} of a col2im kernel void(dcols, dx, ints x int64,
    alpha, beta), make(CT) its function for compute type CT: float64 for float64,
    float32 for the rest (col2im_rows.py's too)."""
    table = {}
    for ct_name, CT in (("float32", float32), ("float64", float64)):
        fn = make(CT)
        for t in (d for d in BF16_DTYPES if (d == "float64") == (ct_name == "float64")):
            a = f"{array_type(t)}[::1]"
            sig = f"void({a}, {a}, {', '.join(['int64'] * ints)}, {ct_name}, {ct_name})"
            table[t] = (Kernel(fn, [sig]), sig)
            if name:
                table[t][0].name = name
    return table


_KERNELS = typed_kernels(_kernel, 25)


def col2im(dcols, dx, g, alpha, beta, stream):
    """dx (N, H, W, C) from the columns dcols (M, R S C) for ConvGeometry g (`usable`)."""
    k, sig = _KERNELS[dtype_name(dx)]
    total = g.N * g.H * g.W * g.C // 4
    if total:
        k.launch(sig, -(-total // BLOCK), BLOCK, stream, dcols, dx, g.H, g.W, g.C, g.R, g.S,
                 g.PH, g.PW, g.sh, g.sw, g.qh, g.qw, g.dh, g.dw, g.flip, total,
                 *magic_args(g.C // 4, g.W, g.H, g.sh, g.sw), alpha, beta)
    return dx

"""Convolution on the GPU for every geometry (1-3 d, stride, per-side padding, dilation,
groups, both modes, NCHW and NHWC). The formulas are in nbdnn/cpu/conv.py.

Forward algorithms (`algo=`; "auto" takes depthwise when groups == C, winograd4 or
winograd for 3x3 stride-1 layers of >= 32 channels a group (`_auto_forward`), else
implicit_gemm):
- gemm: explicit im2col into a workspace, the matmul kernel, an epilogue pass
  (nbdnn/cuda/conv/gemm.py).
- winograd / winograd4: F(2x2, 3x3) / F(4x4, 3x3) transforms around 16 / 36 batched
  GEMMs (2-d, 3x3, stride 1, dilation 1; nbdnn/cuda/conv/winograd.py).
- implicit_gemm: the GEMM kernel's tiles and thread layout with the A tile gathered
  from x on the fly (nbdnn/cuda/conv/implicit_gemm_source.py); M = N*P output positions,
  N = K/g filters, K = C/g*T*R*S taps, one grid row per group. Fused epilogue.
  float16 / bfloat16 channels-last on sm_90 ("auto" too, before the others): the
  tensor-core GEMM, its A gathered by TMA's im2col mode (nbdnn/cuda/conv/wgmma_conv.py;
  1x1 stride-1 filters the GEMM itself), where its limits hold.
- depthwise: one input channel a group. Channels-first layers (windows of up to 64
  taps, any stride and dilation) run the row kernel generated per window geometry
  (nbdnn/cuda/conv/depthwise_rows.py); channels-last ones generated 3x3/5x5 kernels
  (nbdnn/cuda/conv/depthwise.py); other depthwise filters run direct.
- direct: one thread an output element (nbdnn/cuda/conv/direct.py).

Every kernel sees 3 spatial axes (1-d and 2-d problems get leading axes of size 1)
and derives the strides of x, w and y from the layout, so one kernel serves every
rank and layout. A thread's output index is decomposed in the array's memory order
(channels fastest for NHWC), so consecutive threads write consecutive addresses.
- forward: y[n, k, p] gathers C/g * T*R*S products, then the epilogue
  act(alpha * acc + beta * z + bias), z = residual or the previous y.
- backward data, "auto" with every stride 1 (and paddings <= d*(R-1)): the forward
  algorithms over dy with the filter's channels swapped and flipped (_data_as_forward;
  16-bit channels-last on sm_90 the tensor cores read the filter as stored,
  DATA_FILTER_AS_STORED); channels-last 1x1: one GEMM dx = dy @ W (DATA_1X1_GEMM,
  gemm.backward_data_1x1); the filter's likewise (FILTER_1X1_GEMM: dW = dy^T @ x; other
  16-bit channels-last filters of one group: wgmma_conv.backward_filter).
- backward data and filter, algorithm "gemm" (the default otherwise, unless groups == C): the
  matmul kernel over the output gradient's rows and the im2col columns (split-K for
  the filter's long reduction), col2im for dx (nbdnn/cuda/conv/gemm.py).
- backward, "depthwise" (the default when groups == C): the forward depthwise kernel
  over dy for data (stride 1, dilation 1, else direct), ordered chunk sums for the
  filter (3x3/5x5, else gemm).
- backward data and filter, "direct": gathers, one thread a dx or dw element, no
  atomics (nbdnn/cuda/conv/direct.py).
- backward bias: reduce_tensor over every axis but the channels.
Per output element the direct forward reads C/g*T*R*S elements of x and of w (from
L1/L2: neighbouring threads share them): the reference-speed algorithm.

Resources (ptxas, sm_90), float32: direct forward 138 registers; implicit GEMM
variant 2 small 102, tiny 72 (no large tile); variant 3 (chunked, and its "_t" form) small
102, tiny 72, large capped at 128 (two blocks an SM) with a 176-200 B stack frame
whose spills sit outside the k loop (4 local loads in it, perf/tools/sass_dump.py);
depthwise forward variant 1 3x3 105, 5x5 153, variant 2 (tiles) 3x3 96 (stride 1)
and 126 (stride 2), 5x5 167, variant 3 (rows; the H200's driver) 3x3/1 48-64, 3x3/2
72, 5x5/1 100; nothing else spills. Speed against cuDNN:
 ("Convolution").
"""
import functools

import numpy as np

from .. import matmul as _mm
from ..matmul import TILES, gemm_call, choose_tile
from ..runtime.arrays import dtype_name, empty, vector_aligned
from ..runtime.device import sm_count
from ..runtime.grid import launch
from ..tensor import reduce_tensor, scale_tensor, set_tensor, transform_into
from ..._shapes import winograd_workspace
from ..._vocab import ACTIVATION_MODES
from . import depthwise as _conv_depthwise, depthwise_rows as _conv_depthwise_rows, \
    gemm as _conv_gemm, wgmma_conv as _wgmma_conv, winograd as _conv_winograd
from .geometry import geometry
from . import channels_first as _channels_first, im2col_words as _words
from . import implicit_gemm_source as _igemm
from .kernels import KERNELS as _KERNELS

# MobileNet's row kernel (float32 3x3/1, 4 rows a thread) for the PTX test; the others
# are built on first use
_conv_depthwise_rows.kernel("float32", "float32", (3, 3, 1, 1, 1, 1, 0), 4)


AUTO_WORKSPACE_LIMIT = 2 ** 31  # bytes of scratch memory "auto" may ask for
# "auto"'s channels-last 1x1 stride-1 data gradient as one GEMM dx = dy @ W (gemm.py
# backward_data_1x1) rather than W transposed, then the forward GEMM.
# Measured (H200, ResNet-50's nine 1x1 layers, bf16 NHWC, batch 32, graph replay): their
# data gradients at 0.55-1.09x cuDNN's speed, where the copy + GEMM ran 0.45-0.96x.
DATA_1X1_GEMM = True
# "auto"'s channels-last 1x1 stride-1 filter gradient as the GEMM dW = dy^T @ x (tiled
# TMA loads of x, the GEMM's own maps and narrow tiles) rather than wgmma_convdw (im2col
# boxes of x, 256-wide tiles, host maps). Measured (H200, as DATA_1X1_GEMM): the nine
# 0.60-0.80x cuDNN through the GEMM, 0.38-0.78x through wgmma_convdw (after its column
# words; 0.23-0.64x before).
FILTER_1X1_GEMM = True
# A stride-1 16-bit channels-last data gradient of a filter with more than one tap reads
# the filter as stored on the tensor cores (_data_filter_as_stored: B MN-major, no
# transposed copy). Measured (H200, ResNet-50's 3x3 layers, bf16, batch 32): the copy
# had taken 3.4-47 us of their data gradients' 24-72; now 0.71-1.0x cuDNN's speed
# (0.22-0.73x before); tests/test_conv_tc_data.py passed, memcheck and racecheck clean.
DATA_FILTER_AS_STORED = True


def _auto_forward(g, dtype="float32"):
    """depthwise for groups == C. 3x3, stride 1, dilation 1 2-d layers: winograd4 when
    its batched GEMMs have K * tiles >= 24576 outputs, else winograd (fewer, larger
    GEMMs would leave SMs idle), from 32 channels in and out a group (float16: winograd
    from 128), while the workspace fits AUTO_WORKSPACE_LIMIT (ResNet-50's s1 3x3 at
    batch 256 asks for 0.9 GB). Measured through graphs on the H200
    (batch 1-32, 32-512 channels: one of the two beat the implicit GEMM on 17 of
    18 layers (1.2-6.3x; 4% behind at 32 channels, batch 8), and this rule picks the
    faster of them on all 18. Else implicit_gemm."""
    N, C, K, G, D, H, W, T, R, S, PD, PH, PW, sd, sh, sw = g[:16]
    if C == G:
        return "depthwise"
    if (D, T, PD, R, S, sh, sw, g.dh, g.dw) != (1, 1, 1, 3, 3, 1, 1, 1, 1) or \
            min(C, K) // G < (128 if dtype in ("float16", "bfloat16") else 32):
        return "implicit_gemm"
    if dtype in ("float16", "bfloat16") or K * N * -(-PH // 4) * -(-PW // 4) < 24576:
        algo, m = "winograd", 2
    else:
        algo, m = "winograd4", 4
    fits = winograd_workspace(N, C, K, G, (PH, PW), m) * np.dtype(dtype).itemsize <= \
        AUTO_WORKSPACE_LIMIT
    return algo if fits else "implicit_gemm"


def _vector_epilogue(y, K, Kg, P, last, variant):
    """1 when the implicit GEMM's epilogue may store runs of 4 columns as one vector:
    the tile's columns are filters (channels-last, K and K/g multiples of 4) or
    positions ("_t", channels-first, P a multiple of 4), and y is aligned."""
    if variant == "igemm_" and not last:
        return 0
    fits = (K % 4 == 0 and Kg % 4 == 0) if last else P % 4 == 0
    return int(fits and vector_aligned(y))


def _gemm_in(math, dtype):
    """The GEMM the "gemm" algorithm calls: in float32's TF32 modes, the matmul's own
    (tf32_parts.py rounds or splits the im2col columns and the filters; sm_90: the
    tensor cores)."""
    if math == "ieee" or dtype != "float32":
        return gemm_call
    return functools.partial(gemm_call, math_mode=math)


def conv_forward(x, w, bias, residual, stride, pads, dilation, groups, mode, last,
                 activation, coef, algo, math="ieee", *, alpha, beta, out, stream):
    g = geometry(tuple(x.shape), tuple(w.shape), stride, pads, dilation, groups, mode, last)
    N, K, P = g.N, g.K, (g.PD, g.PH, g.PW)
    shape = (N,) + P[3 - (len(x.shape) - 2):] + (K,) if last else \
        (N, K) + P[3 - (len(x.shape) - 2):]
    dtype = dtype_name(x)
    y = out if out is not None else empty(x, shape, dtype)
    act = -1 if activation is None else ACTIVATION_MODES.index(activation)
    args = (x, w, y, bias if bias is not None else y, residual if residual is not None else y,
            *g, int(bias is not None), int(residual is not None), act, coef, alpha, beta)
    total = N * K * P[0] * P[1] * P[2]
    gemm = _gemm_in(math, dtype)
    if gemm is not gemm_call:  # (the front end let "auto" or "gemm" through)
        algo = "gemm"
        if math == "tf32" and total and _mm.TENSOR_CORES and _mm.tensor_cores() and \
                _wgmma_conv.tf32_usable(x, w, y, g, bias, residual, alpha, beta):
            _wgmma_conv.forward(x, w, y, bias, residual, activation, coef, alpha, beta, g,
                                stream)
            return y
    if algo in ("auto", "implicit_gemm") and total and (_channels_first.forward(
            x, w, y, bias, residual, g, dtype, activation, coef, alpha, beta, stream, algo,
            _auto_forward, _on_tensor_cores) if
            not last else _on_tensor_cores(x, w, y, bias, residual, g, dtype, activation,
                                           coef, alpha, beta, stream)):
        return y
    if algo == "auto":
        algo = _auto_forward(g, dtype)
    if algo == "depthwise" and _conv_depthwise.forward(_KERNELS, x, y, w, *args[3:5], g,
                                                       args[-6:], stream):
        return y
    if algo in ("direct", "depthwise"):  # depthwise without a generated kernel
        launch(_KERNELS, "fwd", dtype, total, stream, *args)
    elif algo == "gemm":
        if total:
            _conv_gemm.forward(_KERNELS, gemm, x, w, y, bias, residual, g, act, coef, alpha,
                               beta, stream)
    elif algo in ("winograd", "winograd4"):
        if total:
            _conv_winograd.forward(_KERNELS, gemm_call, x, w, y, bias, residual, g, act, coef,
                                   alpha, beta, stream, 4 if algo == "winograd4" else 2)
    elif total:
        _implicit_gemm(x, w, y, args, g, total, dtype, stream)
    return y


def _on_tensor_cores(x, w, y, bias, residual, g, dtype, activation, coef, alpha, beta,
                     stream):
    """16-bit channels-last forward on sm_90's tensor cores, "auto" or "implicit_gemm":
    a 1x1 filter with stride 1 and no padding is the GEMM y = x w^T (wgmma_gemm.py, own
    tensor maps: plannable) when the epilogue is the GEMM's too (alpha 1, no z); others
    the im2col kernel (wgmma_conv.py) where it takes them. False, doing nothing,
    otherwise."""
    if dtype not in ("float16", "bfloat16") or not (_mm.TENSOR_CORES and _mm.tensor_cores()):
        return False
    M, C, K = g.N * g.PH * g.PW, g.C, g.K
    if _words.PAD_NARROW_CHANNELS and C % 8 and _words.usable(g) and \
            (alpha, beta, residual) == (1, 0, None):  # (the stem: im2col_words.py)
        row = -(-(g.R * g.S * C) // 8) * 8
        gemm_call(_words.columns(x, g, row, stream).reshape((M, row)),
              _words.filter_rows(w, row, stream).reshape((K, row)), False, True, bias,
              activation, coef, 1.0, 0.0, y.reshape((M, K)), stream)
        return True
    if not _wgmma_conv.usable(x, w, y, g, bias, residual, alpha, beta):
        return False
    if g.R * g.S == 1 and (g.sh, g.sw, g.qh, g.qw) == (1, 1, 0, 0) and \
            (g.H, g.W) == (g.PH, g.PW) and (alpha, beta, residual) == (1, 0, None):
        gemm_call(x.reshape((M, C)), w.reshape((K, C)), False, True, bias, activation, coef, 1.0,
              0.0, y.reshape((M, K)), stream)
        return True
    _wgmma_conv.forward(x, w, y, bias, residual, activation, coef, alpha, beta, g, stream)
    return True


def _implicit_gemm(x, w, y, args, g, total, dtype, stream):
    """Launch the implicit GEMM (nbdnn/cuda/conv/implicit_gemm_source.py): the tile from the GEMM's
    tile choice, variant 3 where C/g fills a k-step and the taps fit its mask ("_t" for
    channels-first), else variant 2 (no 128x128 tile)."""
    N, K, groups, last = g.N, g.K, g.G, g.last
    M, Kg, taps = total // K, K // groups, g.T * g.R * g.S
    tiles = TILES["float64" if dtype == "float64" else "float32"]

    def fits_chunked(size):
        return g.C // groups >= tiles[size][2] and taps <= 64

    size, _ = choose_tile(M, Kg, 0, groups, dtype, False)
    if size == "large" and (Kg <= TILES["float32"]["small"][1] or not fits_chunked(size)):
        size = "small"  # 64 filters would leave half of a 128-wide tile idle
    BM, BN, BK, TM, TN = tiles[size]
    chunked = fits_chunked(size)
    wk = w
    if chunked and not last and taps > 1:  # (K, C/g, TRS) -> (K, TRS, C/g)
        wk = empty(x, tuple(w.shape), dtype)  # like x: torch's caching allocator when x is
        # a torch tensor and w a numba parameter (numba's own allocator: ~30 us a call)
        transform_into(w, (K, g.C // groups, taps), (0, 2, 1), wk, 1.0, 0.0, stream)
    variant = ("igemm_chunked_t_" if not last else "igemm_chunked_") if chunked else "igemm_"
    k, sig = _KERNELS[variant + size, dtype]
    PT, FT = (BN, BM) if variant == "igemm_chunked_t_" else (BM, BN)  # positions, filters
    k.launch(sig, (-(-M // PT) * -(-Kg // FT), groups, 1), (BM // TM) * (BN // TN), stream,
             x, wk, *args[2:5], _igemm.taps_table(g, chunked), *args[5:],
             _vector_epilogue(y, K, Kg, total // (N * K), last, variant))


def conv_backward_data(dy, w, x_shape, stride, pads, dilation, groups, mode, last, algo,
                       math="ieee", *, alpha, beta, out, stream):
    g = geometry(x_shape, tuple(w.shape), stride, pads, dilation, groups, mode, last)
    dx = out if out is not None else empty(dy, x_shape, dtype_name(dy))
    gemm = _gemm_in(math, dtype_name(dy))
    if gemm is not gemm_call:
        algo = "gemm"
    if algo == "auto":
        if DATA_1X1_GEMM and np.prod(x_shape) and \
                _conv_gemm.backward_data_1x1(gemm, dy, w, dx, g, alpha, beta, stream):
            return dx
        if g.C != groups and _data_as_forward(dy, w, dx, stride, pads, dilation, groups,
                                               mode, last, alpha, beta, stream):
            return dx
        algo = "depthwise" if g.C == groups else "gemm"
    if algo == "depthwise":
        if _conv_depthwise.backward_data(_KERNELS, dy, w, dx, g, alpha, beta, stream):
            return dx
        algo = "direct"
    if algo == "direct":
        launch(_KERNELS, "bwd_data", dtype_name(dy), int(np.prod(x_shape)), stream, dy, w, dx, *g,
                alpha, beta)
    elif np.prod(x_shape):
        _conv_gemm.backward_data(_KERNELS, gemm, dy, w, dx, g, alpha, beta, stream)
    return dx


def _data_as_forward(dy, w, dx, stride, pads, dilation, groups, mode, last, alpha, beta,
                     stream):
    """With stride 1, dx is a forward convolution of dy: dx[i] = sum_r dy[i + q - r*d]
    w[r] reads dy with pre-padding d*(R-1) - q and post-padding d*(R-1) - q_post
    through the flipped filter, whose input and output channels swap within each group
    (w' = (C, K/g, taps), a transposed copy). So the forward algorithms (implicit GEMM,
    winograd) serve it. False, doing nothing, when a stride is not 1 or a padding
    exceeds d*(R-1) (the forward padding would be negative)."""
    ws = tuple(w.shape)
    R = ws[1:-1] if last else ws[2:]
    if any(s != 1 for s in stride) or any(max(a, b) > d * (r - 1) for (a, b), d, r in
                                          zip(pads, dilation, R)):
        return False
    back = tuple((d * (r - 1) - a, d * (r - 1) - b) for (a, b), d, r in zip(pads, dilation, R))
    flipped = "cross_correlation" if mode == "convolution" else "convolution"
    if last and groups == 1 and _data_filter_as_stored(dy, w, dx, back, dilation, flipped,
                                                        alpha, beta, stream):
        return True
    K, Cg, taps = ws[0], ws[-1 if last else 1], int(np.prod(R))
    Kg = K // groups
    view, perm = ((groups, Kg, taps, Cg), (0, 3, 2, 1)) if last else \
        ((groups, Kg, Cg, taps), (0, 2, 1, 3))
    wt = empty(dy, (groups * Cg,) + R + (Kg,) if last else (groups * Cg, Kg) + R,
               dtype_name(w))  # like dy, as _implicit_gemm's wk
    transform_into(w, view, perm, wt, 1.0, 0.0, stream)
    conv_forward(dy, wt, None, None, tuple(stride), back, tuple(dilation), groups, flipped,
                 last, None, 0.0, "auto", alpha=alpha, beta=beta, out=dx, stream=stream)
    return True


def _data_filter_as_stored(dy, w, dx, back, dilation, flipped, alpha, beta, stream):
    """_data_as_forward's channels-last, one-group, 16-bit call on the tensor cores with
    w (K, R, S, C) read as stored (DATA_FILTER_AS_STORED: wgmma_conv.forward's
    w_stored): no transposed copy. Filters of more than one tap (a 1x1's is the GEMM's,
    DATA_1X1_GEMM). False, doing nothing, where the kernel would not take the call."""
    ws = tuple(w.shape)
    if not DATA_FILTER_AS_STORED or dtype_name(dy) not in ("float16", "bfloat16") or \
            int(np.prod(ws[1:-1])) == 1 or not (_mm.TENSOR_CORES and _mm.tensor_cores()):
        return False
    g = geometry(tuple(dy.shape), (ws[-1],) + ws[1:-1] + (ws[0],), (1,) * len(back), back,
                 tuple(dilation), 1, flipped, 1)
    if not _wgmma_conv.usable(dy, w, dx, g, None, None, alpha, beta):
        return False
    _wgmma_conv.forward(dy, w, dx, None, None, None, 0.0, alpha, beta, g, stream,
                        w_stored=True)
    return True


def conv_backward_filter(dy, x, w_shape, stride, pads, dilation, groups, mode, last, algo,
                         math="ieee", *, alpha, beta, out, stream):
    g = geometry(tuple(x.shape), w_shape, stride, pads, dilation, groups, mode, last)
    dw = out if out is not None else empty(dy, w_shape, dtype_name(dy))
    gemm = _gemm_in(math, dtype_name(dy))
    if gemm is not gemm_call:
        algo = "gemm"
    if algo == "auto" and FILTER_1X1_GEMM and g.last and g.G == 1 and np.prod(w_shape) and \
            _conv_gemm.backward_filter_1x1(gemm, dy, x, dw, g, alpha, beta, stream):
        return dw
    if algo == "auto" and np.prod(w_shape) and _wgmma_conv.filter_usable(dy, x, dw, g) and \
            _mm.TENSOR_CORES and _mm.tensor_cores():
        return _wgmma_conv.backward_filter(dy, x, dw, g, alpha, beta, stream)
    if algo == "auto":
        algo = "depthwise" if g.C == groups else "gemm"
    if algo == "depthwise":
        if _conv_depthwise.backward_filter(_KERNELS, dy, x, dw, g, alpha, beta, stream,
                                           sm_count()):
            return dw
        algo = "gemm"
    if algo == "direct":
        launch(_KERNELS, "bwd_filter", dtype_name(dy), int(np.prod(w_shape)), stream, dy, x, dw, *g,
                alpha, beta)
    elif np.prod(w_shape) and not _conv_gemm.backward_filter_1x1(gemm, dy, x, dw, g, alpha,
                                                                 beta, stream):
        _conv_gemm.backward_filter(_KERNELS, gemm, dy, x, dw, g, alpha, beta, stream)
    return dw


def conv_backward_bias(dy, last, *, alpha, beta, out, stream):
    nd = len(dy.shape)
    axes = tuple(i for i in range(nd) if i != (nd - 1 if last else 1))
    if any(dy.shape[i] == 0 for i in axes):  # a sum over no elements: 0, blended
        K = dy.shape[nd - 1 if last else 1]
        y = out if out is not None else empty(dy, (K,), dtype_name(dy))
        if beta == 0:
            return set_tensor(0.0, out=y, stream=stream)
        return scale_tensor(y, beta, out=y, stream=stream)
    return reduce_tensor(dy, "add", axes, False, False, alpha=alpha, beta=beta, out=out,
                         stream=stream)

"""OpSpec rows for convolution (imported by nbdnn.testing): forward (fused epilogue and
algorithm drawn at random) and the three backward passes, over random rank (1-3 d), layout,
mode, stride, per-side padding, dilation and groups (depthwise and channel
multipliers included). Tolerances grow with the reduction length (C/g * taps forward
and backward data, N * output positions for the filter)."""
import math

import numpy as np

import nbdnn
from nbdnn.testing.specs.matmul import math_modes, matmul_tol
from nbdnn.ops.conv import winograd_fits
from nbdnn._vocab import BF16_DTYPES, MATH_MODES
from nbdnn.testing.harness import Case, OpSpec, rand

CONV = {1: nbdnn.conv1d, 2: nbdnn.conv2d, 3: nbdnn.conv3d}
ACTIVATIONS = (None, None, "relu", "gelu", "tanh")


def _problem(draw, big):
    """(nd, x shape, w shape, keywords, (K, taps, output positions))."""
    nd = (2, 2, 1, 3)[draw(0, 3)]
    cap = (12, 6, 3)[nd - 1] if not big else (40, 20, 8)[nd - 1]
    G = draw(1, 3)
    C, K = G * draw(1, 3), G * draw(1, 3)
    R = tuple(draw(1, 3) for _ in range(nd))
    stride = tuple(draw(1, 2) for _ in range(nd))
    dil = tuple(draw(1, 2) for _ in range(nd))
    pads = tuple((draw(0, 2), draw(0, 2)) for _ in range(nd))
    S = tuple(max(draw(1, cap), (r - 1) * d + 1 - a - b)
              for r, d, (a, b) in zip(R, dil, pads))
    last = draw(0, 1) == 1
    N = draw(1, 2)
    xs = (N,) + S + (C,) if last else (N, C) + S
    ws = (K,) + R + (C // G,) if last else (K, C // G) + R
    P = tuple((s + a + b - d * (r - 1) - 1) // q + 1
              for s, (a, b), d, r, q in zip(S, pads, dil, R, stride))
    kw = dict(stride=stride, padding=pads, dilation=dil, groups=G,
              mode=("cross_correlation", "convolution")[draw(0, 1)],
              layout="NHWC" if last else "NCHW")
    return nd, xs, ws, kw, (K, C // G * math.prod(R), N * math.prod(P))


def _conv(x, w, bias=None, residual=None, nd=2, **kw):
    return CONV[nd](x, w, bias, residual=residual, **kw)


def _make_forward(draw, dtype, big):
    rng = np.random.default_rng(draw(0, 2 ** 31))
    nd, xs, ws, kw, (K, taps, _) = _problem(draw, big)
    x, w = rand(rng, xs, dtype, -1, 1), rand(rng, ws, dtype, -1, 1)
    bias = rand(rng, (K,), dtype, -1, 1) if draw(0, 1) else None
    residual = None
    if draw(0, 2) == 0:
        residual = rand(rng, CONV[nd](x, w, **kw).shape, dtype)
        kw["alpha2"] = (1.0, 0.5)[draw(0, 1)]
    algos = ("auto", "direct", "implicit_gemm", "gemm")
    if winograd_fits(nd, ws[2:] if kw["layout"] == "NCHW" else ws[1:-1], kw["stride"],
                     kw["dilation"]):
        algos += ("winograd", "winograd4")
    kw.update(nd=nd, activation=ACTIVATIONS[draw(0, len(ACTIVATIONS) - 1)],
              algo=algos[draw(0, len(algos) - 1)])
    atol, rtol = matmul_tol(dtype, taps + 2)
    if kw["algo"] == "winograd4":  # F(4x4)'s transforms: ~4x the rounding (auto never
        # takes it here: these layers have fewer than 32 channels a group)
        atol, rtol = 4 * atol, 4 * rtol
    kw["math"], (x, w), tol = _tf32(draw, dtype, [x, w], (atol, rtol), kw)
    return Case((x, w, bias, residual), kw, tol=tol, blend=residual is None)


def _tf32(draw, dtype, operands, tol, kw):
    """float32 rows of algo "auto" or "gemm" (the ones that run the TF32 modes) draw a
    math mode, last (the earlier draws stay as they were); the TF32 modes' operands
    are TF32-exact (matmul's math_modes)."""
    if kw["algo"] not in ("auto", "gemm"):
        return "ieee", operands, tol
    return math_modes(draw, dtype, operands, tol)


def _make_backward(which):
    def make(draw, dtype, big):
        rng = np.random.default_rng(draw(0, 2 ** 31))
        nd, xs, ws, kw, (_, taps, positions) = _problem(draw, big)
        x, w = rand(rng, xs, dtype, -1, 1), rand(rng, ws, dtype, -1, 1)
        dy = rand(rng, CONV[nd](x, w, **kw).shape, dtype, -1, 1)
        kw["algo"] = ("auto", "direct", "gemm")[draw(0, 2)]
        if which == "data":
            kw["math"], (dy, w), tol = _tf32(draw, dtype, [dy, w],
                                             matmul_tol(dtype, taps * max(1, ws[0])), kw)
            return Case((dy, w, xs), kw, tol=tol)
        if which == "filter":
            kw["math"], (dy, x), tol = _tf32(draw, dtype, [dy, x],
                                             matmul_tol(dtype, positions), kw)
            return Case((dy, x, ws), kw, tol=tol)
        return Case((dy,), {"layout": kw["layout"]}, tol=matmul_tol(dtype, positions))
    return make


def _depthwise_problem(draw, big):
    """A 2-d depthwise problem (groups == C, multiplier 1-2) that mostly fits the
    generated kernels (3x3/5x5, stride 1-2 along H, dilation 1 along H); dilation 2
    along H sends some to the direct fallback."""
    C, mult = draw(1, 3), draw(1, 2)
    R = (3, 5)[draw(0, 1)]
    stride, dil = (draw(1, 2), draw(1, 2)), ((1, 1, 1, 2)[draw(0, 3)], draw(1, 2))
    pads = tuple((draw(0, 2), draw(0, 2)) for _ in range(2))
    cap = 12 if big else 7
    S = tuple(max(draw(1, cap), (R - 1) * d + 1 - a - b) for d, (a, b) in zip(dil, pads))
    last, N, K = draw(0, 1) == 1, draw(1, 2), C * mult
    xs = (N,) + S + (C,) if last else (N, C) + S
    ws = (K, R, R, 1) if last else (K, 1, R, R)
    kw = dict(stride=stride, padding=pads, dilation=dil, groups=C,
              mode=("cross_correlation", "convolution")[draw(0, 1)],
              layout="NHWC" if last else "NCHW", algo=("auto", "depthwise")[draw(0, 1)])
    return xs, ws, kw


def _make_depthwise(which):
    def make(draw, dtype, big):
        rng = np.random.default_rng(draw(0, 2 ** 31))
        xs, ws, kw = _depthwise_problem(draw, big)
        x, w = rand(rng, xs, dtype, -1, 1), rand(rng, ws, dtype, -1, 1)
        y = nbdnn.conv2d(x, w, **kw)
        taps, positions = 2 * 25, y.size // ws[0]  # multiplier x R*S; N*P*Q
        if which == "forward":
            bias = rand(rng, (ws[0],), dtype, -1, 1) if draw(0, 1) else None
            kw.update(activation=ACTIVATIONS[draw(0, len(ACTIVATIONS) - 1)])
            return Case((x, w, bias), kw, tol=matmul_tol(dtype, taps))
        dy = rand(rng, y.shape, dtype, -1, 1)
        if which == "data":
            return Case((dy, w, xs), kw, tol=matmul_tol(dtype, taps))
        return Case((dy, x, ws), kw, tol=matmul_tol(dtype, positions))
    return make


# (x shape, w shape, keywords): geometry at its limits, channels first unless said
EDGES = {
    "padding as wide as the filter (output larger than the input)":
        ((1, 4, 5, 6), (6, 2, 3, 3), dict(padding=2, groups=2)),
    "stride past the filter": ((2, 3, 7, 7), (4, 3, 1, 1), dict(stride=3)),
    "filter as large as the input": ((1, 2, 5, 4), (3, 2, 5, 4), dict()),
    "prime sizes, dilation, per-side padding, flipped":
        ((1, 3, 7, 11), (5, 3, 3, 2), dict(stride=(2, 1), dilation=(2, 3),
                                           padding=((2, 0), (1, 3)), mode="convolution")),
    "depthwise with a channel multiplier, channels last":
        ((2, 6, 5, 3), (6, 3, 3, 1), dict(padding=1, groups=3, layout="NHWC")),
    "1-d, dilation past the input's end": ((2, 2, 9), (3, 2, 3), dict(dilation=4, padding=3)),
    "3-d, stride and padding": ((1, 2, 3, 4, 5), (2, 1, 2, 3, 2), dict(stride=2, padding=1,
                                                                      groups=2)),
}


# (x shape, w shape, keywords), channels-last 1-d and 3-d: the ranks and layout whose
# kernels take 2-d shortcuts (ConvGeometry.planar); tests/test_conv_ranks.py runs each
# in every dtype and math mode
RANKS = {
    "1-d, narrow channels, padding after": ((2, 5, 3), (2, 2, 3), dict(padding=((0, 1),))),
    "1-d, 8 channels, stride and dilation":
        ((1, 9, 8), (4, 3, 8), dict(stride=2, dilation=2, padding=((1, 2),))),
    "3-d, one plane, depth padding (several output planes)":
        ((1, 1, 2, 2, 1), (1, 1, 2, 2, 1), dict(padding=((2, 2), (0, 0), (0, 0)))),
    "3-d, one plane, depth padding before (the tap in the padding)":
        ((1, 1, 3, 3, 2), (2, 1, 1, 3, 2), dict(stride=(2, 1, 1), dilation=(1, 2, 2),
                                              padding=((0, 2), (0, 0), (2, 0)))),
    "3-d, depth 3, stride and padding":
        ((1, 3, 4, 3, 4), (3, 2, 2, 1, 4), dict(stride=(2, 1, 1), padding=1)),
}


def rank_case(name, which, dtype, mode, algo):
    """RANKS[name] channels-last, as a Case of the forward, "data" or "filter" row, in
    float32 math `mode` (operands TF32-exact for "tf32", as the rows draw them)."""
    xs, ws, kw = RANKS[name]
    nd = len(xs) - 2
    kw = dict(kw, layout="NHWC", algo=algo)
    rng = np.random.default_rng(len(name))
    x, w = rand(rng, xs, dtype, -1, 1), rand(rng, ws, dtype, -1, 1)
    y = CONV[nd](x.astype(np.float64), w.astype(np.float64), **kw)
    dy = rand(rng, y.shape, dtype, -1, 1)
    draw = lambda lo, hi: MATH_MODES.index(mode)  # noqa: E731  (math_modes's one draw)
    taps = math.prod(ws[1:])
    if which == "forward":
        kw["math"], (x, w), tol = math_modes(draw, dtype, [x, w], matmul_tol(dtype, taps + 2))
        return Case((x, w, rand(rng, (ws[0],), dtype, -1, 1), None), dict(kw, nd=nd), tol=tol)
    if which == "data":
        kw["math"], (dy, w), tol = math_modes(draw, dtype, [dy, w], matmul_tol(dtype, taps * ws[0]))
        return Case((dy, w, xs), kw, tol=tol)
    kw["math"], (dy, x), tol = math_modes(draw, dtype, [dy, x], matmul_tol(dtype, y.size))
    return Case((dy, x, ws), kw, tol=tol)


def _edge(name, which, algo):
    def make(dtype):
        xs, ws, kw = EDGES[name]
        nd = len(xs) - 2
        rng = np.random.default_rng(len(name))
        x, w = rand(rng, xs, dtype, -1, 1), rand(rng, ws, dtype, -1, 1)
        y = CONV[nd](x.astype(np.float64), w.astype(np.float64), **kw)
        taps = math.prod(ws[1:])
        if which == "forward":
            bias = rand(rng, (ws[0],), dtype, -1, 1)
            return Case((x, w, bias, None), dict(kw, nd=nd, algo=algo),
                        tol=matmul_tol(dtype, taps + 2))
        dy = rand(rng, y.shape, dtype, -1, 1)
        if which == "data":
            return Case((dy, w, xs), dict(kw, algo=algo), tol=matmul_tol(dtype, taps * ws[0]))
        return Case((dy, x, ws), dict(kw, algo=algo), tol=matmul_tol(dtype, y.size))
    return make


def _edges(which, algos):
    return {f"{name}, {algo}": _edge(name, which, algo) for name in EDGES for algo in algos}


ROW = {"family": "conv", "dtypes": BF16_DTYPES}  # every conv op takes bfloat16
SPECS = [OpSpec("conv", _conv, _make_forward, **ROW, ops=("conv1d", "conv2d", "conv3d"),
                boundary=_edges("forward", ("auto", "implicit_gemm"))),
         OpSpec("conv_backward_data", nbdnn.conv_backward_data, _make_backward("data"),
                **ROW, boundary=_edges("data", ("auto", "direct"))),
         OpSpec("conv_backward_filter", nbdnn.conv_backward_filter,
                _make_backward("filter"), **ROW,
                boundary=_edges("filter", ("auto", "direct"))),
         OpSpec("conv_depthwise", nbdnn.conv2d, _make_depthwise("forward"), **ROW),
         OpSpec("conv_depthwise_backward_data", nbdnn.conv_backward_data,
                _make_depthwise("data"), **ROW),
         OpSpec("conv_depthwise_backward_filter", nbdnn.conv_backward_filter,
                _make_depthwise("filter"), **ROW),
         OpSpec("conv_backward_bias", nbdnn.conv_backward_bias, _make_backward("bias"),
                **ROW)]

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
  algorithms over dy with the filter's channels swapped and flipped (as_forward;
  16-bit channels-last on sm_90 the tensor cores read the filter as stored,
  filter_as_stored); channels-last 1x1: one GEMM dx = dy @ W (gemm_1x1); the filter's
  likewise (gemm_1x1: dW = dy^T @ x; other 16-bit channels-last filters of one group:
  tensor_cores, wgmma_conv.backward_filter).
- backward data, float32 in math "tf32" ("auto") with every stride 1 and more than one tap
  on sm_90: as_forward in math "tf32" (the tf32 kernel; channels-first through
  channels-last copies: tf32_as_forward); channels-last 1x1: gemm_1x1 in tf32 too.
- backward data and filter, algorithm "gemm" (the default otherwise, unless groups == C): the
  matmul kernel over the output gradient's rows and the im2col columns (split-K for
  the filter's long reduction), col2im for dx (nbdnn/cuda/conv/gemm.py).
- backward, "depthwise" (the default when groups == C): the forward depthwise kernel
  over dy for data (stride 1, dilation 1, else direct), ordered chunk sums for the
  filter (3x3/5x5, else gemm).
- backward data and filter, "direct": gathers, one thread a dx or dw element, no
  atomics (nbdnn/cuda/conv/direct.py).
- backward bias: reduce_tensor over every axis but the channels.
FORWARD, DATA and FILTER below declare these as variants in order of preference (the
first usable and wanted one runs a call); `forced(name)` makes a test or a benchmark
run one (runtime/variants.py).
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
import dataclasses
import functools

import numpy as np

from .. import matmul as _mm
from ..matmul import TILES, gemm_call, choose_tile
from ..runtime import variants
from ..runtime.memory.arrays import dtype_name, empty, size, vector_aligned
from ..runtime.device import sm_count
from ..runtime.launch.grid import launch
from ..runtime.variants import Variant
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
    if not _winograd_fits(g) or \
            min(C, K) // G < (128 if dtype in ("float16", "bfloat16") else 32):
        return "implicit_gemm"
    if dtype in ("float16", "bfloat16") or K * N * -(-PH // 4) * -(-PW // 4) < 24576:
        algo, m = "winograd", 2
    else:
        algo, m = "winograd4", 4
    fits = winograd_workspace(N, C, K, G, (PH, PW), m) * np.dtype(dtype).itemsize <= \
        AUTO_WORKSPACE_LIMIT
    return algo if fits else "implicit_gemm"


def _winograd_fits(g):
    """The winograd kernels' geometry: 2-d 3x3, stride 1, dilation 1."""
    return (g.D, g.T, g.PD, g.R, g.S, g.sh, g.sw, g.dh, g.dw) == (1, 1, 1, 3, 3, 1, 1, 1, 1)


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


@dataclasses.dataclass
class Call:
    """One validated call as the variants take it. Forward: x, w -> y; data gradient:
    dy, w -> dx; filter gradient: dy, x -> dw. g: the ConvGeometry; algo: the algorithm
    asked for ("gemm" in float32's TF32 modes, whatever was asked); pick: the
    algorithm "auto" resolves to (algo itself when one was named)."""
    g: object
    algo: str
    math: str
    alpha: float
    beta: float
    stream: object
    x: object = None
    w: object = None
    y: object = None
    dy: object = None
    dx: object = None
    dw: object = None
    bias: object = None
    residual: object = None
    activation: str = None
    coef: float = 0.0
    pick: str = None
    args: tuple = ()  # the data gradient's (stride, pads, dilation, groups, mode, last)
    asked: str = None  # the algorithm as asked (algo: "gemm" for every TF32-mode call)

    @property
    def dtype(self):
        return dtype_name(self.x if self.x is not None else self.dy)

    @property
    def gemm(self):
        return _gemm_in(self.math, self.dtype)

    @property
    def exact(self):
        """Plain arithmetic: not float32 in a TF32 mode (which runs "gemm" alone)."""
        return self.gemm is gemm_call

    @property
    def act(self):
        return -1 if self.activation is None else ACTIVATION_MODES.index(self.activation)

    @property
    def plain(self):
        """The GEMM's own epilogue: alpha 1, no z (a residual, or beta on y)."""
        return (self.alpha, self.beta, self.residual) == (1, 0, None)

    def tail(self):
        """The kernels' epilogue arguments after the geometry."""
        return (int(self.bias is not None), int(self.residual is not None), self.act,
                self.coef, self.alpha, self.beta)

    def arrays(self):
        """(x, w, y, bias or y, residual or y): the forward kernels' first arguments."""
        y = self.y
        return (self.x, self.w, y, self.bias if self.bias is not None else y,
                self.residual if self.residual is not None else y)


def _algo(c, *names):
    """c asked for "auto" or one of names."""
    return c.algo == "auto" or c.algo in names


def _tensor_cores():
    return _mm.tensor_cores()


# ---- the forward's variants, in order of preference
def _tc16(c):
    """16-bit, "auto" or "implicit_gemm", sm_90's tensor cores."""
    return c.dtype in ("float16", "bfloat16") and _algo(c, "implicit_gemm") and \
        _tensor_cores()


def _wgmma_usable(c):
    return _wgmma_conv.usable(c.x, c.w, c.y, c.g, c.bias, c.residual, c.alpha, c.beta)


def _one_by_one(g):
    """A 1x1 filter with stride 1 and no padding: y = x w^T over the positions."""
    return g.R * g.S == 1 and (g.sh, g.sw, g.qh, g.qw) == (1, 1, 0, 0) and \
        (g.H, g.W) == (g.PH, g.PW)


def _stem_words(c):
    """Channels not a multiple of 8 (a 3-channel stem): im2col columns padded to 16-byte
    rows and the GEMM (im2col_words.py)."""
    g, row = c.g, -(-(c.g.R * c.g.S * c.g.C) // 8) * 8
    M = g.N * g.PH * g.PW
    gemm_call(_conv_gemm.columns(_KERNELS, c.x, g, c.stream, row).reshape((M, row)),
              _conv_gemm.filter_rows(_KERNELS, c.w, row, c.stream).reshape((g.K, row)), False,
              True, c.bias,
              c.activation, c.coef, 1.0, 0.0, c.y.reshape((M, g.K)), c.stream)


def _gemm_1x1_forward(c):
    M = c.g.N * c.g.PH * c.g.PW
    gemm_call(c.x.reshape((M, c.g.C)), c.w.reshape((c.g.K, c.g.C)), False, True, c.bias,
              c.activation, c.coef, 1.0, 0.0, c.y.reshape((M, c.g.K)), c.stream)


def _wgmma_forward(c):
    _wgmma_conv.forward(c.x, c.w, c.y, c.bias, c.residual, c.activation, c.coef, c.alpha,
                        c.beta, c.g, c.stream)


CHANNELS_LAST_16 = (
    Variant("stem_words", lambda c: c.g.last and _tc16(c) and c.g.C % 8 != 0 and
            _words.usable(c.g) and c.plain, _stem_words,
            "im2col_words.py: narrow channels as padded im2col columns, the GEMM's fused "
            "epilogue (alpha 1, no z)"),
    Variant("gemm_1x1", lambda c: c.g.last and _tc16(c) and _wgmma_usable(c) and
            _one_by_one(c.g) and c.plain, _gemm_1x1_forward,
            "a 1x1 stride-1 filter is the GEMM y = x w^T (wgmma_gemm.py, own tensor maps: "
            "plannable), the GEMM's epilogue"),
    Variant("tensor_cores", lambda c: c.g.last and _tc16(c) and _wgmma_usable(c),
            _wgmma_forward,
            "wgmma_conv.py: the tensor-core GEMM, A gathered by TMA's im2col mode"),
)


def _copies_usable(c):
    g = c.g
    if g.last or not _tc16(c) or g.G != 1 or (c.beta != 0 and c.residual is None):
        return False  # (beta only as a residual's weight: z = y would need y copied in)
    gl = g._replace(last=1)  # (every other field is the layout's own: geometry.py)
    return _wgmma_conv.usable(c.x, c.w, c.y, gl, c.bias, c.residual, c.alpha, c.beta)


def _through_copies(table):
    """run(c) for a channels-first call: through channels-last copies, the first variant of
    `table` that takes the channels-last call running on them (channels_first.py)."""
    def run(c):
        def channels_last(xt, wt, yt, rt, gl):
            cl = dataclasses.replace(c, x=xt, w=wt, y=yt, residual=rt, g=gl)
            next(v for v in table if v.usable(cl)).run(cl)
        _channels_first.forward(c.x, c.w, c.y, c.residual, c.g, c.dtype, c.stream,
                                channels_last)
    return run


def _depthwise_forward(c):
    _conv_depthwise.forward(_KERNELS, c.x, c.y, c.w, *c.arrays()[3:], c.g, c.tail(),
                            c.stream)


def _winograd(m):
    return lambda c: _conv_winograd.forward(_KERNELS, gemm_call, c.x, c.w, c.y, c.bias,
                                            c.residual, c.g, c.act, c.coef, c.alpha, c.beta,
                                            c.stream, m)


def _tf32_usable(c):
    """float32 in math "tf32" ("auto" and "gemm" both arrive as "gemm": _run) that the
    tf32 wgmma kernel takes (channels-last, no residual, alpha 1, beta 0)."""
    return c.math == "tf32" and c.dtype == "float32" and _algo(c, "gemm") and \
        _tensor_cores() and _wgmma_conv.tf32_usable(c.x, c.w, c.y, c.g, c.bias, c.residual,
                                                    c.alpha, c.beta)


def _tf32_copies_usable(c):
    """A channels-first float32 call the tf32 kernel would take channels-last."""
    return not c.g.last and c.g.G == 1 and \
        _tf32_usable(dataclasses.replace(c, g=c.g._replace(last=1)))


TF32_TENSOR_CORES = Variant(
    "tf32_tensor_cores", _tf32_usable, _wgmma_forward,
    "wgmma_conv.py's tf32 kind: float32 in math \"tf32\" on the tensor cores")


FORWARD = (
    TF32_TENSOR_CORES,
    Variant("tf32_channels_first_copies", _tf32_copies_usable,
            _through_copies((TF32_TENSOR_CORES,)),
            "channels_first.py: float32 NCHW in math \"tf32\" through channels-last copies "
            "and the tf32 kernel, where a filter has more than one tap (the GEMM path's "
            "im2col columns move R S T times x's items; the copies 2 (C + K) a position)",
            wanted=lambda c: c.g.T * c.g.R * c.g.S > 1),
    Variant("channels_first_copies", _copies_usable, _through_copies(CHANNELS_LAST_16),
            "channels_first.py: 16-bit NCHW through channels-last copies and the tensor "
            "cores, where the GEMM's flops pay for the copies",
            wanted=lambda c: _channels_first.pays(c.g, c.dtype, c.pick)),
    *CHANNELS_LAST_16,
    Variant("depthwise", lambda c: c.exact and _algo(c, "depthwise") and
            _conv_depthwise.forward_usable(c.g, size(c.x), size(c.y)), _depthwise_forward,
            "depthwise.py, depthwise_rows.py: generated kernels a window geometry",
            wanted=lambda c: c.pick == "depthwise"),
    Variant("winograd4", lambda c: c.exact and _algo(c, "winograd4") and _winograd_fits(c.g),
            _winograd(4), "winograd.py: F(4x4, 3x3) around 36 batched GEMMs",
            wanted=lambda c: c.pick == "winograd4"),
    Variant("winograd", lambda c: c.exact and _algo(c, "winograd") and _winograd_fits(c.g),
            _winograd(2), "winograd.py: F(2x2, 3x3) around 16 batched GEMMs",
            wanted=lambda c: c.pick == "winograd"),
    Variant("implicit_gemm", lambda c: c.exact and _algo(c, "implicit_gemm"),
            lambda c: _implicit_gemm(c),
            "implicit_gemm_source.py: the GEMM's tiles, A gathered from x on the fly",
            wanted=lambda c: c.pick == "implicit_gemm"),
    Variant("gemm_1x1_channels_first", lambda c: _algo(c, "gemm") and
            _conv_gemm.forward_1x1_usable(c.g) and c.bias is None and c.residual is None and
            c.activation is None,
            lambda c: _conv_gemm.forward_1x1(c.gemm, c.x, c.w, c.y, c.g, c.alpha, c.beta,
                                             c.stream),
            "gemm.py: channels-first 1x1 at stride 1, no bias, residual or activation: "
            "y[n] = W x[n], a batched GEMM over the positions as stored (no im2col "
            "columns, no epilogue pass); float32's TF32 modes run here",
            wanted=lambda c: c.pick == "gemm"),
    Variant("gemm_positions", lambda c: not c.exact and c.bias is None and
            c.residual is None and c.activation is None and
            _conv_gemm.forward_positions_usable(c.g, c.dtype),
            lambda c: _conv_gemm.forward_positions(_KERNELS, c.gemm, c.x, c.w, c.y, c.g,
                                                   c.alpha, c.beta, c.stream),
            "gemm.py: float32 channels-first in a TF32 mode without bias, residual or "
            "activation (the stem, strided 1x1 layers; 3x3 layers run the tf32 kernel "
            "through copies first): y[n] = W cols[n], each image's columns transposed, "
            "a batched GEMM writing y as stored (no raw product, no transposing epilogue)"),
    Variant("gemm", lambda c: _algo(c, "gemm"),
            lambda c: _conv_gemm.forward(_KERNELS, c.gemm, c.x, c.w, c.y, c.bias, c.residual,
                                         c.g, c.act, c.coef, c.alpha, c.beta, c.stream),
            "gemm.py: im2col columns in a workspace, the matmul, an epilogue pass",
            wanted=lambda c: c.pick == "gemm"),
    Variant("direct", lambda c: c.exact and _algo(c, "direct", "depthwise"),
            lambda c: launch(_KERNELS, "fwd", c.dtype, size(c.y), c.stream, *c.arrays(),
                             *c.g, *c.tail()),
            "direct.py: a thread an output element (and depthwise filters without a "
            "generated kernel)",
            wanted=lambda c: c.pick in ("direct", "depthwise")),
)


def conv_forward(x, w, bias, residual, stride, pads, dilation, groups, mode, last,
                 activation, coef, algo, math="ieee", *, alpha, beta, out, stream):
    g = geometry(tuple(x.shape), tuple(w.shape), stride, pads, dilation, groups, mode, last)
    shape = (g.N,) + (g.PD, g.PH, g.PW)[3 - (len(x.shape) - 2):] + (g.K,) if last else \
        (g.N, g.K) + (g.PD, g.PH, g.PW)[3 - (len(x.shape) - 2):]
    dtype = dtype_name(x)
    y = out if out is not None else empty(x, shape, dtype)
    c = Call(g, algo, math, alpha, beta, stream, x=x, w=w, y=y, bias=bias, residual=residual,
             activation=activation, coef=coef)
    return _run(c, "conv_forward", FORWARD, y, lambda: _auto_forward(g, dtype))


def _run(c, op, table, out, auto):
    """Run call c through `table` into `out` (nothing for an empty one): c.pick is
    auto() for "auto" (float32's TF32 modes run "gemm", the front end let "auto" or
    "gemm" through)."""
    c.asked = c.algo
    if not c.exact:
        c.algo = "gemm"
    c.pick = auto() if c.algo == "auto" else c.algo
    if size(out):
        variants.choose("conv", op, table, c).run(c)
    return out


def _implicit_gemm(c):
    """Launch the implicit GEMM (nbdnn/cuda/conv/implicit_gemm_source.py): the tile from the GEMM's
    tile choice, variant 3 where C/g fills a k-step and the taps fit its mask ("_t" for
    channels-first), else variant 2 (no 128x128 tile)."""
    x, w, y, g, dtype, stream = c.x, c.w, c.y, c.g, c.dtype, c.stream
    total = size(y)
    N, K, groups, last = g.N, g.K, g.G, g.last
    M, Kg, taps = total // K, K // groups, g.T * g.R * g.S
    tiles = TILES["float64" if dtype == "float64" else "float32"]

    def fits_chunked(size):
        return g.C // groups >= tiles[size][2] and taps <= 64

    size_, _ = choose_tile(M, Kg, 0, groups, dtype, False)
    if size_ == "large" and (Kg <= TILES["float32"]["small"][1] or not fits_chunked(size_)):
        size_ = "small"  # 64 filters would leave half of a 128-wide tile idle
    BM, BN, BK, TM, TN = tiles[size_]
    chunked = fits_chunked(size_)
    wk = w
    if chunked and not last and taps > 1:  # (K, C/g, TRS) -> (K, TRS, C/g)
        wk = empty(x, tuple(w.shape), dtype)  # like x: torch's caching allocator when x is
        # a torch tensor and w a numba parameter (numba's own allocator: ~30 us a call)
        transform_into(w, (K, g.C // groups, taps), (0, 2, 1), wk, 1.0, 0.0, stream)
    variant = ("igemm_chunked_t_" if not last else "igemm_chunked_") if chunked else "igemm_"
    k, sig = _KERNELS[variant + size_, dtype]
    PT, FT = (BN, BM) if variant == "igemm_chunked_t_" else (BM, BN)  # positions, filters
    k.launch(sig, (-(-M // PT) * -(-Kg // FT), groups, 1), (BM // TM) * (BN // TN), stream,
             x, wk, *c.arrays()[2:], _igemm.taps_table(g, chunked), *g, *c.tail(),
             _vector_epilogue(y, K, Kg, total // (N * K), last, variant))


# ---- the data gradient's variants
def _data_back_pads(c):
    """The forward paddings that make dx a stride-1 forward convolution of dy
    (`_as_forward`), or None where a stride is not 1 or a padding exceeds d*(R-1)."""
    stride, pads, dilation = c.args[:3]
    ws = tuple(c.w.shape)
    R = ws[1:-1] if c.g.last else ws[2:]
    if any(s != 1 for s in stride) or any(max(a, b) > d * (r - 1) for (a, b), d, r in
                                          zip(pads, dilation, R)):
        return None
    return tuple((d * (r - 1) - a, d * (r - 1) - b) for (a, b), d, r in zip(pads, dilation, R))


def _flipped(c):
    return "cross_correlation" if c.args[4] == "convolution" else "convolution"


def _as_stored_geometry(c):
    """The forward geometry that reads dy through w (K, R, S, C) as stored: C and K swap."""
    ws = tuple(c.w.shape)
    return geometry(tuple(c.dy.shape), (ws[-1],) + ws[1:-1] + (ws[0],), (1,) * (len(ws) - 2),
                    _data_back_pads(c), tuple(c.args[2]), 1, _flipped(c), 1)


def _as_stored_usable(c):
    ws = tuple(c.w.shape)
    if c.algo != "auto" or not c.g.last or c.g.G != 1 or \
            c.dtype not in ("float16", "bfloat16") or int(np.prod(ws[1:-1])) == 1 or \
            _data_back_pads(c) is None or not _tensor_cores():
        return False
    return _wgmma_conv.usable(c.dy, c.w, c.dx, _as_stored_geometry(c), None, None, c.alpha,
                              c.beta)


def _as_stored(c):
    _wgmma_conv.forward(c.dy, c.w, c.dx, None, None, None, 0.0, c.alpha, c.beta,
                        _as_stored_geometry(c), c.stream, w_stored=True)


def _as_forward(c):
    """With stride 1, dx is a forward convolution of dy: dx[i] = sum_r dy[i + q - r*d]
    w[r] reads dy with pre-padding d*(R-1) - q and post-padding d*(R-1) - q_post
    through the flipped filter, whose input and output channels swap within each group
    (w' = (C, K/g, taps), a transposed copy). So the forward algorithms (implicit GEMM,
    winograd) serve it."""
    stride, pads, dilation, groups, mode, last = c.args
    ws = tuple(c.w.shape)
    R = ws[1:-1] if last else ws[2:]
    K, Cg, taps = ws[0], ws[-1 if last else 1], int(np.prod(R))
    Kg = K // groups
    view, perm = ((groups, Kg, taps, Cg), (0, 3, 2, 1)) if last else \
        ((groups, Kg, Cg, taps), (0, 2, 1, 3))
    wt = empty(c.dy, (groups * Cg,) + R + (Kg,) if last else (groups * Cg, Kg) + R,
               dtype_name(c.w))  # like dy, as _implicit_gemm's wk
    transform_into(c.w, view, perm, wt, 1.0, 0.0, c.stream)
    conv_forward(c.dy, wt, None, None, tuple(stride), _data_back_pads(c), tuple(dilation),
                 groups, _flipped(c), last, None, 0.0, "auto", c.math, alpha=c.alpha,
                 beta=c.beta, out=c.dx, stream=c.stream)


def _tf32_as_forward_usable(c):
    """float32 in math "tf32" with "auto" asked, every stride 1, one group, more than
    one tap, alpha 1, beta 0: as_forward, whose forward the tf32 kernel takes (its
    channels-last geometry: the forward over dy, the channels swapped)."""
    if c.asked != "auto" or c.math != "tf32" or c.dtype != "float32" or c.g.G != 1 or \
            c.g.T * c.g.R * c.g.S == 1 or (c.alpha, c.beta) != (1, 0) or \
            _data_back_pads(c) is None:
        return False
    stride, pads, dilation, groups, mode, last = c.args
    ws = tuple(c.w.shape)
    R = ws[1:-1] if last else ws[2:]
    K, C = ws[0], ws[-1 if last else 1]
    dys = tuple(c.dy.shape)
    dy_last = dys if last else (dys[0],) + dys[2:] + (dys[1],)
    gl = geometry(dy_last, (C,) + R + (K,), (1,) * len(R), _data_back_pads(c),
                  tuple(dilation), 1, _flipped(c), 1)
    return _wgmma_conv.tf32_usable(c.dy, c.dy, c.dx, gl, None, None, 1.0, 0.0)  # (dy for
    # the flipped filter's copy: fresh memory, aligned as dy is)


DATA = (
    Variant("gemm_1x1", lambda c: c.asked == "auto" and _conv_gemm.data_1x1_usable(c.g),
            lambda c: _conv_gemm.backward_data_1x1(c.gemm, c.dy, c.w, c.dx, c.g, c.alpha,
                                                   c.beta, c.stream),
            "gemm.py: channels-last 1x1 stride 1, one group: dx = dy @ W, W as stored. "
            "Measured (H200, ResNet-50's nine 1x1 layers, bf16 NHWC, batch 32, graph "
            "replay): 0.55-1.09x cuDNN's speed, where as_forward's copy + GEMM ran "
            "0.45-0.96x"),
    Variant("filter_as_stored", _as_stored_usable, _as_stored,
            "wgmma_conv.py (w_stored): 16-bit channels-last stride 1, one group, more "
            "than one tap: as_forward on the tensor cores reading the filter as stored "
            "(B MN-major, no transposed copy). Measured (H200, ResNet-50's 3x3 layers, "
            "bf16, batch 32): 0.71-1.0x cuDNN's speed; the copy had taken 3.4-47 us of "
            "their 24-72",
            wanted=lambda c: c.g.C != c.g.G),
    Variant("as_forward", lambda c: c.algo == "auto" and _data_back_pads(c) is not None,
            _as_forward,
            "every stride 1: the forward algorithms over dy, the filter transposed and "
            "flipped",
            wanted=lambda c: c.g.C != c.g.G),
    Variant("tf32_as_forward", _tf32_as_forward_usable, _as_forward,
            "float32 in math \"tf32\", every stride 1, more than one tap: as_forward's "
            "transposed, flipped filter and the tf32 kernel's forward over dy (channels-first "
            "through channels-last copies), where the GEMM path's columns and col2im move "
            "R S T times dx's items",
            wanted=lambda c: _tensor_cores()),
    Variant("depthwise", lambda c: c.exact and _algo(c, "depthwise") and
            _conv_depthwise.data_usable(c.g),
            lambda c: _conv_depthwise.backward_data(_KERNELS, c.dy, c.w, c.dx, c.g, c.alpha,
                                                    c.beta, c.stream),
            "depthwise.py: the forward kernel over dy (stride 1, dilation 1)",
            wanted=lambda c: c.pick == "depthwise"),
    Variant("gemm_1x1_channels_first", lambda c: _algo(c, "gemm") and
            _conv_gemm.forward_1x1_usable(c.g),
            lambda c: _conv_gemm.backward_data_1x1_channels_first(
                c.gemm, c.dy, c.w, c.dx, c.g, c.alpha, c.beta, c.stream),
            "gemm.py: channels-first 1x1 at stride 1: dx[n] = W^T dy[n], a batched GEMM "
            "over the positions as stored (no rows copy, no col2im); float32's TF32 modes "
            "run here",
            wanted=lambda c: c.pick == "gemm"),
    Variant("gemm_positions", lambda c: not c.exact and
            _conv_gemm.data_positions_usable(c.g, c.dtype),
            lambda c: _conv_gemm.backward_data_positions(_KERNELS, c.gemm, c.dy, c.w, c.dx,
                                                         c.g, c.alpha, c.beta, c.stream),
            "gemm.py: float32 channels-first in a TF32 mode that tf32_as_forward does not "
            "take (a stride, alpha or beta): dcols[n] = W^T dy[n] over dy as stored, each "
            "image's columns transposed, gathered into dx (col2im_t)"),
    Variant("gemm", lambda c: _algo(c, "gemm"),
            lambda c: _conv_gemm.backward_data(_KERNELS, c.gemm, c.dy, c.w, c.dx, c.g,
                                               c.alpha, c.beta, c.stream),
            "gemm.py: the GEMM dcols = dy W, col2im into dx",
            wanted=lambda c: c.pick == "gemm"),
    Variant("direct", lambda c: c.exact and _algo(c, "direct", "depthwise"),
            lambda c: launch(_KERNELS, "bwd_data", c.dtype, size(c.dx), c.stream, c.dy, c.w,
                             c.dx, *c.g, c.alpha, c.beta),
            "direct.py: a thread a dx element, no atomics",
            wanted=lambda c: c.pick in ("direct", "depthwise")),
)


def conv_backward_data(dy, w, x_shape, stride, pads, dilation, groups, mode, last, algo,
                       math="ieee", *, alpha, beta, out, stream):
    g = geometry(x_shape, tuple(w.shape), stride, pads, dilation, groups, mode, last)
    dx = out if out is not None else empty(dy, x_shape, dtype_name(dy))
    c = Call(g, algo, math, alpha, beta, stream, dy=dy, w=w, dx=dx,
             args=(stride, pads, dilation, groups, mode, last))
    return _run(c, "conv_backward_data", DATA, dx, lambda: _auto_backward(g))


def _auto_backward(g):
    """"auto"'s algorithm for a gradient: depthwise for groups == C, else gemm."""
    return "depthwise" if g.C == g.G else "gemm"


# ---- the filter gradient's variants
FILTER = (
    Variant("gemm_1x1", lambda c: _algo(c, "gemm") and c.g.last and c.g.G == 1 and
            _conv_gemm.filter_1x1_usable(c.g, c.dtype),
            lambda c: _conv_gemm.backward_filter_1x1(c.gemm, c.dy, c.x, c.dw, c.g, c.alpha,
                                                     c.beta, c.stream),
            "gemm.py: channels-last 1x1 stride 1, one group: dW = dy^T @ x as stored. "
            "Measured (H200, ResNet-50's nine 1x1 layers, bf16, batch 32): 0.60-0.80x "
            "cuDNN's speed, where tensor_cores ran 0.38-0.78x"),
    Variant("tensor_cores", lambda c: c.algo == "auto" and
            _wgmma_conv.filter_usable(c.dy, c.x, c.dw, c.g) and _tensor_cores(),
            lambda c: _wgmma_conv.backward_filter(c.dy, c.x, c.dw, c.g, c.alpha, c.beta,
                                                  c.stream),
            "wgmma_conv.py: 16-bit channels-last, one group: dW over the positions on the "
            "tensor cores, im2col boxes of x"),
    Variant("depthwise", lambda c: c.exact and _algo(c, "depthwise") and
            _conv_depthwise.filter_usable(c.g),
            lambda c: _conv_depthwise.backward_filter(_KERNELS, c.dy, c.x, c.dw, c.g, c.alpha,
                                                      c.beta, c.stream, sm_count()),
            "depthwise.py: ordered chunk sums, 3x3 and 5x5",
            wanted=lambda c: c.pick == "depthwise"),
    Variant("direct", lambda c: c.exact and _algo(c, "direct"),
            lambda c: launch(_KERNELS, "bwd_filter", c.dtype, size(c.dw), c.stream, c.dy,
                             c.x, c.dw, *c.g, c.alpha, c.beta),
            "direct.py: a thread a dw element, no atomics",
            wanted=lambda c: c.pick == "direct"),
    Variant("gemm_positions", lambda c: not c.exact and
            _conv_gemm.filter_positions_usable(c.g, c.dtype),
            lambda c: _conv_gemm.backward_filter_positions(_KERNELS, c.gemm, c.dy, c.x, c.dw,
                                                           c.g, c.alpha, c.beta, c.stream),
            "gemm.py: float32 channels-first in a TF32 mode (but 1x1 at stride 1 over "
            "P >= 128 positions): dW = sum over n of dy[n] cols[n]^T, the columns "
            "transposed so both operands are K-major over the positions (the gemm "
            "variant's rows and columns would each be copied transposed for the tensor "
            "cores); per image with partials, or over all images at once where dy's "
            "copy is smaller than the partials"),
    Variant("gemm", lambda c: _algo(c, "gemm", "depthwise"),
            lambda c: _conv_gemm.backward_filter(_KERNELS, c.gemm, c.dy, c.x, c.dw, c.g,
                                                 c.alpha, c.beta, c.stream),
            "gemm.py: the GEMM dW = dy^T cols over the positions (split-K), im2col-free "
            "for channels-first 1x1 layers",
            wanted=lambda c: c.pick in ("gemm", "depthwise")),
)


def conv_backward_filter(dy, x, w_shape, stride, pads, dilation, groups, mode, last, algo,
                         math="ieee", *, alpha, beta, out, stream):
    g = geometry(tuple(x.shape), w_shape, stride, pads, dilation, groups, mode, last)
    dw = out if out is not None else empty(dy, w_shape, dtype_name(dy))
    c = Call(g, algo, math, alpha, beta, stream, dy=dy, x=x, dw=dw)
    return _run(c, "conv_backward_filter", FILTER, dw, lambda: _auto_backward(g))


def forced(name):
    """Inside (this thread): convolutions run the variant `name` (of FORWARD, DATA,
    FILTER, the im2col / col2im steps' COLUMNS and COL2IM in gemm.py, or depthwise.py's
    FORWARD), or raise
    NotSupportedError where its kernels cannot take a call (runtime/variants.py)."""
    return variants.forced("conv", name, variants.names(
        FORWARD, DATA, FILTER, _conv_gemm.COLUMNS, _conv_gemm.COL2IM,
        _conv_depthwise.FORWARD))


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

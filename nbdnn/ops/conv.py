"""conv1d / conv2d / conv3d and their backward passes: cuDNN's convolution with every
geometry parameter, both modes, NCHW and NHWC, and the fused bias / residual /
activation epilogue of cudnnConvolutionBiasActivationForward. One N-d implementation;
the formulas are in nbdnn/cpu/conv.py.

Parameters (per spatial axis, an int for all of them or a sequence of nd):
stride >= 1, dilation >= 1, padding >= 0: an int, nd ints (symmetric) or nd
(pre, post) pairs. groups divides C and K (groups == C is depthwise; K = m*C a
channel multiplier). layout "NCHW" (channels first; w is (K, C/g, *R)) or "NHWC"
(channels last; w is (K, *R, C/g)); the rank-exact names NCW/NWC/NCDHW/NDHWC work too.

math: float32's mode (nbdnn/_math_mode.py), forward and gradients, as matmul's. The
TF32 modes run algorithm "gemm" ("auto" too; another is a BadParamError): on sm_90 the
tensor cores (tf32 channels-last forward: the im2col kernel; else im2col + the GEMM)."""
import contextlib
import functools
import math
import numbers

from ..errors import BadParamError, NotSupportedError, ShapeError, fail
from .registry import op
from ._common import (Call, blend_params, check_size, choice, int_tuple, is_int, same_dtype,
                      scalar)
from .activation import fused_coef
from .._math_mode import resolve as _math, resolve_for as _math_algo
from .. import arrays as _arrays, backend as _backend
from .._shapes import winograd_workspace
from .._vocab import BF16_DTYPES, CONV_ALGOS as ALGOS, CONV_MODES as MODES, LAYOUTS as _LAYOUTS, \
    SPATIAL_LAYOUTS

LAYOUTS = {n: _LAYOUTS[n][0] for n in SPATIAL_LAYOUTS}  # layout -> channels last
WINOGRAD = {"winograd": 2, "winograd4": 4}  # algo: outputs a tile side
BACKWARD_ALGOS = ("auto", "direct", "gemm", "depthwise")


def int_args(op, name, v, nd, lo):
    if type(v) is int and v >= lo:  # the common calls first: this is on every call's path
        return (v,) * nd
    if type(v) is tuple and len(v) == nd and all(type(i) is int and i >= lo for i in v):
        return v
    want = f"an int >= {lo} or {nd} of them"
    vals = (int(v),) * nd if is_int(v) else int_tuple(op, name, v, want)
    if len(vals) != nd or min(vals) < lo:
        fail(BadParamError, op, name, want, repr(v))
    return vals


def padding_pairs(op, padding, nd):
    """((pre, post), ...) per spatial axis."""
    if type(padding) is int and padding >= 0:
        return ((padding, padding),) * nd
    want = f"an int >= 0, {nd} of them or {nd} (pre, post) pairs"
    if is_int(padding):
        return tuple((p, p) for p in int_args(op, "padding", padding, nd, 0))
    try:
        items = tuple(padding) if not isinstance(padding, (str, bytes)) else None
    except TypeError:
        items = None
    if items is None or len(items) != nd:
        fail(BadParamError, op, "padding", want, repr(padding))
    if all(is_int(p) for p in items):
        return tuple((p, p) for p in int_args(op, "padding", items, nd, 0))
    flat = []
    for p in items:
        pair = int_tuple(op, "padding", p, want) if not is_int(p) else ()
        if len(pair) != 2:
            fail(BadParamError, op, "padding", want, repr(padding))
        flat += pair
    flat = int_args(op, "padding", tuple(flat), 2 * nd, 0)
    return tuple(zip(flat[0::2], flat[1::2]))


def layout_arg(op, layout, nd):
    choice(op, "layout", layout, tuple(LAYOUTS))
    if len(layout) not in (4, nd + 2):
        fail(BadParamError, op, "layout", f"a {nd + 2}-letter layout or NCHW/NHWC", layout)
    return LAYOUTS[layout]


def geometry(op, nd, x_shape, w_shape, last, stride, pads, dilation, groups):
    """(N, C, S, K, R, P) after checking that x and w fit; S, R, P spatial tuples. A
    geometry that passed is remembered (every argument is a hashable value by now;
    groups only when an int, since True == 1 would find 1's entry): this runs on every
    eager call."""
    if type(groups) is int:
        return _checked_geometry(op, nd, tuple(x_shape), tuple(w_shape), last, stride,
                                 pads, dilation, groups)
    return _check_geometry(op, nd, x_shape, w_shape, last, stride, pads, dilation, groups)


def _check_geometry(op, nd, x_shape, w_shape, last, stride, pads, dilation, groups):
    for name, s in (("x", x_shape), ("w", w_shape)):
        if len(s) != nd + 2:
            fail(ShapeError, op, f"{name}.ndim", f"{nd + 2} for a {nd}-d convolution", len(s))
    N, C, S = (x_shape[0], x_shape[-1], tuple(x_shape[1:-1])) if last else \
        (x_shape[0], x_shape[1], tuple(x_shape[2:]))
    K, Cg, R = (w_shape[0], w_shape[-1], tuple(w_shape[1:-1])) if last else \
        (w_shape[0], w_shape[1], tuple(w_shape[2:]))
    if not isinstance(groups, numbers.Integral) or isinstance(groups, bool) or groups < 1:
        fail(BadParamError, op, "groups", "an int >= 1", repr(groups))
    if C % groups or K % groups:
        fail(ShapeError, op, "groups", f"a divisor of C = {C} and K = {K}", groups)
    if Cg != C // groups:
        fail(ShapeError, op, "w.shape", f"C/groups = {C // groups} input channels per filter "
             f"({'last' if last else 'second'} axis)", tuple(w_shape))
    P = tuple((s + a + b - d * (r - 1) - 1) // st + 1
              for s, (a, b), d, r, st in zip(S, pads, dilation, R, stride))
    if any(p <= 0 for p in P) or any(r <= 0 for r in R):
        fail(ShapeError, op, "output size", "> 0 on every spatial axis (input "
             f"{S} + padding {pads} against filter {R} dilated {dilation})", P)
    check_size(op, "the output", (N, K) + P)
    return N, C, S, K, R, P


_checked_geometry = functools.lru_cache(maxsize=1024)(_check_geometry)


def out_shape(N, K, P, last):
    return (N,) + P + (K,) if last else (N, K) + P


def conv_params(op, nd, stride, padding, dilation, mode, layout):
    return (int_args(op, "stride", stride, nd, 1), padding_pairs(op, padding, nd),
            int_args(op, "dilation", dilation, nd, 1), choice(op, "mode", mode, MODES),
            layout_arg(op, layout, nd))


def winograd_fits(nd, R, stride, dilation):
    return nd == 2 and R == (3, 3) and stride == (1, 1) and dilation == (1, 1)


def _depthwise(op, algo, C, groups):
    if algo == "depthwise" and C != groups:
        fail(BadParamError, op, "algo", "depthwise only with one input channel a group "
             "(groups == C)", f"'depthwise' with C = {C}, groups = {groups}")


def _algo(op, algo, nd, R, stride, dilation):
    choice(op, "algo", algo, ALGOS)
    if algo in WINOGRAD and not winograd_fits(nd, R, stride, dilation):
        fail(BadParamError, op, "algo", f"{algo} only for 2-d 3x3 filters with stride 1 "
             "and dilation 1", f"'{algo}' with a {nd}-d {R} filter, stride {stride}, "
             f"dilation {dilation}")
    return algo


def conv(nd, x, w, bias=None, *, stride=1, padding=0, dilation=1, groups=1,
         mode="cross_correlation", layout="NCHW", algo="auto", activation=None, coef=None,
         residual=None, alpha=1.0, beta=0.0, alpha2=1.0, math=None, out=None, backend=None,
         stream=None):
    op = f"conv{nd}d"
    c = Call(op, backend, stream, x=x, w=w, bias=bias, residual=residual, out=out)
    x_shape, dtype = c.array("x", x, BF16_DTYPES)
    w_shape, w_dtype = c.array("w", w, BF16_DTYPES)
    same_dtype(op, ["x", "w"], [dtype, w_dtype])
    stride, pads, dilation, mode, last = conv_params(op, nd, stride, padding, dilation,
                                                     mode, layout)
    N, C, S, K, R, P = geometry(op, nd, tuple(x_shape), tuple(w_shape), last, stride,
                                pads, dilation, groups)
    yshape = out_shape(N, K, P, last)
    if bias is not None:
        b_shape, b_dtype = c.array("bias", bias, BF16_DTYPES)
        if tuple(b_shape) != (K,):
            fail(ShapeError, op, "bias.shape", f"(K,) = ({K},)", tuple(b_shape))
        same_dtype(op, ["x", "bias"], [dtype, b_dtype])
    if residual is not None:
        r_shape, r_dtype = c.array("residual", residual, BF16_DTYPES)
        if tuple(r_shape) != yshape:
            fail(ShapeError, op, "residual.shape", f"the output's {yshape}", tuple(r_shape))
        same_dtype(op, ["x", "residual"], [dtype, r_dtype])
    coef = fused_coef(op, activation, coef)
    algo = _algo(op, algo, nd, R, stride, dilation)
    _depthwise(op, algo, C, groups)
    math = _math_algo(op, math, dtype, algo, ("auto", "gemm"))
    alpha, beta = blend_params(op, alpha, beta, out)
    alpha2 = scalar(op, "alpha2", alpha2)
    if residual is None and alpha2 != 1.0:
        fail(BadParamError, op, "alpha2", "1 without a residual (it scales the residual)",
             alpha2)
    if residual is not None:
        if beta != 0:  # the fused epilogue adds one tensor z: the residual or out
            raise NotSupportedError(
                f"{op}: beta = {beta} with a residual: the fused epilogue adds one tensor "
                "(z = residual, weight alpha2; without a residual, z = out, weight beta); "
                "blend out in a second call (nbdnn.add_tensor)")
        beta = alpha2  # the backends' z weight
    out = c.out(out, yshape, dtype)
    return c.run("conv_forward", x, w, bias, residual, stride, pads, dilation, groups, mode,
                 last, activation, coef, algo, math, alpha=alpha, beta=beta, out=out)


@op("conv", backward=("conv_backward_data", "conv_backward_filter", "conv_backward_bias"),
    dispatches="conv_forward")
def conv1d(x, w, bias=None, **kw):
    """1-D convolution: x (N, C, W) or (N, W, C); see conv2d."""
    return conv(1, x, w, bias, **kw)


@op("conv", backward=("conv_backward_data", "conv_backward_filter", "conv_backward_bias"),
    dispatches="conv_forward")
def conv2d(x, w, bias=None, **kw):
    """y = act(alpha * conv(x, w) + alpha2 * residual + bias) with a residual (alpha2
    defaults to 1: the residual is added, as batch_norm_infer adds its), else
    y = act(alpha * conv(x, w) + beta * out + bias) (cuDNN's fused form, z = y). beta
    != 0 together with a residual is a NotSupportedError: the epilogue adds one tensor.

    x (N, C, H, W) and w (K, C/groups, R, S) for layout "NCHW"; x (N, H, W, C) and w
    (K, R, S, C/groups) for "NHWC". Keywords: stride, padding, dilation, groups, mode
    ("cross_correlation" or "convolution": flipped filter), layout, algo, activation
    (a mode of nbdnn.activation) and coef, residual, alpha, beta, alpha2, math (float32:
    "ieee", "tf32", "3xtf32"; the module docstring), out. Returns y of shape
    (N, K, P, Q) (or (N, P, Q, K)) and x's dtype.

    algo: "direct", "implicit_gemm", "gemm", "winograd" (F(2x2, 3x3): 2-d 3x3, stride
    1, dilation 1), "winograd4" (F(4x4, 3x3): the same filters; float16 layers
    transform and multiply in float32), "depthwise" (groups == C; filters without a
    generated kernel run "direct"), or
    "auto": "depthwise" when groups == C; on the GPU for 3x3 stride-1 layers of at
    least 32 channels in and out a group "winograd4", or "winograd" where F(4x4)'s
    fewer tiles would leave the GPU idle (float16: "winograd" from 128 channels), if
    its workspace fits 2 GiB (nbdnn.cuda.conv.AUTO_WORKSPACE_LIMIT); else
    "implicit_gemm"."""
    return conv(2, x, w, bias, **kw)


@op("conv", backward=("conv_backward_data", "conv_backward_filter", "conv_backward_bias"),
    dispatches="conv_forward")
def conv3d(x, w, bias=None, **kw):
    """3-D convolution: x (N, C, D, H, W) or (N, D, H, W, C); see conv2d."""
    return conv(3, x, w, bias, **kw)


def _backward_call(op, names, arrays, backend, stream, out):
    c = Call(op, backend, stream, out=out, **dict(zip(names, arrays)))
    described = [c.array(n, a, BF16_DTYPES) for n, a in zip(names, arrays)]
    same_dtype(op, list(names), [d for _, d in described])
    return c, [tuple(s) for s, _ in described], described[0][1]


def _shape_arg(op, name, shape, nd):
    want = f"a shape of {nd + 2} ints >= 0"
    s = int_tuple(op, name, shape, want)
    if len(s) != nd + 2 or min(s) < 0:
        fail(BadParamError, op, name, want, repr(shape))
    check_size(op, name, s)
    return s


def _backward_geometry(op, dy_shape, x_shape, w_shape, nd, stride, padding, dilation,
                       groups, mode, layout, algo, alpha, beta, out, math, dtype):
    """The checked (geometry args, algo, math, alpha, beta) of a data or filter
    gradient."""
    stride, pads, dilation, mode, last = conv_params(op, nd, stride, padding, dilation,
                                                     mode, layout)
    N, C, S, K, R, P = geometry(op, nd, x_shape, w_shape, last, stride, pads, dilation,
                                groups)
    if dy_shape != out_shape(N, K, P, last):
        fail(ShapeError, op, "dy.shape", f"the output's {out_shape(N, K, P, last)}", dy_shape)
    alpha, beta = blend_params(op, alpha, beta, out)
    choice(op, "algo", algo, BACKWARD_ALGOS)
    _depthwise(op, algo, C, groups)
    math = _math_algo(op, math, dtype, algo, ("auto", "gemm"))
    return (stride, pads, dilation, groups, mode, last), algo, math, alpha, beta


@op("conv")
def conv_backward_data(dy, w, x_shape, *, stride=1, padding=0, dilation=1, groups=1,
                       mode="cross_correlation", layout="NCHW", algo="auto", alpha=1.0,
                       beta=0.0, math=None, out=None, backend=None, stream=None):
    """dx = alpha * dL/dx + beta * out for y = conv(x, w); x_shape is x's shape, the
    dimensionality follows w. algo: "gemm", "direct", "depthwise" (groups == C; the
    forward kernel over dy for stride 1, dilation 1, else "direct") or "auto"
    ("depthwise" when groups == C; on the GPU with every stride 1, the forward
    algorithms over dy with the filters transposed and flipped; else "gemm"). math:
    float32's mode, as conv2d's (the TF32 modes: "auto" or "gemm")."""
    op = "conv_backward_data"
    c, (dy_shape, w_shape), dtype = _backward_call(op, ("dy", "w"), (dy, w), backend,
                                                   stream, out)
    nd = len(w_shape) - 2
    x_shape = _shape_arg(op, "x_shape", x_shape, nd)
    geo, algo, math, alpha, beta = _backward_geometry(
        op, dy_shape, x_shape, w_shape, nd, stride, padding, dilation, groups, mode, layout,
        algo, alpha, beta, out, math, dtype)
    out = c.out(out, x_shape, dtype)
    return c.run("conv_backward_data", dy, w, x_shape, *geo, algo, math, alpha=alpha,
                 beta=beta, out=out)


@op("conv")
def conv_backward_filter(dy, x, w_shape, *, stride=1, padding=0, dilation=1, groups=1,
                         mode="cross_correlation", layout="NCHW", algo="auto", alpha=1.0,
                         beta=0.0, math=None, out=None, backend=None, stream=None):
    """dw = alpha * dL/dw + beta * out for y = conv(x, w); w_shape is w's shape.
    algo: "gemm", "direct", "depthwise" (groups == C; 3x3 and 5x5 2-d filters, else
    "gemm") or "auto" ("depthwise" when groups == C, else "gemm"). math: float32's
    mode, as conv2d's (the TF32 modes: "auto" or "gemm")."""
    op = "conv_backward_filter"
    c, (dy_shape, x_shape), dtype = _backward_call(op, ("dy", "x"), (dy, x), backend,
                                                   stream, out)
    nd = len(x_shape) - 2
    w_shape = _shape_arg(op, "w_shape", w_shape, nd)
    geo, algo, math, alpha, beta = _backward_geometry(
        op, dy_shape, x_shape, w_shape, nd, stride, padding, dilation, groups, mode, layout,
        algo, alpha, beta, out, math, dtype)
    out = c.out(out, w_shape, dtype)
    return c.run("conv_backward_filter", dy, x, w_shape, *geo, algo, math, alpha=alpha,
                 beta=beta, out=out)


@op("conv")
def conv_backward_bias(dy, *, layout="NCHW", alpha=1.0, beta=0.0, out=None, backend=None,
                       stream=None):
    """db[k] = alpha * sum of dy over every axis but the channel axis + beta * out."""
    op = "conv_backward_bias"
    c, (dy_shape,), dtype = _backward_call(op, ("dy",), (dy,), backend, stream, out)
    if len(dy_shape) < 3:
        fail(ShapeError, op, "dy.ndim", ">= 3 (N, channels, spatial axes)", len(dy_shape))
    last = layout_arg(op, layout, len(dy_shape) - 2)
    alpha, beta = blend_params(op, alpha, beta, out)
    out = c.out(out, (dy_shape[-1] if last else dy_shape[1],), dtype)
    return c.run("conv_backward_bias", dy, last, alpha=alpha, beta=beta, out=out)


@op("conv", planned=False, dispatches=())
def find_conv_algorithm(x, w, bias=None, *, reps=5, **kw):
    """Time every forward algorithm applicable to this call (as cudnnFindConvolution
    ForwardAlgorithm does) and return them fastest first: a list of dicts with algo,
    time (seconds: median of `reps` runs after one warm-up, each timed on the host
    clock with the GPU synchronised before and after), workspace (bytes of scratch
    memory), deterministic and kernels (the names of the kernels the call launched, in
    order: "wgmma_"/"mma_" ones are the tensor cores'; empty on the CPU). Keywords are
    conv2d's (the rank follows x); `algo` and `out` are not taken. On the CPU backend
    every algorithm is the one reference, so the ranking means nothing there."""
    import statistics
    import time
    if not is_int(reps) or reps < 1:
        fail(BadParamError, "find_conv_algorithm", "reps", "an int >= 1", repr(reps))
    for name, a in (("x", x), ("w", w)):
        _arrays.describe("find_conv_algorithm", name, a)  # a list: a named error
    for k in ("algo", "out"):
        if k in kw:
            fail(BadParamError, "find_conv_algorithm", k, "not given (every algorithm is "
                 "tried, each into its own output)", repr(kw[k]))
    nd, results, (sync, launched) = len(tuple(x.shape)) - 2, [], _device(x, w, kw.get("backend"))
    tf32 = str(_arrays.describe("find_conv_algorithm", "x", x)[1]) == "float32" and \
        _math("find_conv_algorithm", kw.get("math")) != "ieee"
    _, _, C, _, R, _, stride, dilation, groups = _problem(x, w, kw)
    for algo in ALGOS[1:]:
        if algo in WINOGRAD and not winograd_fits(nd, R, stride, dilation) or \
                algo == "depthwise" and C != groups or \
                tf32 and algo != "gemm":  # (a TF32 mode runs "gemm" alone)
            continue
        with launched() as names:
            conv(nd, x, w, bias, algo=algo, **kw)  # warm-up: JIT, validation, the kernels
        samples = []
        for _ in range(reps):
            sync()
            t0 = time.perf_counter()
            conv(nd, x, w, bias, algo=algo, **kw)
            sync()
            samples.append(time.perf_counter() - t0)
        results.append({"algo": algo, "time": statistics.median(samples),
                        "workspace": _workspace(algo, x, w, kw), "deterministic": True,
                        "kernels": tuple(names)})
    return sorted(results, key=lambda r: r["time"])


def _problem(x, w, kw):
    op, nd = "find_conv_algorithm", len(tuple(x.shape)) - 2
    stride, pads, dilation, _, last = conv_params(
        op, nd, kw.get("stride", 1), kw.get("padding", 0), kw.get("dilation", 1),
        kw.get("mode", "cross_correlation"), kw.get("layout", "NCHW"))
    groups = kw.get("groups", 1)
    N, C, S, K, R, P = geometry(op, nd, tuple(x.shape), tuple(w.shape), last, stride, pads,
                                dilation, groups)
    return nd, N, C, K, R, P, stride, dilation, groups


def _workspace(algo, x, w, kw):
    """Bytes of scratch memory: gemm's im2col columns and raw product; winograd's
    transformed filters, input tiles and products."""
    if algo not in ("gemm",) + tuple(WINOGRAD):
        return 0
    _, N, C, K, R, P, _, _, groups = _problem(x, w, kw)
    size = _arrays.describe("find_conv_algorithm", "x", x)[1].itemsize
    if algo == "gemm":
        return N * math.prod(P) * (C * math.prod(R) + K) * size
    # (winograd4 keeps float16 layers' workspace in float32)
    return winograd_workspace(N, C, K, groups, P, WINOGRAD[algo]) * \
        (max(4, size) if algo == "winograd4" else size)


def _device(x, w, backend):
    """(wait for the GPU, a context manager yielding the names of the kernels launched
    in it) on the CUDA backend; no-ops on the CPU's (NumPy arrays: no wait either)."""
    if _backend.choose("find_conv_algorithm", {"x": x, "w": w}, backend)[0] != "cuda":
        return (lambda: None), (lambda: contextlib.nullcontext([]))
    wait = _backend.cuda_runtime("device").synchronize if _arrays.kind(x) == "cuda" else \
        (lambda: None)
    return wait, _backend.cuda_runtime("launch").launched

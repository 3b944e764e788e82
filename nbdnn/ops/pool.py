"""pool1d/pool2d/pool3d and pool_backward: max, avg (padding counted) and
avg_exclude_pad over windows with stride, per-side padding, dilation and ceil mode;
pool_indices: where each max window's value comes from (PyTorch's return_indices).
The formulas are in nbdnn/cpu/pool.py."""
from typing import NamedTuple

import numpy as np

from .._shapes import pool_out_size as out_size
from .._vocab import POOL_MODES as MODES
from ..errors import BadParamError, ShapeError, fail
from .registry import op
from .._vocab import BF16_DTYPES
from ._common import Call, blend_params, check_size, choice, flag, same_dtype
from .conv import int_args, layout_arg, padding_pairs


class PoolParams(NamedTuple):
    """A pooling call's checked parameters, in the order the backends take them."""
    kernel: tuple
    stride: tuple
    pads: tuple       # (pre, post) a spatial axis
    dilation: tuple
    mode: str
    ceil_mode: bool
    nan_propagation: bool
    last: bool        # channels last (NHWC)
    out_size: tuple   # the output's spatial shape


def _params(op, nd, x_shape, kernel, stride, padding, dilation, mode, ceil_mode,
            nan_propagation, layout):
    """The checked PoolParams."""
    last = layout_arg(op, layout, nd)
    if len(x_shape) != nd + 2:
        fail(ShapeError, op, "x.ndim", f"{nd + 2} for {nd}-d pooling", len(x_shape))
    K = int_args(op, "kernel", kernel, nd, 1)
    stride = K if stride is None else int_args(op, "stride", stride, nd, 1)
    pads, dilation = padding_pairs(op, padding, nd), int_args(op, "dilation", dilation, nd, 1)
    choice(op, "mode", mode, MODES)
    ceil_mode = flag(op, "ceil_mode", ceil_mode)
    S = tuple(x_shape[1:-1]) if last else tuple(x_shape[2:])
    P = tuple(out_size(*a, ceil_mode) for a in zip(S, K, stride, dilation,
                                                    (p for p, _ in pads), (q for _, q in pads)))
    if None in P:
        fail(ShapeError, op, "kernel", f"a window no larger than the padded input {S} + "
             f"padding {pads} (dilation {dilation}; ceil mode: past it by less than the "
             f"stride {stride})", K)
    check_size(op, "the output", tuple(x_shape[:2]) + P)
    return PoolParams(K, stride, pads, dilation, mode, ceil_mode,
                      flag(op, "nan_propagation", nan_propagation), last, P)


def _y_shape(x_shape, geo):
    P, last = geo.out_size, geo.last
    return (x_shape[0],) + P + (x_shape[-1],) if last else tuple(x_shape[:2]) + P


def _divisor(op, divisor, mode):
    """The averages' divisor as the backends take it (0: each window's count)."""
    if divisor is None:
        return 0
    if mode == "max":
        fail(BadParamError, op, "divisor", "None for mode 'max' (it divides the averages)",
             divisor)
    if isinstance(divisor, bool) or not isinstance(divisor, (int, np.integer)) or divisor == 0:
        fail(BadParamError, op, "divisor", "a nonzero int", repr(divisor))
    return int(divisor)


def pool(nd, x, kernel, *, stride=None, padding=0, dilation=1, mode="max", ceil_mode=False,
         nan_propagation=True, divisor=None, layout="NCHW", alpha=1.0, beta=0.0, out=None,
         backend=None, stream=None):
    op = f"pool{nd}d"
    c = Call(op, backend, stream, x=x, out=out)
    x_shape, dtype = c.array("x", x, BF16_DTYPES)
    geo = _params(op, nd, tuple(x_shape), kernel, stride, padding, dilation, mode, ceil_mode,
                  nan_propagation, layout)
    divisor = _divisor(op, divisor, mode)
    alpha, beta = blend_params(op, alpha, beta, out)
    out = c.out(out, _y_shape(tuple(x_shape), geo), dtype)
    return c.run("pool_forward", x, *geo, divisor=divisor, alpha=alpha, beta=beta, out=out)


@op("pool", backward="pool_backward", dispatches="pool_forward")
def pool1d(x, kernel, **kw):
    """1-D pooling: x (N, C, W) or (N, W, C); see pool2d."""
    return pool(1, x, kernel, **kw)


@op("pool", backward="pool_backward", dispatches="pool_forward")
def pool2d(x, kernel, **kw):
    """y = alpha * pool(x) + beta * out over windows of `kernel` (an int or one a
    spatial axis). Keywords: stride (default: the kernel), padding (an int, one a
    axis, or (pre, post) pairs), dilation, mode ("max", "avg" counting padding,
    "avg_exclude_pad"), ceil_mode, nan_propagation (max: True gives NaN for a window
    holding one, False skips NaNs), divisor (the averages: a nonzero int dividing every
    window's sum in place of its count, PyTorch's divisor_override), layout
    ("NCHW"/"NHWC"), alpha, beta, out. Global average pooling: kernel = the spatial
    shape, mode "avg". Padding may exceed half the window (PyTorch refuses it): a window
    of padding alone gives -inf (max), 0 (avg) or 0 (avg_exclude_pad, no elements), as
    cuDNN's kernels do."""
    return pool(2, x, kernel, **kw)


@op("pool", backward="pool_backward", dispatches="pool_forward")
def pool3d(x, kernel, **kw):
    """3-D pooling: x (N, C, D, H, W) or (N, D, H, W, C); see pool2d."""
    return pool(3, x, kernel, **kw)


@op("pool")
def pool_backward(dy, x, kernel, *, stride=None, padding=0, dilation=1, mode="max",
                  ceil_mode=False, nan_propagation=True, divisor=None, layout="NCHW",
                  alpha=1.0, beta=0.0, out=None, backend=None, stream=None):
    """dx = alpha * dL/dx + beta * out for y = pool(x) with the same parameters (the
    rank follows x). Max sends each dy to the first maximal element of its window in
    window order; overlapping windows are gathered, not scattered: deterministic."""
    op = "pool_backward"
    c = Call(op, backend, stream, dy=dy, x=x, out=out)
    x_shape, dtype = c.array("x", x, BF16_DTYPES)
    dy_shape, dy_dtype = c.array("dy", dy, BF16_DTYPES)
    same_dtype(op, ["x", "dy"], [dtype, dy_dtype])
    nd = len(x_shape) - 2
    if nd not in (1, 2, 3):
        fail(ShapeError, op, "x.ndim", "3, 4 or 5 (N, C and 1-3 spatial axes)", len(x_shape))
    geo = _params(op, nd, tuple(x_shape), kernel, stride, padding, dilation, mode, ceil_mode,
                  nan_propagation, layout)
    y_shape = _y_shape(tuple(x_shape), geo)
    if tuple(dy_shape) != y_shape:
        fail(ShapeError, op, "dy.shape", f"the output's {y_shape}", tuple(dy_shape))
    divisor = _divisor(op, divisor, mode)
    alpha, beta = blend_params(op, alpha, beta, out)
    out = c.out(out, tuple(x_shape), dtype)
    return c.run("pool_backward", dy, x, *geo, divisor=divisor, alpha=alpha, beta=beta,
                 out=out)


@op("pool")
def pool_indices(x, kernel, *, stride=None, padding=0, dilation=1, ceil_mode=False,
                 nan_propagation=True, layout="NCHW", out=None, backend=None, stream=None):
    """int64 indices, the shape of max pooling's output: each window's first maximal
    element (the one pool's "max" returns and pool_backward sends the gradient to) as
    its flat index within its (n, c) plane of x, row-major over the spatial axes
    (PyTorch's max_pool return_indices: h * W + w for 2-d); -1 for a window holding no
    input element. Keywords as pool2d's, the rank following x."""
    op = "pool_indices"
    c = Call(op, backend, stream, x=x, out=out)
    x_shape, dtype = c.array("x", x, BF16_DTYPES)
    nd = len(x_shape) - 2
    if nd not in (1, 2, 3):
        fail(ShapeError, op, "x.ndim", "3, 4 or 5 (N, C and 1-3 spatial axes)", len(x_shape))
    geo = _params(op, nd, tuple(x_shape), kernel, stride, padding, dilation, "max", ceil_mode,
                  nan_propagation, layout)
    out = c.out(out, _y_shape(tuple(x_shape), geo), np.dtype(np.int64))
    return c.run("pool_indices", x, *geo, out=out)

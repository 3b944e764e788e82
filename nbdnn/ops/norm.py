"""layer_norm / rms_norm over the trailing axes, group_norm / instance_norm over channel
groups (NCHW or NHWC), with their saved statistics, optional scale and bias, and
backward passes (dx, dscale, dbias). The formulas are in nbdnn/cpu/norm.py."""
import math
import numbers

from .._vocab import LAYOUTS as _LAYOUTS
from ..errors import BadParamError, DtypeError, ShapeError, fail
from .registry import op
from .._vocab import BF16_DTYPES
from ._common import Call, compute_dtype, out_tuple, required, same_dtype, same_shape, scalar


def _ndim(op, ndim, shape):
    if isinstance(ndim, bool) or not isinstance(ndim, numbers.Integral) or \
            not 1 <= ndim <= len(shape):
        fail(BadParamError, op, "ndim", f"an int in [1, {len(shape)}] (x.ndim)", repr(ndim))
    if 0 in shape[len(shape) - ndim:]:  # a mean over no elements
        fail(ShapeError, op, "x.shape", f"no empty axis among the last {ndim} (normalised)",
             shape)
    return int(ndim)


def check_params(c, op, names, arrays, tail, dtype, what="x's normalised axes"):
    """scale/bias-like arrays (None skipped): x's dtype, shape `tail`."""
    for name, a in zip(names, arrays):
        if a is not None:
            shape, dt = c.array(name, a, BF16_DTYPES)
            if tuple(shape) != tail:
                fail(ShapeError, op, f"{name}.shape", f"{what} {tail}", tuple(shape))
            same_dtype(op, ["x", name], [dtype, dt])


def check_stats(c, op, names, arrays, lead, dtype, what="x's rows", optional=False):
    """Statistics: the compute dtype (float32 for float16/float32 inputs, float64 for
    float64), shape `lead`; None is an error unless optional (then skipped)."""
    want = compute_dtype(dtype)
    for name, a in zip(names, arrays):
        if a is None:
            if not optional:
                required(op, **{name: a})
            continue
        shape, dt = c.array(name, a, dtypes=None)
        if dt is not want and dt != want:
            fail(DtypeError, op, f"{name}.dtype", f"{want.name} (statistics are kept in the "
                 "compute dtype)", dt.name)
        if tuple(shape) != lead:
            fail(ShapeError, op, f"{name}.shape", f"{what} {lead}", tuple(shape))


def _forward(op, x, scale, bias, ndim, eps, out, backend, stream):
    """(call, checked arguments) of a forward op."""
    c = Call(op, backend, stream, x=x, scale=scale, bias=bias, out=out)
    shape, dtype = c.array("x", x, BF16_DTYPES)
    shape = tuple(shape)
    ndim = _ndim(op, ndim, shape)
    check_params(c, op, ("scale", "bias"), (scale, bias), shape[len(shape) - ndim:], dtype)
    eps = scalar(op, "eps", eps, low=0.0, low_open=True)
    return c, (x, scale, bias, ndim, eps), c.out(out, shape, dtype)


@op("norm", backward="layer_norm_backward", in_place=("x",))
def layer_norm(x, scale=None, bias=None, *, ndim=1, eps=1e-5, out=None, backend=None,
               stream=None):
    """(y, mean, invstd): y = (x - mean) / sqrt(var + eps) * scale + bias over the last
    `ndim` axes; mean and invstd have x.shape[:-ndim] and the compute dtype (float32,
    float64 for float64). scale, bias: x.shape[-ndim:] or None."""
    c, args, out = _forward("layer_norm", x, scale, bias, ndim, eps, out, backend, stream)
    return c.run("layer_norm", *args, out=out)


@op("norm", backward="rms_norm_backward", in_place=("x",))
def rms_norm(x, scale=None, bias=None, *, ndim=1, eps=1e-6, out=None, backend=None,
             stream=None):
    """(y, invrms): y = x / sqrt(mean(x^2) + eps) * scale + bias over the last `ndim`
    axes."""
    c, args, out = _forward("rms_norm", x, scale, bias, ndim, eps, out, backend, stream)
    return c.run("rms_norm", *args, out=out)


def _backward(op, dy, x, stats, names, scale, ndim, out, backend, stream):
    """(call, checked arguments, out tuple or None) of a backward op."""
    outs = out_tuple(op, out, ("dx", "dscale", "dbias"))
    c = Call(op, backend, stream, dy=dy, x=x, scale=scale,
             **dict(zip(names, stats)), **{f"out[{i}]": o for i, o in enumerate(outs)})
    shape, dtype = c.array("x", x, BF16_DTYPES)
    dshape, ddtype = c.array("dy", dy, BF16_DTYPES)
    shape = tuple(shape)
    same_shape(op, ["x", "dy"], [shape, dshape])
    same_dtype(op, ["x", "dy"], [dtype, ddtype])
    ndim = _ndim(op, ndim, shape)
    lead, tail = shape[:len(shape) - ndim], shape[len(shape) - ndim:]
    check_params(c, op, ("scale",), (scale,), tail, dtype)
    check_stats(c, op, names, stats, lead, dtype)
    if out is not None:
        outs = tuple(c.out(o, s, dtype, f"out[{i}]") for i, (o, s) in
                     enumerate(zip(outs, (shape, tail, tail))))
    return c, (dy, x, *stats, scale, ndim), outs or None


@op("norm")
def layer_norm_backward(dy, x, mean, invstd, scale=None, *, ndim=1, out=None, backend=None,
                        stream=None):
    """(dx, dscale, dbias) from the forward's x, mean, invstd and scale."""
    c, args, out = _backward("layer_norm_backward", dy, x, (mean, invstd), ("mean", "invstd"),
                             scale, ndim, out, backend, stream)
    return c.run("layer_norm_backward", *args, out=out)


@op("norm")
def rms_norm_backward(dy, x, invrms, scale=None, *, ndim=1, out=None, backend=None,
                      stream=None):
    """(dx, dscale, dbias) from the forward's x, invrms and scale."""
    c, args, out = _backward("rms_norm_backward", dy, x, (invrms,), ("invrms",), scale, ndim,
                             out, backend, stream)
    return c.run("rms_norm_backward", *args, out=out)


LAYOUTS = {n: last for n, (last, _) in _LAYOUTS.items()}  # layout -> channels last


def _grouped(op, c, x, scale, bias, groups, layout):
    """(shape, dtype, groups, last) of a group_norm call after the checks."""
    shape, dtype = c.array("x", x, BF16_DTYPES)
    shape = tuple(shape)
    if len(shape) < 2:
        fail(ShapeError, op, "x.ndim", ">= 2 (N, C, spatial...)", len(shape))
    if layout not in LAYOUTS:
        fail(BadParamError, op, "layout", f"one of {', '.join(LAYOUTS)}", repr(layout))
    rank = _LAYOUTS[layout][1]
    if rank is not None and rank != len(shape):
        fail(ShapeError, op, "x.ndim", f"{rank} for layout {layout!r} (NCHW / NHWC: any rank)",
             len(shape))
    last = LAYOUTS[layout]
    C = shape[-1] if last else shape[1]
    if groups is None:  # (instance_norm: a group a channel)
        if C == 0:
            fail(ShapeError, op, "x.shape", "at least one channel", shape)
        groups = C
    if isinstance(groups, bool) or not isinstance(groups, numbers.Integral) or groups < 1 \
            or C % groups:
        fail(ShapeError, op, "groups", f"an int >= 1 dividing C = {C}", repr(groups))
    if math.prod(shape) == 0:
        fail(ShapeError, op, "x.shape", "no empty axis (a mean over no elements)", shape)
    check_params(c, op, ("scale", "bias"), (scale, bias), (C,), dtype)
    return shape, dtype, int(groups), last


@op("norm", backward="group_norm_backward", in_place=("x",))
def group_norm(x, groups, scale=None, bias=None, *, eps=1e-5, layout="NCHW", out=None,
               backend=None, stream=None):
    """(y, mean, invstd): x (N, C, *S) ("NCHW") or (N, *S, C) ("NHWC") normalised over
    each sample's groups of C/groups channels; scale, bias (C,) or None; mean, invstd
    (N, groups) in the compute dtype."""
    return _group_norm("group_norm", x, groups, scale, bias, eps, layout, out, backend,
                       stream)


def _group_norm(op, x, groups, scale, bias, eps, layout, out, backend, stream):
    """group_norm's front end for op (group_norm, or instance_norm with groups None: a
    group a channel), errors naming op."""
    c = Call(op, backend, stream, x=x, scale=scale, bias=bias, out=out)
    shape, dtype, groups, last = _grouped(op, c, x, scale, bias, groups, layout)
    eps = scalar(op, "eps", eps, low=0.0, low_open=True)
    out = c.out(out, shape, dtype)
    return c.run("group_norm", x, groups, scale, bias, eps, last, out=out)


@op("norm", backward="instance_norm_backward", dispatches="group_norm", in_place=("x",))
def instance_norm(x, scale=None, bias=None, *, eps=1e-5, layout="NCHW", out=None,
                  backend=None, stream=None):
    """group_norm with a group a channel: statistics (N, C)."""
    return _group_norm("instance_norm", x, None, scale, bias, eps, layout, out, backend,
                       stream)


@op("norm")
def group_norm_backward(dy, x, mean, invstd, scale=None, *, groups, layout="NCHW", out=None,
                        backend=None, stream=None):
    """(dx, dscale, dbias) from the forward's x, mean, invstd and scale."""
    return _group_norm_backward("group_norm_backward", dy, x, mean, invstd, scale, groups,
                                layout, out, backend, stream)


def _group_norm_backward(op, dy, x, mean, invstd, scale, groups, layout, out, backend,
                         stream):
    outs = out_tuple(op, out, ("dx", "dscale", "dbias"))
    c = Call(op, backend, stream, dy=dy, x=x, mean=mean, invstd=invstd, scale=scale,
             **{f"out[{i}]": o for i, o in enumerate(outs)})
    shape, dtype, groups, last = _grouped(op, c, x, scale, None, groups, layout)
    dshape, ddtype = c.array("dy", dy, BF16_DTYPES)
    same_shape(op, ["x", "dy"], [shape, dshape])
    same_dtype(op, ["x", "dy"], [dtype, ddtype])
    check_stats(c, op, ("mean", "invstd"), (mean, invstd), (shape[0], groups), dtype)
    C = shape[-1] if last else shape[1]
    if out is not None:
        outs = tuple(c.out(o, s, dtype, f"out[{i}]") for i, (o, s) in
                     enumerate(zip(outs, (shape, (C,), (C,)))))
    return c.run("group_norm_backward", dy, x, mean, invstd, scale, groups, last,
                 out=outs or None)


@op("norm", dispatches="group_norm_backward")
def instance_norm_backward(dy, x, mean, invstd, scale=None, *, layout="NCHW", out=None,
                           backend=None, stream=None):
    """group_norm_backward with a group a channel."""
    return _group_norm_backward("instance_norm_backward", dy, x, mean, invstd, scale, None,
                                layout, out, backend, stream)

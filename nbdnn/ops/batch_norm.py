"""batch_norm_train / batch_norm_infer / batch_norm_backward: modes spatial and
per_activation, NCHW/NHWC (any rank >= 2), fused residual add and activation (cuDNN's
BN_ADD_ACTIVATION). The formulas are in nbdnn/cpu/batch_norm.py.

scale and bias have x's dtype or, beside float16 / bfloat16 x, float32 (cuDNN's
scale-bias descriptor is float for half inputs; PyTorch's batch norm under autocast
keeps its float32 weights): one dtype for both, which dscale and dbias come back in."""
import math

from .._vocab import BATCH_NORM_MODES as MODES
from ..errors import DtypeError, ShapeError, fail
from .registry import op
from .._vocab import BF16_DTYPES
from ._common import (Call, blend_params, choice, compute_dtype, out_tuple, required,
                      same_dtype, same_shape, scalar)
from .activation import fused_coef
from .norm import check_params, check_stats


def _geometry(op, x_shape, mode, layout):
    """(parameter shape, last)."""
    choice(op, "mode", mode, MODES)
    choice(op, "layout", layout, ("NCHW", "NHWC"))
    if len(x_shape) < 2:
        fail(ShapeError, op, "x.ndim", ">= 2 (N, C, ...)", len(x_shape))
    last = layout == "NHWC"
    if mode == "per_activation":
        return tuple(x_shape[1:]), last
    return (x_shape[-1] if last else x_shape[1],), last


def _arrays(c, op, dtype, pshape, params=(), stats=(), like=(), optional_stats=False):
    """Check scale/bias-like params (`_param_dtype`) and statistics (nbdnn.ops.norm's
    checks, against the parameter shape) and arrays shaped like x; None params and
    like-arrays are skipped, None statistics too where optional (the running ones).
    Returns the parameters' dtype."""
    pdt = _param_dtype(c, op, dtype, params)
    check_params(c, op, *zip(*params), pshape, pdt, what="the parameter shape")
    check_stats(c, op, *zip(*stats), pshape, dtype, what="the parameter shape",
           optional=optional_stats)
    for name, (a, shape) in like:
        if a is not None:
            s, dt = c.array(name, a, BF16_DTYPES)
            same_shape(op, ["x", name], [shape, tuple(s)])
            same_dtype(op, ["x", name], [dtype, dt])
    return pdt


def _param_dtype(c, op, dtype, params):
    """The dtype scale and bias share: x's, or float32 beside 16-bit x (module
    docstring); x's where neither is given."""
    given = [(name, c.array(name, a, BF16_DTYPES)[1]) for name, a in params if a is not None]
    if not given:
        return dtype
    name, pdt = given[0]
    if pdt != dtype and not (pdt == compute_dtype(dtype) and dtype.itemsize == 2):
        fail(DtypeError, op, f"{name}.dtype", f"{dtype.name} like x" +
             (" or float32" if dtype.itemsize == 2 else ""), pdt.name)
    return pdt


def _act(op, activation, coef):
    return activation, fused_coef(op, activation, coef)


@op("batch_norm", backward="batch_norm_backward", in_place=("x",))
def batch_norm_train(x, scale=None, bias=None, running_mean=None, running_var=None, *,
                     momentum=0.1, eps=1e-5, mode="spatial", layout="NCHW", residual=None,
                     activation=None, coef=None, out=None, backend=None, stream=None):
    """(y, saved_mean, saved_invstd): y = act(scale * (x - mean) * invstd + bias +
    residual) with the batch's statistics; running_mean/running_var (optional, the
    compute dtype, C-contiguous) are updated in place with `momentum` (cuDNN's
    exponential average factor; unbiased variance). out: y's buffer."""
    op = "batch_norm_train"
    c = Call(op, backend, stream, x=x, scale=scale, bias=bias,
             running_mean=running_mean, running_var=running_var, residual=residual, out=out)
    shape, dtype = c.array("x", x, BF16_DTYPES)
    shape = tuple(shape)
    pshape, last = _geometry(op, shape, mode, layout)
    _arrays(c, op, dtype, pshape, (("scale", scale), ("bias", bias)),
            (("running_mean", running_mean), ("running_var", running_var)),
            (("residual", (residual, shape)),), optional_stats=True)
    ct = compute_dtype(dtype)
    for name, r in (("running_mean", running_mean), ("running_var", running_var)):
        if r is not None:
            c.out(r, pshape, ct, name)  # updated in place: contiguous and writeable
    momentum = scalar(op, "momentum", momentum, low=0.0, high=1.0)
    eps = scalar(op, "eps", eps, low=0.0, low_open=True)
    act, coef = _act(op, activation, coef)
    if math.prod(shape) == 0:
        fail(ShapeError, op, "x.shape", "no zero-sized axis (statistics of nothing)", shape)
    return c.run("batch_norm_train", x, scale, bias, running_mean, running_var, residual,
                 momentum, eps, mode, last, act, coef, out=c.out(out, shape, dtype),
                 inplace=(3, 4))


@op("batch_norm", in_place=("x", "residual"))
def batch_norm_infer(x, scale, bias, mean, var, *, eps=1e-5, mode="spatial", layout="NCHW",
                     residual=None, activation=None, coef=None, alpha=1.0, beta=0.0, out=None,
                     backend=None, stream=None):
    """y = alpha * act(scale * (x - mean) / sqrt(var + eps) + bias + residual) + beta *
    out, with given statistics (the running ones; compute dtype)."""
    op = "batch_norm_infer"
    c = Call(op, backend, stream, x=x, scale=scale, bias=bias, mean=mean,
             var=var, residual=residual, out=out)
    shape, dtype = c.array("x", x, BF16_DTYPES)
    shape = tuple(shape)
    pshape, last = _geometry(op, shape, mode, layout)
    _arrays(c, op, dtype, pshape, (("scale", scale), ("bias", bias)),
            (("mean", mean), ("var", var)), (("residual", (residual, shape)),))
    eps = scalar(op, "eps", eps, low=0.0, low_open=True)
    act, coef = _act(op, activation, coef)
    alpha, beta = blend_params(op, alpha, beta, out)
    return c.run("batch_norm_infer", x, scale, bias, mean, var, residual, eps, mode, last,
                 act, coef, alpha=alpha, beta=beta, out=c.out(out, shape, dtype))


@op("batch_norm")
def batch_norm_backward(dy, x, scale, saved_mean, saved_invstd, *, bias=None, residual=None,
                        activation=None, coef=None, mode="spatial", layout="NCHW", out=None,
                        backend=None, stream=None):
    """(dx, dscale, dbias), and dresidual when the forward added a residual; dy is the
    gradient of the forward's y; dscale and dbias in the parameters' dtype (scale's, or
    bias's where scale is None; x's where neither is given). With an activation, bias and residual must be the
    forward's (the pre-activation is recomputed). out: None or a tuple of the results'
    buffers."""
    op = "batch_norm_backward"
    required(op, dy=dy)
    outs = out_tuple(op, out, ("dx", "dscale", "dbias") + (("dresidual",) if residual is not
                                                            None else ()))
    c = Call(op, backend, stream, dy=dy, x=x, scale=scale, bias=bias,
             saved_mean=saved_mean, saved_invstd=saved_invstd, residual=residual,
             **{f"out[{i}]": o for i, o in enumerate(outs)})
    shape, dtype = c.array("x", x, BF16_DTYPES)
    shape = tuple(shape)
    pshape, last = _geometry(op, shape, mode, layout)
    pdt = _arrays(c, op, dtype, pshape, (("scale", scale), ("bias", bias)),
                  (("saved_mean", saved_mean), ("saved_invstd", saved_invstd)),
                  (("dy", (dy, shape)), ("residual", (residual, shape))))
    act, coef = _act(op, activation, coef)
    if out is not None:
        outs = tuple(c.out(o, s, d, f"out[{i}]") for i, (o, s, d) in enumerate(
            zip(outs, (shape, pshape, pshape, shape), (dtype, pdt, pdt, dtype))))
    return c.run("batch_norm_backward", dy, x, scale, bias, saved_mean, saved_invstd,
                 residual, mode, last, act, coef, out=outs or None)

"""torch.ops.nbdnn's normalisations and their backwards. Each forward returns y with the
statistics nbdnn's backward reads (mean and invstd, or invrms: float32, float64 for
float64 x), which are not differentiable; the backward keeps x, the weight and those
statistics, so nothing is recomputed. Weights and biases have x's dtype, as nbdnn's
norms take them, or for batch norm float32 beside 16-bit x (_args.FLOAT32_PARAMS);
gradients come back in theirs. Batch norm's running statistics are advanced as PyTorch
advances them (momentum, unbiased variance), in float32 while nbdnn runs, and copied
into the buffers by nbdnn.torch.batch_norm."""
from typing import Optional

import torch
from torch.library import custom_op

import nbdnn
from ._bridge import call, arr, channels_last, direct, new, on_cpu, plain_eager, \
    register_autograd, run, run_as, stream_of, tensor

Tensor = torch.Tensor


def _stat_dtype(x):
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _stats(x, shape):
    return x.new_empty(shape, dtype=_stat_dtype(x))


def _grads(x, w, has_b, last=False, params=None):
    """The fake (dx, dw, db) of a norm: dw and db empty where there is no weight / bias,
    in the parameters' dtype (`params`'s, else w's, else x's: batch norm's may be
    float32 beside 16-bit x); dx channels-last where last (batch and group norm of a
    channels-last x; layer and RMS norm make x contiguous, as PyTorch's)."""
    n = w.shape if w is not None else (0,)
    pdt = (params if params is not None else w if w is not None else x).dtype
    return new(x, x.shape, last), x.new_empty(n, dtype=pdt), \
        x.new_empty(n if has_b else (0,), dtype=pdt)


def _pick(grads, w, has_b):
    dx, dw, db = grads
    return dx, dw if w is not None else dx.new_empty(0), db if has_b else dx.new_empty(0)


# ---- batch norm: x (N, C, ...) or (N, C); statistics over all axes but C. A custom op
# with autograd must not mutate its inputs: the updated running statistics are outputs,
# which nbdnn.torch.batch_norm copies into the buffers (torch.compile functionalises it)
@custom_op("nbdnn::batch_norm", mutates_args=())
def batch_norm(x: Tensor, w: Optional[Tensor], b: Optional[Tensor],
               running_mean: Optional[Tensor], running_var: Optional[Tensor], training: bool,
               momentum: float, eps: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(y, mean, invstd, new running mean, new running var): training, the batch's
    statistics, the running ones advanced (empty where not given); otherwise the
    running statistics used, the other four outputs empty."""
    return _batch_norm_run(x, w, b, running_mean, running_var, training, momentum, eps)


def _batch_norm_run(x, w, b, running_mean, running_var, training, momentum, eps, **fused):
    """batch_norm's outputs; fused: batch_norm_act's residual, activation and coef."""
    if not training:  # (a channels-last x runs as NHWC and y stays channels-last)
        y = run_as(nbdnn.batch_norm_infer, x, x, *_affine(x, w, b),
                   running_mean.to(_stat_dtype(x)), running_var.to(_stat_dtype(x)), eps=eps,
                   nhwc_layout=True, **fused)
        return (y,) + tuple(_stats(x, 0) for _ in range(4))
    cpu = on_cpu(x)
    rm, rv = (arr(r.to(_stat_dtype(x), copy=True), cpu) if r is not None else None
              for r in (running_mean, running_var))
    y, mean, invstd = run_as(nbdnn.batch_norm_train, x, x, w, b, rm, rv, momentum=momentum,
                             eps=eps, nhwc_layout=True, **fused)
    advanced = (tensor(r, x) if r is not None else _stats(x, 0) for r in (rm, rv))
    return (y, mean, invstd, *advanced)


@direct(batch_norm)
def _(x, w, b, running_mean, running_var, training, momentum, eps):
    return _batch_norm_eager(x, w, b, running_mean, running_var, training, momentum, eps)


def _batch_norm_eager(x, w, b, running_mean, running_var, training, momentum, eps, **fused):
    """An eager call's batch norm: running statistics of the statistics' dtype and
    contiguous are advanced in place by nbdnn's kernel and returned as the advanced ones
    (nbdnn.torch.batch_norm then copies nothing); the op itself (the dispatcher's path:
    torch.compile, opcheck) must not mutate its inputs and copies them."""
    if not training or not plain_eager(x) or any(
            r is not None and (r.dtype != _stat_dtype(x) or not r.is_contiguous() or
                               not plain_eager(r)) for r in (running_mean, running_var)):
        return _batch_norm_run(x, w, b, running_mean, running_var, training, momentum, eps,
                               **fused)
    y, mean, invstd = run_as(nbdnn.batch_norm_train, x, x, w, b, running_mean, running_var,
                             momentum=momentum, eps=eps, nhwc_layout=True, **fused)
    return (y, mean, invstd, *(r if r is not None else _stats(x, 0)
                               for r in (running_mean, running_var)))


def _affine(x, w, b):
    """(w, b), a missing one ones / zeros of the other's dtype (nbdnn takes one)."""
    C, like = x.shape[1], w if w is not None else b if b is not None else x
    return (w if w is not None else like.new_ones(C),
            b if b is not None else like.new_zeros(C))


@batch_norm.register_fake
def _(x, w, b, running_mean, running_var, training, momentum, eps):
    return _batch_norm_fake(x, running_mean, running_var, training)


@custom_op("nbdnn::batch_norm_backward", mutates_args=())
def batch_norm_backward(dy: Tensor, x: Tensor, w: Optional[Tensor], mean: Tensor,
                        invstd: Tensor, has_bias: bool,
                        eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """Training mode: (dx, dw, db) through the batch statistics (eps: for the second
    order, nbdnn/torch/_second_order.py, which recomputes them)."""
    return _pick(run_as(nbdnn.batch_norm_backward, x, dy, x, w, mean, invstd,
                        nhwc_layout=True), w, has_bias)


@custom_op("nbdnn::batch_norm_infer_backward", mutates_args=())
def batch_norm_infer_backward(dy: Tensor, x: Tensor, w: Optional[Tensor],
                              running_mean: Tensor, running_var: Tensor, eps: float,
                              has_bias: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Inference mode (fixed statistics), from nbdnn ops: dx = w dy / sqrt(var + eps)
    (batch_norm_infer of dy, mean 0, bias 0); db = sum dy, dw = sum dy xhat over all
    axes but C (conv_backward_bias, xhat = batch_norm_infer of x with w 1, b 0)."""
    C = x.shape[1]
    pdt = w.dtype if w is not None else x.dtype
    zeros, mean, var = (x.new_zeros(C), running_mean.to(_stat_dtype(x)),
                        running_var.to(_stat_dtype(x)))
    dx = run_as(nbdnn.batch_norm_infer, x, dy, _affine(x, w, None)[0],
                zeros.to(pdt), mean.new_zeros(C), var, eps=eps, nhwc_layout=True)
    db = _channel_sums(x, dy).to(pdt) if has_bias else dx.new_empty(0, dtype=pdt)
    dw = dx.new_empty(0, dtype=pdt)
    if w is not None:
        xhat = run_as(nbdnn.batch_norm_infer, x, x, x.new_ones(C), zeros, mean, var, eps=eps,
                      nhwc_layout=True)
        dw = _channel_sums(x, run_as(nbdnn.op_tensor, x, "mul", dy, xhat)).to(pdt)
    return dx, dw, db


def _channel_sums(x, t):
    """t (x's shape) summed over every axis but C, in x's layout (conv_backward_bias)."""
    if channels_last(x):
        return run_as(nbdnn.conv_backward_bias, x, t, nhwc_layout=True)
    return run(nbdnn.conv_backward_bias, x, t.reshape(*t.shape[:2], -1))


@batch_norm_backward.register_fake
def _(dy, x, w, mean, invstd, has_bias, eps):
    return _grads(x, w, has_bias, channels_last(x))


@batch_norm_infer_backward.register_fake
def _(dy, x, w, running_mean, running_var, eps, has_bias):
    return _grads(x, w, has_bias, channels_last(x))


def _batch_norm_setup(ctx, inputs, output):
    x, w, b, rm, rv, training, momentum, eps = inputs
    ctx.mark_non_differentiable(*output[1:])
    ctx.training, ctx.eps, ctx.has_w, ctx.has_b = training, eps, w is not None, b is not None
    ctx.save_for_backward(x, w, *(output[1:3] if training else (rm, rv)))


def _batch_norm_grad(ctx, dy, *_stat_grads):
    x, w, s0, s1 = ctx.saved_tensors
    if ctx.training:
        dx, dw, db = call(batch_norm_backward, dy, x, w, s0, s1, ctx.has_b, ctx.eps)
    else:
        dx, dw, db = call(batch_norm_infer_backward, dy, x, w, s0, s1, ctx.eps, ctx.has_b)
    return (dx, dw if ctx.has_w else None, db if ctx.has_b else None) + (None,) * 5


register_autograd(batch_norm, _batch_norm_grad, _batch_norm_setup)


# ---- batch norm, a residual and an activation in one pass (cuDNN's fused batch norm):
# y = act(bn(x) + residual); its backward one pass too (nbdnn recomputes the
# pre-activation from x, the statistics, the bias and the residual, so the backward keeps
# those, not y). Training only has a backward: nbdnn.torch.batch_norm_act composes the
# unfused ops where an inference-mode call must be differentiated.
@custom_op("nbdnn::batch_norm_act", mutates_args=())
def batch_norm_act(x: Tensor, w: Optional[Tensor], b: Optional[Tensor],
                   running_mean: Optional[Tensor], running_var: Optional[Tensor],
                   residual: Optional[Tensor], training: bool, momentum: float, eps: float,
                   activation: str, coef: float) -> tuple[Tensor, Tensor, Tensor, Tensor,
                                                          Tensor]:
    """batch_norm's five outputs, y = act(bn(x) + residual) (residual optional)."""
    return _batch_norm_run(x, w, b, running_mean, running_var, training, momentum, eps,
                           residual=residual, activation=activation, coef=coef)


@direct(batch_norm_act)
def _(x, w, b, running_mean, running_var, residual, training, momentum, eps, activation,
      coef):
    return _batch_norm_eager(x, w, b, running_mean, running_var, training, momentum, eps,
                             residual=residual, activation=activation, coef=coef)


@batch_norm_act.register_fake
def _(x, w, b, running_mean, running_var, residual, training, momentum, eps, activation,
      coef):
    return _batch_norm_fake(x, running_mean, running_var, training)


def _batch_norm_fake(x, running_mean, running_var, training):
    n = x.shape[1] if training else 0
    rn = [x.shape[1] if training and r is not None else 0 for r in (running_mean, running_var)]
    return (new(x, x.shape, channels_last(x)), _stats(x, n), _stats(x, n), _stats(x, rn[0]),
            _stats(x, rn[1]))


@custom_op("nbdnn::batch_norm_act_backward", mutates_args=())
def batch_norm_act_backward(dy: Tensor, x: Tensor, w: Optional[Tensor], b: Optional[Tensor],
                            mean: Tensor, invstd: Tensor, residual: Optional[Tensor],
                            eps: float, activation: str,
                            coef: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Training mode: (dx, dw, db, dresidual), empty where there is no w, b or residual
    (eps: for the second order, which recomputes the statistics)."""
    grads = run_as(nbdnn.batch_norm_backward, x, dy, x, w, mean, invstd, bias=b,
                   residual=residual, activation=activation, coef=coef, nhwc_layout=True)
    dx, dw, db = _pick(grads[:3], w, b is not None)
    return dx, dw, db, grads[3] if residual is not None else dx.new_empty(0)


@batch_norm_act_backward.register_fake
def _(dy, x, w, b, mean, invstd, residual, eps, activation, coef):
    dx, dw, db = _grads(x, w, b is not None, channels_last(x), w if w is not None else b)
    return dx, dw, db, new(x, x.shape, channels_last(x)) if residual is not None else \
        x.new_empty(0)


def _batch_norm_act_setup(ctx, inputs, output):
    x, w, b, rm, rv, residual, training, momentum, eps, activation, coef = inputs
    if not training:
        from ..errors import NotSupportedError
        raise NotSupportedError("nbdnn::batch_norm_act: an inference-mode call has no "
                                "backward (nbdnn.torch.batch_norm_act composes the unfused "
                                "ops there)")
    ctx.mark_non_differentiable(*output[1:])
    ctx.eps, ctx.activation, ctx.coef = eps, activation, coef
    ctx.has_w, ctx.has_b, ctx.has_r = w is not None, b is not None, residual is not None
    ctx.save_for_backward(x, w, b, output[1], output[2], residual)


def _batch_norm_act_grad(ctx, dy, *_stat_grads):
    x, w, b, mean, invstd, residual = ctx.saved_tensors
    dx, dw, db, dr = call(batch_norm_act_backward, dy, x, w, b, mean, invstd, residual,
                          ctx.eps, ctx.activation, ctx.coef)
    return (dx, dw if ctx.has_w else None, db if ctx.has_b else None, None, None,
            dr if ctx.has_r else None) + (None,) * 5


register_autograd(batch_norm_act, _batch_norm_act_grad, _batch_norm_act_setup)


# ---- layer norm and RMS norm: over x's last ndim axes (the weight's shape)
@custom_op("nbdnn::layer_norm", mutates_args=())
def layer_norm(x: Tensor, w: Optional[Tensor], b: Optional[Tensor], ndim: int,
               eps: float) -> tuple[Tensor, Tensor, Tensor]:
    return run(nbdnn.layer_norm, x, x, w, b, ndim=ndim, eps=eps)


@custom_op("nbdnn::layer_norm_backward", mutates_args=())
def layer_norm_backward(dy: Tensor, x: Tensor, mean: Tensor, invstd: Tensor,
                        w: Optional[Tensor], ndim: int, has_bias: bool,
                        eps: float) -> tuple[Tensor, Tensor, Tensor]:
    return _pick(run(nbdnn.layer_norm_backward, x, dy, x, mean, invstd, w, ndim=ndim), w,
                 has_bias)


@direct(layer_norm)
def _(x, w, b, ndim, eps):
    s = stream_of(x)
    if s is None:
        return layer_norm._init_fn(x, w, b, ndim, eps)
    x = (x.data if x.requires_grad else x).contiguous()
    if w is not None:
        w = (w.data if w.requires_grad else w).contiguous()
    if b is not None:
        b = (b.data if b.requires_grad else b).contiguous()
    return nbdnn.layer_norm(x, w, b, ndim=ndim, eps=eps, stream=s) if s else \
        nbdnn.layer_norm(x, w, b, ndim=ndim, eps=eps)


@layer_norm.register_fake
def _(x, w, b, ndim, eps):
    return x.new_empty(x.shape), _stats(x, x.shape[:x.dim() - ndim]), \
        _stats(x, x.shape[:x.dim() - ndim])


@layer_norm_backward.register_fake
def _(dy, x, mean, invstd, w, ndim, has_bias, eps):
    return _grads(x, w, has_bias)


def _layer_norm_setup(ctx, inputs, output):
    x, w, b, ndim, eps = inputs
    ctx.mark_non_differentiable(output[1], output[2])
    ctx.save_for_backward(x, output[1], output[2], w)
    ctx.ndim, ctx.eps, ctx.has_w, ctx.has_b = ndim, eps, w is not None, b is not None


def _layer_norm_grad(ctx, dy, _dmean, _dinvstd):
    x, mean, invstd, w = ctx.saved_tensors
    dx, dw, db = call(layer_norm_backward, dy, x, mean, invstd, w, ctx.ndim, ctx.has_b,
                      ctx.eps)
    return dx, dw if ctx.has_w else None, db if ctx.has_b else None, None, None


register_autograd(layer_norm, _layer_norm_grad, _layer_norm_setup)


@custom_op("nbdnn::rms_norm", mutates_args=())
def rms_norm(x: Tensor, w: Optional[Tensor], ndim: int, eps: float) -> tuple[Tensor, Tensor]:
    return run(nbdnn.rms_norm, x, x, w, None, ndim=ndim, eps=eps)


@custom_op("nbdnn::rms_norm_backward", mutates_args=())
def rms_norm_backward(dy: Tensor, x: Tensor, invrms: Tensor, w: Optional[Tensor],
                      ndim: int, eps: float) -> tuple[Tensor, Tensor]:
    dx, dw, _ = _pick(run(nbdnn.rms_norm_backward, x, dy, x, invrms, w, ndim=ndim), w, False)
    return dx, dw


@rms_norm.register_fake
def _(x, w, ndim, eps):
    return x.new_empty(x.shape), _stats(x, x.shape[:x.dim() - ndim])


@rms_norm_backward.register_fake
def _(dy, x, invrms, w, ndim, eps):
    return _grads(x, w, False)[:2]


def _rms_norm_setup(ctx, inputs, output):
    x, w, ndim, eps = inputs
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(x, output[1], w)
    ctx.ndim, ctx.eps, ctx.has_w = ndim, eps, w is not None


def _rms_norm_grad(ctx, dy, _dinvrms):
    x, invrms, w = ctx.saved_tensors
    dx, dw = call(rms_norm_backward, dy, x, invrms, w, ctx.ndim, ctx.eps)
    return dx, dw if ctx.has_w else None, None, None


register_autograd(rms_norm, _rms_norm_grad, _rms_norm_setup)


# ---- group norm (instance norm: groups = C): x (N, C, ...), statistics (N, groups)
@custom_op("nbdnn::group_norm", mutates_args=())
def group_norm(x: Tensor, groups: int, w: Optional[Tensor], b: Optional[Tensor],
               eps: float) -> tuple[Tensor, Tensor, Tensor]:
    return run_as(nbdnn.group_norm, x, x, groups, w, b, eps=eps, nhwc_layout=True)


@custom_op("nbdnn::group_norm_backward", mutates_args=())
def group_norm_backward(dy: Tensor, x: Tensor, mean: Tensor, invstd: Tensor,
                        w: Optional[Tensor], groups: int, has_bias: bool,
                        eps: float) -> tuple[Tensor, Tensor, Tensor]:
    return _pick(run_as(nbdnn.group_norm_backward, x, dy, x, mean, invstd, w, groups=groups,
                        nhwc_layout=True), w, has_bias)


@group_norm.register_fake
def _(x, groups, w, b, eps):
    return (new(x, x.shape, channels_last(x)), _stats(x, (x.shape[0], groups)),
            _stats(x, (x.shape[0], groups)))


@group_norm_backward.register_fake
def _(dy, x, mean, invstd, w, groups, has_bias, eps):
    return _grads(x, w, has_bias, channels_last(x))


def _group_norm_setup(ctx, inputs, output):
    x, groups, w, b, eps = inputs
    ctx.mark_non_differentiable(output[1], output[2])
    ctx.save_for_backward(x, output[1], output[2], w)
    ctx.groups, ctx.eps, ctx.has_w, ctx.has_b = groups, eps, w is not None, b is not None


def _group_norm_grad(ctx, dy, _dmean, _dinvstd):
    x, mean, invstd, w = ctx.saved_tensors
    dx, dw, db = call(group_norm_backward, dy, x, mean, invstd, w, ctx.groups, ctx.has_b,
                      ctx.eps)
    return dx, None, dw if ctx.has_w else None, db if ctx.has_b else None, None


register_autograd(group_norm, _group_norm_grad, _group_norm_setup)

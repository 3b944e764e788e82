"""Second and higher-order gradients through torch.ops.nbdnn: autograd registered on each
backward op, so torch.autograd.grad(..., create_graph=True) (gradient penalties,
Hessian-vector products, meta-learning) works as with torch.nn.functional.

The forward and the first backward stay nbdnn's ops. A backward op's own derivative is
PyTorch's: a formula (rules.RULES) writes each backward op's outputs from its inputs in PyTorch's ops
(most as torch.func.vjp of the torch.nn.functional call the op replaces), and its
backward is torch.func.vjp of that formula. torch.func's results are differentiable by
autograd, so third and later orders follow. Only the first backward runs nbdnn's
kernels; a double backward costs PyTorch's composite formula (on the CUDA tensors:
PyTorch's kernels).

The statistics a backward op reads (batch, layer, group and RMS norm's mean and invstd;
attention's o and log-sum-exp) are functions of x that the forward marks
non-differentiable: the formulas recompute them from x, so a second derivative sees
their dependence on x (as PyTorch's own double backward of batch norm does). Dropout in
attention cannot be differentiated twice: PyTorch's formula cannot draw nbdnn's mask (a
NotSupportedError); dropout itself is linear in dy (its mask is saved)."""
import torch

from . import _ops_conv as conv, _ops_random as rnd
from ._bridge import register_autograd

F = torch.nn.functional
Tensor = torch.Tensor


def _vjp(f, primals, cotangent):
    """f's vector-Jacobian product at primals (a tuple, one gradient a primal)."""
    return torch.func.vjp(f, *primals)[1](cotangent)


def _empty(t):
    return t.new_empty(0)


def _sum_but_channels(t):
    """t (N, C, ...) summed over every axis but C: a bias's gradient (t has at least the
    two axes N and C, so the list is never empty)."""
    return t.sum(dim=[d for d in range(t.dim()) if d != 1])


# ---- activations: nbdnn.activation's modes as PyTorch computes them; coef as nbdnn's
ACTIVATIONS = {
    "relu": lambda x, c: F.relu(x),
    "leaky_relu": lambda x, c: F.leaky_relu(x, c),
    "elu": lambda x, c: F.elu(x, c),
    "gelu": lambda x, c: F.gelu(x),
    "gelu_tanh": lambda x, c: F.gelu(x, approximate="tanh"),
    "swish": lambda x, c: F.silu(x) if c == 1.0 else x * torch.sigmoid(c * x),
    "sigmoid": lambda x, c: torch.sigmoid(x),
    "tanh": lambda x, c: torch.tanh(x),
    "softplus": lambda x, c: F.softplus(x, c),
    "clipped_relu": lambda x, c: F.hardtanh(x, 0.0, c),
    "clamp": lambda x, c: F.hardtanh(x, -c, c),
    "hardswish": lambda x, c: F.hardswish(x),
    "hardsigmoid": lambda x, c: F.relu6(x + 3) / 6,  # (F.hardsigmoid's backward has no
    # derivative in PyTorch; relu6's has, and its gradient is the same, 1/6 inside)
}


def activation_backward(dy, x, mode, coef):
    return _vjp(lambda x: ACTIVATIONS[mode](x, coef), (x,), dy)[0]


def softmax_backward(dy, y, dim, log):
    """From the output y, as PyTorch's _softmax_backward_data: y is differentiated too
    (its gradient flows back through the forward op's own backward)."""
    if log:
        return dy - torch.exp(y) * dy.sum(dim, keepdim=True)
    return y * (dy - (dy * y).sum(dim, keepdim=True))


def linear_backward(dy, x, w, has_bias, w_in_out=False):
    x2 = x.reshape(-1, x.shape[-1])
    if w_in_out:  # (w (I, O): y = x w + b)
        dy2 = dy.reshape(-1, w.shape[1])
        return (dy2 @ w.t()).reshape(x.shape), x2.t() @ dy2, \
            dy2.sum(0) if has_bias else _empty(w)
    dy2 = dy.reshape(-1, w.shape[0])
    dx = (dy2 @ w).reshape(x.shape)
    return dx, dy2.t() @ x2, dy2.sum(0) if has_bias else _empty(w)


def lrn_backward(dy, x, size, alpha, beta, k):
    return _vjp(lambda x: F.local_response_norm(x, size, alpha, beta, k), (x,), dy)[0]


# ---- convolution and pooling; padding as the ops carry it, per-side pairs flattened
# (pre_0, post_0, pre_1, ...) by spatial axis, F.pad's order is the last axis first
def conv_math(x, w, stride, padding, dilation, groups):
    pads = [p for a in reversed(range(w.dim() - 2)) for p in padding[2 * a:2 * a + 2]]
    fn = (F.conv1d, F.conv2d, F.conv3d)[w.dim() - 3]
    return fn(F.pad(x, pads), w, None, stride, 0, dilation, groups)


def conv_backward(dy, x, w, stride, padding, dilation, groups, output_mask):
    dx, dw = _vjp(lambda x, w: conv_math(x, w, stride, padding, dilation, groups), (x, w), dy)
    want_x, want_w, want_b = output_mask
    return (dx if want_x else _empty(x), dw if want_w else _empty(w),
            _sum_but_channels(dy) if want_b else _empty(w))


def conv_transpose_backward(dy, x, w, stride, padding, dilation, groups, output_mask):
    """The transposed convolution y = A_w^T x: dx = A_w dy (a convolution of dy, cut to
    x's shape), dw = the convolution's weight gradient at dy with cotangent x (grown to
    the convolution's output: _ops_conv.grown), db = dy's channel sums."""
    want_x, want_w, want_b = output_mask
    dx = conv_math(dy, w, stride, padding, dilation, groups)[
        (slice(None), slice(None)) + tuple(slice(S) for S in x.shape[2:])] \
        if want_x else _empty(x)
    Q = conv.conv_shape(dy.shape, w.shape, stride, padding, dilation)
    dw = _vjp(lambda w: conv_math(dy, w, stride, padding, dilation, groups), (w,),
              conv.grown(x, Q))[0] if want_w else _empty(w)
    return dx, dw, _sum_but_channels(dy) if want_b else _empty(w)


def pool_math(x, kernel, stride, padding, dilation, mode, ceil_mode, divisor=0):
    nd = len(kernel)
    pad = padding[0::2]  # (nbdnn.torch's pools pad both sides alike)
    if mode == "max":
        return (F.max_pool1d, F.max_pool2d, F.max_pool3d)[nd - 1](
            x, kernel, stride, pad, dilation, ceil_mode)
    extra = (divisor or None,) if nd > 1 else ()  # (avg_pool1d takes no divisor: never one)
    return (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[nd - 1](
        x, kernel, stride, pad, ceil_mode, mode == "avg", *extra)


def pool_backward(dy, x, kernel, stride, padding, dilation, mode, ceil_mode, divisor=0):
    return _vjp(lambda x: pool_math(x, kernel, stride, padding, dilation, mode, ceil_mode,
                                    divisor), (x,), dy)[0]


# ---- normalisations: the saved statistics recomputed from x (see above)
def _norm_grads(f, dy, x, w, has_bias, bias_grad):
    """(dx, dw, db) of y = f(x, w) + b: dw and db empty where there is no w / b."""
    if w is None:
        dx, dw = _vjp(lambda x: f(x, None), (x,), dy)[0], _empty(x)
    else:
        dx, dw = _vjp(f, (x, w), dy)
    return dx, dw, bias_grad(dy) if has_bias else _empty(x)


def batch_norm_backward(dy, x, w, mean, invstd, has_bias, eps):
    return _norm_grads(lambda x, w: F.batch_norm(x, None, None, w, None, True, 0.0, eps),
                       dy, x, w, has_bias, _sum_but_channels)


def batch_norm_act_backward(dy, x, w, b, mean, invstd, residual, eps, activation, coef):
    """(dx, dw, db, dresidual) of y = act(batch_norm(x) w + b + residual), the batch's
    statistics (recomputed from x); empty where there is no w, b or residual."""
    def f(x, w, b, r):
        y = F.batch_norm(x, None, None, w, b, True, 0.0, eps)
        return ACTIVATIONS[activation](y if r is None else y + r, coef)
    live = [t for t in (x, w, b, residual) if t is not None]

    def g(*ts):
        it = iter(ts)
        return f(*(next(it) if t is not None else None for t in (x, w, b, residual)))
    got = iter(_vjp(g, tuple(live), dy))
    return tuple(next(got) if t is not None else _empty(x) for t in (x, w, b, residual))


def batch_norm_infer_backward(dy, x, w, running_mean, running_var, eps, has_bias):
    return _norm_grads(lambda x, w: F.batch_norm(x, running_mean.to(x.dtype),
                                                 running_var.to(x.dtype), w, None, False,
                                                 0.0, eps),
                       dy, x, w, has_bias, _sum_but_channels)


def _leading_sums(ndim):
    """The bias gradient of a norm over the trailing ndim axes: dy summed over the
    others; dy itself when there are none (a norm over the whole sample: sum(dim=[])
    would sum over every axis)."""
    return lambda dy: dy.sum(dim=list(range(dy.dim() - ndim))) if dy.dim() > ndim else dy


def layer_norm_backward(dy, x, mean, invstd, w, ndim, has_bias, eps):
    return _norm_grads(lambda x, w: F.layer_norm(x, x.shape[x.dim() - ndim:], w, None, eps),
                       dy, x, w, has_bias, _leading_sums(ndim))


def rms_norm_backward(dy, x, invrms, w, ndim, eps):
    return _norm_grads(lambda x, w: F.rms_norm(x, x.shape[x.dim() - ndim:], w, eps),
                       dy, x, w, False, None)[:2]


def group_norm_backward(dy, x, mean, invstd, w, groups, has_bias, eps):
    return _norm_grads(lambda x, w: F.group_norm(x.contiguous(), groups, w, None, eps),  # (a
                       # channels-last x: PyTorch 2.13's forward mode views it wrongly)
                       dy, x, w, has_bias, _sum_but_channels)


def dropout_backward(dy, mask, p):
    return dy * mask.to(dy.dtype) * (1.0 / (1.0 - p))


def attention_backward(do, q, k, v, o, lse, attn_mask, dropout_p, causal, scale,
                       enable_gqa, seed):
    rnd.no_dropout(dropout_p, "second-order gradients")
    return _vjp(lambda q, k, v: rnd.attention_math(q, k, v, attn_mask, causal, scale,
                                                   enable_gqa), (q, k, v), do)


def register_second_order(op, formula, wrt):
    """Autograd for backward op: its gradient is torch.func.vjp of formula at its inputs."""
    def setup(ctx, inputs, output):
        tensors = [i for i, a in enumerate(inputs) if isinstance(a, Tensor)]
        ctx.save_for_backward(*(inputs[i] for i in tensors))
        ctx.tensors = tensors
        ctx.others = [None if isinstance(a, Tensor) else a for a in inputs]

    def grad(ctx, *grads):
        args = list(ctx.others)
        for i, t in zip(ctx.tensors, ctx.saved_tensors):
            args[i] = t
        live = [i for i in wrt if args[i] is not None and ctx.needs_input_grad[i]]
        if not live:
            return (None,) * len(args)

        def f(*ts):
            a = list(args)
            for i, t in zip(live, ts):
                a[i] = t
            return formula(*a)
        outs, pull = torch.func.vjp(f, *(args[i] for i in live))
        single = isinstance(outs, Tensor)
        outs = (outs,) if single else outs
        cot = tuple(torch.zeros_like(o) if g is None else g for g, o in zip(grads, outs))
        got = dict(zip(live, pull(cot[0] if single else cot)))
        return tuple(got.get(i) for i in range(len(args)))
    register_autograd(op, grad, setup)


"""torch.ops.nbdnn's pointwise and matrix ops: activation, softmax, linear, lrn, each a
custom op with a fake (shape-only) implementation and its backward, itself a custom op,
registered for autograd. The tensors a backward keeps are what nbdnn's backward reads:
activation x (nbdnn computes f'(x) from x) but relu its output, as PyTorch's relu (y >
0 exactly where x > 0, so the derivative is the same; the input, often a batch norm's
output, is then free), softmax its output, linear x and w, lrn x. relu's inplace=True
runs in x's memory as PyTorch's relu_ (activation_in_place)."""
from typing import Optional

import torch
from torch.library import custom_op

import nbdnn
from ._bridge import call, channels_last, direct, nchw, new, nhwc, plain_eager, \
    register_autograd, run, run_as, stream_of, DTYPES, FLOAT32, MATMUL_TF32

OUTPUT_MODES = ("relu",)  # modes whose backward reads the output: f'(x) = [y > 0]


@custom_op("nbdnn::activation", mutates_args=())
def activation(x: torch.Tensor, mode: str, coef: float) -> torch.Tensor:
    """y = f(x) for nbdnn.activation's modes (a channels-last x stays so)."""
    return run_as(nbdnn.activation, x, x, mode, coef=coef)


@custom_op("nbdnn::activation_backward", mutates_args=())
def activation_backward(dy: torch.Tensor, x: torch.Tensor, mode: str,
                        coef: float) -> torch.Tensor:
    return run_as(nbdnn.activation_backward, x, dy, x, None, mode, coef=coef)


@direct(activation)
def _(x, mode, coef):
    s = stream_of(x)
    if s is None:
        return activation._init_fn(x, mode, coef)
    if x.requires_grad:
        x = x.data
    if x.is_contiguous():
        return nbdnn.activation(x, mode, coef=coef, stream=s) if s else \
            nbdnn.activation(x, mode, coef=coef)
    if channels_last(x):
        x = nhwc(x)
        return nchw(nbdnn.activation(x, mode, coef=coef, stream=s) if s else
                    nbdnn.activation(x, mode, coef=coef))
    return activation._init_fn(x, mode, coef)


@direct(activation_backward)
def _(dy, x, mode, coef):
    s = stream_of(x)
    if s is None or not (x.is_contiguous() and dy.is_contiguous()):
        return activation_backward._init_fn(dy, x, mode, coef)
    if x.requires_grad:
        x = x.data
    if dy.requires_grad:
        dy = dy.data
    return nbdnn.activation_backward(dy, x, None, mode, coef=coef, stream=s) if s else \
        nbdnn.activation_backward(dy, x, None, mode, coef=coef)


@activation.register_fake
def _(x, mode, coef):
    return new(x, x.shape, channels_last(x))


@activation_backward.register_fake
def _(dy, x, mode, coef):
    return new(x, x.shape, channels_last(x))


def _activation_setup(ctx, inputs, output):
    ctx.save_for_backward(output if inputs[1] in OUTPUT_MODES else inputs[0])
    ctx.mode, ctx.coef = inputs[1:]


def _activation_grad(ctx, dy):
    (x,) = ctx.saved_tensors
    return call(activation_backward, dy, x, ctx.mode, ctx.coef), None, None


register_autograd(activation, _activation_grad, _activation_setup)


class _ActivationInPlace(torch.autograd.Function):
    """An OUTPUT_MODES activation written into x, x marked dirty and saved (it holds the
    output): PyTorch's relu_ (one pass over x, no copy, nothing more kept)."""

    @staticmethod
    def forward(ctx, x, mode, coef):
        _write(x.data, mode, coef)
        ctx.mark_dirty(x)
        ctx.save_for_backward(x)
        ctx.mode, ctx.coef = mode, coef
        return x

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return call(activation_backward, dy, y, ctx.mode, ctx.coef), None, None


def _write(x, mode, coef):
    """x = f(x) in x's memory (contiguous or channels-last x)."""
    t = nhwc(x) if channels_last(x) else x
    run(nbdnn.activation, t, t, mode, coef=coef, out=t)


def activation_in_place(x, mode, coef):
    """x = f(x) in x's memory, its version bumped, the write recorded where autograd
    records; or None where this path does not apply (another mode, a leaf that requires
    grad, a layout nbdnn cannot write, not plain eager mode): the caller's copying path
    runs (nbdnn.torch._args.in_place)."""
    if mode not in OUTPUT_MODES or not plain_eager(x) or x.dtype not in DTYPES or \
            not (x.is_contiguous() or channels_last(x)):
        return None
    if x.requires_grad and torch.is_grad_enabled():
        return None if x.is_leaf else _ActivationInPlace.apply(x, mode, coef)
    _write(x, mode, coef)
    torch.autograd.graph.increment_version(x)
    return x


@custom_op("nbdnn::softmax", mutates_args=())
def softmax(x: torch.Tensor, dim: int, log: bool) -> torch.Tensor:
    """softmax (log: log_softmax) over axis dim."""
    return run(nbdnn.softmax, x, x, dim, algo="log" if log else "accurate")


@custom_op("nbdnn::softmax_backward", mutates_args=())
def softmax_backward(dy: torch.Tensor, y: torch.Tensor, dim: int, log: bool) -> torch.Tensor:
    return run(nbdnn.softmax_backward, y, dy, y, dim, algo="log" if log else "accurate")


@softmax.register_fake
def _(x, dim, log):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@softmax_backward.register_fake
def _(dy, y, dim, log):
    return torch.empty_like(y, memory_format=torch.contiguous_format)


def _softmax_setup(ctx, inputs, output):
    ctx.save_for_backward(output)
    ctx.dim, ctx.log = inputs[1:]


def _softmax_grad(ctx, dy):
    (y,) = ctx.saved_tensors
    return call(softmax_backward, dy, y, ctx.dim, ctx.log), None, None


register_autograd(softmax, _softmax_grad, _softmax_setup)


# linear: x (..., I) viewed as (M, I), w (O, I), y = x w^T + b: one GEMM of M x O x I.
# w_in_out: w stored (I, O), y = x w + b (transformers' Conv1D, GPT-2's projections):
# the same GEMM with B read as stored, no transposed copy.
@custom_op("nbdnn::linear", mutates_args=())
def linear(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor],
           w_in_out: bool = False) -> torch.Tensor:
    if x.dim() == 2:  # (a reshape costs ~1 us of host time)
        return run(nbdnn.matmul, x, x, w, trans_b=not w_in_out, bias=b)
    y = run(nbdnn.matmul, x, x.reshape(-1, x.shape[-1]), w, trans_b=not w_in_out, bias=b)
    return y.reshape(*x.shape[:-1], w.shape[1 if w_in_out else 0])


@custom_op("nbdnn::linear_backward", mutates_args=())
def linear_backward(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, has_bias: bool,
                    w_in_out: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dw, db); db empty without a bias."""
    flat = x.dim() != 2
    out = w.shape[1 if w_in_out else 0]
    dx, dw, *db = run(nbdnn.matmul_backward, x, dy.reshape(-1, out) if flat else dy,
                      x.reshape(-1, x.shape[-1]) if flat else x, w, trans_b=not w_in_out,
                      bias=has_bias)
    return dx.reshape(x.shape) if flat else dx, dw, db[0] if has_bias else w.new_empty(0)


@direct(linear)
def _(x, w, b, w_in_out=False):
    s = stream_of(x)
    if s is None or x.dim() != 2:
        return linear._init_fn(x, w, b, w_in_out)
    x = (x.data if x.requires_grad else x).contiguous()
    w = (w.data if w.requires_grad else w).contiguous()
    if b is not None:
        b = (b.data if b.requires_grad else b).contiguous()
    kw = {"trans_b": not w_in_out, "bias": b}
    if s:
        kw["stream"] = s
    if x.dtype is FLOAT32 and MATMUL_TF32():
        kw["math"] = "tf32"
    return nbdnn.matmul(x, w, **kw)


@linear.register_fake
def _(x, w, b, w_in_out=False):
    return x.new_empty(*x.shape[:-1], w.shape[1 if w_in_out else 0])


@linear_backward.register_fake
def _(dy, x, w, has_bias, w_in_out=False):
    return (x.new_empty(x.shape), w.new_empty(w.shape),
            w.new_empty(w.shape[1 if w_in_out else 0] if has_bias else 0))


def _linear_setup(ctx, inputs, output):
    x, w, b = inputs[:3]
    ctx.save_for_backward(x, w)
    ctx.has_bias = b is not None
    ctx.w_in_out = bool(inputs[3]) if len(inputs) > 3 else False


def _linear_grad(ctx, dy):
    x, w = ctx.saved_tensors
    dx, dw, db = call(linear_backward, dy, x, w, ctx.has_bias, ctx.w_in_out)
    return dx, dw, db if ctx.has_bias else None, None


register_autograd(linear, _linear_grad, _linear_setup)


# lrn: across channels, x (N, C, ...); PyTorch's local_response_norm is cuDNN's LRN
@custom_op("nbdnn::lrn", mutates_args=())
def lrn(x: torch.Tensor, size: int, alpha: float, beta: float, k: float) -> torch.Tensor:
    return run(nbdnn.lrn, x, x, size, alpha, beta, k)


@custom_op("nbdnn::lrn_backward", mutates_args=())
def lrn_backward(dy: torch.Tensor, x: torch.Tensor, size: int, alpha: float, beta: float,
                 k: float) -> torch.Tensor:
    return run(nbdnn.lrn_backward, x, dy, x, size, alpha, beta, k)


@lrn.register_fake
def _(x, size, alpha, beta, k):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@lrn_backward.register_fake
def _(dy, x, size, alpha, beta, k):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _lrn_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.params = inputs[1:]


def _lrn_grad(ctx, dy):
    (x,) = ctx.saved_tensors
    return (call(lrn_backward, dy, x, *ctx.params),) + (None,) * 4


register_autograd(lrn, _lrn_grad, _lrn_setup)

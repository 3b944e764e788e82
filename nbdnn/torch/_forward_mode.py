"""Forward-mode derivatives of torch.ops.nbdnn (torch.func.jvp, jacfwd, hessian): the jvp
rule of each op's torch.func-ready autograd.Function (_bridge.transformable).

As for the second order (nbdnn/torch/_second_order.py), the rule is PyTorch's: each
forward op written in PyTorch's ops (the torch.nn.functional call it replaces; each op's
formula in rules.RULES) and each backward op as its second-order formula writes it,
pushed forward by torch.func.jvp. The values stay nbdnn's (the Function's forward); the tangents are
PyTorch's formula at the same inputs. The statistics outputs (mean, invstd, the
dropout mask, attention's log-sum-exp, the advanced running statistics) get none: the
forward marks them non-differentiable."""
import torch

from . import _ops_random as rnd
from ._second_order import conv_math

F = torch.nn.functional
Tensor = torch.Tensor


def conv_forward(x, w, b, stride, padding, dilation, groups):
    y = conv_math(x, w, stride, padding, dilation, groups)
    return y if b is None else y + b.reshape(1, -1, *([1] * (y.dim() - 2)))


def conv_transpose_forward(x, w, b, stride, padding, dilation, output_padding, groups):
    fn = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[w.dim() - 3]
    return fn(x, w, b, stride, padding[0::2], output_padding, groups, dilation)  # (both
    # sides alike: nbdnn.torch's transposed convolutions pad so)


def batch_norm_forward(x, w, b, running_mean, running_var, training, momentum, eps):
    if training:  # (the batch's statistics, as the op computes y)
        return F.batch_norm(x, None, None, w, b, True, 0.0, eps)
    return F.batch_norm(x, running_mean.to(x.dtype), running_var.to(x.dtype), w, b, False,
                        0.0, eps)


def batch_norm_act_forward(x, w, b, running_mean, running_var, residual, training, momentum,
                           eps, activation, coef):
    from ._second_order import ACTIVATIONS
    y = batch_norm_forward(x, w, b, running_mean, running_var, training, momentum, eps)
    return ACTIVATIONS[activation](y if residual is None else y + residual, coef)


def dropout_forward(x, p, seed, outputs):
    """y = x mask / (1 - p), the mask the op drew (its second output)."""
    return x * outputs[1].to(x.dtype) * (1.0 / (1.0 - p))


def attention_forward(q, k, v, attn_mask, dropout_p, causal, scale, enable_gqa, seed):
    rnd.no_dropout(dropout_p, "forward-mode derivatives")
    return rnd.attention_math(q, k, v, attn_mask, causal, scale, enable_gqa)


def rule(op, formula, wrt, with_outputs):
    """(save, jvp) for op: save keeps the tensor inputs (and outputs where the formula
    reads them) for forward mode; jvp pushes the tangents through formula."""
    returns = len(op._opoverload._schema.returns)

    def save(ctx, inputs, output):
        outs = output if isinstance(output, tuple) else (output,)
        ctx.jvp_at = [i for i, a in enumerate(inputs) if isinstance(a, Tensor)]
        ctx.jvp_args = [None if isinstance(a, Tensor) else a for a in inputs]
        ctx.save_for_forward(*(inputs[i] for i in ctx.jvp_at),
                             *(outs if with_outputs else ()))

    def jvp(ctx, *tangents):
        saved, args = ctx.saved_tensors, list(ctx.jvp_args)
        for i, t in zip(ctx.jvp_at, saved):
            args[i] = t
        extra = (tuple(saved[len(ctx.jvp_at):]),) if with_outputs else ()
        live = [i for i in wrt if args[i] is not None and tangents[i] is not None]

        def f(*ts):
            a = list(args)
            for i, t in zip(live, ts):
                a[i] = t
            return formula(*a, *extra)
        if not live:
            return None if returns == 1 else (None,) * returns
        out = torch.func.jvp(f, tuple(args[i].clone() for i in live),  # (a primal may be an
                             # expanded view, its elements sharing memory, which a dual
                             # cannot take: jacrev's basis under jacfwd)
                             tuple(tangents[i] for i in live))[1]
        out = (out,) if isinstance(out, Tensor) else tuple(out)
        out += (None,) * (returns - len(out))  # (the statistics: non-differentiable)
        return out[0] if returns == 1 else out
    return save, jvp


"""Forward-mode derivatives of torch.ops.nbdnn (torch.func.jvp, jacfwd, hessian): the jvp
rule of each op's torch.func-ready autograd.Function (_bridge.transformable).

As for the second order (nbdnn/torch/_second_order.py), the rule is PyTorch's: each
forward op written in PyTorch's ops (FORWARD: the torch.nn.functional call it
replaces) and each backward op as _second_order.FORMULAS writes it, pushed forward by
torch.func.jvp. The values stay nbdnn's (the Function's forward); the tangents are
PyTorch's formula at the same inputs. The statistics outputs (mean, invstd, the
dropout mask, attention's log-sum-exp, the advanced running statistics) get none: the
forward marks them non-differentiable."""
import torch

from . import _ops_basic as basic, _ops_conv as conv, _ops_norm as norm, \
    _ops_random as rnd
from ._bridge import JVP
from ._second_order import ACTIVATIONS, FORMULAS, conv_math, pool_math

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


def dropout_forward(x, p, seed, outputs):
    """y = x mask / (1 - p), the mask the op drew (its second output)."""
    return x * outputs[1].to(x.dtype) * (1.0 / (1.0 - p))


def attention_forward(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa, seed):
    rnd.no_dropout(dropout_p, "forward-mode derivatives")
    return rnd.attention_math(q, k, v, attn_mask, is_causal, scale, enable_gqa)


# forward op -> (its formula: y, the first output, from the op's arguments; the
# positions of the inputs it is differentiated by; whether it takes the op's outputs too)
FORWARD = {
    basic.activation: (lambda x, mode, coef: ACTIVATIONS[mode](x, coef), (0,), False),
    basic.softmax: (lambda x, dim, log: (F.log_softmax if log else F.softmax)(x, dim), (0,),
                    False),
    basic.linear: (lambda x, w, b: F.linear(x, w, b), (0, 1, 2), False),
    basic.lrn: (lambda x, size, alpha, beta, k: F.local_response_norm(x, size, alpha, beta, k),
                (0,), False),
    conv.conv: (conv_forward, (0, 1, 2), False),
    conv.conv_transpose: (conv_transpose_forward, (0, 1, 2), False),
    conv.pool: (pool_math, (0,), False),
    conv.pool_indices: (None, (), False),  # (integers: no tangent)
    norm.batch_norm: (batch_norm_forward, (0, 1, 2), False),
    norm.layer_norm: (lambda x, w, b, ndim, eps: F.layer_norm(x, x.shape[x.dim() - ndim:], w, b,
                                                              eps), (0, 1, 2), False),
    norm.rms_norm: (lambda x, w, ndim, eps: F.rms_norm(x, x.shape[x.dim() - ndim:], w, eps),
                    (0, 1), False),
    norm.group_norm: (lambda x, groups, w, b, eps: F.group_norm(x.contiguous(), groups, w, b,
                                                                eps),  # (PyTorch 2.13's forward
                      (0, 2, 3), False),  # mode views a channels-last x wrongly)
    rnd.dropout: (dropout_forward, (0,), True),
    rnd.attention: (attention_forward, (0, 1, 2, 3), False),
}


def _rule(op, formula, wrt, with_outputs):
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


def register():
    """Every op's forward-mode rule (once: nbdnn.torch's import calls it)."""
    for op, (formula, wrt, with_outputs) in FORWARD.items():
        JVP[op] = _rule(op, formula, wrt, with_outputs)
    for op, (formula, wrt) in FORMULAS.items():
        JVP[op] = _rule(op, formula, wrt, False)

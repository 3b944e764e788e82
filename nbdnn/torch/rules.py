"""Each torch.ops.nbdnn op's rules beyond its forward and backward, in one record a op:
its forward-mode derivative (torch.func.jvp, jacfwd, hessian: _forward_mode.py), a
backward op's own derivative (second order: _second_order.py) and its vmap rule (the
batch as one call: _batching.py). A rule is PyTorch's formula of the op at nbdnn's
values; a missing vmap rule runs a call a sample. `register()` (nbdnn.torch's import)
installs them; tests/test_torch_func.py and tests/test_torch_second_order.py check
every op against F's."""
import dataclasses
from typing import Callable, Optional

import torch

from . import _ops_basic as basic, _ops_conv as conv, _ops_norm as norm, \
    _ops_random as rnd
from . import _forward_mode as fm, _second_order as so
from ._batching import fold, not_first, shared_mask, trailing
from ._bridge import BATCHED, JVP

F = torch.nn.functional


@dataclasses.dataclass(frozen=True)
class Rules:
    """jvp: a forward op's (formula of its outputs from its arguments, the positions it
    is differentiated by, whether the formula takes the op's outputs too); None with
    `no_tangent` for an op of integer outputs. second: a backward op's (formula, the
    positions differentiated by): its autograd, and its jvp. vmap: the batching rule."""
    jvp: Optional[tuple] = None
    second: Optional[tuple] = None
    vmap: Optional[Callable] = None
    no_tangent: bool = False


RULES = {
    basic.activation: Rules(jvp=(lambda x, mode, coef: so.ACTIVATIONS[mode](x, coef), (0,),
                                 False), vmap=fold((0,))),
    basic.activation_backward: Rules(second=(so.activation_backward, (0, 1)),
                                     vmap=fold((0, 1))),
    basic.softmax: Rules(jvp=(lambda x, dim, log: (F.log_softmax if log else F.softmax)(x, dim),
                              (0,), False), vmap=fold((0,), not_first)),
    basic.softmax_backward: Rules(second=(so.softmax_backward, (0, 1)),
                                  vmap=fold((0, 1), not_first)),
    basic.linear: Rules(jvp=(lambda x, w, b, w_in_out=False: F.linear(x, w.t() if w_in_out
                                                                      else w, b),
                             (0, 1, 2), False),
                        vmap=fold((0,))),
    basic.linear_backward: Rules(second=(so.linear_backward, (0, 1, 2))),
    basic.lrn: Rules(jvp=(lambda x, size, alpha, beta, k: F.local_response_norm(
        x, size, alpha, beta, k), (0,), False), vmap=fold((0,))),
    basic.lrn_backward: Rules(second=(so.lrn_backward, (0, 1)), vmap=fold((0, 1))),
    conv.conv: Rules(jvp=(fm.conv_forward, (0, 1, 2), False), vmap=fold((0,))),
    conv.conv_backward: Rules(second=(so.conv_backward, (0, 1, 2))),
    conv.conv_transpose: Rules(jvp=(fm.conv_transpose_forward, (0, 1, 2), False),
                               vmap=fold((0,))),
    conv.conv_transpose_backward: Rules(second=(so.conv_transpose_backward, (0, 1, 2))),
    conv.pool: Rules(jvp=(so.pool_math, (0,), False), vmap=fold((0,))),
    conv.pool_backward: Rules(second=(so.pool_backward, (0, 1)), vmap=fold((0, 1))),
    conv.pool_indices: Rules(no_tangent=True, vmap=fold((0,))),
    norm.batch_norm: Rules(jvp=(fm.batch_norm_forward, (0, 1, 2), False),
                           vmap=fold((0,), lambda ndim, x, w, b, rm, rv, training, *rest:
                                     not training)),
    norm.batch_norm_backward: Rules(second=(so.batch_norm_backward, (0, 1, 2))),
    norm.batch_norm_act: Rules(jvp=(fm.batch_norm_act_forward, (0, 1, 2, 5), False),
                               vmap=fold((0, 5), lambda ndim, x, w, b, rm, rv, r, training,
                                         *rest: not training)),
    norm.batch_norm_act_backward: Rules(second=(so.batch_norm_act_backward, (0, 1, 2, 3, 6))),
    norm.batch_norm_infer_backward: Rules(second=(so.batch_norm_infer_backward, (0, 1, 2))),
    norm.layer_norm: Rules(jvp=(lambda x, w, b, ndim, eps: F.layer_norm(
        x, x.shape[x.dim() - ndim:], w, b, eps), (0, 1, 2), False), vmap=fold((0,), trailing)),
    norm.layer_norm_backward: Rules(second=(so.layer_norm_backward, (0, 1, 4))),
    norm.rms_norm: Rules(jvp=(lambda x, w, ndim, eps: F.rms_norm(
        x, x.shape[x.dim() - ndim:], w, eps), (0, 1), False), vmap=fold((0,), trailing)),
    norm.rms_norm_backward: Rules(second=(so.rms_norm_backward, (0, 1, 3))),
    norm.group_norm: Rules(jvp=(lambda x, groups, w, b, eps: F.group_norm(
        x.contiguous(), groups, w, b, eps),  # (PyTorch 2.13's forward mode views a
        (0, 2, 3), False), vmap=fold((0,))),  # channels-last x wrongly)
    norm.group_norm_backward: Rules(second=(so.group_norm_backward, (0, 1, 4))),
    rnd.dropout: Rules(jvp=(fm.dropout_forward, (0,), True)),
    rnd.dropout_backward: Rules(second=(so.dropout_backward, (0,)), vmap=fold((0, 1))),
    rnd.attention: Rules(jvp=(fm.attention_forward, (0, 1, 2, 3), False),
                         vmap=fold((0, 1, 2), shared_mask)),
    rnd.attention_backward: Rules(second=(so.attention_backward, (0, 1, 2, 3, 6))),
    rnd.paged_attention: Rules(jvp=(rnd.paged_attention_math, (0, 1, 2), False)),
}


def register():
    """Every op's rules (once: nbdnn.torch's import calls it)."""
    for op, r in RULES.items():
        if r.no_tangent:  # (integers: a jvp of no tangent)
            JVP[op] = fm.rule(op, None, (), False)
        if r.jvp is not None:
            JVP[op] = fm.rule(op, *r.jvp)
        if r.second is not None:
            so.register_second_order(op, *r.second)
            JVP[op] = fm.rule(op, *r.second, False)
        if r.vmap is not None:
            BATCHED[op] = r.vmap

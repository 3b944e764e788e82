"""vmap rules that run a whole batch as one nbdnn call (torch.func.vmap, and the vmap
inside jacrev and per-sample gradients), where the op allows it; the others run a call
a sample (_bridge.transformable's loop).

Most ops treat their input's first axis as independent samples: convolutions, pools,
group norm, LRN, linear (every leading axis), layer and RMS norm over the trailing
axes, elementwise ops, softmax over another axis, batch norm in inference, attention
with a mask shared by the batch, and the backwards that return only an input's
gradient. For those, vmap's axis is folded into the first one, (B, N, ...) -> (B N,
...), the op runs once, and each output's first axis is unfolded. Weights must be
unbatched (a per-sample weight, or a weight's gradient per sample, needs the loop), and
so must running statistics and masks. Which op takes which rule: rules.RULES."""
import torch


Tensor = torch.Tensor


def _front(t, d, B):
    """t's vmap axis d first; an unbatched t (d None) expanded to B alike."""
    return t.movedim(d, 0) if d is not None else t.expand(B, *t.shape)


def fold(samples, ok=None):
    """The vmap rule of an op whose tensors at positions `samples` hold independent
    samples along their first axis; ok(ndim, *args) (ndim: the first one's dimensions
    without vmap's axis) may refuse a call, which then runs the loop (None)."""
    def rule(apply, B, in_dims, args):
        if any(d is not None for i, (a, d) in enumerate(zip(args, in_dims))
               if i not in samples and isinstance(a, Tensor)):
            return None
        first = next(i for i in samples if args[i] is not None)
        ndim = args[first].dim() - (in_dims[first] is not None)
        if ndim < 1 or ok is not None and not ok(ndim, *args):
            return None
        a = list(args)
        fronts = {i: _front(a[i], in_dims[i], B) for i in samples if a[i] is not None}
        N = fronts[first].shape[1]
        if N == 0 or any(t.dim() < 2 or t.shape[1] != N for t in fronts.values()):
            return None
        for i, t in fronts.items():
            a[i] = t.reshape(B * N, *t.shape[2:])
        out = apply(*a)
        outs = out if isinstance(out, tuple) else (out,)
        unfolded = tuple((o.reshape(B, N, *o.shape[1:]), 0) if o.dim() and o.shape[0] == B * N
                         else (o, None) for o in outs)
        if not isinstance(out, tuple):
            return unfolded[0]
        return tuple(o for o, _ in unfolded), tuple(d for _, d in unfolded)
    return rule


def not_first(ndim, *args):  # (softmax over the sample axis would mix samples; dim is
    # the first int of softmax's and its backward's arguments)
    return next(a for a in args if isinstance(a, int)) % ndim != 0


def trailing(ndim, x, *rest):  # (layer / RMS norm over every axis would too)
    return rest[-2] < ndim


def shared_mask(ndim, q, k, v, attn_mask, *rest):
    return attn_mask is None or attn_mask.dim() < 4 or attn_mask.shape[0] == 1

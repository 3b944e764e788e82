"""torch.ops.nbdnn's dropout and scaled_dot_product_attention (its dropout on the
attention probabilities), with their backwards; paged_attention (decoding, beside its
attention; its gradients from PyTorch's formula of it, paged_attention_math). Their randomness is nbdnn's Philox
stream (the CPU reference and the GPU drop the same elements), keyed by a value that
nbdnn.torch draws from torch's generators on every call, so torch.manual_seed governs it:
- CPU tensors, and attention everywhere: a seed from torch's CPU generator, an int64 CPU
  tensor argument (torch.compile traces its draw) that the kernels take as a launch
  argument (a captured CUDA graph replays attention's mask drawn at capture);
- dropout on CUDA: an offset drawn on the device by torch's CUDA generator (a 1-element
  int64 tensor), which nbdnn.dropout reads as its offset counter when the kernel runs
  (seed 0). torch's generator is capture-safe, so each replay of a captured CUDA graph
  draws a new one and drops fresh elements, as PyTorch's dropout does; eager calls and
  captured ones run the same kernel (a warm-up before capture compiles it).
Dropout's backward keeps the uint8 mask; attention's keeps q, k, v, o and the float32
log-sum-exp (no recomputation of the forward; a float attn_mask that requires grad gets
its gradient from PyTorch's math form, attention_math)."""
from typing import Optional

import torch
from torch.library import custom_op

import nbdnn
from .._vocab import ATTENTION_ALIGNMENTS
from ..errors import NotSupportedError
from ._bridge import call, channels_last, new, register_autograd, run, run_as

Tensor = torch.Tensor


def draw_seed(like=None):
    """A seed from torch's default CPU generator (an int64 scalar tensor, >= 0); for a CUDA
    tensor like, an offset drawn on its device by torch's CUDA generator (1 element)."""
    if like is not None and like.is_cuda:
        return torch.randint(0, 2 ** 62, (1,), dtype=torch.int64, device=like.device)
    return torch.randint(0, 2 ** 62, (), dtype=torch.int64)


@custom_op("nbdnn::dropout", mutates_args=())
def dropout(x: Tensor, p: float, seed: Tensor) -> tuple[Tensor, Tensor]:
    """(y, mask): y = x mask / (1 - p), mask uint8, 1 where kept (element i of x's
    memory order draws stream element i: a channels-last x draws in NHWC order). seed:
    draw_seed(x)'s; a device-drawn one is the stream's offset (seed 0), read when the
    kernel runs, from a copy (nbdnn advances its counter in place; the op's inputs stay
    as they were)."""
    if seed.is_cuda:
        return run_as(nbdnn.dropout, x, x, p, seed=0, offset=seed.clone().view(torch.uint64))
    return run_as(nbdnn.dropout, x, x, p, seed=int(seed))


@custom_op("nbdnn::dropout_backward", mutates_args=())
def dropout_backward(dy: Tensor, mask: Tensor, p: float) -> Tensor:
    return run_as(nbdnn.dropout_backward, mask, dy, mask, p)


@dropout.register_fake
def _(x, p, seed):
    last = channels_last(x)
    return new(x, x.shape, last), new(x, x.shape, last, torch.uint8)


@dropout_backward.register_fake
def _(dy, mask, p):
    return new(dy, dy.shape, channels_last(mask))


def _dropout_setup(ctx, inputs, output):
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(output[1])
    ctx.p = inputs[1]


def _dropout_grad(ctx, dy, _dmask):
    (mask,) = ctx.saved_tensors
    return call(dropout_backward, dy, mask, ctx.p), None, None


register_autograd(dropout, _dropout_grad, _dropout_setup)


# attention: q (B, Hq, Sq, D), k (B, Hk, Sk, D), v (B, Hk, Sk, Dv); o (B, Hq, Sq, Dv),
# lse (B, Hq, Sq) float32 (float64 for float64 q); causal: 0 none, 1 top-left (PyTorch's
# is_causal), 2 bottom-right (CausalBias lower-right): ATTENTION_ALIGNMENTS' code
def _attention_kw(attn_mask, dropout_p, causal, scale, enable_gqa, seed):
    return dict(attn_mask=attn_mask, dropout_p=dropout_p, is_causal=causal != 0,
                alignment=ATTENTION_ALIGNMENTS[max(causal, 1) - 1], scale=scale,
                enable_gqa=enable_gqa, seed=int(seed))


@custom_op("nbdnn::scaled_dot_product_attention", mutates_args=())
def attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Optional[Tensor], dropout_p: float,
              causal: int, scale: Optional[float], enable_gqa: bool,
              seed: Tensor) -> tuple[Tensor, Tensor]:
    """(o, lse)."""
    return run(nbdnn.scaled_dot_product_attention, q, q, k, v,
               **_attention_kw(attn_mask, dropout_p, causal, scale, enable_gqa, seed))


@custom_op("nbdnn::scaled_dot_product_attention_backward", mutates_args=())
def attention_backward(do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor,
                       attn_mask: Optional[Tensor], dropout_p: float, causal: int,
                       scale: Optional[float], enable_gqa: bool,
                       seed: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    return run(nbdnn.scaled_dot_product_attention_backward, q, do, q, k, v, o, lse,
               **_attention_kw(attn_mask, dropout_p, causal, scale, enable_gqa, seed))


@attention.register_fake
def _(q, k, v, attn_mask, dropout_p, causal, scale, enable_gqa, seed):
    lse = q.new_empty(q.shape[:3], dtype=torch.float64 if q.dtype == torch.float64
                      else torch.float32)
    return q.new_empty((*q.shape[:3], v.shape[3])), lse


@attention_backward.register_fake
def _(do, q, k, v, o, lse, attn_mask, dropout_p, causal, scale, enable_gqa, seed):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


@custom_op("nbdnn::paged_attention", mutates_args=())
def paged_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor,
                    seq_lens_k: Tensor, is_causal: bool, scale: Optional[float],
                    window_left: int = -1, window_right: int = -1,
                    softcap: float = 0.0) -> tuple[Tensor, Tensor]:
    """(o, lse) of nbdnn.paged_attention, q (B, Sq, Hq, D); a window side of -1 is open
    and a softcap of 0 none (flash_attn_with_kvcache's window_size and softcap)."""
    window = None if window_left < 0 and window_right < 0 else \
        tuple(None if w < 0 else w for w in (window_left, window_right))
    return run(nbdnn.paged_attention, q, q, k_cache, v_cache, block_table, seq_lens_k,
               is_causal=is_causal, scale=scale, layout="BSHD", window=window,
               softcap=softcap or None)


@paged_attention.register_fake
def _(q, k_cache, v_cache, block_table, seq_lens_k, is_causal, scale, window_left=-1,
      window_right=-1, softcap=0.0):
    B, Sq, Hq, _ = q.shape
    lse = q.new_empty((B, Hq, Sq), dtype=torch.float64 if q.dtype == torch.float64
                      else torch.float32)
    return q.new_empty((B, Sq, Hq, v_cache.shape[3])), lse


def paged_attention_math(q, k_cache, v_cache, block_table, seq_lens_k, is_causal, scale,
                         window_left=-1, window_right=-1, softcap=0.0):
    """paged_attention's o in PyTorch's ops, on the device without a host read: every
    table entry's page gathered into (B, W P) keys (entries outside the cache read page 0,
    removed), a boolean mask of the live keys (length, bottom-right causal rows, the
    window's sides that are not -1, pages in the cache), attention_math (with the logit
    cap, softcap > 0). What its
    gradients and forward-mode derivatives differentiate (decoding rarely asks:
    gradients through the gathered caches)."""
    B, Sq, Hq, D = q.shape
    pages, P, Hk, _ = k_cache.shape
    W = block_table.shape[1]
    t = block_table.long()
    inside = (t >= 0) & (t < pages)
    k, v = (c[t.clamp(0, pages - 1)].reshape(B, W * P, Hk, c.shape[3]).transpose(1, 2)
            for c in (k_cache, v_cache))
    j = torch.arange(W * P, device=q.device)
    n = seq_lens_k.long().clamp(0, W * P)[:, None, None]  # (B, 1, 1)
    live = (j < n) & inside.repeat_interleave(P, 1)[:, None, :]
    diag = n - Sq + torch.arange(Sq, device=q.device)[:, None]  # (B, Sq, 1): row i's
    if is_causal:  # row i attends keys j <= n - Sq + i
        live = live & (j <= diag)
    if window_left >= 0:
        live = live & (j >= diag - window_left)
    if window_right >= 0:
        live = live & (j <= diag + window_right)
    o = attention_math(q.transpose(1, 2), k, v, live[:, None], False, scale, Hk != Hq,
                       softcap)
    return o.transpose(1, 2)


def _paged_setup(ctx, inputs, output):
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(*inputs[:5])
    ctx.params = inputs[5:]


def _paged_grad(ctx, do, _dlse):
    """(dq, dk_cache, dv_cache) from the math form's vector-Jacobian product."""
    q, kc, vc, table, lens = ctx.saved_tensors
    _, vjp = torch.func.vjp(lambda q, kc, vc: paged_attention_math(q, kc, vc, table, lens,
                                                                   *ctx.params), q, kc, vc)
    return vjp(do) + (None,) * (2 + len(ctx.params))  # (table, lengths, the keywords)


register_autograd(paged_attention, _paged_grad, _paged_setup)


def attention_math(q, k, v, attn_mask, causal, scale, enable_gqa, softcap=0.0):
    """PyTorch's math form of scaled_dot_product_attention without dropout, in
    PyTorch's ops, with nbdnn's rule that a fully masked query row gives 0: what a float
    attn_mask's gradient and the higher derivatives (_second_order.py, _forward_mode.py)
    differentiate. q (B, H, L, E), k (B, Hk, S, E), v (B, Hk, S, Ev); materialises the
    (B, H, L, S) scores, as PyTorch's math backend does. causal: the attention op's
    code (1 top-left, 2 bottom-right: key j <= i + S - L); softcap > 0: the scaled
    scores capped as softcap tanh(s / softcap) before the mask."""
    if enable_gqa and k.shape[1] != q.shape[1]:
        k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
    s = q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if causal:
        L, S = s.shape[-2:]
        attn_mask = torch.ones(L, S, dtype=torch.bool, device=s.device).tril(
            S - L if causal == 2 else 0)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        s = s.masked_fill(~attn_mask, float("-inf"))
    elif attn_mask is not None:
        s = s + attn_mask
    dead = torch.isneginf(s).all(-1, keepdim=True)
    p = torch.softmax(s.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0)
    return p @ v


def no_dropout(dropout_p, what):
    if dropout_p > 0:
        raise NotSupportedError(
            f"nbdnn.torch.scaled_dot_product_attention: {what} with dropout_p > 0 (PyTorch's "
            "formula cannot draw nbdnn's dropout mask)")


def _attention_setup(ctx, inputs, output):
    q, k, v, attn_mask = inputs[:4]
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(q, k, v, output[0], output[1], attn_mask, inputs[8])
    ctx.params = inputs[4:8]


def _attention_grad(ctx, do, _dlse):
    """(dq, dk, dv) from nbdnn's backward; a float attn_mask that requires grad gets its
    gradient (dS, the scores' gradient, summed over the axes it broadcasts along) from
    the math form's vector-Jacobian product, in PyTorch's ops."""
    q, k, v, o, lse, attn_mask, seed = ctx.saved_tensors
    grads = call(attention_backward, do, q, k, v, o, lse, attn_mask, *ctx.params, seed)
    dmask = None
    if ctx.needs_input_grad[3] and attn_mask is not None and attn_mask.is_floating_point():
        dropout_p, causal, scale, enable_gqa = ctx.params
        no_dropout(dropout_p, "the gradient of a float attn_mask")
        dmask = torch.func.vjp(lambda m: attention_math(q, k, v, m, causal, scale,
                                                        enable_gqa), attn_mask)[1](do)[0]
    return grads + (dmask,) + (None,) * 5


register_autograd(attention, _attention_grad, _attention_setup)

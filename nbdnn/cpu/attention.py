"""Scaled dot-product attention, the reference for
nbdnn.scaled_dot_product_attention: torch.nn.functional.scaled_dot_product_attention's
meaning, plus the log-sum-exp a flash kernel keeps, variable lengths, and dropout from
nbdnn.dropout's Philox stream.

Shapes (layout "BHSD"; "BSHD" swaps the head and sequence axes of q, k, v, o, do):
    q (B, Hq, Sq, D), k (B, Hk, Sk, D), v (B, Hk, Sk, Dv), o (B, Hq, Sq, Dv)
    lse (B, Hq, Sq): float32 (float64 for float64 inputs)

    h' = h // (Hq / Hk)                          grouped-query heads (enable_gqa;
                                                 Hq == Hk otherwise)
    s[b, h, i, j] = cap(scale q[b, h, i] . k[b, h', j]) - slope[b, h] |i + d_b - j|
                    + bias[b, h, i, j]
        scale: 1 / sqrt(D) unless given; cap(x) = softcap tanh(x / softcap) where a
        softcap is given (logit softcapping), else x; slope: alibi_slopes (ALiBi) where
        given, else 0, about the alignment's diagonal d_b (below)
        bias: a float mask added, a boolean mask's False -> -inf (either broadcast
        to (B, Hq, Sq, Sk)); -inf where j > i + d_b (is_causal; the diagonal's
        offset d_b is 0 aligned top-left, PyTorch's torch.ones(Sq, Sk).tril(), and
        Lk_b - Lq_b aligned bottom-right, the rows being the sequence's last: Lq_b
        and Lk_b the batch entry's query and key lengths, seq_lens_q[b] and
        seq_lens_k[b] where given, else Sq and Sk); with a sliding window (left,
        right), -inf outside i + d - left <= j <= i + d + right (is_causal: right 0);
        -inf where j >= seq_lens_k[b] and on every row i >= seq_lens_q[b] (variable
        lengths in a padded batch)
    lse[b, h, i] = log sum_j exp s[b, h, i, j]
    p = exp(s - lse)                             each row's softmax
    p' = p keep / (1 - dropout_p)                keep: nbdnn.dropout's mask over the
                                                 B Hq Sq Sk elements of p in C order,
                                                 for (seed, offset)
    o = p' @ v[b, h']

A fully masked row (every s = -inf) gives o = 0 and lse = -inf (PyTorch's math
backend gives NaN): a padded query, or a causal row before the first key, is inert
in the output and in the backward.

16-bit inputs compute in float32 with p rounded to the input dtype before p' @ v (the
tensor cores' second operand); float32 follows the math mode in both products
(tf32 rounds q, k, p and v); float64 is exact.

Backward, given do (o's shape) and the forward's o and lse (FlashAttention-2's
recomputation: p from lse, no stored probabilities):
    dv[b, h'] = sum over the group's heads h of p'^T @ do
    dp = (do @ v^T) keep / (1 - dropout_p)
    delta_i = sum_d do[i, d] o[i, d]             (= sum_j p'_ij dp'_ij)
    ds = p (dp - delta) cap'(x)                 cap'(x) = 1 - tanh(x / softcap)^2 (1
                                                 without a cap), x the scaled product
    dq = scale ds @ k,   dk[b, h'] = scale sum over h of ds^T @ q
"""
import numpy as np

from . import dropout as _dropout
from .._vocab import ATTENTION_ALIGNMENTS
from ._common import compute_dtype
from .matmul import product, tf32

LAYOUTS = ("BHSD", "BSHD")


def _bhsd(t, layout):
    return np.swapaxes(t, 1, 2) if layout == "BSHD" else t


def _heads(t, Hq):
    """k or v (B, Hk, S, D) with each head repeated for its Hq / Hk query heads."""
    return np.repeat(t, Hq // t.shape[1], axis=1) if t.shape[1] != Hq else t


def _group_sum(g, Hk):
    """(B, Hq, S, D) summed over each kv head's query heads: (B, Hk, S, D)."""
    B, Hq, S, D = g.shape
    return g.reshape(B, Hk, Hq // Hk, S, D).sum(axis=2) if Hq != Hk else g


BOTTOM_RIGHT = ATTENTION_ALIGNMENTS.index("bottom_right") + 1  # (its causal code)


def diagonals(B, Sq, Sk, code, seq_lens_q, seq_lens_k):
    """(B, 1, 1, 1) int64: each batch entry's diagonal offset d_b for code 1 (top-left:
    0) or 2 (bottom-right: Lk_b - Lq_b)."""
    if code != BOTTOM_RIGHT:
        return np.zeros((B, 1, 1, 1), np.int64)
    lq = np.full(B, Sq) if seq_lens_q is None else np.asarray(seq_lens_q).reshape(B)
    lk = np.full(B, Sk) if seq_lens_k is None else np.asarray(seq_lens_k).reshape(B)
    return (lk.astype(np.int64) - lq.astype(np.int64)).reshape(B, 1, 1, 1)


def alibi(shape, ct, slopes, code, seq_lens_q, seq_lens_k):
    """-slope |i + d_b - j| over (B, Hq, Sq, Sk) in ct (0 without slopes; code: the
    diagonal's, diagonals')."""
    if slopes is None:
        return ct(0)
    B, Hq, Sq, Sk = shape
    d = diagonals(B, Sq, Sk, code, seq_lens_q, seq_lens_k)
    dist = np.abs(np.arange(Sq)[None, None, :, None] + d - np.arange(Sk)[None, None, None, :])
    sl = np.asarray(slopes).astype(ct).reshape((-1, Hq, 1, 1))
    return -sl * dist.astype(ct)


def pairs(shape, attn_mask, is_causal, seq_lens_q, seq_lens_k, window=None):
    """(B, Hq, Sq, Sk) bool: the (query, key) pairs that no boolean mask, causal band or
    length removes. is_causal: 0 or False none, 1 or True the diagonal top-left, 2
    bottom-right; the band about it: window (lo, hi), lo <= j - i - d <= hi (None: an
    open side), plain causal (None, 0). A removed pair's score is never formed and its
    products are skipped, as the kernels skip it: a NaN or Inf in a k, v, q or do row
    met only through removed pairs does not reach the outputs."""
    B, Hq, Sq, Sk = shape
    out = np.ones((1, 1, Sq, Sk), bool)
    if attn_mask is not None and np.asarray(attn_mask).dtype == np.bool_:
        out = out & np.asarray(attn_mask)
    if is_causal:
        d = diagonals(B, Sq, Sk, is_causal, seq_lens_q, seq_lens_k)
        off = np.arange(Sk)[None, None, None, :] - np.arange(Sq)[None, None, :, None] - d
        lo, hi = window if window is not None else (None, 0)
        if lo is not None:
            out = out & (off >= lo)
        if hi is not None:
            out = out & (off <= hi)
    if seq_lens_k is not None:
        keys = np.arange(Sk)[None, :] < np.asarray(seq_lens_k).reshape(B, 1)
        out = out & keys[:, None, None, :]
    if seq_lens_q is not None:
        rows = np.arange(Sq)[None, :] < np.asarray(seq_lens_q).reshape(B, 1)
        out = out & rows[:, None, :, None]
    return np.broadcast_to(out, shape)


def bias(shape, dtype, attn_mask, is_causal, seq_lens_q, seq_lens_k):
    """The additive bias (B, Hq, Sq, Sk) of the scores (module docstring), with
    -inf where the masks remove a score, in the compute dtype."""
    add = np.zeros(shape, dtype)
    if attn_mask is not None and np.asarray(attn_mask).dtype != np.bool_:
        add = add + np.asarray(attn_mask).astype(dtype)
    return np.where(pairs(shape, attn_mask, is_causal, seq_lens_q, seq_lens_k), add,
                    dtype(-np.inf))


def _scores(qc, kc, scale, live, add, math, softcap=0.0):
    """(s, t): cap(scale q k^T) + add on the live pairs, -inf on the removed ones, and t =
    tanh(scale q k^T / softcap) (None without a cap: cap is the identity)."""
    s = product(qc, np.swapaxes(kc, -1, -2), math) * scale
    t = None
    if softcap:
        cap = s.dtype.type(softcap)
        t = np.tanh(s / cap)
        s = cap * t
    with np.errstate(invalid="ignore"):
        return np.where(live, s + add, s.dtype.type(-np.inf)), t


def _mul(x, y, math):
    """x * y elementwise as product multiplies under float32's math mode."""
    if x.dtype != np.float32 or math == "ieee":
        return x * y
    xh, yh = tf32(x), tf32(y)
    if math == "tf32":
        return xh * yh
    return xh * yh + (xh * tf32(y - yh) + tf32(x - xh) * yh)


def _live_product(a, b, live, math):
    """a @ b summed over the live pairs only (a: (..., I, J), zero on removed pairs;
    live: a's shape): a removed pair takes no part even where b holds a NaN or an Inf
    (0 * inf would be NaN). The extra pass runs only for a non-finite b."""
    fin = np.isfinite(b)
    if fin.all():
        return product(a, b, math)
    out = product(a, np.where(fin, b, 0), math)
    with np.errstate(invalid="ignore", over="ignore"):
        odd = _mul(a[..., :, :, None], np.where(fin, 0, b)[..., None, :, :], math)
        return out + np.where(live[..., :, :, None] & ~fin[..., None, :, :], odd, 0).sum(-2)


def _keep(shape, dropout_p, seed, offset, ct):
    """keep / (1 - p) over (B, Hq, Sq, Sk), or None without dropout."""
    if dropout_p == 0:
        return None
    n = int(np.prod(shape))
    keep = _dropout.mask(n, dropout_p, seed, offset).reshape(shape)
    return np.where(keep != 0, ct(1) / ct(1 - dropout_p) if dropout_p < 1 else ct(0), ct(0))


def _forward(q, k, v, attn_mask, dropout_p, is_causal, scale, seed, offset, seq_lens_q,
             seq_lens_k, math, window=None, softcap=0.0, slopes=None, alibi_code=0):
    """(o, lse, p, keep, parts) in the compute dtype, q, k, v in BHSD."""
    ct = compute_dtype(q.dtype)
    B, Hq, Sq, D = q.shape
    Sk = k.shape[2]
    scale = ct(1 / np.sqrt(D) if scale is None else scale)
    qc, kc, vc = (t.astype(ct) for t in (q, _heads(k, Hq), _heads(v, Hq)))
    live = pairs((B, Hq, Sq, Sk), attn_mask, is_causal, seq_lens_q, seq_lens_k, window)
    add = bias((B, Hq, Sq, Sk), ct, attn_mask, False, None, None) + \
        alibi((B, Hq, Sq, Sk), ct, slopes, alibi_code, seq_lens_q, seq_lens_k)
    s, _ = _scores(qc, kc, scale, live, add, math, softcap)
    top = np.max(s, axis=-1, keepdims=True) if Sk else np.full(s.shape[:-1] + (1,), -np.inf, ct)
    rows = top != -np.inf  # rows with a score left (NaN scores: a NaN row)
    top = np.where(rows, top, ct(0))
    with np.errstate(invalid="ignore"):
        e = np.where(live, np.exp(s - top), ct(0))
    total = e.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = np.where(rows, top + np.log(total), ct(-np.inf))
        p = np.where(rows, e / np.where(rows, total, ct(1)), ct(0))
    keep = _keep(p.shape, dropout_p, seed, offset, ct)
    pd = p if keep is None else p * keep
    if q.dtype != ct:  # 16-bit: p as the second product's operand
        pd = pd.astype(q.dtype).astype(ct)
    o = _live_product(pd, vc, live & rows, math)
    return o, lse[..., 0], p, keep, (qc, kc, vc, scale)


def scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale,
                                 enable_gqa, seed, offset, layout, seq_lens_q, seq_lens_k,
                                 math="ieee", window=None, softcap=0.0, alibi_slopes=None,
                                 alibi_code=0, *, out=None, stream=None):
    """(o, lse) (module docstring); q, k, v validated by the front end."""
    qb, kb, vb = (_bhsd(t, layout) for t in (q, k, v))
    o, lse, *_ = _forward(qb, kb, vb, attn_mask, dropout_p, is_causal, scale, seed,
                          offset, seq_lens_q, seq_lens_k, math, window, softcap,
                          alibi_slopes, alibi_code)
    o = np.ascontiguousarray(_bhsd(o, layout)).astype(q.dtype)
    if out is not None:
        out[...] = o
        o = out
    lse_dtype = np.float64 if q.dtype == np.float64 else np.float32
    return o, lse.astype(lse_dtype)


def gather_pages(cache, table, length):
    """The first `length` keys of one sequence from a paged cache (pages, P, H, D)
    through its block-table row: (H, length, D)."""
    P = cache.shape[1]
    used = np.asarray(table)[:-(-length // P)].astype(np.int64)
    rows = cache[used].reshape((-1,) + cache.shape[2:])[:length]
    return np.swapaxes(rows, 0, 1)


def paged_attention(q, k_cache, v_cache, block_table, seq_lens_k, is_causal, scale, layout,
                    window=None, softcap=0.0, *, out=None, stream=None):
    """(o, lse) of attention against a paged key / value cache: batch entry b's keys
    0 .. L_b - 1 (L_b = seq_lens_k[b]) gathered through its block-table row (key j:
    page block_table[b, j // P], row j % P of k_cache (pages, P, Hk, D) and v_cache),
    then scaled_dot_product_attention's meaning with grouped-query heads; is_causal
    aligns the Sq query rows bottom-right (they are the sequence's last Sq: row i
    attends keys j <= L_b - Sq + i), a window (lo, hi) about that diagonal (pairs'
    band) and the logit cap. The front end checked that every page a key lives in is in
    the cache."""
    qb = _bhsd(q, layout)
    B, Hq, Sq, D = qb.shape
    Dv = v_cache.shape[3]
    ct = compute_dtype(q.dtype)
    o = np.zeros((B, Hq, Sq, Dv), ct)
    lse = np.full((B, Hq, Sq), -np.inf, ct)
    for b in range(B):
        L = int(seq_lens_k[b])
        k, v = (gather_pages(c, block_table[b], L)[None] for c in (k_cache, v_cache))
        ob, lb, *_ = _forward(qb[b:b + 1], k, v, None, 0.0, BOTTOM_RIGHT if is_causal else 0,
                              scale, 0, 0, None, None, "ieee", window, softcap)
        o[b], lse[b] = ob[0], lb[0]
    o = np.ascontiguousarray(_bhsd(o, layout)).astype(q.dtype)
    if out is not None:
        out[...] = o
        o = out
    return o, lse.astype(np.float64 if q.dtype == np.float64 else np.float32)


def scaled_dot_product_attention_backward(do, q, k, v, o, lse, attn_mask, dropout_p,
                                          is_causal, scale, enable_gqa, seed, offset,
                                          layout, seq_lens_q, seq_lens_k, math="ieee",
                                          window=None, softcap=0.0, alibi_slopes=None,
                                          alibi_code=0, *, out=None, stream=None):
    """(dq, dk, dv) (module docstring) from the forward's o and lse: p recomputed from
    lse, as the flash kernels do."""
    qb, kb, vb, ob, dob = (_bhsd(t, layout) for t in (q, k, v, o, do))
    ct = compute_dtype(q.dtype)
    B, Hq, Sq, D = qb.shape
    Hk, Sk = kb.shape[1], kb.shape[2]
    sc = ct(1 / np.sqrt(D) if scale is None else scale)
    qc, kc, vc = (t.astype(ct) for t in (qb, _heads(kb, Hq), _heads(vb, Hq)))
    lse_c = np.asarray(lse).astype(ct)[..., None]
    rows = lse_c > -np.inf  # (NaN: no live row either; the kernels skip it too)
    live = pairs((B, Hq, Sq, Sk), attn_mask, is_causal, seq_lens_q, seq_lens_k,
                 window) & rows
    add = bias((B, Hq, Sq, Sk), ct, attn_mask, False, None, None) + \
        alibi((B, Hq, Sq, Sk), ct, alibi_slopes, alibi_code, seq_lens_q, seq_lens_k)
    s, t = _scores(qc, kc, sc, live, add, math, softcap)
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.where(live, np.exp(s - np.where(rows, lse_c, ct(0))), ct(0))
    keep = _keep(p.shape, dropout_p, seed, offset, ct)
    pd = p if keep is None else p * keep
    doc, oc = dob.astype(ct), ob.astype(ct)
    if q.dtype != ct:
        pd = pd.astype(q.dtype).astype(ct)
    live_t = np.swapaxes(live, -1, -2)
    dv = _group_sum(_live_product(np.swapaxes(pd, -1, -2), doc, live_t, math), Hk)
    dp = product(doc, np.swapaxes(vc, -1, -2), math)
    if keep is not None:
        dp = dp * keep
    delta = np.sum(doc * oc, axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        ds = np.where(live, p * (dp - delta) * (1 if t is None else 1 - t * t), ct(0))
    dq = _live_product(ds, kc, live, math) * sc
    dk = _group_sum(_live_product(np.swapaxes(ds, -1, -2), qc, live_t, math) * sc, Hk)
    grads = tuple(np.ascontiguousarray(_bhsd(g, layout)).astype(t.dtype)
                  for g, t in ((dq, q), (dk, k), (dv, v)))
    if out is None:
        return grads
    for buf, g in zip(out, grads):
        buf[...] = g
    return tuple(out)

"""scaled_dot_product_attention / scaled_dot_product_attention_backward:
torch.nn.functional.scaled_dot_product_attention's meaning (cuDNN's SDPA graphs), plus
the log-sum-exp a flash kernel keeps, variable lengths without a mask, and dropout
from nbdnn.dropout's Philox stream; paged_attention: decoding against a paged key /
value cache (a block table a sequence). The formulas are in nbdnn/cpu/attention.py.

Where nbdnn differs from PyTorch, it says so: a fully masked query row gives o = 0 and
lse = -inf (PyTorch's math backend gives NaN); an attn_mask together with is_causal
applies both (PyTorch refuses the pair); dropout_p must be below 1.

Masked pairs take no part: a NaN or Inf met only through a removed pair stays out. On
the GPU the fast paths keep that for q and k in the forward, whose scores they mask,
but not for v: a removed pair's probability is an exact 0 in the product P V, and
0 x NaN is NaN, so a NaN or Inf in a v row reaches the query rows whose key tile holds
it (as in FlashAttention, cuDNN and PyTorch's math backend). They are the tensor-core
kernels (16-bit, head dims 64 and 128: nbdnn/cuda/attention/flash.py; float32 forward in
"tf32" / "3xtf32": flash_tf32.py) and, for calls without seq_lens of at least 64 x 64
scores a head, the GEMM path (float32; 16-bit with a mask, dropout or other head dims:
gemm.py, whose backward also lets a NaN in a k, q or do row of removed pairs through).
Keep padding rows finite (the GEMM path leaves calls with seq_lens to the exact
kernels); the CPU reference skips removed pairs."""
import numpy as np

from .._vocab import ATTENTION_ALIGNMENTS as ALIGNMENTS, BF16_DTYPES
from ..errors import BadParamError, DtypeError, NotSupportedError, ShapeError, fail
from .registry import op
from ._common import Call, choice, flag, is_int, out_tuple, required, same_dtype, scalar
from .dropout import uint64_arg
from .._math_mode import resolve as _math

LAYOUTS = ("BHSD", "BSHD")
MAX_HEAD_DIM = 256  # (the kernels' register and shared-memory tiles)
_INTS = ("int32", "int64")


def _bhsd(op, name, shape, layout):
    """(B, H, S, D) of a 4-d q, k, v, o or do in `layout`."""
    if len(shape) != 4:
        fail(ShapeError, op, f"{name}.ndim", f"4 ({layout}: batch, "
             f"{'heads, sequence' if layout == 'BHSD' else 'sequence, heads'}, head dim)",
             len(shape))
    B, a, b, D = (int(s) for s in shape)
    return (B, a, b, D) if layout == "BHSD" else (B, b, a, D)


def _dims(op, c, q, k, v, layout, enable_gqa):
    """(B, Hq, Hk, Sq, Sk, D, Dv, dtype) of checked q, k, v."""
    choice(op, "layout", layout, LAYOUTS)
    (qs, dtype), (ks, kd), (vs, vd) = (c.array(n, t, BF16_DTYPES)
                                       for n, t in (("q", q), ("k", k), ("v", v)))
    same_dtype(op, ["q", "k", "v"], [dtype, kd, vd])
    (B, Hq, Sq, D), (Bk, Hk, Sk, Dk), (Bv, Hv, Sv, Dv) = (
        _bhsd(op, n, s, layout) for n, s in (("q", qs), ("k", ks), ("v", vs)))
    if Dk != D:
        fail(ShapeError, op, "k.shape", f"q's head dim {D} as its last axis", tuple(ks))
    if (Bk, Bv) != (B, B):
        fail(ShapeError, op, "k, v batch", f"q's batch {B}", (Bk, Bv))
    if (Hv, Sv) != (Hk, Sk):
        fail(ShapeError, op, "v.shape", f"k's heads {Hk} and sequence {Sk}", tuple(vs))
    gqa = flag(op, "enable_gqa", enable_gqa)
    if Hk == 0 or (Hq != Hk and not (gqa and Hq % Hk == 0)):
        fail(ShapeError, op, "k heads", f"q's {Hq} heads" + (
            " or a divisor of them (grouped-query attention)" if gqa else
            " (enable_gqa=True for grouped-query attention: a divisor of them)"), Hk)
    _head_dims(op, (("q", D), ("v", Dv)))
    return B, Hq, Hk, Sq, Sk, D, Dv, dtype


def _head_dims(op, dims):
    """(name, head dim) pairs within the kernels' 1 .. MAX_HEAD_DIM."""
    for name, d in dims:
        if not 1 <= d <= MAX_HEAD_DIM:
            fail(NotSupportedError, op, f"{name} head dim", f"1 to {MAX_HEAD_DIM}", d)


def _scale(op, scale, dtype):
    """A given scale, finite in the compute dtype; None stays None."""
    if scale is None:
        return None
    scale = scalar(op, "scale", scale)
    if str(dtype) != "float64" and not abs(scale) <= _FLOAT32_MAX:  # (computed in float32)
        fail(BadParamError, op, "scale", "finite in float32, the compute dtype of "
             f"{dtype} (|scale| <= {_FLOAT32_MAX:.4g})", scale)
    return scale


def _softcap(op, softcap, dtype):
    """A logit cap: None (0.0 to the backends: none) or a positive number, finite in the
    compute dtype."""
    if softcap is None:
        return 0.0
    cap = scalar(op, "softcap", softcap, low=0.0, low_open=True)
    if str(dtype) != "float64" and not cap <= _FLOAT32_MAX:
        fail(BadParamError, op, "softcap", f"finite in float32 (<= {_FLOAT32_MAX:.4g})", cap)
    return cap


def _mask(op, c, attn_mask, dtype, B, Hq, Sq, Sk):
    """A boolean mask (True: attend) or an additive one of q's dtype, broadcastable
    to (B, Hq, Sq, Sk)."""
    if attn_mask is None:
        return
    ms, md = c.array("attn_mask", attn_mask, dtypes=None)
    if md != np.bool_ and md != dtype:
        fail(DtypeError, op, "attn_mask.dtype", f"bool or q's dtype {np.dtype(dtype).name}",
             md.name)
    ms = tuple(int(s) for s in ms)
    full = (B, Hq, Sq, Sk)
    if len(ms) > 4 or any(m not in (1, f) for m, f in zip(ms[::-1], full[::-1])):
        fail(ShapeError, op, "attn_mask.shape", f"broadcastable to (B, Hq, Sq, Sk) = {full}",
             ms)


def _lengths(op, c, name, lens, B, S):
    """seq_lens_q / seq_lens_k: (B,) ints, each a batch entry's length in [0, S]
    (values checked on the CPU; the CUDA kernels clamp them to [0, S])."""
    if lens is None:
        return
    shape, dtype = c.array(name, lens, dtypes=None)
    if dtype.name not in _INTS:
        fail(DtypeError, op, f"{name}.dtype", "int32 or int64", dtype.name)
    if tuple(shape) != (B,):
        fail(ShapeError, op, f"{name}.shape", f"(B,) = ({B},): one length a batch entry",
             tuple(shape))
    if isinstance(lens, np.ndarray) and B and not (0 <= lens.min() and lens.max() <= S):
        fail(BadParamError, op, name, f"lengths in [0, {S}]",
             f"[{lens.min()}, {lens.max()}]")


def _slopes(op, c, alibi_slopes, B, Hq):
    """alibi_slopes: None, or float32 (Hq,) or (B, Hq): a head's (a batch entry's head's)
    slope."""
    if alibi_slopes is None:
        return
    shape, dtype = c.array("alibi_slopes", alibi_slopes, dtypes=None)
    if dtype.name != "float32":
        fail(DtypeError, op, "alibi_slopes.dtype", "float32", dtype.name)
    if tuple(shape) not in ((Hq,), (B, Hq)):
        fail(ShapeError, op, "alibi_slopes.shape", f"(Hq,) = ({Hq},) or (B, Hq) = "
             f"({B}, {Hq})", tuple(shape))
    if isinstance(alibi_slopes, np.ndarray) and not np.isfinite(alibi_slopes).all():
        fail(BadParamError, op, "alibi_slopes", "finite", "a non-finite slope")


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _window(op, window):
    """window: None or (left, right), each None (open) or an int >= 0."""
    if window is None:
        return None
    if not isinstance(window, (tuple, list)) or len(window) != 2 or any(
            w is not None and (not is_int(w) or w < 0) for w in window):
        fail(BadParamError, op, "window", "None or (left, right), each None or an int >= 0",
             window)
    return tuple(None if w is None else int(w) for w in window)


def _band(op, is_causal, alignment, window):
    """(the backends' causal code, their window): code 0 without a band, else the
    alignment's position + 1 (1 top-left, 2 bottom-right); window (lo, hi) about the
    diagonal, lo <= j - i - d <= hi, None on an open side, or None for plain causal
    (None, 0)."""
    causal = flag(op, "is_causal", is_causal)
    choice(op, "alignment", alignment, ALIGNMENTS)
    window = _window(op, window)
    if window is None and not causal:
        return 0, None
    left, right = window if window is not None else (None, None)
    if causal:
        right = 0 if right is None else min(right, 0)
    if left is None and right is None:  # (an open window: no band)
        return 0, None
    code = ALIGNMENTS.index(alignment) + 1
    band = (None if left is None else -left, right)
    return code, None if band == (None, 0) else band


def _keywords(op, c, dims, attn_mask, dropout_p, is_causal, alignment, window, scale, seed,
              offset, seq_lens_q, seq_lens_k, softcap, alibi_slopes):
    """The checked keywords shared by forward and backward (is_causal and window as
    _band's, softcap as _softcap's); the last: the ALiBi diagonal's code (0 without
    slopes, else the alignment's: 1 top-left, 2 bottom-right)."""
    B, Hq, Hk, Sq, Sk, D, Dv, dtype = dims
    _mask(op, c, attn_mask, dtype, B, Hq, Sq, Sk)
    _slopes(op, c, alibi_slopes, B, Hq)
    p = scalar(op, "dropout_p", dropout_p, low=0.0, high=1.0)
    if p >= 1:
        fail(BadParamError, op, "dropout_p", "in [0, 1)", p)
    scale = _scale(op, scale, dtype)
    _lengths(op, c, "seq_lens_q", seq_lens_q, B, Sq)
    _lengths(op, c, "seq_lens_k", seq_lens_k, B, Sk)
    band = _band(op, is_causal, alignment, window)  # (checks alignment)
    return p, band, scale, uint64_arg(op, "seed", seed), uint64_arg(op, "offset", offset), \
        _softcap(op, softcap, dtype), \
        0 if alibi_slopes is None else ALIGNMENTS.index(alignment) + 1


@op("attention", backward="scaled_dot_product_attention_backward")
def scaled_dot_product_attention(q, k, v, *, attn_mask=None, dropout_p=0.0, is_causal=False,
                                 scale=None, enable_gqa=False, seed=0, offset=0,
                                 layout="BHSD", seq_lens_q=None, seq_lens_k=None, math=None,
                                 alignment="top_left", window=None, softcap=None,
                                 alibi_slopes=None, out=None, backend=None, stream=None):
    """(o, lse): o = softmax(scale q k^T + mask) v per head, lse the float32 (float64
    for float64) log-sum-exp of each query row's scaled, masked scores.

    q (B, Hq, Sq, D), k (B, Hk, Sk, D), v (B, Hk, Sk, Dv) in layout "BHSD" ("BSHD":
    the sequence before the heads); o (B, Hq, Sq, Dv) in q's layout, lse (B, Hq, Sq).
    scale: 1 / sqrt(D) unless given. attn_mask: bool (True attends) or additive of q's
    dtype, broadcastable to (B, Hq, Sq, Sk) whatever the layout. is_causal: key j > query
    i + d masked, the diagonal's offset d by alignment: "top_left" (PyTorch's is_causal)
    0, "bottom_right" Lk - Lq (the rows are the sequence's last, as after a cached
    prefix; Lq, Lk: the entry's seq_lens_q / seq_lens_k where given, else Sq, Sk; rows
    with no key left give o = 0, lse = -inf). window: a sliding window (left, right),
    each None (open) or an int >= 0: query i attends keys i + d - left .. i + d + right
    (FlashAttention's window_size, None for its -1; is_causal caps right at 0). softcap:
    the scaled scores capped as softcap tanh(s / softcap) before the mask (Gemma 2's and
    FlashAttention's logit softcapping; None: none). alibi_slopes: float32 (Hq,) or
    (B, Hq): ALiBi, each score takes -slope |i + d - j| after the cap (d: the alignment's
    diagonal offset, as for is_causal, causal or not; FlashAttention's alibi_slopes,
    whose diagonal is bottom-right). enable_gqa:
    Hk may divide Hq (each k/v head
    serves Hq / Hk query heads). dropout_p in [0, 1): the probabilities dropped by
    nbdnn.dropout's mask over the (B, Hq, Sq, Sk) scores in C order for (seed, offset),
    the kept ones scaled by 1 / (1 - p). seq_lens_q / seq_lens_k: (B,) int lengths of a
    padded batch (keys past a length are masked, query rows past one give zeros).
    float16, bfloat16 (float32 inside, p rounded to the dtype before p v), float32
    (math: "ieee", "tf32", "3xtf32"), float64. A fully masked row: o = 0, lse = -inf."""
    op = "scaled_dot_product_attention"
    c = Call(op, backend, stream, q=q, k=k, v=v, attn_mask=attn_mask,
             seq_lens_q=seq_lens_q, seq_lens_k=seq_lens_k, alibi_slopes=alibi_slopes, out=out)
    dims = _dims(op, c, q, k, v, layout, enable_gqa)
    B, Hq, Hk, Sq, Sk, D, Dv, dtype = dims
    p, (causal, band), scale, seed, offset, cap, alibi = _keywords(
        op, c, dims, attn_mask, dropout_p, is_causal, alignment, window, scale, seed, offset,
        seq_lens_q, seq_lens_k, softcap, alibi_slopes)
    math = _math(op, math)
    o_shape = (B, Hq, Sq, Dv) if layout == "BHSD" else (B, Sq, Hq, Dv)
    out = c.out(out, o_shape, dtype)
    return c.run("scaled_dot_product_attention", q, k, v, attn_mask, p, causal, scale,
                 enable_gqa, seed, offset, layout, seq_lens_q, seq_lens_k, math, band, cap,
                 alibi_slopes, alibi, out=out)


@op("attention")
def scaled_dot_product_attention_backward(do, q, k, v, o, lse, *, attn_mask=None,
                                          dropout_p=0.0, is_causal=False, scale=None,
                                          enable_gqa=False, seed=0, offset=0, layout="BHSD",
                                          seq_lens_q=None, seq_lens_k=None, math=None,
                                          alignment="top_left", window=None, softcap=None,
                                          alibi_slopes=None, out=None, backend=None,
                                          stream=None):
    """(dq, dk, dv) of scaled_dot_product_attention given do = dL/do and the forward's
    o and lse (the probabilities are recomputed from lse, FlashAttention-2's way), with
    the forward's keywords. out: a tuple of the three gradients' buffers."""
    op = "scaled_dot_product_attention_backward"
    outs = out_tuple(op, out, ("dq", "dk", "dv"))
    c = Call(op, backend, stream, do=do, q=q, k=k, v=v, o=o, lse=lse,
             attn_mask=attn_mask, seq_lens_q=seq_lens_q, seq_lens_k=seq_lens_k,
             alibi_slopes=alibi_slopes,
             **{f"out[{i}]": t for i, t in enumerate(outs)})
    dims = _dims(op, c, q, k, v, layout, enable_gqa)
    B, Hq, Hk, Sq, Sk, D, Dv, dtype = dims
    o_shape = (B, Hq, Sq, Dv) if layout == "BHSD" else (B, Sq, Hq, Dv)
    for name, t in (("do", do), ("o", o)):
        shape, dt = c.array(name, t, BF16_DTYPES)
        same_dtype(op, ["q", name], [dtype, dt])
        if tuple(shape) != o_shape:
            fail(ShapeError, op, f"{name}.shape", f"o's shape {o_shape}", tuple(shape))
    lshape, ldt = c.array("lse", lse, ("float64",) if dtype == np.float64 else ("float32",))
    if tuple(lshape) != (B, Hq, Sq):
        fail(ShapeError, op, "lse.shape", f"(B, Hq, Sq) = {(B, Hq, Sq)}", tuple(lshape))
    p, (causal, band), scale, seed, offset, cap, alibi = _keywords(
        op, c, dims, attn_mask, dropout_p, is_causal, alignment, window, scale, seed, offset,
        seq_lens_q, seq_lens_k, softcap, alibi_slopes)
    math = _math(op, math)
    if out is not None:
        outs = tuple(c.out(t, tuple(int(s) for s in ref.shape), dtype, f"out[{i}]")
                     for i, (t, ref) in enumerate(zip(outs, (q, k, v))))
    return c.run("scaled_dot_product_attention_backward", do, q, k, v, o, lse, attn_mask, p,
                 causal, scale, enable_gqa, seed, offset, layout, seq_lens_q, seq_lens_k,
                 math, band, cap, alibi_slopes, alibi, out=outs or None)


def _pages(op, c, q, k_cache, v_cache, block_table, seq_lens_k, layout):
    """(B, Hq, Hk, Sq, D, Dv, dtype, P, W) of a checked paged call; on the CPU, every
    page a key lives in is checked to be in the cache."""
    choice(op, "layout", layout, LAYOUTS)
    (qs, dtype), (ks, kd), (vs, vd) = (c.array(n, t, BF16_DTYPES) for n, t in (
        ("q", q), ("k_cache", k_cache), ("v_cache", v_cache)))
    same_dtype(op, ["q", "k_cache", "v_cache"], [dtype, kd, vd])
    B, Hq, Sq, D = _bhsd(op, "q", qs, layout)
    for name, shape in (("k_cache", ks), ("v_cache", vs)):
        if len(shape) != 4:
            fail(ShapeError, op, f"{name}.ndim", "4 (pages, page size, kv heads, head dim)",
                 len(shape))
    pages, P, Hk, Dk = (int(s) for s in ks)
    if Dk != D:
        fail(ShapeError, op, "k_cache.shape", f"q's head dim {D} as its last axis", tuple(ks))
    if tuple(int(s) for s in vs[:3]) != (pages, P, Hk):
        fail(ShapeError, op, "v_cache.shape", f"k_cache's (pages, page size, kv heads) = "
             f"{(pages, P, Hk)} first", tuple(vs))
    Dv = int(vs[3])
    if pages == 0 or P == 0:
        fail(ShapeError, op, "k_cache.shape", "at least one page of at least one row",
             tuple(ks))
    if Hk == 0 or Hq % Hk:
        fail(ShapeError, op, "k_cache heads", f"a divisor of q's {Hq} heads (grouped-query "
             "attention)", Hk)
    _head_dims(op, (("q", D), ("v_cache", Dv)))
    ts, tdt = c.array("block_table", block_table, dtypes=None)
    if tdt.name not in _INTS:
        fail(DtypeError, op, "block_table.dtype", "int32 or int64", tdt.name)
    if len(ts) != 2 or int(ts[0]) != B or int(ts[1]) == 0:
        fail(ShapeError, op, "block_table.shape", f"(B, W) = ({B}, W >= 1): a row of page "
             "numbers a batch entry", tuple(ts))
    W = int(ts[1])
    required(op, seq_lens_k=seq_lens_k)
    _lengths(op, c, "seq_lens_k", seq_lens_k, B, W * P)
    if isinstance(block_table, np.ndarray) and isinstance(seq_lens_k, np.ndarray):
        used = np.arange(W)[None, :] < -(-seq_lens_k.reshape(B, 1) // P)
        bad = used & ((block_table < 0) | (block_table >= pages))
        if bad.any():
            b, w = (int(i) for i in np.argwhere(bad)[0])
            fail(BadParamError, op, "block_table", f"page numbers in [0, {pages}) where a "
                 f"sequence's keys live", f"block_table[{b}, {w}] = {block_table[b, w]}")
    return B, Hq, Hk, Sq, D, Dv, dtype, P, W


@op("attention")
def paged_attention(q, k_cache, v_cache, block_table, seq_lens_k, *, is_causal=False,
                    scale=None, layout="BSHD", window=None, softcap=None, out=None,
                    backend=None, stream=None):
    """(o, lse): attention of q against key and value caches held in pages (vLLM's and
    FlashAttention's paged KV cache), decoding's shape: a few query rows a sequence.

    q (B, Sq, Hq, D) in layout "BSHD" (the default here; "BHSD": (B, Hq, Sq, D)).
    k_cache (pages, P, Hk, D), v_cache (pages, P, Hk, Dv): page p holds P consecutive
    keys of every kv head. block_table (B, W) int32 / int64: batch entry b's key j lives
    in page block_table[b, j // P], row j % P. seq_lens_k (B,) int: b's keys are
    0 .. L_b - 1, L_b <= W P; entries of a row past its ceil(L_b / P) pages are never
    read (any value), the others must name pages of the cache: the CPU backend raises
    BadParamError otherwise, the GPU kernels, which read the table and the lengths on
    the device only (one call captured in a CUDA graph serves every length), take the
    keys of such a page as absent and read none of it. Hk divides Hq (grouped-query
    heads). is_causal: the Sq rows are the sequence's last (bottom-right: row i attends
    keys j <= L_b - Sq + i; several tokens decoded at once). window: a sliding window
    (left, right) about that diagonal, each None (open) or an int >= 0 (row i attends
    keys L_b - Sq + i - left .. L_b - Sq + i + right; is_causal caps right at 0).
    softcap: scaled scores capped as softcap tanh(s / softcap) (None: none). scale:
    1 / sqrt(D) unless given. o in q's layout, lse (B, Hq, Sq) float32 (float64
    for float64). A row without keys: o = 0, lse = -inf. float16, bfloat16 (float32
    inside), float32, float64. Forward only (inference: no backward)."""
    op = "paged_attention"
    c = Call(op, backend, stream, q=q, k_cache=k_cache, v_cache=v_cache,
             block_table=block_table, seq_lens_k=seq_lens_k, out=out)
    B, Hq, Hk, Sq, D, Dv, dtype, P, W = _pages(op, c, q, k_cache, v_cache, block_table,
                                               seq_lens_k, layout)
    causal, band = _band(op, is_causal, "bottom_right", window)
    scale = _scale(op, scale, dtype)
    scale = 1 / np.sqrt(D) if scale is None else scale
    cap = _softcap(op, softcap, dtype)
    o_shape = (B, Hq, Sq, Dv) if layout == "BHSD" else (B, Sq, Hq, Dv)
    out = c.out(out, o_shape, dtype)
    return c.run("paged_attention", q, k_cache, v_cache, block_table, seq_lens_k, causal,
                 float(scale), layout, band, cap, out=out)

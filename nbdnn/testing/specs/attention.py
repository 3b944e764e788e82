"""OpSpec rows for scaled_dot_product_attention and its backward (imported by
nbdnn.testing; its hypothesis rows).

A call draws both layouts, grouped-query heads (Hq a multiple of Hk), head dims that
differ for v, sequences of 1 up (query and key lengths apart), a mask (none, boolean
or additive, of every broadcast rank; a boolean mask can leave a row fully masked: o
= 0, lse = -inf), causal (top-left or bottom-right), sliding windows, logit caps
(softcap), dropout (the
Philox stream of nbdnn.dropout, any seed and offset), variable lengths (int32 or int64,
zero included), a given scale, and float32's math modes. The backward takes the float64
reference's o and lse, rounded as a forward would store them.

paged_attention's row draws page sizes of 1 up, block tables of a shuffled page order
with unused entries of -1, lengths of 0 up to the table's capacity (int32 or int64),
grouped-query heads, bottom-right causal rows, sliding windows, both layouts and a given
scale; its decode boundary is a 1100-key sequence in pages of 16.
"""
import math

import numpy as np

import nbdnn
from nbdnn._vocab import BF16_DTYPES, MATH_MODES
from nbdnn.cpu.matmul import tf32
from nbdnn.testing.harness import EPS, Case, OpSpec, rand


def attention_tol(dtype, length, mode="ieee"):
    """(atol, rtol) for sums of `length` products of probabilities and values in
    [-1, 1], accumulated in float32 (float64 for float64), p rounded to the storage
    dtype (TF32 under "tf32") before its product, the result rounded once."""
    acc = EPS["float64" if dtype == "float64" else "float32"]
    eps = 2.0 ** -11 if mode == "tf32" else EPS[dtype]
    return (8 * acc * length + 8 * eps * math.sqrt(length),
            8 * eps + 8 * acc * math.sqrt(length))


def _dims(draw, big):
    B, Hk, G = draw(1, 3 if big else 2), draw(1, 3 if big else 2), draw(1, 3 if big else 2)
    hi = 80 if big else 6
    Sq, Sk = draw(1, hi), draw(1, hi + 2)
    D = (16, 64, 128, 256, draw(1, 40))[draw(0, 4)] if big else draw(1, 9)
    Dv = D if draw(0, 1) else (draw(1, 70) if big else draw(1, 9))
    return B, Hk * G, Hk, Sq, Sk, D, Dv


def _mask(draw, rng, dtype, B, Hq, Sq, Sk):
    kind = draw(0, 3)
    if kind < 2:
        return None
    full = (B, Hq, Sq, Sk)
    rank = draw(1, 4)
    shape = tuple(n if draw(0, 2) else 1 for n in full[4 - rank:])
    if kind == 2:
        return rng.random(shape) > 0.25
    return rand(rng, shape, dtype, -2, 2)


def _lens(draw, rng, B, S):
    if draw(0, 2):
        return None
    return rng.integers(0, S + 1, B).astype(np.int32 if draw(0, 1) else np.int64)


def _call(draw, dtype, big):
    """(q, k, v), keywords, tolerance."""
    rng = np.random.default_rng(draw(0, 2 ** 31))
    B, Hq, Hk, Sq, Sk, D, Dv = _dims(draw, big)
    layout = ("BHSD", "BSHD")[draw(0, 1)]

    def t(H, S, d):
        return rand(rng, (B, H, S, d) if layout == "BHSD" else (B, S, H, d), dtype, -1, 1)
    q, k, v = t(Hq, Sq, D), t(Hk, Sk, D), t(Hk, Sk, Dv)
    mode = MATH_MODES[draw(0, len(MATH_MODES) - 1)] if dtype == "float32" else "ieee"
    if mode == "tf32":  # (the float64 oracle has no mode: TF32-exact q and k)
        q, k = tf32(q), tf32(k)
    kw = {"layout": layout, "enable_gqa": Hq != Hk, "attn_mask": _mask(
        draw, rng, dtype, B, Hq, Sq, Sk), "is_causal": draw(0, 2) == 0, "math": mode,
        "seq_lens_q": _lens(draw, rng, B, Sq), "seq_lens_k": _lens(draw, rng, B, Sk)}
    if kw["is_causal"] and draw(0, 1):  # (the diagonal at each entry's Lk - Lq)
        kw["alignment"] = "bottom_right"
    if draw(0, 3) == 0:  # a sliding window: one side open, or both sides set
        kw["window"] = ((None, draw(0, 3)), (draw(0, 3), None), (draw(0, 3), draw(0, 3)))[
            draw(0, 2)]
    if draw(0, 4) == 0:  # a cap that bites (scores reach ~D scale), or a loose one
        kw["softcap"] = (0.5, 2.0, 30.0)[draw(0, 2)]
    if draw(0, 2) == 0:
        kw.update(dropout_p=(0.1, 0.5, 0.9)[draw(0, 2)], seed=draw(0, 2 ** 31) << draw(0, 32),
                  offset=draw(0, 2 ** 31))
    if draw(0, 3) == 0:
        kw["scale"] = (0.05, 0.3, 1.0)[draw(0, 2)]
    return (q, k, v), kw, attention_tol(dtype, Sk * Hq // Hk + Sq + D + Dv, mode)


ARRAY_KEYWORDS = ("attn_mask", "seq_lens_q", "seq_lens_k")


def _positional(kw):
    """The keywords' arrays, to pass positionally (the harness moves positional arrays
    to the device and the float ones to float64 for the reference), and the rest."""
    return tuple(kw.get(n) for n in ARRAY_KEYWORDS), \
        {n: a for n, a in kw.items() if n not in ARRAY_KEYWORDS}


def _forward(q, k, v, attn_mask, seq_lens_q, seq_lens_k, **kw):
    return nbdnn.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                              seq_lens_q=seq_lens_q, seq_lens_k=seq_lens_k,
                                              **kw)


def _backward(do, q, k, v, o, lse, attn_mask, seq_lens_q, seq_lens_k, **kw):
    return nbdnn.scaled_dot_product_attention_backward(
        do, q, k, v, o, lse, attn_mask=attn_mask, seq_lens_q=seq_lens_q,
        seq_lens_k=seq_lens_k, **kw)


def _make_forward(draw, dtype, big):
    arrays, kw, tol = _call(draw, dtype, big)
    extra, kw = _positional(kw)
    return Case(arrays + extra, kw, tol=tol)


def _make_backward(draw, dtype, big):
    (q, k, v), kw, tol = _call(draw, dtype, big)
    rng = np.random.default_rng(draw(0, 2 ** 31))
    m = kw["attn_mask"]  # (the float64 reference takes an additive mask in float64)
    ref = dict(kw, attn_mask=m if m is None or m.dtype == np.bool_ else m.astype(np.float64))
    o, lse = nbdnn.scaled_dot_product_attention(*(a.astype(np.float64) for a in (q, k, v)),
                                                backend="cpu", **ref)
    do = rand(rng, o.shape, dtype, -1, 1)
    lse = lse.astype(np.float64 if dtype == "float64" else np.float32)
    extra, kw = _positional(kw)
    # (dk, dv sum over every query of the group: a longer reduction)
    return Case((do, q, k, v, o.astype(dtype), lse) + extra, kw,
                tol=(4 * tol[0], 4 * tol[1]))


def _edge(backward, **over):
    def make(dtype):
        def draw(lo, hi):  # the middle of every choice, then the overrides
            return (lo + hi) // 2
        case = (_make_backward if backward else _make_forward)(draw, dtype, False)
        args = list(case.args)
        for name, value in over.items():
            if name in ARRAY_KEYWORDS:
                args[len(args) - 3 + ARRAY_KEYWORDS.index(name)] = value
            else:
                case.kwargs[name] = value
        case.args = tuple(args)
        return case
    return make


def _decode(backward):
    """One query of two heads sharing a kv head against 1100 keys: the forward past
    decode.MIN_KEYS runs flash-decoding (9 chunks of 128 on a GPU, 35 of 32 in the
    simulator), with a key length and dropout."""
    def make(dtype):
        rng = np.random.default_rng(11)
        q, k, v = (rand(rng, s, dtype, -1, 1) for s in ((1, 2, 1, 16), (1, 1, 1100, 16),
                                                        (1, 1, 1100, 8)))
        kw = {"layout": "BHSD", "enable_gqa": True, "math": "ieee", "dropout_p": 0.2,
              "seed": 3, "offset": 5}
        extra = (None, None, np.array([1000]))
        tol = attention_tol(dtype, 1100 * 2 + 25)
        if not backward:
            return Case((q, k, v) + extra, kw, tol=tol)
        o, lse = nbdnn.scaled_dot_product_attention(
            *(a.astype(np.float64) for a in (q, k, v)), backend="cpu", seq_lens_k=extra[2],
            **kw)
        do = rand(rng, o.shape, dtype, -1, 1)
        return Case((do, q, k, v, o.astype(dtype), lse.astype(np.float32)) + extra, kw,
                    tol=(4 * tol[0], 4 * tol[1]))
    return make


EDGES = {"causal, grouped heads": {"is_causal": True},
         "causal bottom-right": {"is_causal": True, "alignment": "bottom_right"},
         "sliding window": {"is_causal": True, "window": (2, None)},
         "logit cap": {"softcap": 0.5},
         "every row fully masked": {"attn_mask": np.zeros((1, 1), bool)},
         "no live keys (lengths 0)": {"seq_lens_k": np.zeros(1, np.int64)}}

def _paged_call(rng, dtype, B, Hk, G, Sq, D, Dv, P, lens, extra_w, layout):
    """(q, k_cache, v_cache, block_table, seq_lens_k): the used pages a shuffled order
    of the cache's, the unused table entries -1 (never read)."""
    W = max(1, -(-max(lens) // P)) + extra_w
    need = [-(-L // P) for L in lens]
    pages = max(1, sum(need) + 1)
    order, at = rng.permutation(pages), 0
    table = np.full((B, W), -1, np.int64)
    for b, n in enumerate(need):
        table[b, :n] = order[at:at + n]
        at += n
    Hq = Hk * G
    q = rand(rng, (B, Sq, Hq, D) if layout == "BSHD" else (B, Hq, Sq, D), dtype, -1, 1)
    kc, vc = (rand(rng, (pages, P, Hk, d), dtype, -1, 1) for d in (D, Dv))
    return q, kc, vc, table, np.asarray(lens)


def _make_paged(draw, dtype, big):
    rng = np.random.default_rng(draw(0, 2 ** 31))
    B, Hk, G = draw(1, 3), draw(1, 3 if big else 2), draw(1, 4 if big else 2)
    Sq = draw(1, 16 if big else 4)
    D = (64, 128, draw(1, 40))[draw(0, 2)] if big else draw(1, 9)
    Dv = D if draw(0, 1) else draw(1, 70 if big else 9)
    P = (1, 16, draw(2, 64 if big else 8))[draw(0, 2)]
    lens = [draw(0, 600 if big else 40) for _ in range(B)]
    layout = ("BHSD", "BSHD")[draw(0, 1)]
    args = _paged_call(rng, dtype, B, Hk, G, Sq, D, Dv, P, lens, draw(0, 2), layout)
    idx = np.int32 if draw(0, 1) else np.int64
    args = args[:3] + tuple(a.astype(idx) for a in args[3:])
    kw = {"layout": layout, "is_causal": draw(0, 1) == 1}
    if draw(0, 3) == 0:
        kw["scale"] = (0.05, 0.3, 1.0)[draw(0, 2)]
    if draw(0, 3) == 0:  # a sliding window about the bottom-right diagonal
        kw["window"] = (draw(0, 8), None if draw(0, 1) else draw(0, 4))
    return Case(args, kw, tol=attention_tol(dtype, max(lens) * G + Sq + D + Dv))


def _paged_decode(dtype):
    """Two sequences of 1100 and 700 keys in pages of 16 (the split kernel's tiles and
    chunks at 16-bit D 64; the generic one's otherwise), two query rows each, causal."""
    rng = np.random.default_rng(12)
    args = _paged_call(rng, dtype, 2, 2, 2, 2, 64, 64, 16, [1100, 700], 1, "BSHD")
    return Case(args, {"layout": "BSHD", "is_causal": True},
                tol=attention_tol(dtype, 1100 * 2 + 2 + 128))


SPECS = [OpSpec("scaled_dot_product_attention", _forward, _make_forward, family="attention",
                ops=("scaled_dot_product_attention",), blend=False, dtypes=BF16_DTYPES,
                boundary=dict({n: _edge(False, **o) for n, o in EDGES.items()},
                              decode=_decode(False))),
         OpSpec("scaled_dot_product_attention_backward", _backward, _make_backward,
                family="attention", ops=("scaled_dot_product_attention_backward",),
                blend=False, dtypes=BF16_DTYPES,
                boundary=dict({n: _edge(True, **o) for n, o in EDGES.items()},
                              decode=_decode(True))),
         OpSpec("paged_attention", nbdnn.paged_attention, _make_paged, family="attention",
                blend=False, dtypes=BF16_DTYPES, boundary={"decode": _paged_decode})]

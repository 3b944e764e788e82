"""nbdnn.paged_attention: decoding against a key / value cache held in pages through a
block table. The reference (nbdnn/cpu/attention.py) and both CUDA part kernels (the
simulator without a GPU: decode.py's paged_part for every dtype, decode_split.py's
paged form for 16-bit at D 64 and 128) against an oracle built another way: the pages
gathered into a padded batch, scaled_dot_product_attention in float64 with a boolean
mask that removes the padding, the bottom-right causal pairs and the keys of pages
outside the cache. Page sizes 1 to 16, grouped-query heads, rows without keys,
unused table entries holding anything, int32 and int64 tables and lengths, both
layouts; the front end's refusals."""
import numpy as np
import pytest

import nbdnn
from nbdnn import BadParamError, DtypeError, ShapeError
from nbdnn.cuda import cuda
from nbdnn.cuda.runtime.launch.kernel import launched


def _problem(rng, dtype, B, Sq, Hq, Hk, D, Dv, P, pages, W, lens, layout="BSHD"):
    """q, the caches and a block table whose used entries are distinct pages in a
    random order and whose unused ones hold garbage (-7, pages + 3)."""
    qs = (B, Sq, Hq, D) if layout == "BSHD" else (B, Hq, Sq, D)
    q = rng.standard_normal(qs).astype(dtype)
    kc = rng.standard_normal((pages, P, Hk, D)).astype(dtype)
    vc = rng.standard_normal((pages, P, Hk, Dv)).astype(dtype)
    order = rng.permutation(pages)
    table = np.where(rng.random((B, W)) < 0.5, -7, pages + 3)
    at = 0
    for b, L in enumerate(lens):
        n = -(-L // P)
        table[b, :n] = order[at:at + n]
        at += n
    return q, kc, vc, table, np.asarray(lens)


def _oracle(q, kc, vc, table, lens, causal, layout, scale=None, window=None, softcap=None):
    """(o, lse) in float64: the pages gathered into (B, W P) keys, a boolean mask for
    the lengths, the bottom-right causal rule, a sliding window (left, right) about its
    diagonal and pages outside the cache; softcap as scaled_dot_product_attention's."""
    pages, P, Hk, D = kc.shape
    B, W = table.shape
    Sq = q.shape[1] if layout == "BSHD" else q.shape[2]
    K = np.zeros((B, W * P, Hk, D))
    V = np.zeros((B, W * P, Hk, vc.shape[3]))
    live = np.zeros((B, 1, Sq, W * P), bool)
    for b in range(B):
        L = int(lens[b])
        for w in range(W):
            pg = int(table[b, w])
            if 0 <= pg < pages:
                K[b, w * P:(w + 1) * P] = kc[pg]
                V[b, w * P:(w + 1) * P] = vc[pg]
                live[b, 0, :, w * P:(w + 1) * P] = True
        live[b, 0, :, L:] = False
        if causal:
            live[b, 0] &= np.tril(np.ones((Sq, W * P), bool), L - Sq)
        if window is not None:  # key j of row i: L - Sq + i - left <= j <= ... + right
            off = np.arange(W * P)[None, :] - np.arange(Sq)[:, None] - (L - Sq)
            if window[0] is not None:
                live[b, 0] &= off >= -window[0]
            if window[1] is not None:
                live[b, 0] &= off <= window[1]
    qq = q.astype(np.float64)
    if layout == "BHSD":
        K, V = K.transpose(0, 2, 1, 3), V.transpose(0, 2, 1, 3)
    return nbdnn.scaled_dot_product_attention(qq, K, V, attn_mask=live, enable_gqa=True,
                                              scale=scale, layout=layout, softcap=softcap,
                                              backend="cpu")


TOL = {np.float64: 1e-12, np.float32: 2e-5, np.float16: 3e-3}


def _band_kw(causal):
    """(paged_attention's keywords, _oracle's) of a case's causal column: a bool, or a
    window (left, right), causal where right is None."""
    if isinstance(causal, tuple):
        right_open = causal[1] is None
        return dict(is_causal=right_open, window=causal), \
            dict(causal=right_open, window=causal)
    return dict(is_causal=causal), dict(causal=causal)


@pytest.mark.parametrize("dtype,B,Sq,Hq,Hk,D,Dv,P,W,lens,causal,layout", [
    (np.float64, 3, 1, 4, 2, 8, 6, 4, 5, [5, 0, 20], False, "BSHD"),
    (np.float64, 2, 3, 2, 2, 8, 8, 1, 9, [9, 2], True, "BHSD"),   # rows before any key
    (np.float32, 2, 2, 6, 3, 16, 16, 3, 4, [7, 12], True, "BSHD"),
    (np.float32, 1, 1, 2, 1, 4, 4, 16, 2, [17], False, "BHSD"),
    (np.float64, 2, 3, 2, 1, 8, 8, 4, 5, [19, 2], (5, None), "BSHD"),  # windowed, causal
    (np.float64, 2, 2, 2, 2, 8, 8, 3, 4, [11, 7], (None, 1), "BHSD"),  # right side only
])
def test_reference_matches_the_oracle(dtype, B, Sq, Hq, Hk, D, Dv, P, W, lens, causal,
                                      layout):
    """causal: True, False, or a window (left, right) (causal too when right is None)."""
    rng = np.random.default_rng(sum(lens) + P)
    pages = sum(-(-L // P) for L in lens) + 2
    q, kc, vc, table, ln = _problem(rng, dtype, B, Sq, Hq, Hk, D, Dv, P, pages, W, lens,
                                    layout)
    kw, ref = _band_kw(causal)
    for tdt in (np.int32, np.int64):
        o, lse = nbdnn.paged_attention(q, kc, vc, table.astype(tdt), ln.astype(tdt),
                                       layout=layout, **kw)
        want_o, want_lse = _oracle(q, kc, vc, table, ln, layout=layout, **ref)
        assert o.dtype == dtype and lse.dtype == (np.float64 if dtype == np.float64 else
                                                  np.float32)
        np.testing.assert_allclose(o, want_o, rtol=TOL[dtype], atol=TOL[dtype])
        np.testing.assert_allclose(lse, want_lse, rtol=TOL[dtype], atol=TOL[dtype])
    if 0 in lens:  # a sequence without keys: o = 0, lse = -inf
        b = lens.index(0)
        assert np.all(lse[b] == -np.inf) and not np.any(o[b])


def _run_cuda(q, kc, vc, table, ln, causal, layout, on_device=False):
    args = (q, kc, vc, table, ln)
    if on_device:  # (the front end cannot read device arrays: the kernels' own guard)
        args = tuple(cuda.to_device(a) for a in args)
    with launched() as names:
        o, lse = nbdnn.paged_attention(*args, layout=layout, backend="cuda",
                                       **_band_kw(causal)[0])
    return np.asarray(o if not on_device else o.copy_to_host(), np.float64), \
        np.asarray(lse if not on_device else lse.copy_to_host()), names


@pytest.mark.parametrize("dtype,Sq,Hq,Hk,D,P,lens,causal,layout", [
    (np.float64, 1, 4, 2, 8, 4, [37, 0, 70], False, "BSHD"),
    (np.float32, 3, 2, 1, 12, 5, [66, 2, 49], True, "BHSD"),
    (np.float16, 2, 4, 4, 8, 16, [80, 33, 1], True, "BSHD"),
    (np.float64, 3, 2, 1, 8, 4, [70, 5, 41], (40, None), "BHSD"),  # a window across chunks
    (np.float16, 2, 4, 2, 64, 16, [80, 33, 1], (7, 0), "BSHD"),  # (decode_split's shape)
])
def test_generic_kernel_matches_the_oracle(dtype, Sq, Hq, Hk, D, P, lens, causal, layout):
    """decode.py's paged_part (3 chunks of 32 keys in the simulator), then combine;
    windowed calls too (decode_split leaves them to it, 16-bit D 64 included)."""
    rng = np.random.default_rng(P)
    W = -(-max(lens) // P) + 1
    pages = sum(-(-L // P) for L in lens) + 3
    q, kc, vc, table, ln = _problem(rng, dtype, 3, Sq, Hq, Hk, D, D, P, pages, W, lens,
                                    layout)
    o, lse, names = _run_cuda(q, kc, vc, table.astype(np.int32), ln, causal, layout)
    assert names[-2:] == ["attention_paged_part", "attention_decode_combine"], names
    want_o, want_lse = _oracle(q, kc, vc, table, ln, layout=layout, **_band_kw(causal)[1])
    np.testing.assert_allclose(o, want_o, rtol=TOL[dtype], atol=TOL[dtype])
    np.testing.assert_allclose(lse, want_lse, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("backend,dtype,D,causal", [
    ("cpu", np.float64, 8, False), ("cuda", np.float64, 8, True),
    ("cuda", np.float16, 64, (9, 0))])
def test_softcap_is_sdpas_over_the_gathered_pages(backend, dtype, D, causal):
    """A logit cap (softcap) on the reference and decode.py's paged part (which split-key
    decoding leaves capped calls to, its 16-bit D 64 shape included) against the
    gathered pages' scaled_dot_product_attention with the same cap."""
    rng = np.random.default_rng(D)
    lens = [37, 5, 70]
    W = -(-max(lens) // 8) + 1
    q, kc, vc, table, ln = _problem(rng, dtype, 3, 2, 4, 2, D, D, 8,
                                    sum(-(-L // 8) for L in lens) + 2, W, lens, "BSHD")
    q = (4 * q.astype(np.float64)).astype(dtype)  # (scores past the cap)
    kw, ref = _band_kw(causal)
    with launched() as names:
        o, lse = nbdnn.paged_attention(q, kc, vc, table, ln, softcap=0.7, backend=backend,
                                       **kw)
    assert backend == "cpu" or "attention_paged_part" in names, names
    want_o, want_lse = _oracle(q, kc, vc, table, ln, layout="BSHD", softcap=0.7, **ref)
    np.testing.assert_allclose(np.asarray(o, np.float64), want_o, rtol=TOL[dtype],
                               atol=TOL[dtype])
    np.testing.assert_allclose(np.asarray(lse), want_lse, rtol=TOL[dtype], atol=TOL[dtype])
    plain, _ = _oracle(q, kc, vc, table, ln, layout="BSHD", **ref)
    assert np.abs(plain - want_o).max() > 1e-2  # (the cap bites)


@pytest.mark.parametrize("D,Sq,Hq,Hk,P,causal,layout", [
    (64, 1, 4, 2, 16, False, "BSHD"),
    (64, 2, 8, 2, 8, True, "BHSD"),    # R = G Sq = 8 rows a kv head
    (128, 2, 2, 1, 32, True, "BSHD"),
])
def test_split_kernel_matches_the_oracle(D, Sq, Hq, Hk, P, causal, layout):
    """decode_split.py's paged form in float16 (tiles of 32 keys in the simulator): keys
    of one tile spread over pages, a tile past a sequence's end (re-read rows), a
    sequence without keys."""
    rng = np.random.default_rng(D + P)
    lens = [70, 0, 45]
    W = -(-max(lens) // P) + 1
    pages = sum(-(-L // P) for L in lens) + 1
    q, kc, vc, table, ln = _problem(rng, np.float16, 3, Sq, Hq, Hk, D, D, P, pages, W, lens,
                                    layout)
    o, lse, names = _run_cuda(q, kc, vc, table, ln, causal, layout)
    assert names[-2].startswith("attention_splitkv_paged_d") and \
        names[-1] == "attention_decode_combine", names
    want_o, want_lse = _oracle(q, kc, vc, table, ln, causal, layout)
    np.testing.assert_allclose(o, want_o, rtol=3e-3, atol=3e-3)
    np.testing.assert_allclose(lse, want_lse, rtol=3e-3, atol=3e-3)


@pytest.mark.parametrize("split", [False, True])
def test_a_page_outside_the_cache_is_absent_on_the_gpu(split):
    """The kernels read the table on the device only: a used entry outside [0, pages)
    (which the CPU refuses) removes its page's keys and reads nothing there."""
    rng = np.random.default_rng(3)
    D, P, W, lens = (64, 8, 6, [40, 24]) if split else (8, 4, 10, [37, 20])
    dtype = np.float16 if split else np.float32
    q, kc, vc, table, ln = _problem(rng, dtype, 2, 1, 2, 2, D, D, P, 16, W, lens)
    table[0, 1], table[1, 0] = -1, 16  # (the first row keeps its other pages)
    o, lse, names = _run_cuda(q, kc, vc, table, ln, False, "BSHD", on_device=True)
    assert names[-2].startswith("attention_splitkv_paged" if split else
                                "attention_paged_part"), names
    want_o, want_lse = _oracle(q, kc, vc, table, ln, False, "BSHD")
    tol = 3e-3 if split else 2e-5
    np.testing.assert_allclose(o, want_o, rtol=tol, atol=tol)
    np.testing.assert_allclose(lse, want_lse, rtol=tol, atol=tol)
    with pytest.raises(BadParamError, match=r"block_table\[0, 1\] = -1"):
        nbdnn.paged_attention(q, kc, vc, table, ln)


Q = np.zeros((2, 1, 4, 8), np.float32)
KC = np.zeros((5, 4, 2, 8), np.float32)
T = np.array([[0, 1], [2, 3]], np.int32)
L = np.array([8, 3])


@pytest.mark.parametrize("call, err, words", [
    (lambda: nbdnn.paged_attention(Q, KC, KC, T.astype(np.float32), L), DtypeError,
     "block_table.dtype"),
    (lambda: nbdnn.paged_attention(Q, KC, KC, T[:1], L), ShapeError, "block_table.shape"),
    (lambda: nbdnn.paged_attention(Q, KC, KC, T[:, :0], L), ShapeError, "block_table.shape"),
    (lambda: nbdnn.paged_attention(Q, KC, KC, T, None), BadParamError, "seq_lens_k"),
    (lambda: nbdnn.paged_attention(Q, KC, KC, T, np.array([9, 3])), BadParamError,
     "lengths in [0, 8]"),
    (lambda: nbdnn.paged_attention(Q, KC, KC, T, L.astype(np.float32)), DtypeError,
     "seq_lens_k.dtype"),
    (lambda: nbdnn.paged_attention(Q, KC, KC, np.array([[0, 5], [2, 3]]), L), BadParamError,
     "block_table[0, 1] = 5"),
    (lambda: nbdnn.paged_attention(Q, KC[..., :4], KC, T, L), ShapeError, "k_cache.shape"),
    (lambda: nbdnn.paged_attention(Q, KC, KC[:, :2], T, L), ShapeError, "v_cache.shape"),
    (lambda: nbdnn.paged_attention(Q, KC[:, :, :1].repeat(3, 2), KC[:, :, :1].repeat(3, 2),
                                   T, L), ShapeError, "k_cache heads"),
    (lambda: nbdnn.paged_attention(Q, KC[:0], KC[:0], T, L), ShapeError, "one page"),
    (lambda: nbdnn.paged_attention(Q, KC.astype(np.float64), KC, T, L), DtypeError,
     "k_cache"),
    (lambda: nbdnn.paged_attention(Q, KC[0], KC, T, L), ShapeError, "k_cache.ndim"),
    (lambda: nbdnn.paged_attention(Q, KC, KC, T, L, layout="THD"), BadParamError, "layout"),
    (lambda: nbdnn.paged_attention(Q, KC, KC, T, L, scale=1e39), BadParamError, "scale"),
    (lambda: nbdnn.paged_attention(Q, KC, KC, T, L, out=np.zeros((2, 1, 4, 7), np.float32)),
     ShapeError, "out"),
])
def test_bad_paged_calls(call, err, words):
    with pytest.raises(err) as e:
        call()
    assert words in str(e.value)


def test_unused_table_entries_are_never_read():
    """Entries past a sequence's pages hold anything (a freed page, -1): no error, the
    same result as with them zeroed."""
    rng = np.random.default_rng(1)
    q, kc, vc, table, ln = _problem(rng, np.float64, 2, 1, 2, 2, 8, 8, 4, 6, 3, [5, 4])
    clean = np.where(np.arange(3)[None, :] < -(-ln[:, None] // 4), table, 0)
    a = nbdnn.paged_attention(q, kc, vc, table, ln)
    b = nbdnn.paged_attention(q, kc, vc, clean, ln)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)

"""The tensor-core attention forward (cuda/attention/flash.py) and backward (flash_bwd.py,
forced on) on an sm_90 GPU against the float64 CPU reference of the same 16-bit inputs:
their features (causal, sliding windows, logit caps, ALiBi, masks, dropout, grouped-query heads,
variable lengths, both layouts, tails of both sequences), the forward's defined rows
(nothing attends: o = 0, lse = -inf; a NaN score: a NaN row), the variants,
bit-identical reruns and a 16k-long sequence. Skipped without such a GPU (CI compiles
the kernels: tests/test_ptx.py)."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import nbdnn
from nbdnn.cuda.runtime.launch.kernel import launched

ml_dtypes = pytest.importorskip("ml_dtypes")


def _hopper():
    from nbdnn.cuda.runtime.simulator import SIMULATOR
    if SIMULATOR:
        return False
    from nbdnn.cuda.matmul import tensor_cores
    try:
        return tensor_cores()
    except Exception:  # (no GPU at all)
        return False


pytestmark = pytest.mark.skipif(not _hopper(), reason="needs an sm_90 GPU (wgmma, TMA)")
DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
TOL = {"bfloat16": 2e-2, "float16": 3e-3}  # (P rounds to the input dtype before PV)


def _inputs(rng, dtype, layout, B, Hq, Hk, Sq, Sk, D):
    def t(H, S):
        shape = (B, H, S, D) if layout == "BHSD" else (B, S, H, D)
        return rng.normal(0, 1, shape).astype(DTYPES[dtype])
    return t(Hq, Sq), t(Hk, Sk), t(Hk, Sk)


def _run(q, k, v, **kw):
    with launched() as names:
        o, lse = nbdnn.scaled_dot_product_attention(q, k, v, backend="cuda", **kw)
    assert any(n.startswith("attention_flash_fwd") for n in names), names
    return np.asarray(o, np.float64), np.asarray(lse, np.float64)


def _in_float64(kw):
    """The call's keywords for the float64 reference: an additive mask in float64 too
    (the op takes a mask in q's dtype or bool)."""
    m = kw.get("attn_mask")
    if m is None or m.dtype == bool:
        return kw
    return {**kw, "attn_mask": np.asarray(m, np.float64)}


def _reference(q, k, v, **kw):
    o, lse = nbdnn.scaled_dot_product_attention(
        *(np.asarray(a, np.float64) for a in (q, k, v)), backend="cpu", **_in_float64(kw))
    return np.asarray(o), np.asarray(lse)


@pytest.mark.parametrize("dtype,D,layout,causal,B,Hq,Hk,Sq,Sk,lens", [
    ("bfloat16", 128, "BHSD", False, 2, 4, 4, 300, 333, None),
    ("float16", 64, "BSHD", True, 1, 4, 2, 257, 257, None),
    ("bfloat16", 64, "BHSD", True, 2, 2, 1, 200, 450, None),
    ("float16", 128, "BHSD", True, 1, 2, 2, 500, 130, None),
    ("bfloat16", 128, "BSHD", False, 3, 2, 2, 190, 260, ([190, 5, 0], [1, 260, 100])),
    ("float16", 64, "BHSD", True, 2, 3, 3, 129, 640, ([129, 64], [0, 300])),
])
def test_flash_forward_matches_reference(dtype, D, layout, causal, B, Hq, Hk, Sq, Sk, lens):
    rng = np.random.default_rng(Sq + Sk)
    q, k, v = _inputs(rng, dtype, layout, B, Hq, Hk, Sq, Sk, D)
    _check_forward(q, k, v, dtype, lens, is_causal=causal, enable_gqa=Hq != Hk, layout=layout)


def _check_forward(q, k, v, dtype, lens, **kw):
    """The forward on flash against the reference; lens: (seq_lens_q, seq_lens_k) or
    None (with them some rows attend to nothing: o = 0, lse = -inf, exactly)."""
    if lens:
        kw.update(seq_lens_q=np.array(lens[0]), seq_lens_k=np.array(lens[1]))
    o, lse = _run(q, k, v, **kw)
    want_o, want_lse = _reference(q, k, v, **kw)
    np.testing.assert_allclose(o, want_o, atol=TOL[dtype], rtol=TOL[dtype])
    np.testing.assert_allclose(lse, want_lse, atol=1e-3, rtol=1e-4)
    if lens:
        dead = np.isneginf(want_lse)
        bhsd = o if kw.get("layout", "BHSD") == "BHSD" else o.transpose(0, 2, 1, 3)
        assert dead.any() and np.isneginf(lse[dead]).all() and (bhsd[dead] == 0).all()
    return kw


def test_flash_reruns_are_bit_identical():
    rng = np.random.default_rng(1)
    q, k, v = _inputs(rng, "bfloat16", "BHSD", 2, 4, 4, 384, 1000, 128)
    first, again = _run(q, k, v, is_causal=True), _run(q, k, v, is_causal=True)
    assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(first, again))


def test_flash_nan_rows_stay_their_own():
    """A NaN in one query row makes that row NaN; a NaN key past seq_lens_k takes no part."""
    rng = np.random.default_rng(2)
    q, k, v = _inputs(rng, "float16", "BHSD", 1, 1, 1, 64, 300, 64)
    q[0, 0, 5, 3] = np.nan
    k[0, 0, 290, 0] = np.nan
    o, lse = _run(q, k, v, seq_lens_k=np.array([280]))
    assert np.isnan(o[0, 0, 5]).all() and np.isnan(lse[0, 0, 5])
    rest = np.delete(np.arange(64), 5)
    assert np.isfinite(o[0, 0, rest]).all() and np.isfinite(lse[0, 0, rest]).all()


def test_flash_long_sequence():
    """S = 16k bfloat16 against the reference in float64, 512 query rows at a time."""
    rng = np.random.default_rng(3)
    S, D = 16384, 64
    q, k, v = _inputs(rng, "bfloat16", "BHSD", 1, 1, 1, S, S, D)
    o, lse = _run(q, k, v)
    for r in (0, 8192, S - 512):
        want_o, want_lse = _reference(q[:, :, r:r + 512], k, v)
        np.testing.assert_allclose(o[:, :, r:r + 512], want_o, atol=1e-2, rtol=1e-2)
        np.testing.assert_allclose(lse[:, :, r:r + 512], want_lse, atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("variant", ["F1", "F2", "F3"])
def test_flash_variants_match_reference(variant, monkeypatch):
    """F1, F2 and F3 (flash.VARIANT) on one case with every feature that changes the
    loop: causal tiles, a key tail, grouped-query heads, variable lengths."""
    from nbdnn.cuda.attention import flash
    monkeypatch.setitem(flash.VARIANT, 128, variant)
    _loop_case(4, (2, 4, 2, 300, 700, 128), ([300, 129], [650, 700]))


def _loop_case(seed, dims, lens, causal=True):
    """bfloat16, grouped-query heads, seq_lens (q's, k's) against the reference."""
    rng = np.random.default_rng(seed)
    q, k, v = _inputs(rng, "bfloat16", "BHSD", *dims)
    kw = dict(is_causal=causal, enable_gqa=True, seq_lens_q=np.array(lens[0]),
              seq_lens_k=np.array(lens[1]))
    o, lse = _run(q, k, v, **kw)
    want_o, want_lse = _reference(q, k, v, **kw)
    np.testing.assert_allclose(o, want_o, atol=2e-2, rtol=2e-2)
    np.testing.assert_allclose(lse, want_lse, atol=1e-3, rtol=1e-4)


def _grads(q, k, v, do, backend, **kw):
    o, lse = nbdnn.scaled_dot_product_attention(q, k, v, backend=backend, **kw)
    with launched() as names:
        grads = nbdnn.scaled_dot_product_attention_backward(do, q, k, v, o, lse,
                                                            backend=backend, **kw)
    return [np.asarray(g, np.float64) for g in grads], names


def _check_backward(q, k, v, do, tol, suffix="", **kw):
    """The backward on flash_bwd's kernels (names ending in suffix) against the float64
    reference's gradients of the same 16-bit inputs: each gradient's largest error
    within 2 tol of its largest value."""
    got, names = _grads(q, k, v, do, "cuda", **kw)
    for which in ("dkv", "dq"):
        assert any(n.startswith(f"attention_flash_{which}") and n.endswith(suffix)
                   for n in names), names
    want, _ = _grads(*(np.asarray(a, np.float64) for a in (q, k, v, do)), "cpu",
                     **_in_float64(kw))
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        scale = max(np.abs(w).max(), 1e-6)
        assert np.abs(g - w).max() <= 2 * tol * scale, (name, np.abs(g - w).max(), scale)


@pytest.mark.parametrize("dtype,D,layout,causal,B,Hq,Hk,Sq,Sk,lens", [
    ("bfloat16", 128, "BHSD", False, 2, 2, 2, 300, 333, None),
    ("float16", 64, "BSHD", True, 1, 4, 2, 257, 257, None),
    ("bfloat16", 64, "BHSD", True, 2, 2, 1, 200, 450, None),
    ("float16", 128, "BHSD", True, 1, 2, 2, 500, 130, None),
    ("bfloat16", 128, "BSHD", False, 3, 2, 2, 190, 260, ([190, 5, 0], [1, 260, 100])),
])
def test_flash_backward_matches_reference(dtype, D, layout, causal, B, Hq, Hk, Sq, Sk, lens,
                                          monkeypatch):
    """flash_bwd.py against the float64 reference's gradients of
    the same 16-bit q, k, v, do: the largest error within TOL of the largest gradient."""
    rng = np.random.default_rng(Sq * Sk)
    q, k, v = _inputs(rng, dtype, layout, B, Hq, Hk, Sq, Sk, D)
    do = rng.normal(0, 1, q.shape).astype(DTYPES[dtype])
    kw = dict(is_causal=causal, enable_gqa=Hq != Hk, layout=layout)
    if lens:
        kw.update(seq_lens_q=np.array(lens[0]), seq_lens_k=np.array(lens[1]))
    _check_backward(q, k, v, do, TOL[dtype], **kw)


@pytest.mark.parametrize("dtype,D,layout,Sq,Sk,lens", [
    ("bfloat16", 64, "BHSD", 200, 450, None),
    ("float16", 128, "BSHD", 500, 130, None),
    ("bfloat16", 128, "BHSD", 300, 700, ([300, 129], [650, 100])),
])
def test_flash_bottom_right_matches_reference(dtype, D, layout, Sq, Sk, lens):
    """alignment="bottom_right" (the diagonal at key i + Lk - Lq) forward and backward:
    a shorter query side (its first tile starts past the keys' first tiles), a longer one
    (its first Sq - Sk rows see no key: o = 0, lse = -inf), lengths whose offsets differ
    by entry (129 rows over 100 keys, and 300 over 650), grouped-query heads."""
    rng = np.random.default_rng(Sq + 3 * Sk)
    q, k, v = _inputs(rng, dtype, layout, 2, 4, 2, Sq, Sk, D)
    do = rng.normal(0, 1, q.shape).astype(DTYPES[dtype])
    kw = _check_forward(q, k, v, dtype, lens, is_causal=True, alignment="bottom_right",
                        enable_gqa=True, layout=layout)
    _check_backward(q, k, v, do, TOL[dtype], **kw)


@pytest.mark.parametrize("dtype,D,layout,Sq,Sk,window,causal,alignment,lens,extra", [
    ("bfloat16", 64, "BHSD", 600, 600, (100, 0), True, "top_left", None, {}),
    ("float16", 128, "BSHD", 300, 700, (129, None), False, "bottom_right",
     ([300, 129], [650, 100]), {}),
    ("bfloat16", 128, "BHSD", 500, 450, (0, 37), False, "top_left", None, {}),
    ("float16", 64, "BHSD", 257, 1000, (5, 3), False, "bottom_right", None, {}),
    ("bfloat16", 64, "BSHD", 333, 400, (70, 0), True, "bottom_right", None,
     dict(dropout_p=0.2, seed=7, attn_mask="heads")),
    ("float16", 128, "BHSD", 200, 256, (None, 64), False, "top_left", None,
     dict(attn_mask="additive")),
])
def test_flash_windows_match_reference(dtype, D, layout, Sq, Sk, window, causal, alignment,
                                       lens, extra):
    """Sliding windows (window=(left, right) about either alignment's diagonal) forward
    and backward: a left side that spans tiles (a block's first key tile past key 0), a
    right side past the diagonal without causal, both sides narrow (most key tiles of a
    block skipped; rows of the longer query side that no key reaches), entries whose
    lengths move the diagonal, and a window with a mask and dropout."""
    rng = np.random.default_rng(Sq + 7 * Sk)
    q, k, v = _inputs(rng, dtype, layout, 2, 4, 2, Sq, Sk, D)
    do = rng.normal(0, 1, q.shape).astype(DTYPES[dtype])
    kw = dict(window=window, is_causal=causal, alignment=alignment, enable_gqa=True,
              layout=layout, **extra)
    if "attn_mask" in kw:
        kw["attn_mask"] = _mask(rng, kw["attn_mask"], 2, 4, Sq, Sk, dtype)
    tol = 2 * TOL[dtype] if extra else TOL[dtype]
    if lens:
        kw.update(seq_lens_q=np.array(lens[0]), seq_lens_k=np.array(lens[1]))
    o, lse = _run(q, k, v, **kw)
    want_o, want_lse = _reference(q, k, v, **kw)
    np.testing.assert_allclose(o, want_o, atol=tol, rtol=tol)
    np.testing.assert_allclose(lse, want_lse, atol=1e-3, rtol=1e-4)
    _check_backward(q, k, v, do, tol, **kw)


def _check_feature(rng, q, k, v, do, dtype, Sq, Sk, suffix, kw):
    """A compiled-in feature's kernels (names ending in suffix), forward and backward,
    against the float64 reference; q (B 2, Hq 4, Sq), k, v (Hk 2, Sk); kw["attn_mask"]
    a _mask kind, made here."""
    kw = dict(kw, enable_gqa=True)
    if "attn_mask" in kw:
        kw["attn_mask"] = _mask(rng, kw["attn_mask"], 2, 4, Sq, Sk, dtype)
    with launched() as names:
        o, lse = _run(q, k, v, **kw)
    assert any(n.startswith("attention_flash_fwd") and n.endswith(suffix) for n in names), \
        names
    want_o, want_lse = _reference(q, k, v, **kw)
    np.testing.assert_allclose(o, want_o, atol=2 * TOL[dtype], rtol=2 * TOL[dtype])
    np.testing.assert_allclose(lse, want_lse, atol=1e-3, rtol=1e-4)
    _check_backward(q, k, v, do, TOL[dtype], suffix, **kw)


@pytest.mark.parametrize("dtype,D,layout,cap,kw", [
    ("bfloat16", 128, "BHSD", 2.0, dict()),
    ("float16", 64, "BSHD", 0.5, dict(is_causal=True, window=(90, 0))),
    ("bfloat16", 64, "BHSD", 30.0, dict(attn_mask="additive", dropout_p=0.1, seed=3)),
    ("float16", 128, "BHSD", 1.0, dict(is_causal=True, alignment="bottom_right",
                                       attn_mask="heads")),
])
def test_flash_softcap_matches_reference(dtype, D, layout, cap, kw):
    """Logit caps (softcap) on the tensor cores, forward and backward, against the float64
    reference: a cap that bites (scores past it in both directions), a loose one (Gemma
    2's 50-like) with an additive mask and dropout, with a window, with a boolean mask
    and bottom-right causal rows."""
    Sq, Sk = 300, 264
    rng = np.random.default_rng(int(cap * 10) + D)
    q, k, v = _inputs(rng, dtype, layout, 2, 4, 2, Sq, Sk, D)
    q = (3 * np.asarray(q, np.float32)).astype(DTYPES[dtype])  # (scores past the caps)
    do = rng.normal(0, 1, q.shape).astype(DTYPES[dtype])
    _check_feature(rng, q, k, v, do, dtype, Sq, Sk, "_c", dict(kw, softcap=cap, layout=layout))


@pytest.mark.parametrize("dtype,D,layout,per_entry,kw", [
    ("bfloat16", 128, "BHSD", False, dict()),
    ("float16", 64, "BSHD", True, dict(is_causal=True, alignment="bottom_right",
                                       seq_lens_q=np.array([300, 129]),
                                       seq_lens_k=np.array([250, 264]))),
    ("bfloat16", 64, "BHSD", False, dict(softcap=2.0, attn_mask="additive", window=(70, 0),
                                         is_causal=True)),
    ("float16", 128, "BHSD", True, dict(alignment="bottom_right", dropout_p=0.1, seed=5)),
])
def test_flash_alibi_matches_reference(dtype, D, layout, per_entry, kw):
    """ALiBi on the tensor cores, forward and backward, against the float64 reference:
    per-head and per-(entry, head) slopes, either diagonal (lengths that move the
    bottom-right one by entry), with a cap, an additive mask and a window, with
    dropout."""
    Sq, Sk = 300, 264
    rng = np.random.default_rng(D + 7 * int(per_entry))
    q, k, v = _inputs(rng, dtype, layout, 2, 4, 2, Sq, Sk, D)
    do = rng.normal(0, 1, q.shape).astype(DTYPES[dtype])
    slopes = rng.uniform(0.01, 0.5, (2, 4) if per_entry else (4,)).astype(np.float32)
    _check_feature(rng, q, k, v, do, dtype, Sq, Sk, "_l",
                   dict(kw, alibi_slopes=slopes, layout=layout))


def test_flash_backward_reruns_are_bit_identical(monkeypatch):
    rng = np.random.default_rng(5)
    q, k, v = _inputs(rng, "bfloat16", "BHSD", 1, 4, 2, 320, 500, 128)
    do = rng.normal(0, 1, q.shape).astype(ml_dtypes.bfloat16)
    first, _ = _grads(q, k, v, do, "cuda", is_causal=True, enable_gqa=True)
    again, _ = _grads(q, k, v, do, "cuda", is_causal=True, enable_gqa=True)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))


@pytest.mark.parametrize("D", [64, 128])
def test_flash_persistent_matches_reference(D, monkeypatch):
    """flash.PERSISTENT (forced on: variant F1; non-causal: causal calls never take it):
    more (batch, head, query) tiles than SMs, so blocks loop, reloading Q after the
    consumers release it."""
    from nbdnn.cuda.attention import flash
    monkeypatch.setitem(flash.PERSISTENT, D, 1 << 62)
    with launched() as names:
        _loop_case(6, (2, 40, 20, 300, 333, D), ([300, 150], [333, 200]), causal=False)
    assert any(n.endswith("_p") for n in names), names


@pytest.mark.parametrize("D", [64, 128])
@given(data=st.data())
def test_flash_forward_random_shapes(D, data):
    """Drawn shapes, tails, causal, grouped-query heads, lengths and layouts through the
    tensor-core forward against the float64 reference (the gpu profile's draws)."""
    dtype = data.draw(st.sampled_from(sorted(DTYPES)))
    layout = data.draw(st.sampled_from(["BHSD", "BSHD"]))
    B, Hk, G = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2)), \
        data.draw(st.integers(1, 3))
    Sq, Sk = data.draw(st.integers(17, 300)), data.draw(st.integers(1, 300))
    kw = dict(is_causal=data.draw(st.booleans()), enable_gqa=G > 1, layout=layout)
    if data.draw(st.booleans()):
        kw.update(seq_lens_q=np.array([data.draw(st.integers(0, Sq)) for _ in range(B)]),
                  seq_lens_k=np.array([data.draw(st.integers(0, Sk)) for _ in range(B)]))
    q, k, v = _inputs(np.random.default_rng(Sq * 1000 + Sk), dtype, layout, B, Hk * G, Hk,
                      Sq, Sk, D)
    o, lse = _run(q, k, v, **kw)
    want_o, want_lse = _reference(q, k, v, **kw)
    np.testing.assert_allclose(o, want_o, atol=TOL[dtype], rtol=TOL[dtype])
    np.testing.assert_allclose(lse, want_lse, atol=1e-3, rtol=1e-4)


def _mask(rng, kind, B, Hq, Sq, Sk, dtype="bfloat16"):
    """A boolean mask (True attends): "causal" (B, 1, Sq, Sk), transformers' causal
    mask under graph capture, with holes and one row that attends to nothing;
    "heads": (1, Hq, 1, Sk), broadcast over batch entries and rows. "additive":
    (B, 1, Sq, Sk) values in [-2, 2] of the dtype, -inf in the causal mask's holes
    (transformers' older float masks), one row all -inf."""
    if kind is None:
        return None
    if kind == "additive":
        m = rng.uniform(-2, 2, (B, 1, Sq, Sk))
        m[~_mask(rng, "causal", B, Hq, Sq, Sk)] = -np.inf
        return m.astype(DTYPES[dtype])
    if kind == "causal":
        m = np.tril(np.ones((Sq, Sk), bool), Sk - Sq)[None, None] & \
            (rng.random((B, 1, Sq, Sk)) > 0.1)
        m[0, 0, Sq // 2] = False
        return m
    return rng.random((1, Hq, 1, Sk)) > 0.3


@pytest.mark.parametrize("dtype,D,layout,causal,B,Hq,Hk,Sq,Sk,mask,p", [
    ("bfloat16", 64, "BHSD", False, 2, 2, 2, 200, 256, "causal", 0.0),
    ("float16", 128, "BSHD", False, 1, 4, 2, 300, 300, "heads", 0.0),
    ("bfloat16", 128, "BHSD", True, 2, 2, 2, 260, 332, None, 0.1),
    ("float16", 64, "BSHD", False, 1, 2, 1, 129, 640, "causal", 0.2),
    ("bfloat16", 128, "BHSD", False, 1, 2, 2, 64, 1024, "heads", 0.5),
    ("bfloat16", 64, "BSHD", False, 2, 2, 1, 150, 200, "additive", 0.0),
    ("float16", 128, "BHSD", False, 1, 2, 2, 130, 256, "additive", 0.1),
])
def test_flash_masks_and_dropout_match_reference(dtype, D, layout, causal, B, Hq, Hk, Sq,
                                                 Sk, mask, p):
    """The masked / dropped kernels (forward, dK/dV, dQ) against the float64 reference
    with the same mask and the same Philox stream (seed, offset): a dropped pair, a
    False mask byte or an additive value (-inf too), a row that attends to nothing
    (o = 0, lse = -inf)."""
    rng = np.random.default_rng(Sq + Sk)
    q, k, v = _inputs(rng, dtype, layout, B, Hq, Hk, Sq, Sk, D)
    do = rng.normal(0, 1, q.shape).astype(DTYPES[dtype])
    kw = dict(is_causal=causal, enable_gqa=Hq != Hk, layout=layout, dropout_p=p,
              seed=1234, offset=5 * Sk, attn_mask=_mask(rng, mask, B, Hq, Sq, Sk, dtype))
    with launched() as names:
        o, lse = _run(q, k, v, **kw)
    suffix = {None: "", "additive": "_a"}.get(mask, "_m") + ("_d" if p else "")
    assert any(n.startswith("attention_flash_fwd") and n.endswith(suffix) for n in names)
    want_o, want_lse = _reference(q, k, v, **kw)
    np.testing.assert_allclose(o, want_o, atol=2 * TOL[dtype], rtol=2 * TOL[dtype])
    np.testing.assert_allclose(lse, want_lse, atol=1e-3, rtol=1e-4)
    if mask in ("causal", "additive"):
        assert np.all(o[0, Sq // 2] == 0 if layout == "BSHD" else o[0, :, Sq // 2] == 0)
    _check_backward(q, k, v, do, TOL[dtype], suffix, **kw)

"""Attention's causal band: the diagonal aligned bottom-right (alignment="bottom_right":
the query rows are the sequence's last, as when decoding or prefilling after a cached
prefix) and sliding windows (window=(left, right) about it). The CPU reference against
constructions that do not use them (the tail rows of a top-left causal call over the
whole sequence; each batch entry alone at its own lengths; an explicit boolean mask of
the band), and every CUDA path against the reference, forward and backward: the exact
kernels, the GEMM path and flash-decoding in the simulator; the tensor-core kernels
(tests/test_attention_flash.py, tests/test_attention_tf32.py) on a GPU."""
import numpy as np
import pytest

import nbdnn
from attention_cases import BR, check_path as _check_path, grads as _grads, rand as _t, \
    sdpa as _sdpa


@pytest.mark.parametrize("Sq,Sk", [(1, 9), (4, 9), (9, 9)])
def test_reference_is_the_tail_of_a_causal_call_over_the_whole_sequence(Sq, Sk):
    """Row i of Sq bottom-right = row Sk - Sq + i of a top-left causal call whose Sk
    query rows end in q: forward, lse, and the gradients (do zero on the other rows)."""
    rng = np.random.default_rng(Sq)
    B, H, D = 2, 3, 5
    q, k, v, do = _t(rng, B, H, Sq, D), _t(rng, B, H, Sk, D), _t(rng, B, H, Sk, D), \
        _t(rng, B, H, Sq, D)
    full = np.concatenate([_t(rng, B, H, Sk - Sq, D), q], axis=2)
    o, lse = _sdpa(q, k, v, **BR)
    fo, flse = _sdpa(full, k, v, is_causal=True)
    np.testing.assert_allclose(o, fo[:, :, Sk - Sq:], rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(lse, flse[:, :, Sk - Sq:], rtol=1e-13, atol=1e-13)
    fdo = np.concatenate([np.zeros((B, H, Sk - Sq, D)), do], axis=2)
    dq, dk, dv = _grads(q, k, v, do, **BR)
    fdq, fdk, fdv = _grads(full, k, v, fdo, is_causal=True)
    for g, w in ((dq, fdq[:, :, Sk - Sq:]), (dk, fdk), (dv, fdv)):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-13)


def test_reference_with_lengths_aligns_each_entry_at_its_own():
    """seq_lens_q / seq_lens_k: entry b's rows end at its own Lk_b (the diagonal at
    Lk_b - Lq_b), as the entry alone, cut to its lengths; rows past Lq_b and rows with
    no key left (Lq_b > Lk_b) give o = 0, lse = -inf."""
    rng = np.random.default_rng(7)
    B, H, Sq, Sk, D = 3, 2, 5, 8, 4
    q, k, v = _t(rng, B, H, Sq, D), _t(rng, B, H, Sk, D), _t(rng, B, H, Sk, D)
    lq, lk = np.array([5, 2, 4]), np.array([8, 6, 2])
    o, lse = _sdpa(q, k, v, seq_lens_q=lq, seq_lens_k=lk, **BR)
    for b in range(B):
        ob, lb = _sdpa(q[b:b + 1, :, :lq[b]], k[b:b + 1, :, :lk[b]], v[b:b + 1, :, :lk[b]],
                       **BR)
        np.testing.assert_allclose(o[b, :, :lq[b]], ob[0], rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(lse[b, :, :lq[b]], lb[0], rtol=1e-13, atol=1e-13)
        assert (o[b, :, lq[b]:] == 0).all() and (lse[b, :, lq[b]:] == -np.inf).all()
    assert (lse[2, :, :2] == -np.inf).all() and np.isfinite(lse[2, :, 2:4]).all()  # (4 > 2)


def test_alignment_matters_only_off_the_square_and_only_when_causal():
    rng = np.random.default_rng(3)
    q, k, v = _t(rng, 1, 2, 6, 4), _t(rng, 1, 2, 6, 4), _t(rng, 1, 2, 6, 4)
    for a, b in ((_sdpa(q, k, v, **BR), _sdpa(q, k, v, is_causal=True)),
                 (_sdpa(q[:, :, :4], k, v, alignment="bottom_right"),
                  _sdpa(q[:, :, :4], k, v))):
        np.testing.assert_array_equal(a[0], b[0])
    top, bottom = _sdpa(q[:, :, :4], k, v, is_causal=True), _sdpa(q[:, :, :4], k, v, **BR)
    assert np.abs(top[0] - bottom[0]).max() > 0.01


@pytest.mark.parametrize("op", ["forward", "backward"])
def test_alignment_is_checked(op):
    rng = np.random.default_rng(0)
    q = _t(rng, 1, 1, 2, 4)
    call = (lambda **kw: _sdpa(q, q, q, **kw)) if op == "forward" else \
        (lambda **kw: nbdnn.scaled_dot_product_attention_backward(
            q, q, q, q, q, np.zeros((1, 1, 2)), backend="cpu", **kw))
    for bad in ("bottom-right", "BOTTOM_RIGHT", None, 2):
        with pytest.raises(nbdnn.BadParamError, match="alignment"):
            call(is_causal=True, alignment=bad)


LENS = {"seq_lens_q": np.array([3, 1]), "seq_lens_k": np.array([4, 7])}


@pytest.mark.parametrize("Sq,Sk,kw", [(3, 7, {}), (7, 3, {}), (3, 7, LENS),
                                      (3, 7, {"attn_mask": "bool"})],
                         ids=["short-q", "long-q", "lengths", "mask"])
def test_exact_kernels(Sq, Sk, kw, monkeypatch):
    if kw.get("attn_mask") == "bool":
        kw = dict(kw, attn_mask=np.random.default_rng(1).random((Sq, Sk)) > 0.3)
    _check_path("simt", "attention_fwd", np.float64, 2, 4, 2, Sq, Sk, 6, kw, True,
                monkeypatch, 1e-12)


@pytest.mark.parametrize("Sq,Sk", [(64, 96), (96, 64)])
def test_gemm_path(Sq, Sk, monkeypatch):
    _check_path("gemm", "attention_rows", np.float32, 1, 2, 1, Sq, Sk, 8, {}, True,
                monkeypatch, 1e-5)


@pytest.mark.parametrize("variant,prefix,dtype,D,kw", [
    ("decode", "attention_decode_part", np.float64, 6, {}),
    ("decode", "attention_decode_part", np.float64, 6, LENS),
    ("decode_split", "attention_splitkv_d", np.float16, 64, {}),
    ("decode_split", "attention_splitkv_d", np.float16, 64, LENS),
])
def test_decoding(variant, prefix, dtype, D, kw, monkeypatch):
    """A few rows against 77 keys (the entry with lengths: 4 and 7 of them, fewer
    than its rows: its first rows see no key)."""
    _check_path(variant, prefix, dtype, 2, 4, 2, 3, 77, D, kw, False, monkeypatch,
                1e-12 if dtype == np.float64 else 2e-3)


def _band_mask(B, Sq, Sk, left, right, bottom_right, lq=None, lk=None):
    """The band as an explicit (B, 1, Sq, Sk) boolean mask, entry by entry."""
    m = np.zeros((B, 1, Sq, Sk), bool)
    for b in range(B):
        d = ((Sk if lk is None else lk[b]) - (Sq if lq is None else lq[b])) \
            if bottom_right else 0
        for i in range(Sq):
            for j in range(Sk):
                m[b, 0, i, j] = (left is None or j >= i + d - left) and \
                    (right is None or j <= i + d + right)
    return m


@pytest.mark.parametrize("window,causal,alignment,lens", [
    ((2, None), False, "top_left", False), ((None, 1), False, "top_left", False),
    ((1, 2), False, "bottom_right", False), ((3, 5), True, "top_left", False),
    ((2, 0), True, "bottom_right", True), ((0, 0), False, "bottom_right", True),
])
def test_reference_window_is_the_band_mask(window, causal, alignment, lens):
    """A window equals its band written out as a boolean mask (is_causal caps its right
    side at 0), forward and backward, lengths moving each entry's diagonal."""
    rng = np.random.default_rng(11)
    B, H, Sq, Sk, D = 2, 2, 5, 9, 4
    q, k, v, do = _t(rng, B, H, Sq, D), _t(rng, B, H, Sk, D), _t(rng, B, H, Sk, D), \
        _t(rng, B, H, Sq, D)
    kw = dict(seq_lens_q=np.array([5, 3]), seq_lens_k=np.array([9, 4])) if lens else {}
    right = min(window[1], 0) if causal and window[1] is not None else (0 if causal else
                                                                        window[1])
    mask = _band_mask(B, Sq, Sk, window[0], right, alignment == "bottom_right",
                      kw.get("seq_lens_q"), kw.get("seq_lens_k"))
    got = _sdpa(q, k, v, window=window, is_causal=causal, alignment=alignment, **kw)
    want = _sdpa(q, k, v, attn_mask=mask, **kw)
    for g, w in zip(got + _grads(q, k, v, do, window=window, is_causal=causal,
                                 alignment=alignment, **kw),
                    want + _grads(q, k, v, do, attn_mask=mask, **kw)):
        np.testing.assert_allclose(g, w, rtol=1e-13, atol=1e-13)


def test_open_and_causal_windows_are_the_plain_calls():
    rng = np.random.default_rng(5)
    q, k, v = _t(rng, 1, 2, 4, 3), _t(rng, 1, 2, 7, 3), _t(rng, 1, 2, 7, 3)
    for a, b in ((_sdpa(q, k, v, window=(None, None)), _sdpa(q, k, v)),
                 (_sdpa(q, k, v, window=(None, 0)), _sdpa(q, k, v, is_causal=True)),
                 (_sdpa(q, k, v, window=(None, 0), alignment="bottom_right"),
                  _sdpa(q, k, v, **BR))):
        np.testing.assert_array_equal(a[0], b[0])


@pytest.mark.parametrize("bad", [(-1, 0), (0, -2), (1,), (1, 2, 3), "12", (1.5, 0), 3])
def test_window_is_checked(bad):
    rng = np.random.default_rng(0)
    q = _t(rng, 1, 1, 2, 4)
    with pytest.raises(nbdnn.BadParamError, match="window"):
        _sdpa(q, q, q, window=bad)


WINDOWS = [dict(window=(2, 1), is_causal=False, alignment="top_left"),
           dict(window=(3, None), is_causal=True, alignment="bottom_right"),
           dict(window=(None, 2), is_causal=False, alignment="bottom_right", **LENS)]


@pytest.mark.parametrize("kw", WINDOWS, ids=["both-sides", "causal-left", "right-lengths"])
def test_exact_kernels_windows(kw, monkeypatch):
    _check_path("simt", "attention_fwd", np.float64, 2, 4, 2, 3, 7, 6, kw, True,
                monkeypatch, 1e-12)


@pytest.mark.parametrize("kw", WINDOWS[:2], ids=["both-sides", "causal-left"])
def test_gemm_path_windows(kw, monkeypatch):
    _check_path("gemm", "attention_rows", np.float32, 1, 2, 1, 64, 80, 8,
                dict(kw, window=(17, kw["window"][1])), True, monkeypatch, 1e-5)


@pytest.mark.parametrize("kw", WINDOWS, ids=["both-sides", "causal-left", "right-lengths"])
def test_decoding_windows(kw, monkeypatch):
    _check_path("decode", "attention_decode_part", np.float64, 2, 4, 2, 3, 77, 6,
                dict(kw, window=(40, kw["window"][1])), False, monkeypatch, 1e-12)


def test_the_tensor_core_kernels_take_every_band():
    """flash.takes (the tensor-core forward and backward) takes either alignment of plain
    causal and sliding windows; `windowed` tells the windows (which decode_split leaves
    to the other paths) from plain causal."""
    import ml_dtypes
    from nbdnn.cuda.attention import flash
    from nbdnn.cuda.attention.geometry import geometry
    q = np.zeros((1, 2, 32, 64), ml_dtypes.bfloat16)

    def geo(code, window):
        return geometry(q, q, q, q, None, 0.0, code, None, 0, 0, "BHSD", 0, 0, "ieee",
                        window)
    for code, window in ((1, None), (2, None), (0, None)):
        assert flash.takes("bfloat16", geo(code, window)) and not geo(code, window).windowed
    for code, window in ((1, (-3, 0)), (2, (None, 2)), (1, (0, 0))):
        assert geo(code, window).windowed and flash.takes("bfloat16", geo(code, window))


def test_eager_plans_replay_each_band_as_its_own():
    """An eager call plan is a signature's (ops/_plan.py): a replayed window, alignment
    or causal flag answers as the full call, and a call that differs in one of them
    alone gets its own plan, not the replay of another's."""
    from nbdnn.cuda.runtime.memory.arrays import to_device
    rng = np.random.default_rng(9)
    host = [_t(rng, 1, 2, S, 4) for S in (3, 6, 6)]
    dev = [to_device(a) for a in host]
    for kw in (dict(window=(2, 1)), dict(window=(1, 1)), dict(window=(1, 1), **BR),
               dict(**BR), dict(is_causal=True), dict(window=(None, 0))):
        want = _sdpa(*host, **kw)
        for _ in range(5):  # (the 4th and 5th replay this signature's plan)
            o, lse = nbdnn.scaled_dot_product_attention(*dev, **kw)
            np.testing.assert_allclose(np.asarray(o.copy_to_host()), want[0], rtol=1e-12,
                                       atol=1e-12)

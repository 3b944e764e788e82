"""ALiBi (alibi_slopes: float32 (Hq,) or (B, Hq); score (i, j) takes -slope |i + d - j|
after the logit cap, d the alignment's diagonal offset, causal or not): the CPU reference
against the same bias written out as an additive mask, the keyword's checks, the exact
kernels and flash-decoding in the simulator against the reference, the variants
without ALiBi refusing it, and eager plans replaying each call's own slopes."""
import numpy as np
import pytest

import nbdnn
from attention_cases import check_path, check_refusal, grads, rand, sdpa, with_mask


def _bias(slopes, B, Hq, Sq, Sk, alignment, lens):
    """-slope |i + d_b - j| as a float64 (B, Hq, Sq, Sk) additive mask."""
    lq, lk = lens if lens else (np.full(B, Sq), np.full(B, Sk))
    d = (np.asarray(lk) - np.asarray(lq)) if alignment == "bottom_right" else np.zeros(B)
    i, j = np.arange(Sq)[:, None], np.arange(Sk)[None, :]
    s = np.broadcast_to(np.asarray(slopes, np.float64).reshape(-1, Hq), (B, Hq))
    return np.stack([-s[b][:, None, None] * np.abs(i + d[b] - j) for b in range(B)])


@pytest.mark.parametrize("per_entry,causal,alignment,lens,softcap", [
    (False, False, "top_left", None, None),
    (True, True, "bottom_right", ([5, 2], [7, 6]), None),
    (False, False, "bottom_right", None, 1.5),
    (True, True, "top_left", None, None)])
def test_reference_is_the_bias_written_out(per_entry, causal, alignment, lens, softcap):
    """Against an additive mask of the same values (after the cap: the cap's identity
    there is the capped scores plus the mask), forward and gradients; per-head or per
    (entry, head) slopes, causal or not, either diagonal, lengths that move it."""
    rng = np.random.default_rng(int(per_entry) + 2 * int(causal))
    B, Hq, Hk, Sq, Sk, D = 2, 4, 2, 5, 7, 6
    q, k, v = (rand(rng, B, H, S, D) for H, S in ((Hq, Sq), (Hk, Sk), (Hk, Sk)))
    do = rand(rng, B, Hq, Sq, D)
    slopes = rng.uniform(0.05, 1, (B, Hq) if per_entry else (Hq,)).astype(np.float32)
    kw = dict(is_causal=causal, alignment=alignment, enable_gqa=True, softcap=softcap)
    if lens:
        kw.update(seq_lens_q=np.array(lens[0]), seq_lens_k=np.array(lens[1]))
    mask = _bias(slopes, B, Hq, Sq, Sk, alignment, lens)
    got = sdpa(q, k, v, alibi_slopes=slopes, **kw)
    want = sdpa(q, k, v, attn_mask=mask, **kw)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
    for g, w in zip(grads(q, k, v, do, alibi_slopes=slopes, **kw),
                    grads(q, k, v, do, attn_mask=mask, **kw)):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
    assert np.abs(got[0] - sdpa(q, k, v, **kw)[0]).max() > 1e-3  # (the slopes count)


@pytest.mark.parametrize("bad,err", [
    (np.ones(4, np.float64), nbdnn.DtypeError), (np.ones((1, 4), np.float32), nbdnn.ShapeError),
    (np.ones(3, np.float32), nbdnn.ShapeError), (np.float32([1, np.nan, 1, 1]),
                                                 nbdnn.BadParamError)])
def test_slopes_are_checked(bad, err):
    rng = np.random.default_rng(0)
    q = rand(rng, 2, 4, 3, 4)
    with pytest.raises(err, match="alibi_slopes"):
        sdpa(q, q, q, alibi_slopes=bad)
    with pytest.raises(err, match="alibi_slopes"):
        nbdnn.scaled_dot_product_attention_backward(q, q, q, q, q, np.zeros((2, 4, 3)),
                                                    backend="cpu", alibi_slopes=bad)


SLOPES = np.float32([0.5, 0.25, 0.125, 0.0625])
CASES = [dict(alibi_slopes=SLOPES, is_causal=False, alignment="top_left"),
         dict(alibi_slopes=np.float32([[0.3, 0.2, 0.1, 0.9], [1.0, 0.5, 0.7, 0.05]]),
              seq_lens_q=np.array([3, 1]), seq_lens_k=np.array([4, 7])),
         dict(alibi_slopes=SLOPES, softcap=1.0, attn_mask="bool", window=(3, None))]


@pytest.mark.parametrize("kw", CASES, ids=["heads", "entries-lengths", "cap-mask-window"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_exact_kernels_alibi(kw, dtype, monkeypatch):
    tol = 1e-12 if dtype == np.float64 else 2e-5
    check_path("simt", "attention_fwd", dtype, 2, 4, 2, 3, 7, 6, with_mask(kw, 3, 7), True,
               monkeypatch, tol)


@pytest.mark.parametrize("kw", CASES[:2], ids=["heads", "entries-lengths"])
def test_decoding_alibi(kw, monkeypatch):
    check_path("decode", "attention_decode_part", np.float64, 2, 4, 2, 3, 77, 6,
               with_mask(kw, 3, 77), False, monkeypatch, 1e-12)


@pytest.mark.parametrize("variant,dtype,Sq,Sk,D", [
    ("gemm", np.float32, 64, 80, 8), ("decode_split", np.float16, 2, 80, 64)])
def test_variants_without_alibi_refuse_it(variant, dtype, Sq, Sk, D, monkeypatch):
    """The GEMM path and split-key decoding take no slopes: forced onto such a call they
    raise NotSupportedError (unforced, it runs elsewhere)."""
    check_refusal(variant, dtype, Sq, Sk, D, monkeypatch,
                  alibi_slopes=np.float32([0.5, 0.25]))


def test_eager_plans_replay_each_calls_slopes():
    """A replayed plan reads the call's own slopes array: two arrays of one shape, and
    none, each answer as the full call."""
    from nbdnn.cuda.runtime.memory.arrays import to_device
    rng = np.random.default_rng(9)
    host = [rand(rng, 1, 2, S, 4) for S in (3, 6, 6)]
    dev = [to_device(a) for a in host]
    for slopes in (np.float32([0.5, 2.0]), np.float32([1.5, 0.1]), None):
        want = sdpa(*host, alibi_slopes=slopes)
        s = None if slopes is None else to_device(slopes)
        for _ in range(5):  # (the 4th and 5th replay this signature's plan)
            o, lse = nbdnn.scaled_dot_product_attention(*dev, alibi_slopes=s)
            np.testing.assert_allclose(np.asarray(o.copy_to_host()), want[0], rtol=1e-12,
                                       atol=1e-12)

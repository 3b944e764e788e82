"""Logit softcapping (softcap=c: each scaled score s becomes c tanh(s / c) before the
mask, Gemma 2's and FlashAttention's): the CPU reference against PyTorch's autograd of
the formula written out, forward and gradients; the keyword's checks; the exact
kernels and flash-decoding in the simulator against the reference; the variants that
do not cap leave such calls to the others; an eager plan keyed by its cap."""
import numpy as np
import pytest

import nbdnn
from attention_cases import BR, check_path, check_refusal, grads, rand, sdpa, with_mask

torch = pytest.importorskip("torch")


def _by_torch(q, k, v, do, cap, scale, mask, causal, window):
    """o, lse and the gradients of the capped scores' attention by torch's autograd in
    float64: s = cap tanh(scale q k^T / cap) + mask, -inf outside the causal band."""
    Hq, Hk = q.shape[1], k.shape[1]
    t = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    kk, vv = (x.repeat_interleave(Hq // Hk, dim=1) for x in t[1:])
    s = t[0] @ kk.transpose(-1, -2) * scale
    s = cap * torch.tanh(s / cap) + torch.tensor(mask)
    Sq, Sk = s.shape[-2:]
    off = torch.arange(Sk)[None, :] - torch.arange(Sq)[:, None]
    band = torch.ones(Sq, Sk, dtype=torch.bool)
    if causal:
        band &= off <= 0
    if window is not None:
        band &= off >= -window
    s = s.masked_fill(~band, -torch.inf)
    lse = torch.logsumexp(s, -1)
    o = torch.softmax(s, -1) @ vv
    g = torch.autograd.grad(o, t, torch.tensor(do))
    return [x.detach().numpy() for x in (o, lse, *g)]


@pytest.mark.parametrize("cap,causal,window,gqa", [
    (5.0, False, None, False), (0.7, True, None, True), (2.0, True, 3, False),
    (1e4, False, None, True)])
def test_reference_is_the_capped_formula(cap, causal, window, gqa):
    """Against torch's autograd of the formula: a cap that bites (0.7 over scores up to
    ~3), a loose one, causal with a window, an additive mask, grouped heads; a cap far
    past the scores is (nearly) no cap."""
    rng = np.random.default_rng(int(cap * 10))
    B, Hq, Hk, Sq, Sk, D = 2, 4, 2 if gqa else 4, 5, 7, 6
    q, k, v = (3 * rand(rng, B, H, S, D) for H, S in ((Hq, Sq), (Hk, Sk), (Hk, Sk)))
    do = rand(rng, B, Hq, Sq, D)
    mask = rand(rng, 1, Hq, Sq, Sk)
    kw = dict(softcap=cap, attn_mask=mask, is_causal=causal, enable_gqa=gqa,
              window=None if window is None else (window, 0))
    o, lse = sdpa(q, k, v, **kw)
    got = grads(q, k, v, do, **kw)
    want = _by_torch(q, k, v, do, cap, 1 / np.sqrt(D), mask, causal, window)
    for g, w in zip((o, lse, *got), want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
    plain = sdpa(q, k, v, **dict(kw, softcap=None))[0]
    assert np.abs(plain - o).max() < (1e-6 if cap > 100 else np.inf)
    assert cap > 100 or np.abs(plain - o).max() > 1e-3  # (the cap changed the answer)


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), "2", True])
def test_softcap_is_checked(bad):
    rng = np.random.default_rng(0)
    q = rand(rng, 1, 1, 2, 4)
    with pytest.raises(nbdnn.BadParamError, match="softcap"):
        sdpa(q, q, q, softcap=bad)
    with pytest.raises(nbdnn.BadParamError, match="softcap"):
        nbdnn.scaled_dot_product_attention_backward(q, q, q, q, q, np.zeros((1, 1, 2)),
                                                    backend="cpu", softcap=bad)


CAPS = [dict(softcap=0.8, is_causal=False),
        dict(softcap=1.5, window=(2, None)),
        dict(softcap=0.5, attn_mask="bool", dropout_p=0.3, seed=4)]


@pytest.mark.parametrize("kw", CAPS, ids=["plain", "causal-window", "mask-dropout"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_exact_kernels_cap(kw, dtype, monkeypatch):
    tol = 1e-12 if dtype == np.float64 else 2e-5
    check_path("simt", "attention_fwd", dtype, 2, 4, 2, 3, 7, 6, with_mask(kw, 3, 7), True,
               monkeypatch, tol)


@pytest.mark.parametrize("kw", CAPS[:2], ids=["plain", "causal-window"])
def test_decoding_caps(kw, monkeypatch):
    check_path("decode", "attention_decode_part", np.float64, 2, 4, 2, 3, 77, 6,
               with_mask(kw, 3, 77), False, monkeypatch, 1e-12)


@pytest.mark.parametrize("variant,dtype,Sq,Sk,D", [
    ("gemm", np.float32, 64, 80, 8), ("decode_split", np.float16, 2, 80, 64)])
def test_variants_without_the_cap_refuse_it(variant, dtype, Sq, Sk, D, monkeypatch):
    """The GEMM path and split-key decoding do not cap: forced onto a capped call they
    raise NotSupportedError (unforced, such a call runs elsewhere), and take it uncapped."""
    check_refusal(variant, dtype, Sq, Sk, D, monkeypatch, softcap=2.0)


def test_eager_plans_replay_each_cap_as_its_own():
    """Calls that differ only in their cap (none, 1, 2) each answer as the full call,
    replayed plans included."""
    from nbdnn.cuda.runtime.memory.arrays import to_device
    rng = np.random.default_rng(9)
    host = [3 * rand(rng, 1, 2, S, 4) for S in (3, 6, 6)]
    dev = [to_device(a) for a in host]
    for kw in (dict(softcap=1.0), dict(softcap=2.0), dict(), dict(softcap=1.0, **BR)):
        want = sdpa(*host, **kw)
        for _ in range(5):  # (the 4th and 5th replay this signature's plan)
            o, lse = nbdnn.scaled_dot_product_attention(*dev, **kw)
            np.testing.assert_allclose(np.asarray(o.copy_to_host()), want[0], rtol=1e-12,
                                       atol=1e-12)

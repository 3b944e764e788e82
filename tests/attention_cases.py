"""What the attention tests share: random inputs, the reference's calls, and one CUDA
variant of nbdnn.cuda.attention forced and checked against the float64 reference."""
import numpy as np
import pytest

import nbdnn
from nbdnn.cuda.runtime.launch.kernel import launched

BR = dict(is_causal=True, alignment="bottom_right")


def rand(rng, *shape):
    return rng.uniform(-1, 1, shape)


def sdpa(q, k, v, backend="cpu", **kw):
    return nbdnn.scaled_dot_product_attention(q, k, v, backend=backend, **kw)


def grads(q, k, v, do, backend="cpu", **kw):
    o, lse = sdpa(q, k, v, backend, **kw)
    return nbdnn.scaled_dot_product_attention_backward(do, q, k, v, o, lse, backend=backend,
                                                       **kw)


def check_path(variant, names_have, dtype, B, Hq, Hk, Sq, Sk, D, kw, backward, monkeypatch,
               tol):
    """Variant `variant` (a kernel whose name starts with names_have launched) against
    the float64 reference of the same inputs, forward and (backward) gradients, within
    tol; kw: the call's keywords over bottom-right causal (BR) and grouped heads."""
    from nbdnn.cuda import attention as A
    from nbdnn.cuda.attention import decode
    monkeypatch.setattr(decode, "MIN_KEYS", 40)  # (simulator-sized decoding)
    rng = np.random.default_rng(Sq * 31 + Sk)
    q, k, v = (rand(rng, B, H, S, D).astype(dtype) for H, S in ((Hq, Sq), (Hk, Sk), (Hk, Sk)))
    do = rand(rng, B, Hq, Sq, D).astype(dtype)
    kw = {**BR, **kw, "enable_gqa": Hq != Hk}
    wide = [a.astype(np.float64) for a in (q, k, v, do)]
    with A.forced(variant), launched() as names:
        o, lse = sdpa(q, k, v, "cuda", **kw)
        got = nbdnn.scaled_dot_product_attention_backward(
            do, q, k, v, o, lse, backend="cuda", **kw) if backward else ()
    assert any(n.startswith(names_have) for n in names), names
    want_o, want_lse = sdpa(*wide[:3], **kw)
    np.testing.assert_allclose(np.asarray(o, np.float64), want_o, rtol=tol, atol=tol)
    np.testing.assert_allclose(np.asarray(lse), want_lse, rtol=tol, atol=tol)
    if backward:
        want = nbdnn.scaled_dot_product_attention_backward(
            wide[3], *wide[:3], want_o, want_lse, backend="cpu", **kw)
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=tol, atol=tol)


def with_mask(kw, Sq, Sk):
    """kw with attn_mask="bool" made a (Sq, Sk) boolean mask (about 30% removed)."""
    if kw.get("attn_mask") == "bool":
        kw = dict(kw, attn_mask=np.random.default_rng(2).random((Sq, Sk)) > 0.3)
    return kw


def check_refusal(variant, dtype, Sq, Sk, D, monkeypatch, **kw):
    """Variant `variant` forced runs a plain (1, 2, Sq, Sk, D) call and raises
    NotSupportedError for the same call with keywords kw (a feature it lacks)."""
    from nbdnn.cuda import attention as A
    from nbdnn.cuda.attention import decode
    monkeypatch.setattr(decode, "MIN_KEYS", 40)
    rng = np.random.default_rng(1)
    q, k, v = (rand(rng, 1, 2, S, D).astype(dtype) for S in (Sq, Sk, Sk))
    with A.forced(variant):
        sdpa(q, k, v, "cuda")
        with pytest.raises(nbdnn.NotSupportedError):
            sdpa(q, k, v, "cuda", **kw)

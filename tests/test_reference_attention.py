"""nbdnn/cpu/attention.py, the reference for issue 25's scaled_dot_product_attention:
against torch.nn.functional.scaled_dot_product_attention in float64 (masks, causal,
grouped-query heads, scale, both layouts, forward and autograd's backward), against
central finite differences (dropout, variable lengths), and the choices PyTorch does
not make: fully masked rows, variable lengths, dropout's Philox mask, lse."""
import numpy as np
import pytest

from nbdnn.cpu import attention as A
from nbdnn.cpu import dropout as D

RNG = np.random.default_rng(25)


def _qkv(B=2, Hq=4, Hk=4, Sq=5, Sk=7, Dk=8, Dv=6, dtype=np.float64):
    return (RNG.standard_normal((B, Hq, Sq, Dk)).astype(dtype),
            RNG.standard_normal((B, Hk, Sk, Dk)).astype(dtype),
            RNG.standard_normal((B, Hk, Sk, Dv)).astype(dtype))


def _run(q, k, v, mask=None, p=0.0, causal=False, scale=None, layout="BHSD", lq=None,
         lk=None, math="ieee", seed=3, offset=0):
    return A.scaled_dot_product_attention(q, k, v, mask, p, causal, scale, q.shape[1] !=
                                          k.shape[1], seed, offset, layout, lq, lk, math)


def _grads(do, q, k, v, o, lse, mask=None, p=0.0, causal=False, scale=None, layout="BHSD",
           lq=None, lk=None, seed=3, offset=0):
    return A.scaled_dot_product_attention_backward(
        do, q, k, v, o, lse, mask, p, causal, scale, q.shape[1] != k.shape[1], seed, offset,
        layout, lq, lk)


CASES = {
    "plain": dict(),
    "bool_mask": dict(mask=RNG.random((5, 7)) > 0.3),
    "float_mask": dict(mask=RNG.standard_normal((2, 1, 5, 7))),
    "causal": dict(causal=True),
    "causal_wide": dict(causal=True, shape=dict(Sq=9, Sk=4)),
    "gqa": dict(shape=dict(Hq=6, Hk=2)),
    "scale": dict(scale=0.3, causal=True, shape=dict(Hq=4, Hk=1)),
}


@pytest.mark.parametrize("layout", ["BHSD", "BSHD"])
@pytest.mark.parametrize("name", list(CASES))
def test_matches_torch_forward_backward_and_lse(name, layout):
    """o, lse and the three gradients against PyTorch's math backend in float64."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    case = dict(CASES[name])
    q, k, v = _qkv(**case.pop("shape", {}))
    mask, causal, scale = case.get("mask"), case.get("causal", False), case.get("scale")
    tq, tk, tv = (torch.tensor(t, requires_grad=True) for t in (q, k, v))
    tm = None if mask is None else torch.tensor(mask)
    want = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=tm, is_causal=causal,
                                          scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    do = RNG.standard_normal(want.shape)
    want.backward(torch.tensor(do))
    sw = np.swapaxes if layout == "BSHD" else (lambda t, a, b: t)
    args = [np.ascontiguousarray(sw(t, 1, 2)) for t in (q, k, v)]
    o, lse = _run(*args, mask=mask, causal=causal, scale=scale, layout=layout)
    np.testing.assert_allclose(sw(o, 1, 2), want.detach().numpy(), rtol=1e-12, atol=1e-12)
    s = np.matmul(q, np.swapaxes(A._heads(k, q.shape[1]), -1, -2)) * \
        (1 / np.sqrt(q.shape[-1]) if scale is None else scale)
    s = s + A.bias(s.shape, np.float64, mask, causal, None, None)
    np.testing.assert_allclose(lse, np.log(np.exp(s).sum(-1)), rtol=1e-12)
    grads = _grads(np.ascontiguousarray(sw(do, 1, 2)), *args, o, lse, mask=mask,
                   causal=causal, scale=scale, layout=layout)
    for g, t in zip(grads, (tq, tk, tv)):
        np.testing.assert_allclose(sw(g, 1, 2), t.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_fully_masked_rows_give_zeros_and_minus_infinity():
    """A row with no score left (a boolean mask all False; a padded query row): o = 0,
    lse = -inf, no gradient through it; the other rows as if it were not there."""
    q, k, v = _qkv()
    mask = np.ones((2, 4, 5, 7), bool)
    mask[0, 1, 2] = False
    o, lse = _run(q, k, v, mask=mask)
    assert np.all(o[0, 1, 2] == 0) and lse[0, 1, 2] == -np.inf
    full, full_lse = _run(q, k, v)
    rest = np.ones(o.shape[:3], bool)
    rest[0, 1, 2] = False
    np.testing.assert_array_equal(o[rest], full[rest])
    np.testing.assert_array_equal(lse[rest], full_lse[rest])
    do = RNG.standard_normal(o.shape)
    dq, dk, dv = _grads(do, q, k, v, o, lse, mask=mask)
    assert np.all(dq[0, 1, 2] == 0) and np.all(np.isfinite(dk)) and np.all(np.isfinite(dv))


def test_variable_lengths_equal_the_truncated_batches():
    """seq_lens_q / seq_lens_k: each batch entry as attention over its own lengths
    (keys past seq_lens_k ignored, query rows past seq_lens_q zero with lse -inf),
    forward and backward; causal inside the valid region."""
    q, k, v = _qkv(Sq=6, Sk=8)
    lq, lk = np.array([4, 6]), np.array([8, 3])
    for causal in (False, True):
        o, lse = _run(q, k, v, causal=causal, lq=lq, lk=lk)
        do = RNG.standard_normal(o.shape)
        dq, dk, dv = _grads(do, q, k, v, o, lse, causal=causal, lq=lq, lk=lk)
        for b in range(2):
            sub = (q[b:b + 1, :, :lq[b]], k[b:b + 1, :, :lk[b]], v[b:b + 1, :, :lk[b]])
            o1, lse1 = _run(*sub, causal=causal)
            np.testing.assert_allclose(o[b, :, :lq[b]], o1[0], rtol=1e-12, atol=1e-14)
            np.testing.assert_allclose(lse[b, :, :lq[b]], lse1[0], rtol=1e-12)
            assert np.all(o[b, :, lq[b]:] == 0) and np.all(lse[b, :, lq[b]:] == -np.inf)
            g1 = _grads(do[b:b + 1, :, :lq[b]], *sub, o1, lse1, causal=causal)
            np.testing.assert_allclose(dq[b, :, :lq[b]], g1[0][0], rtol=1e-10, atol=1e-13)
            np.testing.assert_allclose(dk[b, :, :lk[b]], g1[1][0], rtol=1e-10, atol=1e-13)
            np.testing.assert_allclose(dv[b, :, :lk[b]], g1[2][0], rtol=1e-10, atol=1e-13)
            assert np.all(dk[b, :, lk[b]:] == 0) and np.all(dv[b, :, lk[b]:] == 0)


def test_dropout_uses_the_philox_stream_of_nbdnn_dropout():
    """dropout_p: the probabilities p (B, Hq, Sq, Sk) times nbdnn.dropout's keep mask
    for (seed, offset) over them in C order, over 1 - dropout_p; lse undropped."""
    q, k, v = _qkv(Hq=4, Hk=2)
    o, lse = _run(q, k, v, p=0.3, seed=11, offset=40)
    s = np.matmul(q, np.swapaxes(A._heads(k, 4), -1, -2)) / np.sqrt(8)
    p = np.exp(s - lse[..., None])
    keep = D.mask(p.size, 0.3, 11, 40).reshape(p.shape)
    want = np.matmul(p * keep / 0.7, A._heads(v, 4))
    np.testing.assert_allclose(o, want, rtol=1e-12, atol=1e-14)
    assert 0.5 < keep.mean() < 0.9
    o2, _ = _run(q, k, v, p=0.3, seed=11, offset=41)
    assert not np.allclose(o, o2)


@pytest.mark.parametrize("kw", [dict(p=0.4, causal=True), dict(lq=np.array([3, 5]),
                                                                lk=np.array([6, 2])),
                                dict(mask=RNG.standard_normal((5, 7)), scale=0.7)],
                         ids=["dropout_causal", "lengths", "float_mask"])
def test_backward_matches_finite_differences(kw):
    """d sum(o * r) / d(q, k, v) against central differences in float64, grouped-query
    heads, with dropout (a fixed mask for a fixed seed), lengths, a float mask."""
    q, k, v = _qkv(B=2, Hq=4, Hk=2, Sq=5, Sk=7, Dk=4, Dv=3)
    o, lse = _run(q, k, v, **kw)
    r = RNG.standard_normal(o.shape)
    grads = _grads(r, q, k, v, o, lse, **kw)
    for arr, g in zip((q, k, v), grads):
        for _ in range(10):
            idx = tuple(int(RNG.integers(n)) for n in arr.shape)
            old = arr[idx]
            arr[idx] = old + 1e-6
            up = np.sum(_run(q, k, v, **kw)[0] * r)
            arr[idx] = old - 1e-6
            down = np.sum(_run(q, k, v, **kw)[0] * r)
            arr[idx] = old
            np.testing.assert_allclose(g[idx], (up - down) / 2e-6, rtol=1e-5, atol=1e-8)


def test_16bit_and_tf32_stay_near_float64():
    """bfloat16 inputs (float32 compute, p rounded to bfloat16 before p v) within
    bfloat16's reach of the float64 result on the same rounded operands; float32 in
    math "tf32" near "ieee", and not equal to it."""
    ml = pytest.importorskip("ml_dtypes")
    q, k, v = _qkv(Sq=16, Sk=32, Dk=16, Dv=16)
    qb, kb, vb = (t.astype(ml.bfloat16) for t in (q, k, v))
    o, lse = _run(qb, kb, vb, causal=True)
    want, want_lse = _run(*(t.astype(np.float64) for t in (qb, kb, vb)), causal=True)
    assert o.dtype == ml.bfloat16 and lse.dtype == np.float32
    np.testing.assert_allclose(o.astype(np.float64), want, rtol=2 ** -6, atol=2 ** -6)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-5)
    q32, k32, v32 = (t.astype(np.float32) for t in (q, k, v))
    ieee, _ = _run(q32, k32, v32)
    tf, _ = _run(q32, k32, v32, math="tf32")
    np.testing.assert_allclose(tf, ieee, rtol=2e-2, atol=2e-3)
    assert not np.array_equal(tf, ieee)

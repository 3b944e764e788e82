"""Bad scaled_dot_product_attention calls raise the documented NbdnnError subclass,
naming the parameter (issue 25: head dims that differ, Hq not a multiple of Hk, a mask
that does not broadcast, dropout_p outside [0, 1), mismatched seq_lens)."""
import numpy as np
import pytest

import nbdnn
from nbdnn import BadParamError, DtypeError, NotSupportedError, ShapeError

Q = np.ones((2, 4, 5, 8), np.float32)
K = np.ones((2, 2, 7, 8), np.float32)
V = np.ones((2, 2, 7, 6), np.float32)
SDPA = nbdnn.scaled_dot_product_attention


def _bwd(**kw):
    o, lse = SDPA(Q, K, V, enable_gqa=True)
    args = dict(do=o, o=o, lse=lse)
    args.update(kw)
    return nbdnn.scaled_dot_product_attention_backward(
        args["do"], Q, K, V, args["o"], args["lse"], enable_gqa=True)


@pytest.mark.parametrize("call, err, words", [
    (lambda: SDPA(Q, K, V), ShapeError, "enable_gqa=True"),
    (lambda: SDPA(Q, np.ones((2, 3, 7, 8), np.float32), np.ones((2, 3, 7, 6), np.float32),
                  enable_gqa=True), ShapeError, "k heads"),
    (lambda: SDPA(Q, K[..., :4], V, enable_gqa=True), ShapeError, "head dim"),
    (lambda: SDPA(Q, K, V[:, :, :6], enable_gqa=True), ShapeError, "v.shape"),
    (lambda: SDPA(Q, K[:1], V[:1], enable_gqa=True), ShapeError, "batch"),
    (lambda: SDPA(Q[0], K, V, enable_gqa=True), ShapeError, "q.ndim"),
    (lambda: SDPA(Q, K, V, enable_gqa=True, layout="SBHD"), BadParamError, "layout"),
    (lambda: SDPA(Q, K.astype(np.float64), V, enable_gqa=True), DtypeError, "k"),
    (lambda: SDPA(Q.astype(np.int32), K, V, enable_gqa=True), DtypeError, "q"),
    (lambda: SDPA(np.ones((1, 1, 2, 300)), np.ones((1, 1, 2, 300)), np.ones((1, 1, 2, 3))),
     NotSupportedError, "head dim"),
    (lambda: SDPA(Q, K, V, enable_gqa=True, attn_mask=np.ones((5, 6), bool)), ShapeError,
     "attn_mask.shape"),
    (lambda: SDPA(Q, K, V, enable_gqa=True, attn_mask=np.ones((3, 4, 5, 7), bool)),
     ShapeError, "attn_mask.shape"),
    (lambda: SDPA(Q, K, V, enable_gqa=True, attn_mask=np.ones((5, 7), np.float64)),
     DtypeError, "attn_mask.dtype"),
    (lambda: SDPA(Q, K, V, enable_gqa=True, dropout_p=1.0), BadParamError, "dropout_p"),
    (lambda: SDPA(Q, K, V, enable_gqa=True, dropout_p=-0.1), BadParamError, "dropout_p"),
    (lambda: SDPA(Q, K, V, enable_gqa=True, dropout_p=0.1, seed=-1), BadParamError, "seed"),
    (lambda: SDPA(Q, K, V, enable_gqa=True, scale=float("nan")), BadParamError, "scale"),
    (lambda: SDPA(Q, K, V, enable_gqa=True, is_causal=1), BadParamError, "is_causal"),
    (lambda: SDPA(Q, K, V, enable_gqa=True, seq_lens_q=np.array([1, 2, 3])), ShapeError,
     "seq_lens_q.shape"),
    (lambda: SDPA(Q, K, V, enable_gqa=True, seq_lens_k=np.array([1.0, 2.0])), DtypeError,
     "seq_lens_k.dtype"),
    (lambda: SDPA(Q, K, V, enable_gqa=True, seq_lens_k=np.array([1, 8])), BadParamError,
     "seq_lens_k"),
    (lambda: SDPA(Q, K, V, enable_gqa=True, math="fast"), BadParamError, "math"),
    (lambda: SDPA(Q, K, V, enable_gqa=True, out=np.ones((2, 4, 5, 8), np.float32)),
     ShapeError, "out.shape"),
    (lambda: _bwd(lse=np.ones((2, 4, 5), np.float64)), DtypeError, "lse"),
    (lambda: _bwd(lse=np.ones((2, 4, 6), np.float32)), ShapeError, "lse.shape"),
    (lambda: _bwd(do=np.ones((2, 4, 5, 8), np.float32)), ShapeError, "do.shape"),
])
def test_bad_attention_calls(call, err, words):
    with pytest.raises(err) as e:
        call()
    assert words in str(e.value), str(e.value)


def test_fully_masked_rows_give_zeros_and_minus_infinity():
    """The documented answer for a row with no live score (a padded query, a mask of
    False), on the CPU and through the simulator or GPU alike; its gradients are 0."""
    mask = np.ones((5, 7), bool)
    mask[2] = False
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(t.shape) for t in (Q, K, V))
    for backend in ("cpu", "cuda"):
        o, lse = SDPA(q, k, v, enable_gqa=True, attn_mask=mask, backend=backend)
        assert np.all(np.asarray(o)[:, :, 2] == 0) and np.all(np.asarray(lse)[:, :, 2] == -np.inf)
        assert np.all(np.isfinite(np.asarray(lse)[:, :, [0, 1, 3, 4]]))
        dq, dk, dv = nbdnn.scaled_dot_product_attention_backward(
            np.ones_like(np.asarray(o)), q, k, v, np.asarray(o), np.asarray(lse),
            enable_gqa=True, attn_mask=mask, backend=backend)
        assert np.all(np.asarray(dq)[:, :, 2] == 0)

"""The matmul reference (nbdnn/cpu/matmul.py) against naive loops and finite
differences in float64; the alpha/beta blend and out= on both backends."""
import itertools

import numpy as np
import pytest

import nbdnn

RNG = np.random.default_rng(7)


def _naive(a, b, ta, tb, bias, act):
    A = a.T if ta else a
    B = b.T if tb else b
    M, K = A.shape
    N = B.shape[1]
    c = np.zeros((M, N))
    for i in range(M):
        for j in range(N):
            s = sum(A[i, k] * B[k, j] for k in range(K))
            s += bias[j] if bias is not None else 0.0
            c[i, j] = max(s, 0.0) if act == "relu" else s
    return c


@pytest.mark.parametrize("ta, tb", list(itertools.product([False, True], repeat=2)))
@pytest.mark.parametrize("with_bias, act", [(False, None), (True, "relu")])
def test_matmul_matches_naive_loop(ta, tb, with_bias, act):
    M, K, N = 4, 3, 5
    a = RNG.standard_normal((K, M) if ta else (M, K))
    b = RNG.standard_normal((N, K) if tb else (K, N))
    bias = RNG.standard_normal(N) if with_bias else None
    got = nbdnn.matmul(a, b, trans_a=ta, trans_b=tb, bias=bias, activation=act)
    np.testing.assert_allclose(got, _naive(a, b, ta, tb, bias, act), rtol=1e-13, atol=1e-13)


def test_batch_broadcast_matches_per_matrix_products():
    a = RNG.standard_normal((2, 1, 4, 3))
    b = RNG.standard_normal((5, 3, 6))
    c = nbdnn.matmul(a, b)
    assert c.shape == (2, 5, 4, 6)
    for i in range(2):
        for j in range(5):
            np.testing.assert_allclose(c[i, j], a[i, 0] @ b[j], rtol=1e-13)


@pytest.mark.parametrize("ta, tb", list(itertools.product([False, True], repeat=2)))
def test_backward_matches_finite_differences(ta, tb):
    a = RNG.standard_normal((2, 3, 4) if not ta else (2, 4, 3))   # batched a
    b = RNG.standard_normal((4, 5) if not tb else (5, 4))         # shared b
    bias = RNG.standard_normal(5)
    w = RNG.standard_normal((2, 3, 5))

    def loss(a_, b_, bias_):
        return float(np.sum(w * nbdnn.matmul(a_, b_, trans_a=ta, trans_b=tb, bias=bias_)))

    da, db, dbias = nbdnn.matmul_backward(w, a, b, trans_a=ta, trans_b=tb, bias=True)
    h = 1e-6
    for x, g, args in ((a, da, lambda v: (v, b, bias)), (b, db, lambda v: (a, v, bias)),
                       (bias, dbias, lambda v: (a, b, v))):
        num = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            xp, xm = x.copy(), x.copy()
            xp[idx] += h
            xm[idx] -= h
            num[idx] = (loss(*args(xp)) - loss(*args(xm))) / (2 * h)
        np.testing.assert_allclose(g, num, rtol=1e-6, atol=1e-7)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the simulator's NumPy scalars
@pytest.mark.parametrize("backend", [None, "cuda"])
def test_blend_and_out(backend):
    a = RNG.standard_normal((3, 4)).astype(np.float32)
    b = RNG.standard_normal((4, 2)).astype(np.float32)
    out = RNG.standard_normal((3, 2)).astype(np.float32)
    expect = 0.5 * np.maximum(a @ b, 0) + 2.0 * out
    got = nbdnn.matmul(a, b, activation="relu", alpha=0.5, beta=2.0, out=out.copy(),
                       backend=backend)
    np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-6)
    dc = RNG.standard_normal((3, 2)).astype(np.float32)
    outs = tuple(RNG.standard_normal(s).astype(np.float32) for s in ((3, 4), (4, 2), (2,)))
    grads = nbdnn.matmul_backward(dc, a, b, bias=True, alpha=2.0, beta=-1.0,
                                  out=tuple(o.copy() for o in outs), backend=backend)
    for g, e, o in zip(grads, (dc @ b.T, a.T @ dc, dc.sum(0)), outs):
        np.testing.assert_allclose(g, 2.0 * e - o, rtol=1e-5, atol=1e-5)

"""float32's math modes (nbdnn/_math_mode.py): the TF32 rounding bit for bit, the
accuracy each mode promises, CPU and CUDA agreeing per mode, the defaults and the
context manager, and bad modes as named errors. The crosscheck's matmul rows draw the
mode too (nbdnn/testing/specs/matmul.py)."""
import threading

import numpy as np
import pytest

import nbdnn
from nbdnn.cpu.matmul import tf32
from nbdnn.cuda.runtime.memory.arrays import to_device, to_host

BACKENDS = ["cpu", "cuda"]


def _run(backend, fn, *args, **kw):
    if backend == "cpu":
        return fn(*args, **kw)
    r = fn(*[to_device(a) for a in args], **kw)
    return tuple(map(to_host, r)) if isinstance(r, tuple) else to_host(r)


def test_tf32_rounds_to_nearest_ties_to_even():
    one = np.float32(1)
    ulp = 2.0 ** -10  # TF32's spacing at 1
    x = np.array([1 + ulp / 2, 1 + ulp / 2 + 2 ** -23, 1 + 1.5 * ulp, -(1 + 2.5 * ulp),
                  np.finfo(np.float32).max, np.inf, -np.inf, np.nan, 0.0, -0.0],
                 np.float32)
    want = [one, 1 + ulp, 1 + 2 * ulp, -(1 + 2 * ulp), np.inf, np.inf, -np.inf, np.nan, 0.0,
            -0.0]
    got = tf32(x)
    np.testing.assert_array_equal(got, np.array(want, np.float32))
    assert np.signbit(got[-1]) and not (tf32(x).view(np.uint32)[:5] & 0x1FFF).any()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_product_with_the_identity_shows_each_modes_operands(backend):
    """x @ I: "tf32" gives tf32(x), "3xtf32" hi + lo (hi = tf32(x), lo = tf32(x - hi):
    x to ~22 bits), "ieee" x: the rounding and the split of both backends, bit for bit."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((5, 12)) * 10 ** rng.uniform(-3, 3, (5, 12))).astype(np.float32)
    eye = np.eye(12, dtype=np.float32)
    hi = tf32(x)
    for mode, want in (("ieee", x), ("tf32", hi), ("3xtf32", hi + tf32(x - hi))):
        got = _run(backend, nbdnn.matmul, x, eye, math=mode)
        np.testing.assert_array_equal(got, want, err_msg=mode)


def test_each_mode_keeps_its_accuracy():
    """Against float64: 3xtf32 within twice ieee's error, tf32 far outside it."""
    rng = np.random.default_rng(1)
    a = rng.uniform(-1, 1, (48, 256)).astype(np.float32)
    b = rng.uniform(-1, 1, (256, 40)).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    err = {m: np.abs(nbdnn.matmul(a, b, math=m) - exact).max() for m in nbdnn._vocab.MATH_MODES}
    assert err["3xtf32"] <= 2 * err["ieee"], err
    assert err["tf32"] > 20 * err["ieee"], err


@pytest.mark.parametrize("mode", ["tf32", "3xtf32"])
@pytest.mark.parametrize("trans", [(False, False), (True, True), (True, False)])
def test_cuda_agrees_with_the_reference_per_mode(mode, trans):
    """Forward with bias and a broadcast batch, and both gradients: CUDA against the
    CPU reference in the same mode, to float32 accumulation error."""
    rng = np.random.default_rng(2)
    ta, tb = trans
    a = rng.standard_normal((2, 9, 7) if ta else (2, 7, 9)).astype(np.float32)
    b = rng.standard_normal((6, 9) if tb else (9, 6)).astype(np.float32)
    bias = rng.standard_normal(6).astype(np.float32)
    kw = dict(trans_a=ta, trans_b=tb, math=mode)
    got = to_host(nbdnn.matmul(to_device(a), to_device(b), bias=to_device(bias), **kw))
    np.testing.assert_allclose(got, nbdnn.matmul(a, b, bias=bias, **kw), rtol=1e-5, atol=1e-5)
    dc = rng.standard_normal((2, 7, 6)).astype(np.float32)
    want = nbdnn.matmul_backward(dc, a, b, bias=True, **kw)
    got = _run("cuda", nbdnn.matmul_backward, dc, a, b, bias=True, **kw)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_other_dtypes_ignore_the_mode():
    rng = np.random.default_rng(3)
    for dtype in (np.float64, np.float16):
        a, b = rng.standard_normal((4, 8)).astype(dtype), rng.standard_normal((8, 3)).astype(dtype)
        np.testing.assert_array_equal(nbdnn.matmul(a, b, math="tf32"), nbdnn.matmul(a, b))


def test_default_context_manager_and_threads():
    assert nbdnn.get_math() == "ieee"
    seen = {}
    with nbdnn.math_mode("tf32"):
        assert nbdnn.get_math() == "tf32"
        with nbdnn.math_mode("3xtf32"):
            assert nbdnn.get_math() == "3xtf32"
        assert nbdnn.get_math() == "tf32"
        t = threading.Thread(target=lambda: seen.update(other=nbdnn.get_math()))
        t.start(), t.join()
    assert nbdnn.get_math() == "ieee" and seen["other"] == "ieee"  # a block is per thread
    try:
        nbdnn.set_math("3xtf32")
        assert nbdnn.get_math() == "3xtf32"
        with nbdnn.math_mode("ieee"):
            assert nbdnn.get_math() == "ieee"
    finally:
        nbdnn.set_math("ieee")


@pytest.mark.parametrize("call", [lambda: nbdnn.set_math("fp8"),
                                  lambda: nbdnn.math_mode("TF32").__enter__(),
                                  lambda: nbdnn.matmul(np.ones((2, 2), np.float32),
                                                       np.ones((2, 2), np.float32), math=3),
                                  lambda: nbdnn.matmul_backward(*[np.ones((2, 2))] * 3,
                                                                math="half")])
def test_an_unknown_mode_is_a_named_error(call):
    with pytest.raises(nbdnn.BadParamError, match="math|mode"):
        call()
    assert nbdnn.get_math() == "ieee"

"""The CPU reference of the tensor ops against independent truth: naive Python loops
over every index (itertools.product, scalar `math`), element by element, plus
identities between the ops. Tiny float64 inputs."""
import math
from itertools import product

import numpy as np
import pytest

import nbdnn
from nbdnn.ops.tensor import OP_TENSOR_OPS, REDUCE_OPS, UNARY_OPS

RNG = np.random.default_rng(1234)


def _idx(shape):
    return product(*(range(n) for n in shape))


def _bcast_index(i, small_shape):
    """Index into a trailing-aligned broadcast operand (size-1 dims read element 0)."""
    tail = i[len(i) - len(small_shape):] if small_shape else ()
    return tuple(0 if n == 1 else k for k, n in zip(tail, small_shape))


# ---------------------------------------------------------------- add_tensor

C_SHAPE = (2, 3, 2, 4)


@pytest.mark.parametrize("a_shape", [(1, 3, 1, 1), (3, 1, 1), (4,), (2, 1, 2, 1), C_SHAPE,
                                     (), (1,), (2, 4)])
@pytest.mark.parametrize("alpha, beta", [(1.0, 1.0), (2.0, 0.0), (0.5, -1.5)])
def test_add_tensor_matches_loop(a_shape, alpha, beta):
    a = RNG.standard_normal(a_shape)
    c = RNG.standard_normal(C_SHAPE)
    c0 = c.copy()
    got = nbdnn.add_tensor(a, c, alpha=alpha, beta=beta)
    want = np.empty(C_SHAPE)
    for i in _idx(C_SHAPE):
        want[i] = alpha * float(a[_bcast_index(i, a_shape)]) + beta * float(c[i])
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-15)
    np.testing.assert_array_equal(c, c0)  # c only changes when passed as out=
    assert got.shape == C_SHAPE and got.dtype == np.float64


def test_add_tensor_in_place_form():
    a, c = RNG.standard_normal((1, 3, 1, 1)), RNG.standard_normal(C_SHAPE)
    want = 0.5 * a + 2.0 * c
    assert nbdnn.add_tensor(a, c, alpha=0.5, beta=2.0, out=c) is c
    np.testing.assert_allclose(c, want, rtol=1e-14)


def test_add_tensor_beta_zero_does_not_read_c():
    a, c = RNG.standard_normal((3, 1, 1)), np.full(C_SHAPE, np.nan)
    np.testing.assert_allclose(nbdnn.add_tensor(a, c, beta=0.0), np.broadcast_to(a, C_SHAPE))


# ----------------------------------------------------------------- op_tensor

def _naive_op(op, x, y):
    if op == "add":
        return x + y
    if op == "mul":
        return x * y
    if op == "div":
        return x / y
    if op == "min":
        return x if x <= y else y
    if op == "max":
        return x if x >= y else y
    if op == "sqrt":
        return math.sqrt(x) if x >= 0 else math.nan
    if op == "finite":
        return x if math.isfinite(x) else 0.0
    return 1.0 - x  # not


A_SHAPE = (2, 3, 4)


@pytest.mark.parametrize("op, b_shape", [(op, bs) for op in OP_TENSOR_OPS for bs in
                                         ([None] if op in UNARY_OPS else
                                          [A_SHAPE, (3, 1), (4,), (1, 1, 1)])])
@pytest.mark.parametrize("alpha1, alpha2, beta", [(1.0, 1.0, 0.0), (2.0, -0.5, 0.0),
                                                  (-1.5, 3.0, 0.25)])
def test_op_tensor_matches_loop(op, b_shape, alpha1, alpha2, beta):
    unary = b_shape is None
    a = RNG.standard_normal(A_SHAPE)
    b = None if unary else RNG.standard_normal(b_shape)
    out = RNG.standard_normal(A_SHAPE) if beta else None
    out0 = None if out is None else out.copy()
    want = np.empty(A_SHAPE)
    for i in _idx(A_SHAPE):
        y = 0.0 if unary else alpha2 * float(b[_bcast_index(i, b_shape)])
        want[i] = _naive_op(op, alpha1 * float(a[i]), y)
        if beta:
            want[i] += beta * float(out0[i])
    got = nbdnn.op_tensor(op, a, b, alpha1=alpha1, alpha2=alpha2, beta=beta, out=out)
    if out is not None:
        assert got is out
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-15)  # NaN where sqrt(<0)


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_op_tensor_div_by_zero_is_ieee(backend):
    """x / +-0 is +-inf by the signs, 0 / 0 NaN, on both backends."""
    a = np.array([1.0, -2.0, 0.0, 3.0, 6.0], np.float32)
    b = np.array([0.0, 0.0, 0.0, -0.0, 4.0], np.float32)
    got = nbdnn.op_tensor("div", a, b, backend=backend)
    np.testing.assert_array_equal(got, [np.inf, -np.inf, np.nan, -np.inf, 1.5])


# ------------------------------------------------------------- reduce_tensor

X_SHAPE = (3, 4, 2, 5)
X_INT = RNG.integers(-3, 4, X_SHAPE).astype(np.float64)  # many ties, zeros
X_REAL = RNG.standard_normal(X_SHAPE)


def _naive_block(op, v):
    """(value, index) of one reduced block, a Python list in C order."""
    if op in ("min", "max", "amax"):
        w = [abs(t) for t in v] if op == "amax" else v
        j = 0
        for k, t in enumerate(w):
            if (t < w[j]) if op == "min" else (t > w[j]):  # strict: first occurrence
                j = k
        return w[j], j
    s, p, pnz = 0.0, 1.0, 1.0
    for t in v:
        s += abs(t) if op == "norm1" else t * t if op == "norm2" else t
        p *= t
        pnz *= t if t != 0 else 1.0
    return {"add": s, "norm1": s, "avg": s / len(v), "mul": p, "mul_no_zeros": pnz,
            "norm2": math.sqrt(abs(s))}[op], None


def _naive_reduce(x, op, axes, keepdims):
    nd = x.ndim
    axes = range(nd) if axes is None else [axes] if isinstance(axes, int) else axes
    axes = sorted(a % nd for a in axes)
    kept = [i for i in range(nd) if i not in axes]
    kshape = tuple(x.shape[i] for i in kept)
    val, ind = np.empty(kshape), np.empty(kshape, np.int64)
    for ki in _idx(kshape):
        block = []
        for ri in _idx(tuple(x.shape[i] for i in axes)):
            full = [0] * nd
            for i, k in zip(kept + axes, ki + ri):
                full[i] = k
            block.append(float(x[tuple(full)]))
        val[ki], ind[ki] = _naive_block(op, block) if op in ("min", "max", "amax") else \
            (_naive_block(op, block)[0], -1)
    oshape = tuple(1 if i in axes else n for i, n in enumerate(x.shape)) if keepdims else kshape
    return val.reshape(oshape), ind.reshape(oshape)


AXES = [None, 0, 2, -1, (1,), (0, 2), (1, 3), (3, 0), (0, 1, 3), (0, 1, 2, 3)]


@pytest.mark.parametrize("x", [X_INT, X_REAL], ids=["ints", "reals"])
@pytest.mark.parametrize("keepdims", [True, False])
@pytest.mark.parametrize("axes", AXES, ids=str)
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_tensor_matches_loop(op, axes, keepdims, x):
    want, want_idx = _naive_reduce(x, op, axes, keepdims)
    if op in ("min", "max", "amax"):
        got, idx = nbdnn.reduce_tensor(x, op, axes, keepdims=keepdims, return_indices=True)
        assert idx.dtype == np.int64 and idx.shape == want.shape
        np.testing.assert_array_equal(idx, want_idx)
        np.testing.assert_array_equal(got, want)
    else:
        got = nbdnn.reduce_tensor(x, op, axes, keepdims=keepdims)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert got.shape == want.shape and got.dtype == np.float64


def test_reduce_tensor_ties_pick_first_and_all_zero_product_is_one():
    x = np.array([[2.0, -2.0, 2.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    _, i = nbdnn.reduce_tensor(x, "amax", 1, return_indices=True)
    np.testing.assert_array_equal(i, [[0], [0]])
    _, i = nbdnn.reduce_tensor(x, "max", 1, return_indices=True, keepdims=False)
    np.testing.assert_array_equal(i, [0, 0])
    _, i = nbdnn.reduce_tensor(x, "min", 1, return_indices=True, keepdims=False)
    np.testing.assert_array_equal(i, [1, 0])
    np.testing.assert_array_equal(nbdnn.reduce_tensor(x, "mul_no_zeros", 1), [[-8.0], [1.0]])


def test_reduce_tensor_alpha_beta_blend():
    out = RNG.standard_normal((3, 1, 2, 1))
    want = 2.0 * X_REAL.sum(axis=(1, 3), keepdims=True) - 0.5 * out
    assert nbdnn.reduce_tensor(X_REAL, "add", (1, 3), alpha=2.0, beta=-0.5, out=out) is out
    np.testing.assert_allclose(out, want, rtol=1e-12)


@pytest.mark.parametrize("axes", [(0, 2), (1, 3), (0, 1, 2, 3)], ids=str)
def test_reduce_identities(axes):
    r = lambda x, op, ax: nbdnn.reduce_tensor(x, op, ax)  # noqa: E731  (keepdims=True)
    total = r(X_REAL, "add", axes)
    nested = X_REAL
    for ax in axes:  # one axis at a time
        nested = r(nested, "add", ax)
    np.testing.assert_allclose(total, nested, rtol=1e-12)
    np.testing.assert_allclose(r(X_REAL, "norm2", axes) ** 2, r(X_REAL ** 2, "add", axes),
                               rtol=1e-12)
    count = math.prod(X_SHAPE[a] for a in axes)
    np.testing.assert_allclose(r(X_REAL, "avg", axes), total / count, rtol=1e-12)
    np.testing.assert_allclose(r(X_REAL, "norm1", axes), r(np.abs(X_REAL), "add", axes),
                               rtol=1e-12)
    np.testing.assert_array_equal(r(X_REAL, "amax", axes), r(np.abs(X_REAL), "max", axes))


# ------------------------------------------------------- scale / set tensor

def test_scale_tensor_matches_loop_and_in_place():
    x = RNG.standard_normal((2, 3, 4))
    want = np.empty_like(x)
    for i in _idx(x.shape):
        want[i] = -2.5 * float(x[i])
    np.testing.assert_array_equal(nbdnn.scale_tensor(x, -2.5), want)
    assert nbdnn.scale_tensor(x, -2.5, out=x) is x
    np.testing.assert_array_equal(x, want)


@pytest.mark.parametrize("value", [0.0, -3.25, 0.1, math.inf, -math.inf, math.nan])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_set_tensor_in_place(value, dtype):
    x = RNG.standard_normal((2, 3, 2)).astype(dtype)
    assert nbdnn.set_tensor(x, value) is x
    for i in _idx(x.shape):
        v = x[i]
        assert v.dtype == dtype
        assert (math.isnan(v) and math.isnan(value)) or v == dtype(value)


# ---------------------------------------------------------- transform_tensor

@pytest.mark.parametrize("shape, kw", [
    ((2, 3, 4, 5), dict(layout_from="NCHW", layout_to="NHWC")),
    ((2, 4, 5, 3), dict(layout_from="NHWC", layout_to="NCHW")),
    ((2, 3, 2, 2, 3), dict(layout_from="NCDHW", layout_to="NDHWC")),
    ((2, 3, 4), dict(layout_from="XYZ", layout_to="ZXY")),
    ((2, 3, 4, 5), dict(perm=(2, 0, 3, 1))),
    ((3, 4), dict(perm=[1, 0])),
    ((2, 3, 2, 2, 1, 2), dict(perm=(5, 3, 0, 4, 1, 2))),
])
def test_transform_tensor_matches_loop(shape, kw):
    x = RNG.standard_normal(shape)
    if "perm" in kw:
        perm = tuple(kw["perm"])
    else:
        perm = tuple(kw["layout_from"].index(ch) for ch in kw["layout_to"])
    oshape = tuple(shape[p] for p in perm)
    got = nbdnn.transform_tensor(x, **kw)
    assert got.shape == oshape and got.flags.c_contiguous
    for i in _idx(oshape):
        src = [0] * len(shape)
        for k, p in enumerate(perm):  # out dim k is x dim perm[k]
            src[p] = i[k]
        assert got[i] == x[tuple(src)]
    out = RNG.standard_normal(oshape)
    want = 1.5 * got - 2.0 * out
    nbdnn.transform_tensor(x, **kw, alpha=1.5, beta=-2.0, out=out)
    np.testing.assert_allclose(out, want, rtol=1e-14)


def test_transform_round_trip_is_identity():
    x = RNG.standard_normal((2, 3, 4, 5))
    y = nbdnn.transform_tensor(x, "NCHW", "NHWC")
    np.testing.assert_array_equal(nbdnn.transform_tensor(y, "NHWC", "NCHW"), x)
    x5 = RNG.standard_normal((2, 3, 2, 2, 3))
    y5 = nbdnn.transform_tensor(x5, "NCDHW", "NDHWC")
    np.testing.assert_array_equal(nbdnn.transform_tensor(y5, "NDHWC", "NCDHW"), x5)
    p = (2, 0, 3, 1)
    y = nbdnn.transform_tensor(x, perm=p)
    np.testing.assert_array_equal(nbdnn.transform_tensor(y, perm=np.argsort(p)), x)


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_cast_tensor_blends_and_rounds_once(backend):
    """cast_tensor's alpha, beta and out (the crosscheck rows take no blend: its out=
    has the input's dtype): out = alpha * x + beta * out in the target dtype, rounded
    once (float32 1 + 2^-11 + 2^-20 to float16 rounds up, as one rounding must, where
    rounding to 1 + 2^-11 first and then to even would give 1); float16's overflow to
    inf; a bad dtype is a BadParamError."""
    import nbdnn
    from nbdnn.cuda.runtime.memory.arrays import to_device, to_host
    put = (lambda a: a) if backend == "cpu" else to_device
    get = (lambda a: np.asarray(a)) if backend == "cpu" else to_host
    x = np.array([1 + 2 ** -11 + 2 ** -20, 70000.0, -3.0, 0.5], np.float32)
    y = get(nbdnn.cast_tensor(put(x), "float16", backend=backend))
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y, np.array([1 + 2 ** -10, np.inf, -3.0, 0.5], np.float16))
    out = np.array([1.0, 2.0, 4.0, 8.0], np.float64)
    r = get(nbdnn.cast_tensor(put(x[2:].astype(np.float16)), np.float64, alpha=0.5, beta=2.0,
                              out=put(out[:2].copy()), backend=backend))
    np.testing.assert_array_equal(r, [0.5 * -3.0 + 2.0, 0.5 * 0.5 + 4.0])
    with pytest.raises(nbdnn.BadParamError):
        nbdnn.cast_tensor(put(x), "int8", backend=backend)

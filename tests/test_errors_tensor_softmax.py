"""Tensor ops and softmax: bad input of every kind gives the documented NbdnnError
subclass whose message names the op and the parameter, on both backends; mixed
host/device arrays are a DeviceError; NaN/Inf come out of the CUDA backend where the
CPU reference puts them."""
import contextlib
import math

import numpy as np
import pytest
from numba import cuda

import nbdnn

X = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
X4 = np.linspace(-1, 1, 24, dtype=np.float32).reshape(1, 2, 3, 4)
I32 = X.astype(np.int32)
F32 = np.float32
E = nbdnn  # the error classes: E.ShapeError, E.DtypeError, E.BadParamError

CASES = [
    # dtypes
    (lambda b: nbdnn.add_tensor(I32, I32, backend=b), E.DtypeError, ["add_tensor", "a", "int32"]),
    (lambda b: nbdnn.add_tensor(X[0], X.astype(np.float64), backend=b), E.DtypeError,
     ["add_tensor", "a.dtype", "float32", "float64"]),
    (lambda b: nbdnn.op_tensor("add", X, X.astype(np.float64), backend=b), E.DtypeError,
     ["op_tensor", "b.dtype", "float64"]),
    (lambda b: nbdnn.op_tensor("sqrt", I32, backend=b), E.DtypeError, ["op_tensor", "a", "int32"]),
    (lambda b: nbdnn.reduce_tensor(I32, backend=b), E.DtypeError, ["reduce_tensor", "x", "int32"]),
    (lambda b: nbdnn.scale_tensor(I32, 2.0, backend=b), E.DtypeError, ["scale_tensor", "x"]),
    (lambda b: nbdnn.set_tensor(I32.copy(), 1.0, backend=b), E.DtypeError, ["set_tensor", "x"]),
    (lambda b: nbdnn.transform_tensor(I32, perm=(1, 0), backend=b), E.DtypeError,
     ["transform_tensor", "x", "int32"]),
    (lambda b: nbdnn.softmax(I32, backend=b), E.DtypeError, ["softmax", "x", "int32"]),
    (lambda b: nbdnn.softmax_backward(X, X.astype(np.float64), backend=b), E.DtypeError,
     ["softmax_backward", "dy.dtype", "float64"]),
    # broadcasting
    (lambda b: nbdnn.add_tensor(X[:, :3], X, backend=b), E.ShapeError,
     ["add_tensor", "a.shape", "(3, 3)", "(3, 4)"]),
    (lambda b: nbdnn.add_tensor(X4, X, backend=b), E.ShapeError, ["add_tensor", "a.shape"]),
    (lambda b: nbdnn.op_tensor("mul", X, X[:2], backend=b), E.ShapeError,
     ["op_tensor", "b.shape", "(2, 4)"]),
    (lambda b: nbdnn.op_tensor("max", X, np.ones(3, F32), backend=b), E.ShapeError,
     ["op_tensor", "b.shape", "(3,)"]),
    # op names, unary/binary
    (lambda b: nbdnn.op_tensor("sub", X, X, backend=b), E.BadParamError,
     ["op_tensor", "op", "'sub'"]),
    (lambda b: nbdnn.reduce_tensor(X, "argmax", backend=b), E.BadParamError,
     ["reduce_tensor", "op", "'argmax'"]),
    (lambda b: nbdnn.op_tensor("sqrt", X, X, backend=b), E.BadParamError,
     ["op_tensor", "b", "unary"]),
    (lambda b: nbdnn.op_tensor("add", X, backend=b), E.BadParamError, ["op_tensor", "b", "binary"]),
    # reduce axes and flags
    (lambda b: nbdnn.reduce_tensor(X, "add", 2, backend=b), E.BadParamError,
     ["reduce_tensor", "axes", "[-2, 2)", "2"]),
    (lambda b: nbdnn.reduce_tensor(X, "add", (0, -3), backend=b), E.BadParamError,
     ["reduce_tensor", "axes"]),
    (lambda b: nbdnn.reduce_tensor(X, "add", (1, -1), backend=b), E.BadParamError,
     ["reduce_tensor", "axes", "distinct", "(1, -1)"]),
    (lambda b: nbdnn.reduce_tensor(X, "add", 0.5, backend=b), E.BadParamError,
     ["reduce_tensor", "axes"]),
    (lambda b: nbdnn.reduce_tensor(X, "add", 1, return_indices=True, backend=b), E.BadParamError,
     ["reduce_tensor", "return_indices", "'add'"]),
    (lambda b: nbdnn.reduce_tensor(X, "norm2", return_indices=True, backend=b), E.BadParamError,
     ["reduce_tensor", "return_indices", "'norm2'"]),
    (lambda b: nbdnn.reduce_tensor(X, keepdims="yes", backend=b), E.BadParamError,
     ["reduce_tensor", "keepdims"]),
    (lambda b: nbdnn.reduce_tensor(X[:, :0], "max", 1, backend=b), E.ShapeError,
     ["reduce_tensor", "x.shape", "(3, 0)"]),
    (lambda b: nbdnn.reduce_tensor(X, beta=1.0, backend=b), E.BadParamError,
     ["reduce_tensor", "beta"]),
    # transform
    (lambda b: nbdnn.transform_tensor(X4, "NCHW", "NHWCX", backend=b), E.ShapeError,
     ["transform_tensor", "layout_to", "4"]),
    (lambda b: nbdnn.transform_tensor(X, "NCHW", "NHWC", backend=b), E.ShapeError,
     ["transform_tensor", "layout_from", "'NCHW'"]),
    (lambda b: nbdnn.transform_tensor(X4, "NCHW", "NCDW", backend=b), E.BadParamError,
     ["transform_tensor", "layout_to", "'NCDW'"]),
    (lambda b: nbdnn.transform_tensor(X4, "NCHH", "NHCH", backend=b), E.BadParamError,
     ["transform_tensor", "layout_from"]),
    (lambda b: nbdnn.transform_tensor(X4, "NCHW", backend=b), E.BadParamError,
     ["transform_tensor", "layout_to", "None"]),
    (lambda b: nbdnn.transform_tensor(X4, perm=(0, 1, 1, 2), backend=b), E.BadParamError,
     ["transform_tensor", "perm", "range(4)"]),
    (lambda b: nbdnn.transform_tensor(X4, perm=(0, 1, 2), backend=b), E.BadParamError,
     ["transform_tensor", "perm"]),
    (lambda b: nbdnn.transform_tensor(X4, "NCHW", "NHWC", perm=(0, 2, 3, 1), backend=b),
     E.BadParamError, ["transform_tensor", "perm"]),
    (lambda b: nbdnn.transform_tensor(np.zeros((1,) * 7, F32), perm=range(7), backend=b),
     E.ShapeError, ["transform_tensor", "x.ndim"]),
    # scalars
    (lambda b: nbdnn.scale_tensor(X, math.nan, backend=b), E.BadParamError,
     ["scale_tensor", "alpha", "finite"]),
    (lambda b: nbdnn.set_tensor(X.copy(), "1", backend=b), E.BadParamError,
     ["set_tensor", "value"]),
    (lambda b: nbdnn.set_tensor(np.zeros((3, 8), F32)[:, ::2], 1.0, backend=b), E.BadParamError,
     ["set_tensor", "x", "C-contiguous"]),
    (lambda b: nbdnn.op_tensor("add", X, X, alpha1=math.inf, backend=b), E.BadParamError,
     ["op_tensor", "alpha1"]),
    # softmax
    (lambda b: nbdnn.softmax(X, 2, backend=b), E.BadParamError, ["softmax", "axis", "2"]),
    (lambda b: nbdnn.softmax(X, -3, backend=b), E.BadParamError, ["softmax", "axis", "-3"]),
    (lambda b: nbdnn.softmax(X, 1.0, backend=b), E.BadParamError, ["softmax", "axis"]),
    (lambda b: nbdnn.softmax(X, algo="fastest", backend=b), E.BadParamError,
     ["softmax", "algo", "'fastest'"]),
    (lambda b: nbdnn.softmax(np.ones((), F32), 0, backend=b), E.BadParamError,
     ["softmax", "x.ndim"]),
    (lambda b: nbdnn.softmax_backward(X[:2], X, backend=b), E.ShapeError,
     ["softmax_backward", "dy.shape", "(2, 4)", "(3, 4)"]),
    (lambda b: nbdnn.softmax_backward(X, X, 5, backend=b), E.BadParamError,
     ["softmax_backward", "axis"]),
    (lambda b: nbdnn.softmax_backward(X, X, algo="slow", backend=b), E.BadParamError,
     ["softmax_backward", "algo", "'slow'"]),
    # out=
    (lambda b: nbdnn.softmax(X, out=np.empty((4, 3), F32), backend=b), E.ShapeError,
     ["softmax", "out.shape", "(3, 4)", "(4, 3)"]),
    (lambda b: nbdnn.softmax_backward(X, X, out=np.empty((3, 4)), backend=b), E.DtypeError,
     ["softmax_backward", "out.dtype", "float32", "float64"]),
    (lambda b: nbdnn.reduce_tensor(X, "add", 1, out=np.empty((3,), F32), backend=b), E.ShapeError,
     ["reduce_tensor", "out.shape", "(3, 1)", "(3,)"]),
    (lambda b: nbdnn.reduce_tensor(X, "max", 0, keepdims=False, out=np.empty((4,)), backend=b),
     E.DtypeError, ["reduce_tensor", "out.dtype", "float64"]),
    (lambda b: nbdnn.add_tensor(X[0], X, out=np.empty((1, 4), F32), backend=b), E.ShapeError,
     ["add_tensor", "out.shape", "(3, 4)"]),
    (lambda b: nbdnn.op_tensor("not", X, out=np.empty((3, 8), F32)[:, ::2], backend=b),
     E.BadParamError, ["op_tensor", "out", "C-contiguous"]),
    (lambda b: nbdnn.transform_tensor(X, perm=(1, 0), out=np.empty((3, 4), F32), backend=b),
     E.ShapeError, ["transform_tensor", "out.shape", "(4, 3)"]),
    (lambda b: nbdnn.scale_tensor(X, 2.0, out=np.empty((3, 4), np.float16), backend=b),
     E.DtypeError, ["scale_tensor", "out.dtype", "float16"]),
]


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
@pytest.mark.parametrize("call, err, words", CASES,
                         ids=[f"{i}-{w[0]}-{w[1]}" for i, (_, _, w) in enumerate(CASES)])
def test_bad_input(call, err, words, backend):
    with pytest.raises(err) as e:
        call(backend)
    for w in words:
        assert w in str(e.value), f"{w!r} not in {str(e.value)!r}"


def _dev(a):
    return cuda.to_device(np.ascontiguousarray(a))


@pytest.mark.parametrize("backend", [None, "cuda"])
@pytest.mark.parametrize("call, words", [
    (lambda b: nbdnn.add_tensor(X[0], _dev(X), backend=b), ["add_tensor", "a", "c"]),
    (lambda b: nbdnn.op_tensor("add", _dev(X), X, backend=b), ["op_tensor", "a", "b"]),
    (lambda b: nbdnn.reduce_tensor(_dev(X), out=np.empty((1, 1), F32), backend=b),
     ["reduce_tensor", "x", "out"]),
    (lambda b: nbdnn.transform_tensor(X, perm=(1, 0), out=_dev(X.T), backend=b),
     ["transform_tensor", "x", "out"]),
    (lambda b: nbdnn.softmax(_dev(X), out=np.empty_like(X), backend=b), ["softmax", "x", "out"]),
    (lambda b: nbdnn.softmax_backward(X, _dev(X), backend=b), ["softmax_backward", "dy", "y"]),
])
def test_mixed_host_and_device_is_an_error(call, words, backend):
    with pytest.raises(nbdnn.DeviceError) as e:
        call(backend)
    for w in words:
        assert w in str(e.value), f"{w!r} not in {str(e.value)!r}"


NAN, INF = math.nan, math.inf
XN = np.array([[NAN, 1.0, 2.0, -1.0, 0.5], [0.0, INF, -2.0, 3.0, 1.0],
               [-INF, 1.0, INF, 0.0, 2.0], [1.0, -INF, -INF, 0.0, NAN],
               [-INF, -INF, -INF, -INF, -INF], [1.0, 2.0, 2.0, -3.0, 0.0]], F32)


def _same_nans(gpu, ref):
    np.testing.assert_array_equal(np.isnan(gpu), np.isnan(ref))
    ok = ~np.isnan(ref)
    np.testing.assert_allclose(gpu[ok], ref[ok], rtol=1e-6, atol=1e-7)  # incl. +-inf


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the simulator's NumPy scalars
@pytest.mark.parametrize("axes", [1, 0, None, (0, 1)], ids=str)
@pytest.mark.parametrize("op", ["add", "max", "min"])
def test_reduce_nan_and_inf_propagate_like_the_reference(op, axes):
    ref = nbdnn.reduce_tensor(XN, op, axes)
    _same_nans(nbdnn.reduce_tensor(XN, op, axes, backend="cuda"), ref)
    if op != "add":  # NaN wins, its index is the first NaN's
        ri = nbdnn.reduce_tensor(XN, op, axes, return_indices=True)[1]
        gi = nbdnn.reduce_tensor(XN, op, axes, return_indices=True, backend="cuda")[1]
        np.testing.assert_array_equal(gi, ri)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the simulator's NumPy scalars
@pytest.mark.parametrize("axis, kernel", [(1, None), (1, "rows_block"), (1, "fused"),
                                          (1, "long"), (0, None)])
@pytest.mark.parametrize("algo", ["accurate", "log", "fast"])
def test_softmax_nan_and_inf_propagate_like_the_reference(algo, axis, kernel):
    from nbdnn.cuda import softmax as S
    ref = nbdnn.softmax(XN, axis, algo=algo)
    kw = dict(algo=algo, backend="cuda")
    dy = np.ones_like(XN)
    y = np.where(np.isnan(ref), np.float32(0.5), ref).astype(F32)
    y[0, 0] = NAN
    ref_dx = nbdnn.softmax_backward(dy, y, axis, algo=algo)
    with S.forced(kernel) if kernel else contextlib.nullcontext():
        _same_nans(nbdnn.softmax(XN, axis, **kw), ref)
        _same_nans(nbdnn.softmax_backward(dy, y, axis, **kw), ref_dx)

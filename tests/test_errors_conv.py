"""Bad convolution calls raise the documented NbdnnError subclass, naming the
parameter (issue #3's list: output size <= 0, groups not dividing C or K, filter
channels != C/groups, negative padding, layout mismatch, unimplemented algorithms)."""
import numpy as np
import pytest

import nbdnn
from nbdnn import BadParamError, DtypeError, ShapeError

F32 = np.float32
X, W = np.ones((1, 4, 5, 5), F32), np.ones((6, 4, 3, 3), F32)


@pytest.mark.parametrize("call, err, words", [
    (lambda: nbdnn.conv2d(X, np.ones((6, 4, 7, 7), F32)), ShapeError, "output size"),
    (lambda: nbdnn.conv2d(X, W, groups=3), ShapeError, "groups"),
    (lambda: nbdnn.conv2d(X, np.ones((6, 4, 3, 3), F32), groups=2), ShapeError, "w.shape"),
    (lambda: nbdnn.conv2d(X, W, padding=-1), BadParamError, "padding"),
    (lambda: nbdnn.conv2d(X, W, padding=((1, -1), (0, 0))), BadParamError, "padding"),
    (lambda: nbdnn.conv2d(X, W, stride=0), BadParamError, "stride"),
    (lambda: nbdnn.conv2d(X, W, dilation=(1, 1, 1)), BadParamError, "dilation"),
    (lambda: nbdnn.conv2d(X, W, groups=0), BadParamError, "groups"),
    (lambda: nbdnn.conv2d(X, W, layout="NHWC"), ShapeError, "w.shape"),
    (lambda: nbdnn.conv2d(X, W, layout="CHWN"), BadParamError, "layout"),
    (lambda: nbdnn.conv2d(X, W, mode="xcorr"), BadParamError, "mode"),
    (lambda: nbdnn.conv2d(X, np.ones((6, 4, 5, 5), F32), padding=2, algo="winograd"),
     BadParamError, "algo"),
    (lambda: nbdnn.conv2d(X, W, stride=2, algo="winograd"), BadParamError, "stride"),
    (lambda: nbdnn.conv2d(X, W, dilation=2, padding=2, algo="winograd4"), BadParamError,
     "dilation"),
    (lambda: nbdnn.conv2d(X, W, algo="fastest"), BadParamError, "algo"),
    (lambda: nbdnn.conv2d(X, W.astype(np.float64)), DtypeError, "w.dtype"),
    (lambda: nbdnn.conv2d(X, W, np.ones(4, F32)), ShapeError, "bias.shape"),
    (lambda: nbdnn.conv2d(X, W, residual=np.ones((1, 6, 5, 5), F32)), ShapeError,
     "residual.shape"),
    (lambda: nbdnn.conv2d(X, W, beta=1.0), BadParamError, "beta"),
    (lambda: nbdnn.conv2d(X, W, activation="nope"), BadParamError, "activation"),
    (lambda: nbdnn.conv1d(X, W), ShapeError, "x.ndim"),
    (lambda: nbdnn.conv2d(X, W, out=np.ones((1, 6, 5, 5), F32)), ShapeError, "out.shape"),
    (lambda: nbdnn.conv_backward_data(np.ones((1, 6, 3, 3), F32), W, (1, 4, 5)),
     BadParamError, "x_shape"),
    (lambda: nbdnn.conv_backward_data(np.ones((1, 6, 4, 3), F32), W, X.shape), ShapeError,
     "dy.shape"),
    (lambda: nbdnn.conv_backward_filter(np.ones((1, 6, 3, 3), F32), X, (6, 2, 3, 3)),
     ShapeError, "w.shape"),
    (lambda: nbdnn.conv_backward_bias(np.ones((6, 3), F32)), ShapeError, "dy.ndim"),
])
def test_bad_conv_calls(call, err, words):
    with pytest.raises(err) as e:
        call()
    assert words in str(e.value)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the simulator's NumPy scalars
def test_find_conv_algorithm_ranks_every_algorithm():
    x, w = np.ones((1, 2, 4, 4), F32), np.ones((3, 2, 3, 3), F32)
    found = nbdnn.find_conv_algorithm(x, w, padding=1, reps=1, backend="cuda")
    assert sorted(r["algo"] for r in found) == ["direct", "gemm", "implicit_gemm", "winograd",
                                                "winograd4"]
    assert [r["time"] for r in found] == sorted(r["time"] for r in found)
    assert all(r["deterministic"] for r in found)
    assert all(r["kernels"] and not r["kernels"][0].startswith("wgmma") for r in found)
    assert all(r["kernels"] == () for r in nbdnn.find_conv_algorithm(x, w, reps=1,
                                                                     backend="cpu"))
    space = {r["algo"]: r["workspace"] for r in found}
    assert space["direct"] == space["implicit_gemm"] == 0
    assert space["gemm"] == 16 * (2 * 9 + 3) * 4  # M * (C*R*S + K) float32s
    assert space["winograd"] == 16 * (3 * 2 + 2 * 4 + 3 * 4) * 4  # 16 (K*C + C*T + K*T)
    assert space["winograd4"] == 36 * (3 * 2 + 2 * 1 + 3 * 1) * 4  # one 4x4 tile
    assert not {"winograd", "winograd4"} & {r["algo"] for r in nbdnn.find_conv_algorithm(
        x, w, stride=2, reps=1, backend="cuda")}
    half = {r["algo"]: r["workspace"] for r in nbdnn.find_conv_algorithm(
        x.astype(np.float16), w.astype(np.float16), padding=1, reps=1, backend="cuda")}
    assert half["winograd"] == space["winograd"] // 2  # float16 tiles
    assert half["winograd4"] == space["winograd4"]     # float32 tiles for float16 layers
    with pytest.raises(BadParamError, match="algo"):
        nbdnn.find_conv_algorithm(x, w, algo="direct")


def test_remembered_geometry_still_rejects_what_equals_it():
    """The front end remembers checked geometries; True and 1.0 equal 1 as keys but
    are still refused, and a failing geometry fails every time."""
    nbdnn.conv2d(X, W)  # groups=1, remembered
    for bad in (True, 1.0):
        with pytest.raises(BadParamError, match="groups"):
            nbdnn.conv2d(X, W, groups=bad)
    for _ in range(2):
        with pytest.raises(ShapeError, match="groups"):
            nbdnn.conv2d(X, W, groups=3)

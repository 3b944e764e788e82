"""nbdnn.torch refuses what torch.nn.functional refuses, with an error that names the
function and what is wrong: shapes (ShapeError, a ValueError), dtypes (DtypeError, a
TypeError), arguments nbdnn cannot give PyTorch's meaning for (NotSupportedError, a
NotImplementedError). The
fast checks of the common case (one normalized axis by its size, the dtype checks
before the custom op) must still refuse every wrong call."""
import pytest

torch = pytest.importorskip("torch")

import nbdnn.torch as nt  # noqa: E402
from nbdnn.errors import DtypeError, NotSupportedError, ShapeError  # noqa: E402


def t(*shape, dtype=torch.float64):
    return torch.ones(shape, dtype=dtype)


CASES = {  # name: (call, error type, message fragment)
    "layer_norm one axis": (lambda: nt.layer_norm(t(3, 5), (4,)), ShapeError,
                            r"layer_norm: normalized_shape \(4,\) must end"),
    "layer_norm int": (lambda: nt.layer_norm(t(3, 5), 4), ShapeError, r"\(4,\) must end"),
    "layer_norm two axes": (lambda: nt.layer_norm(t(3, 4, 5), [5, 4]), ShapeError,
                            r"\(5, 4\) must end the input's shape \(3, 4, 5\)"),
    "layer_norm 0-d": (lambda: nt.layer_norm(t(), (1,)), ShapeError, "must end"),
    "layer_norm too many axes": (lambda: nt.layer_norm(t(5), (1, 5)), ShapeError,
                                 "must end"),
    "rms_norm one axis": (lambda: nt.rms_norm(t(2, 6), (3,)), ShapeError,
                          r"rms_norm: normalized_shape \(3,\)"),
    "linear int": (lambda: nt.linear(t(2, 3, dtype=torch.int32), t(4, 3)), DtypeError,
                   "linear: torch.int32"),
    "linear int bias": (lambda: nt.linear(t(2, 3), t(4, 3), t(4, dtype=torch.int64)),
                        DtypeError, "linear: torch.int64"),
    "relu int": (lambda: nt.relu(t(3, dtype=torch.int16)), DtypeError, "relu: torch.int16"),
    "conv2d 3-d weight": (lambda: nt.conv2d(t(1, 2, 5, 5), t(3, 2, 3)), ShapeError,
                          "conv2d: input must be 4-d"),
    "conv2d int": (lambda: nt.conv2d(t(1, 2, 5, 5, dtype=torch.uint8), t(3, 2, 3, 3)),
                   DtypeError, "conv2d: torch.uint8"),
    "group_norm groups": (lambda: nt.group_norm(t(2, 6, 4), 4), ShapeError,
                          "6 channels do not split into 4 groups"),
    "hardtanh min_val": (lambda: nt.hardtanh(t(3), -0.5, 2.0), NotSupportedError,
                         "min_val -0.5"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_refused_with_the_function_named(name):
    call, error, match = CASES[name]
    with pytest.raises(error, match=match):
        call()


def test_errors_are_python_s_own_types_too():
    """Code that catches ValueError, TypeError or NotImplementedError catches
    nbdnn.torch's errors."""
    assert issubclass(ShapeError, ValueError) and issubclass(DtypeError, TypeError)
    assert issubclass(NotSupportedError, NotImplementedError)

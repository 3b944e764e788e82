"""Inputs at the edge of the calling convention (docs/DESIGN.md): ndarray subclasses,
stream=, dtype=None, a fused activation's coef without the activation, a scale that
overflows float32, the other byte order, torch CPU tensors; each a named NbdnnError
whose message names the op and the parameter, the same on both backends, or a
result equal to a plain array's."""
import numpy as np
import pytest

import nbdnn
from nbdnn.cuda import cuda

F32 = np.float32


def both(fn, *args, **kw):
    """fn on the CPU and with backend="cuda" (NumPy in, copied over): (result or error)."""
    out = []
    for backend in ("cpu", "cuda"):
        try:
            out.append(fn(*args, backend=backend, **kw))
        except nbdnn.NbdnnError as e:
            out.append(e)
    return out


@pytest.mark.parametrize("make", [
    lambda a: np.asmatrix(a), lambda a: np.ma.masked_array(a, mask=a > 0.5)],
    ids=["matrix", "masked"])
@pytest.mark.parametrize("call", [
    lambda x, **kw: nbdnn.op_tensor("mul", x, x, **kw),
    lambda x, **kw: nbdnn.activation(x, "gelu", **kw),
    lambda x, **kw: nbdnn.softmax(x, axis=-1, **kw)], ids=["mul", "gelu", "softmax"])
def test_ndarray_subclasses_are_refused_on_both_backends(make, call):
    x = make(np.random.default_rng(0).random((3, 4)).astype(F32))
    for r in both(call, x):
        assert isinstance(r, nbdnn.DtypeError), r
        assert "plain numpy.ndarray" in str(r), r
        assert str(r).split(":")[0] in ("op_tensor", "activation", "softmax"), r


def test_a_memmap_is_a_plain_array(tmp_path):
    m = np.memmap(tmp_path / "m.bin", dtype=F32, mode="w+", shape=(3, 4))
    m[:] = np.arange(12, dtype=F32).reshape(3, 4) - 6
    np.testing.assert_array_equal(nbdnn.activation(m, "relu"), np.maximum(np.asarray(m), 0))


@pytest.mark.parametrize("stream", ["x", -1, 1.5, True, object(), [0], 2 ** 64])
def test_a_bad_stream_is_named_on_every_path(stream):
    x = np.ones((2, 3), F32)
    for r in both(nbdnn.activation, x, "relu", stream=stream):
        assert isinstance(r, nbdnn.BadParamError) and "activation: stream" in str(r), r
    with pytest.raises(nbdnn.BadParamError, match="activation: stream"):
        nbdnn.activation(cuda.to_device(x), "relu", stream=stream)  # (the planned path)


@pytest.mark.parametrize("stream", [None, 0, "handle", "numba"])
def test_the_streams_the_readme_names_are_taken(stream):
    """None and 0 (the legacy default stream), a numba stream, and a stream's raw
    handle as an int (on a GPU a real one: the driver cannot tell a made-up number)."""
    from nbdnn.cuda import SIMULATOR
    from nbdnn.cuda.runtime.memory.arrays import stream_handle
    x = cuda.to_device(np.ones((2, 3), F32))
    if stream in ("numba", "handle"):
        s = cuda.stream()
        stream = s if stream == "numba" else 7 if SIMULATOR else stream_handle(s)
    y = nbdnn.activation(x, "relu", stream=stream)
    np.testing.assert_array_equal(y.copy_to_host(), np.ones((2, 3), F32))


def test_cast_to_none_is_refused():
    for r in both(nbdnn.cast_tensor, np.ones(3, F32), None):
        assert isinstance(r, nbdnn.BadParamError) and "cast_tensor: dtype" in str(r)


def test_coef_without_an_activation_is_refused():
    x, w = np.ones((1, 2, 4, 4), F32), np.ones((3, 2, 3, 3), F32)
    calls = {"conv2d": lambda **kw: nbdnn.conv2d(x, w, coef=0.5, **kw),
             "matmul": lambda **kw: nbdnn.matmul(np.ones((2, 3), F32), np.ones((3, 2), F32),
                                                 coef=0.5, **kw),
             "batch_norm_infer": lambda **kw: nbdnn.batch_norm_infer(
                 x, np.ones(2, F32), np.zeros(2, F32), np.zeros(2, F32), np.ones(2, F32),
                 coef=0.5, **kw)}
    for op, call in calls.items():
        for r in both(call):
            assert isinstance(r, nbdnn.BadParamError) and f"{op}: coef" in str(r), r
    y = nbdnn.conv2d(x, w, activation="leaky_relu", coef=0.5)  # (with one: taken)
    assert y.shape == (1, 3, 2, 2)


def test_an_attention_scale_past_float32_is_refused_for_float32_only():
    q = np.random.default_rng(1).random((1, 1, 2, 4))
    for r in both(nbdnn.scaled_dot_product_attention, q.astype(F32), q.astype(F32),
                  q.astype(F32), scale=1e39):
        assert isinstance(r, nbdnn.BadParamError) and "scale" in str(r) and "float32" in str(r)
    o, _ = nbdnn.scaled_dot_product_attention(q, q, q, scale=1e39)  # float64 computes it
    assert np.isfinite(o).all()


def test_the_other_byte_order_is_said_so():
    x = np.ones(4, ">f4")
    for r in both(nbdnn.activation, x, "relu"):
        assert isinstance(r, nbdnn.DtypeError) and "byte order" in str(r) and ">f4" in str(r)


def test_instance_norm_errors_name_instance_norm():
    for call, x in ((nbdnn.instance_norm, np.ones((2, 0, 3), F32)),
                    (nbdnn.instance_norm, np.ones(3, F32))):
        for r in both(call, x):
            assert isinstance(r, nbdnn.NbdnnError) and str(r).startswith("instance_norm:"), r
            assert "group" not in str(r), r
    r = both(nbdnn.instance_norm_backward, np.ones((2, 3, 4), F32), np.ones((2, 3, 4), F32),
             np.ones((2, 2), F32), np.ones((2, 2), F32))
    for e in r:
        assert isinstance(e, nbdnn.NbdnnError) and str(e).startswith("instance_norm_backward:")


def test_torch_cpu_tensors_are_named_alone_and_beside_numpy():
    torch = pytest.importorskip("torch")
    t, a = torch.ones(3), np.ones(3, F32)
    with pytest.raises(nbdnn.DeviceError, match="activation: x .* torch tensor on cpu"):
        nbdnn.activation(t, "relu")
    for args, name in (((a, t), "b"), ((t, a), "a")):
        with pytest.raises(nbdnn.DeviceError) as e:
            nbdnn.op_tensor("add", *args)
        msg = str(e.value)
        assert f"op_tensor: {name} " in msg and "torch tensor on cpu" in msg
        assert "CUDA (device) array" not in msg

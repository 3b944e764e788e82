"""What eager calls learn from each array kind in one step (cuda.runtime.arrays.facts: shape,
dtype, count, address; what an eager call plan's signature is made of), and the unary
ops' errors and results on repeated calls (their 4th and later calls replay a plan)."""
import numpy as np
import pytest

import nbdnn
from nbdnn.cuda.runtime.memory.arrays import bfloat16_bits, to_device
from nbdnn.errors import NbdnnError

CALLS = {"activation": lambda x, **kw: nbdnn.activation(x, "leaky_relu", **kw),
         "softmax": lambda x, **kw: nbdnn.softmax(x, -1, **kw)}


@pytest.mark.parametrize("name", list(CALLS))
def test_errors_unchanged(name):
    """A planned signature (five calls) and calls that differ from it still raise."""
    h = np.ones((2, 4), np.float32)
    x, y = to_device(h), to_device(h)
    for _ in range(5):
        CALLS[name](x, out=y)
    with pytest.raises(NbdnnError, match="alpha"):
        CALLS[name](x, out=y, alpha=float("nan"))
    with pytest.raises(NbdnnError, match="shape"):
        CALLS[name](x, out=to_device(np.ones((4, 2), np.float32)))
    with pytest.raises(NbdnnError):
        CALLS[name](x, out=y, backend="cpu")
    if name == "activation":
        with pytest.raises(NbdnnError, match="mode"):
            nbdnn.activation(x, "nope", out=y)
        with pytest.raises(NbdnnError, match="mode"):
            nbdnn.activation(x, ["relu"], out=y)


def test_torch_facts_dtypes_pointers_and_declines():
    torch = pytest.importorskip("torch")
    from nbdnn.cuda import SIMULATOR
    if SIMULATOR or not torch.cuda.is_available():
        pytest.skip("needs PyTorch with CUDA and a GPU")
    from nbdnn.arrays import torch_dtypes
    from nbdnn.cuda.runtime.memory.arrays import facts
    for dt, want in ((torch.float16, np.float16), (torch.float32, np.float32),
                     (torch.float64, np.float64)):
        torch_dtypes.pop(dt, None)  # the cache-miss path too
        x = torch.linspace(-1, 1, 6, dtype=dt, device="cuda").reshape(2, 3)
        shape, dtype, n, p = facts(x)
        assert (tuple(shape), dtype, n, p) == ((2, 3), np.dtype(want), 6, x.data_ptr())
        y = torch.empty_like(x)
        assert nbdnn.activation(x, "relu", out=y) is y
        assert torch.equal(y, torch.relu(x))
    assert facts(torch.ones(2, 4, device="cuda")[:, ::2]) is None
    assert facts(torch.ones(2, 4)) is None  # CPU memory: the full path says so
    with pytest.raises(NbdnnError, match="cuda"):
        nbdnn.activation(torch.ones(2, 4), out=torch.ones(2, 4))


def test_numba_facts_is_cached_per_array_and_right_for_views():
    from nbdnn.cuda import SIMULATOR
    if SIMULATOR:
        pytest.skip("real numba device arrays only")
    from nbdnn.cuda.runtime.memory.arrays import facts, ptr_size
    h = np.linspace(-1, 1, 12).astype(np.float32)
    x = to_device(h)
    base = int(x.gpu_data.device_pointer)
    assert facts(x) == ((12,), np.dtype(np.float32), 12, base)
    assert facts(x) is facts(x)  # kept on the array
    from nbdnn.arrays import describe
    assert describe("t", "x", x) == ((12,), np.dtype(np.float32), True)
    assert describe("t", "x", x) is describe("t", "x", x)
    tail = x[4:]
    assert facts(tail) == ((8,), np.dtype(np.float32), 8, base + 16)
    assert ptr_size(tail) == (base + 16, 8)
    assert facts(x.reshape(3, 4)[:, ::2]) is None
    assert facts(to_device(np.zeros(0, np.float32)))[2:] == (0, 0)
    y = to_device(np.zeros(8, np.float32))
    nbdnn.activation(tail, "relu", out=y)
    np.testing.assert_array_equal(y.copy_to_host(), np.maximum(h[4:], 0))


@pytest.mark.parametrize("shape,axis,kernel", [
    ((3, 5), -1, None), ((4, 8), -1, "rows_block"), ((2, 12), -1, "fused"),
    ((2, 40), -1, "long"), ((3, 4, 2), 1, None), ((0, 4), -1, None)])
def test_softmax_every_path_repeated(monkeypatch, shape, axis, kernel):
    """Every softmax kernel path called five times (the last two replay a plan), with
    out= holding stale values. (The path is made the choice, not forced: forced() keeps
    plans out.)"""
    from nbdnn.cuda import softmax as S
    path = S._path  # the module's own chooser, wrapped for this test
    monkeypatch.setattr(S, "_path", lambda outer, L, inner, backward, force, wide=False:
                        path(outer, L, inner, backward, kernel, wide))
    monkeypatch.setattr(S, "_CHOICES", {})
    rng = np.random.default_rng(1)
    h = rng.standard_normal(shape).astype(np.float32)
    want = nbdnn.softmax(h.astype(np.float64), axis, algo="log")
    x = to_device(h)
    for _ in range(5):
        y = to_device(np.full_like(h, 7.0))
        assert nbdnn.softmax(x, axis, algo="log", out=y) is y
        np.testing.assert_allclose(y.copy_to_host(), want, rtol=1e-5, atol=1e-5)


def test_numba_facts_logic_on_a_stand_in():
    """_numba_facts on an object shaped like a DeviceNDArray (the real one needs a GPU;
    test_numba_facts_is_cached_per_array_and_right_for_views runs it there)."""
    from nbdnn.cuda.runtime.memory.arrays import _numba_facts

    class Pointer:
        device_pointer_value = 4096

    class Array:
        reads = 0

        def __init__(self, shape, contiguous):
            self.shape, self.dtype, self.size = shape, np.dtype(np.float32), int(np.prod(shape))
            self.gpu_data, self.contiguous = Pointer(), contiguous

        def is_c_contiguous(self):
            Array.reads += 1
            return self.contiguous

    a = Array((2, 3), True)
    assert _numba_facts(a) == (((2, 3), np.dtype(np.float32), 6, 4096), (4096, 6))
    assert _numba_facts(a) is _numba_facts(a) and Array.reads == 1
    assert _numba_facts(Array((2, 3), False)) == (None, (4096, 6))
    assert _numba_facts(Array((0, 3), True))[1] == (0, 0)  # no memory behind it


@pytest.mark.parametrize("name", list(CALLS))
def test_a_new_output_each_call(name):
    """Without out= (as nbdnn.nn's layers call them) every call, planned or not,
    returns a new array like x."""
    h = np.linspace(-2, 2, 15, dtype=np.float32).reshape(3, 5)
    x, want = to_device(h), CALLS[name](h.astype(np.float64))
    results = [CALLS[name](x) for _ in range(5)]
    assert len({id(r) for r in results}) == 5
    for got in results:
        assert type(got) is type(x) and got.shape == (3, 5)
        np.testing.assert_allclose(got.copy_to_host(), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(NbdnnError, match="beta"):
        CALLS[name](x, beta=1.0)


@pytest.mark.parametrize("shape", [(), (1,), (2, 3)])
def test_bfloat16_bits_keep_the_shape(shape):
    """bfloat16 reaches the GPU as a torch tensor of its bits: a 0-d array stays 0-d (a
    (1,) result broke reduce_tensor to () and the 0-d tensor ops on the H200), a
    reversed view comes out C-contiguous with its values."""
    import ml_dtypes
    a = np.arange(1, 1 + int(np.prod(shape)), dtype=np.float32).reshape(shape)
    b = a.astype(ml_dtypes.bfloat16)
    b = b[::-1] if b.ndim else b
    bits = bfloat16_bits(b)
    assert bits.shape == shape and bits.dtype == np.int16 and bits.flags.c_contiguous
    assert np.array_equal(bits.view(ml_dtypes.bfloat16).astype(np.float32), b.astype(np.float32))

"""The eager fast lane of unary ops (ops._common.cuda_pair): taken only where the full
path would accept the call unchanged, with the same result; every other call goes
the full path and raises its errors."""
import numpy as np
import pytest

import nbdnn
from nbdnn.cuda._arrays import ptr, to_device
from nbdnn.errors import NbdnnError
from nbdnn.ops import _common, activation as op_act, softmax as op_softmax

CALLS = {"activation": lambda x, **kw: nbdnn.activation(x, "leaky_relu", **kw),
         "softmax": lambda x, **kw: nbdnn.softmax(x, -1, **kw)}
MODULES = {"activation": op_act, "softmax": op_softmax}


def _no_full_path(monkeypatch, name):
    def refuse(*a, **k):
        raise AssertionError("the full path ran")
    monkeypatch.setattr(MODULES[name], "Call", refuse)


@pytest.mark.parametrize("name", list(CALLS))
def test_fast_lane_matches_the_reference(monkeypatch, name):
    rng = np.random.default_rng(0)
    h = rng.standard_normal((3, 5)).astype(np.float32)
    want = CALLS[name](h.astype(np.float64), alpha=2.0)
    x, y = to_device(h), to_device(np.zeros_like(h))
    CALLS[name](x, out=y)  # the first call of a type fills the describers: full path
    _no_full_path(monkeypatch, name)
    got = CALLS[name](x, out=y, alpha=2.0)
    assert got is y
    np.testing.assert_allclose(y.copy_to_host(), want, rtol=1e-5, atol=1e-6)


def test_pair_declines_all_but_the_common_case():
    h = np.ones((2, 4), np.float32)
    x, y = to_device(h), to_device(h)
    nbdnn.activation(x, out=y)
    assert _common.cuda_pair(x, y, None, None) == ((2, 4), np.dtype(np.float32), 8,
                                                   ptr(x), ptr(y), y)
    assert _common.cuda_pair(x, y, "cuda", None) is not None
    new = _common.cuda_pair(x, None, None, None)  # out=None: a new array like x
    assert new[:4] == ((2, 4), np.dtype(np.float32), 8, ptr(x))
    assert new[5].shape == (2, 4) and new[4] == ptr(new[5]) and type(new[5]) is type(x)
    declined = [(x, y, "cpu", None), (x, y, None, 0),
                (x, to_device(np.ones((4, 2), np.float32)), None, None),
                (x, to_device(np.ones((2, 4), np.float64)), None, None),
                (x, to_device(np.ones((2, 8), np.float32))[:, ::2], None, None),
                (x, h, None, None), (h, h.copy(), None, None),
                (to_device(np.ones((2, 4), np.int32)), to_device(np.ones((2, 4), np.int32)),
                 None, None)]
    for args in declined:
        assert _common.cuda_pair(*args) is None


@pytest.mark.parametrize("name", list(CALLS))
def test_errors_unchanged(name):
    h = np.ones((2, 4), np.float32)
    x, y = to_device(h), to_device(h)
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


def test_torch_lane_dtypes_pointers_and_declines():
    torch = pytest.importorskip("torch")
    from nbdnn.cuda import SIMULATOR
    if SIMULATOR or not torch.cuda.is_available():
        pytest.skip("needs PyTorch with CUDA and a GPU")
    from nbdnn.backend import _torch_dtypes
    from nbdnn.cuda._arrays import lane
    for dt, want in ((torch.float16, np.float16), (torch.float32, np.float32),
                     (torch.float64, np.float64)):
        _torch_dtypes.pop(dt, None)  # the cache-miss path too
        x = torch.linspace(-1, 1, 6, dtype=dt, device="cuda").reshape(2, 3)
        shape, dtype, n, p = lane(x)
        assert (tuple(shape), dtype, n, p) == ((2, 3), np.dtype(want), 6, x.data_ptr())
        y = torch.empty_like(x)
        assert nbdnn.activation(x, "relu", out=y) is y
        assert torch.equal(y, torch.relu(x))
    assert lane(torch.ones(2, 4, device="cuda")[:, ::2]) is None
    assert lane(torch.ones(2, 4)) is None  # CPU memory: the full path says so
    with pytest.raises(NbdnnError, match="cuda"):
        nbdnn.activation(torch.ones(2, 4), out=torch.ones(2, 4))


def test_numba_lane_is_cached_per_array_and_right_for_views():
    from nbdnn.cuda import SIMULATOR
    if SIMULATOR:
        pytest.skip("real numba device arrays only")
    from nbdnn.cuda._arrays import lane, ptr_size
    h = np.linspace(-1, 1, 12).astype(np.float32)
    x = to_device(h)
    base = int(x.gpu_data.device_pointer)
    assert lane(x) == ((12,), np.dtype(np.float32), 12, base)
    assert lane(x) is lane(x)  # kept on the array
    from nbdnn.backend import describe
    assert describe("t", "x", x) == ((12,), np.dtype(np.float32), True)
    assert describe("t", "x", x) is describe("t", "x", x)
    tail = x[4:]
    assert lane(tail) == ((8,), np.dtype(np.float32), 8, base + 16)
    assert ptr_size(tail) == (base + 16, 8)
    assert lane(x.reshape(3, 4)[:, ::2]) is None
    assert lane(to_device(np.zeros(0, np.float32)))[2:] == (0, 0)
    y = to_device(np.zeros(8, np.float32))
    nbdnn.activation(tail, "relu", out=y)
    np.testing.assert_array_equal(y.copy_to_host(), np.maximum(h[4:], 0))


@pytest.mark.parametrize("shape,axis,kernel", [
    ((3, 5), -1, None), ((4, 8), -1, "rows_block"), ((2, 12), -1, "fused"),
    ((2, 40), -1, "long"), ((3, 4, 2), 1, None), ((0, 4), -1, None)])
def test_softmax_lane_on_every_path(monkeypatch, shape, axis, kernel):
    """Every path through the lane's cached plan: one-kernel paths launch from it, the
    others (long, strided, empty) go through _run; each twice (the second from the
    cache), with out= holding stale values."""
    rng = np.random.default_rng(1)
    h = rng.standard_normal(shape).astype(np.float32)
    want = nbdnn.softmax(h.astype(np.float64), axis, algo="log")
    x = to_device(h)
    nbdnn.softmax(x, axis, out=to_device(np.zeros_like(h)))  # fills the describers
    _no_full_path(monkeypatch, "softmax")
    for _ in range(2):
        y = to_device(np.full_like(h, 7.0))
        assert nbdnn.softmax(x, axis, algo="log", out=y, _kernel=kernel) is y
        np.testing.assert_allclose(y.copy_to_host(), want, rtol=1e-5, atol=1e-5)


def test_numba_facts_logic_on_a_stand_in():
    """_numba_facts on an object shaped like a DeviceNDArray (the real one needs a GPU;
    test_numba_lane_is_cached_per_array_and_right_for_views runs it there)."""
    from nbdnn.cuda._arrays import _numba_facts

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
def test_fast_lane_allocates_a_new_output(monkeypatch, name):
    """Without out= (as nbdnn.nn's layers call them) the lane allocates the result like
    x and still skips the full path."""
    h = np.linspace(-2, 2, 15, dtype=np.float32).reshape(3, 5)
    x, want = to_device(h), CALLS[name](h.astype(np.float64))
    CALLS[name](x)
    _no_full_path(monkeypatch, name)
    got = CALLS[name](x)
    assert type(got) is type(x) and got.shape == (3, 5)
    np.testing.assert_allclose(got.copy_to_host(), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(NbdnnError, match="beta"):
        CALLS[name](x, beta=1.0)

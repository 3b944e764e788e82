"""Several GPUs (issue 27): a call runs on the device holding its arrays and leaves the
caller's current device as it was; arrays on two devices are a DeviceError naming
both; eager call plans, workspaces, cached device tables and graphs belong to one
device. The simulator and a one-GPU machine have one device, so these tests give
nbdnn.cuda.runtime.device a second one by hand: arrays carry the ordinal a test gives
them (`ON`), `current()` is what the test says, and `on(i)` records its switches (and
runs the block on the one real device). The real thing runs on nvidia-h200-x2."""
import contextlib

import numpy as np
import pytest

import nbdnn
from nbdnn import backend as _backend
from nbdnn.cuda import Graph, cuda
from nbdnn.cuda.runtime import device
from nbdnn.errors import DeviceError
from nbdnn.ops import _plan

ON = {}  # id(array) -> the device ordinal the test says holds it


@pytest.fixture
def two_devices(monkeypatch):
    """Two visible devices, device 0 current; `switches` lists every on(i) entered."""
    switches, state = [], {"current": 0}

    @contextlib.contextmanager
    def on(ordinal):
        if ordinal is None or ordinal == state["current"]:
            yield
            return
        switches.append(ordinal)
        before, state["current"] = state["current"], ordinal
        try:
            yield
        finally:
            state["current"] = before
    from nbdnn.cuda.runtime.memory import arrays
    made, alloc = arrays.to_device, arrays.allocate

    def tagged(make):  # arrays made while device i is (fakely) current are on device i
        def fn(*args, **kw):
            a = make(*args, **kw)
            ON[id(a)] = state["current"]
            return a
        return fn
    monkeypatch.setattr(arrays, "to_device", tagged(made))
    monkeypatch.setattr(arrays, "allocate", tagged(alloc))
    monkeypatch.setattr(device, "_count", [2])
    monkeypatch.setattr(device, "current", lambda: state["current"])
    monkeypatch.setattr(device, "of", lambda x: ON.get(id(x), 0))
    monkeypatch.setattr(device, "on", on)
    monkeypatch.setattr(_backend, "_SEVERAL", [True])
    _plan.clear()
    ON.clear()
    yield switches, state
    ON.clear()
    _plan.clear()


def _put(a, ordinal):
    d = cuda.to_device(np.asarray(a))
    ON[id(d)] = ordinal
    return d


def test_a_call_runs_on_its_arrays_device_and_comes_back(two_devices):
    """Arrays on cuda:1 with cuda:0 current: the call runs inside on(1), every call
    again (no plan learned for another device's arrays), and cuda:0 is current after."""
    switches, state = two_devices
    x = np.linspace(-2, 2, 64, dtype=np.float32)
    dx = _put(x, 1)
    for _ in range(5):
        y = nbdnn.activation(dx, "relu")
        np.testing.assert_array_equal(y.copy_to_host(), np.maximum(x, 0))
    assert switches == [1] * 5 and state["current"] == 0
    assert not _plan.plans_of_this_thread()  # (plans: calls on the current device only)


def test_arrays_on_two_devices_are_a_device_error(two_devices):
    x = _put(np.ones(8, np.float32), 0)
    out = _put(np.empty(8, np.float32), 1)
    with pytest.raises(DeviceError, match=r"x is on cuda:0 but out is on cuda:1"):
        nbdnn.activation(x, "relu", out=out)
    a, b = _put(np.ones((4, 4), np.float32), 1), _put(np.ones((4, 4), np.float32), 0)
    with pytest.raises(DeviceError, match=r"on cuda:1 but .* on cuda:0"):
        nbdnn.matmul(a, b)


def test_plans_are_kept_per_device(two_devices):
    """The same signature on the current device: planned, its key naming the device;
    after the current device changes, the same call learns a plan of its own."""
    switches, state = two_devices
    x = np.arange(16, dtype=np.float32) - 8
    for current in (0, 1):
        state["current"] = current
        for _ in range(5):
            y = nbdnn.activation(_put(x, current), "relu")
        np.testing.assert_array_equal(y.copy_to_host(), np.maximum(x, 0))
    keys = list(_plan.plans_of_this_thread())
    assert sorted(k[-1] for k in keys) == [0, 1] and not switches


def test_device_tables_and_workspaces_are_per_device(two_devices):
    from nbdnn.cuda.matmul import batches
    from nbdnn.cuda.runtime.capture.plan_record import workspace
    switches, state = two_devices
    t0 = batches.table((2,), (1,), (2,))
    state["current"] = 1
    t1 = batches.table((2,), (1,), (2,))
    assert t1 is not t0 and batches.table((2,), (1,), (2,)) is t1
    like = cuda.to_device(np.zeros(1, np.float32))
    w1 = workspace.get(like, 64)
    state["current"] = 0
    assert workspace.nbytes == 0 and workspace.get(like, 64) is not w1


def test_a_graph_is_one_devices(two_devices):
    """A graph takes its first launch's device; a call on another inside the same
    capture is a DeviceError."""
    x0 = _put(np.ones(32, np.float32), 0)
    x1 = _put(np.ones(32, np.float32), 1)
    nbdnn.activation(x0, "relu"), nbdnn.activation(x1, "relu")  # (JIT outside)
    g = Graph()
    with pytest.raises(DeviceError, match=r"capturing on cuda:0; a call on cuda:1"):
        with g.capture():
            nbdnn.activation(x0, "relu")
            nbdnn.activation(x1, "relu")
    with g.capture():
        nbdnn.activation(x1, "relu")
    assert g.device == 1


def test_nn_model_moves_to_a_device_and_runs_there(two_devices):
    """nbdnn.nn: model.to("cuda:1") puts every parameter on device 1; its eager steps
    and its planned (graphed) step run there with cuda:0 current, and give the CPU
    model's answers; "cuda:2" (not visible) and other names are refused."""
    from nbdnn import nn
    switches, state = two_devices

    def net():
        return nn.Sequential([nn.Linear(6, 5, seed=0), nn.ReLU(), nn.Linear(5, 3, seed=1)])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    onehot = np.eye(3, dtype=np.float32)[[0, 2, 1, 0]]
    cpu, gpu = net(), net().to("cuda:1")
    assert all(ON[id(m.params[k])] == 1 for m, k in gpu.parameters())
    assert nn.device_of(gpu.parameters()[0][0].params["w"]) == "cuda:1"
    want = cpu.forward(x)
    got = gpu.forward(nn.move(x, "cuda:1"))
    np.testing.assert_allclose(got.copy_to_host(), want, rtol=1e-5, atol=1e-6)
    assert state["current"] == 0 and set(switches) == {1}
    losses = []
    for model in (cpu, gpu):
        steps = nn.GraphedSteps(model, 4, (6,), loss=nn.CrossEntropyLoss(),
                                optimizer=nn.SGD(model, lr=0.1, momentum=0.9))
        losses.append([float(np.asarray(nn.move(steps.step(x, onehot), "cpu")).ravel()[0])
                       for _ in range(3)])
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
    assert steps._graphs["step"].device == 1
    with pytest.raises(DeviceError, match="cuda:2 is not a visible device"):
        net().to("cuda:2")
    with pytest.raises(nbdnn.BadParamError, match="'cpu', 'cuda' or 'cuda:N'"):
        net().to("gpu")


def test_one_device_asks_nothing():
    """With one visible device (this machine under the simulator, or one GPU) the
    device functions are constants and calls never look for their arrays' device."""
    if device.count() != 1:
        pytest.skip("more than one device visible")
    x = cuda.to_device(np.ones(4, np.float32))
    assert device.current() == 0 and device.key() is None and device.of(x) == 0
    assert not _backend.several_devices()
    with device.on(0):
        assert device.current() == 0


@pytest.mark.skipif(__import__("nbdnn.cuda", fromlist=["SIMULATOR"]).SIMULATOR,
                    reason="the driver's answers: a real GPU")
def test_real_device_queries_on_one_gpu(monkeypatch):
    """The multi-device code paths against the driver with the one GPU there is
    (counted as two): each array kind's device (torch's get_device, CuPy's device id,
    the driver's pointer attribute for numba's arrays), the current device, on(0), and
    an op call and a plan that find their arrays' device."""
    monkeypatch.setattr(device, "_count", [2])
    monkeypatch.setattr(device, "_of", {})
    monkeypatch.setattr(_backend, "_SEVERAL", [True])
    _plan.clear()
    x = np.linspace(-1, 1, 256, dtype=np.float32)
    arrays = [cuda.to_device(x)]
    for mod in ("torch", "cupy"):
        try:
            m = __import__(mod)
        except ImportError:
            continue
        arrays.append(m.asarray(x, device="cuda") if mod == "torch" else m.asarray(x))
    assert device.current() == 0 and device.key() == 0
    for a in arrays:
        assert device.of(a) == 0, type(a)
        with device.on(0):
            for _ in range(5):  # (the 4th and 5th replay a plan keyed by device 0)
                y = nbdnn.activation(a, "relu")
        got = y.copy_to_host() if hasattr(y, "copy_to_host") else np.asarray(
            y.cpu() if hasattr(y, "cpu") else y.get())
        np.testing.assert_array_equal(got, np.maximum(x, 0))
    assert all(k[-1] == 0 for k in _plan.plans_of_this_thread())
    _plan.clear()

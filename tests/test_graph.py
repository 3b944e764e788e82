"""nbdnn.cuda.Graph: replays equal eager calls bit for bit, see new input data, keep
their buffers alive; capture errors are clean and leave nothing behind. The same tests
run in the simulator (replay re-runs the recorded launches) and on the GPU (one CUDA
graph)."""
import gc
import weakref

import numpy as np
import pytest

import nbdnn
from nbdnn import nn

cuda_pkg = pytest.importorskip("nbdnn.cuda")
from nbdnn.cuda import Graph
from nbdnn.cuda.runtime.launch import kernel as _launch  # noqa: E402
from numba import cuda  # noqa: E402


def _dev(a):
    return cuda.to_device(np.ascontiguousarray(a))


def _host(a):
    return a.copy_to_host()


def _pipeline(x, w, b, w2, y, logits):
    """conv + bias + relu into y, then a linear layer into logits: three kernels."""
    nbdnn.conv2d(x, w, b, padding=1, activation="relu", out=y)
    nbdnn.matmul(y.reshape(y.shape[0], -1), w2, trans_b=True, out=logits)
    return nbdnn.scale_tensor(logits, 0.5)  # a result allocated inside the capture


def _inputs(rng, n=2, c=2, k=3, hw=4):
    return (rng.standard_normal((n, c, hw, hw)).astype(np.float32),
            rng.standard_normal((k, c, 3, 3)).astype(np.float32),
            rng.standard_normal(k).astype(np.float32),
            rng.standard_normal((5, k * hw * hw)).astype(np.float32))


def test_replay_matches_eager_and_reads_new_inputs():
    rng = np.random.default_rng(0)
    x0, w, b, w2 = _inputs(rng)
    x, wd, bd, w2d = map(_dev, (x0, w, b, w2))
    y, logits = cuda.device_array((2, 3, 4, 4), np.float32), cuda.device_array((2, 5), np.float32)
    g = Graph()
    with g.capture():
        half = _pipeline(x, wd, bd, w2d, y, logits)
    assert len(g) >= 3 and len(g.kernels) == len(g)
    first = _host(half)
    for trial in range(2):
        x1 = rng.standard_normal(x0.shape).astype(np.float32)
        x.copy_to_device(x1)
        g.replay()
        cuda.synchronize()
        ey, elog = cuda.device_array_like(y), cuda.device_array_like(logits)
        expect = _pipeline(_dev(x1), wd, bd, w2d, ey, elog)
        np.testing.assert_array_equal(_host(half), _host(expect))
        np.testing.assert_array_equal(_host(y), _host(ey))
        assert not np.array_equal(_host(half), first)


def test_graph_keeps_buffers_alive():
    rng = np.random.default_rng(1)
    x = _dev(rng.standard_normal((3, 8)).astype(np.float32))
    g = Graph()
    with g.capture():
        t = nbdnn.activation(x, "relu")          # only the graph holds t afterwards
        out = nbdnn.scale_tensor(t, 2.0)
    ref = weakref.ref(t)
    del t
    gc.collect()
    assert ref() is not None
    x.copy_to_device(-np.abs(rng.standard_normal((3, 8))).astype(np.float32) - 1)
    g.replay()
    np.testing.assert_array_equal(_host(out), 0)
    g.reset()
    gc.collect()
    assert ref() is None


def test_numpy_input_inside_capture_is_refused_and_recoverable():
    x = _dev(np.ones((2, 4), np.float32))
    g = Graph()
    with pytest.raises(nbdnn.NotSupportedError, match="x is a NumPy array"):
        with g.capture():
            nbdnn.activation(np.ones((2, 4), np.float32), "relu", backend="cuda")
    assert _launch.recording() is None and len(g) == 0
    with g.capture():  # the same graph captures again, and the context still works
        y = nbdnn.activation(x, "sigmoid")
    g.replay()
    np.testing.assert_allclose(_host(y), 1 / (1 + np.exp(-1)), rtol=1e-6)


def test_error_in_body_leaves_no_graph_and_stops_recording():
    x = _dev(np.ones(4, np.float32))
    g = Graph()
    with pytest.raises(nbdnn.BadParamError):
        with g.capture():
            nbdnn.activation(x, "relu")
            nbdnn.activation(x, "no_such_mode")
    assert len(g) == 0 and _launch.recording() is None
    nbdnn.activation(x, "relu")  # eager again, not recorded anywhere
    assert len(g) == 0
    g.replay()  # an empty graph replays nothing


def test_captures_do_not_nest_and_replay_not_inside_capture():
    g, h = Graph(), Graph()
    with g.capture():
        with pytest.raises(nbdnn.NotSupportedError, match="do not nest"):
            with h.capture():
                pass
        with pytest.raises(nbdnn.NotSupportedError):
            g.replay()


def test_strided_input_is_gathered_again_on_replay():
    base = _dev(np.arange(24, dtype=np.float32).reshape(4, 6))
    view = base[:, ::2]
    g = Graph()
    with g.capture():
        y = nbdnn.scale_tensor(view, 1.0)
    base.copy_to_device(-np.arange(24, dtype=np.float32).reshape(4, 6))
    g.replay()
    np.testing.assert_array_equal(_host(y), -np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2])


def test_dropout_counter_draws_fresh_masks_on_replay():
    ones = np.ones((4, 8), np.float32)
    x, counter = _dev(ones), _dev(np.zeros(1, np.uint64))
    g = Graph()
    with g.capture():
        y, m = nbdnn.dropout(x, 0.5, seed=3, offset=counter)
    masks = [_host(m)]
    for _ in range(2):
        g.replay()
        masks.append(_host(m))
    for k, mk in enumerate(masks):
        np.testing.assert_array_equal(mk, nbdnn.dropout(ones, 0.5, seed=3, offset=32 * k)[1])
    assert int(_host(counter)[0]) == 96


def _small_net(seed):
    # (2, 2, 2, 2) images; two input channels keep the conv off the depthwise kernels,
    # whose filter gradient takes seconds in the simulator
    return nn.Sequential([nn.Conv2d(2, 4, 3, padding=1, seed=seed), nn.BatchNorm2d(4),
                          nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(4, 3, seed=seed + 1)])


def test_captured_training_step_equals_eager_steps():
    rng = np.random.default_rng(2)
    batches = [(rng.standard_normal((2, 2, 2, 2)).astype(np.float32),
                np.eye(3, dtype=np.float32)[rng.integers(0, 3, 2)]) for _ in range(3)]
    eager = _small_net(0).to("cuda")
    e_loss, e_opt = nn.CrossEntropyLoss(), nn.SGD(eager, 0.1, momentum=0.9)
    eager_losses = [float(_host(nn.train_step(eager, e_loss, e_opt, _dev(x), _dev(t))))
                    for x, t in batches]

    model = _small_net(0).to("cuda")
    loss_fn, opt = nn.CrossEntropyLoss(), nn.SGD(model, 0.1, momentum=0.9)
    xb, tb = _dev(batches[0][0]), _dev(batches[0][1])
    losses = [float(_host(nn.train_step(model, loss_fn, opt, xb, tb)))]  # makes velocities
    g = Graph()
    xb.copy_to_device(batches[1][0])
    tb.copy_to_device(batches[1][1])
    with g.capture():  # step 2 runs while it is recorded
        loss = nn.train_step(model, loss_fn, opt, xb, tb)
    losses.append(float(_host(loss)))
    for x, t in batches[2:]:
        xb.copy_to_device(x)
        tb.copy_to_device(t)
        g.replay()
        losses.append(float(_host(loss)))
    assert losses == eager_losses
    for (la, na), (lb, nb) in zip(eager.parameters(), model.parameters()):
        np.testing.assert_array_equal(_host(la.params[na]), _host(lb.params[nb]))


def test_captured_adam_step_corrects_by_the_replays_t():
    """Adam's bias correction advances on the device: replays equal eager steps."""
    rng = np.random.default_rng(5)
    batches = [(rng.standard_normal((4, 6)).astype(np.float32),
                np.eye(3, dtype=np.float32)[rng.integers(0, 3, 4)]) for _ in range(4)]

    def make():
        model = nn.Sequential([nn.Linear(6, 3, seed=4)]).to("cuda")
        return model, nn.CrossEntropyLoss(), nn.Adam(model, 0.05)
    eager, e_loss, e_opt = make()
    want = [float(_host(nn.train_step(eager, e_loss, e_opt, _dev(x), _dev(t))))
            for x, t in batches]
    model, loss_fn, opt = make()
    xb, tb = _dev(batches[0][0]), _dev(batches[0][1])
    got = [float(_host(nn.train_step(model, loss_fn, opt, xb, tb)))]
    g = Graph()
    for i, (x, t) in enumerate(batches[1:]):
        xb.copy_to_device(x)
        tb.copy_to_device(t)
        if i == 0:
            with g.capture():
                loss = nn.train_step(model, loss_fn, opt, xb, tb)
        else:
            g.replay()
        got.append(float(_host(loss)))
    assert got == want
    np.testing.assert_array_equal(_host(eager.seq[0].params["w"]), _host(model.seq[0].params["w"]))


def test_torch_cuda_graph_captures_nbdnn_calls_on_its_stream():
    """The PyTorch interop the docs describe: warm up, then nbdnn calls given
    stream=torch.cuda.current_stream() inside torch.cuda.graph are in torch's graph
    (a result allocated there comes from torch's graph pool)."""
    torch = pytest.importorskip("torch")
    if cuda_pkg.SIMULATOR or not torch.cuda.is_available():
        pytest.skip("needs a GPU and PyTorch with CUDA")
    x = torch.randn(4, 8, device="cuda")
    y = torch.empty_like(x)

    def calls():
        s = torch.cuda.current_stream()
        nbdnn.activation(x, "relu", out=y, stream=s)
        return nbdnn.scale_tensor(y, 2.0, stream=s)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        calls()  # warm-up: JIT and module loads, which a capture forbids
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        z = calls()
    x.copy_(torch.randn(4, 8, device="cuda"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(z, 2 * torch.relu(x))

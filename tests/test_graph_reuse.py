"""Buffer reuse in a captured graph (nbdnn/cuda/runtime/memory/reuse.py): the plan shares
memory only between allocations whose traced lifetimes do not meet and never shares
what the caller keeps; a captured training step on the plan gives the plain step's
losses and weights bit for bit in less memory; calls that do not repeat their traced
run are refused."""
import numpy as np
import pytest

import nbdnn
from nbdnn import nn
from nbdnn.cuda import SIMULATOR, Graph
from nbdnn.cuda.runtime.memory import reuse
from nbdnn.cuda.runtime.memory.arrays import to_device


def _calls(x, chain):
    """y_k = scale(y_{k-1}) for each k in chain (one allocation and one launch each;
    chain[k] = j: that call reads y_j instead, stretching y_j's life)."""
    ys = [x]
    for j in chain:
        ys.append(nbdnn.scale_tensor(ys[j], 2.0))
    return ys[-1]


def test_plan_shares_only_what_lifetimes_allow():
    x = to_device(np.ones(1000, np.float32))
    with reuse.Trace() as trace:  # a chain y1..y6: each buffer dead after the next call
        out = _calls(x, [0, 1, 2, 3, 4, 5])
    entries = [list(e) for e in trace.entries]
    arena = trace.plan(keep=[out])
    # y_k: written by launch k - 1, read by launch k (the last one only written)
    assert [e[4:] for e in entries] == [[k, k + 1] for k in range(5)] + [[5, 5]]
    size = -(-4000 // reuse.ALIGN) * reuse.ALIGN
    offs = [p[5] for p in arena.placed]
    assert arena.nbytes == 2 * size  # a chain needs two buffers at a time
    for i in range(5):  # neighbours are alive together, so never share
        assert offs[i] != offs[i + 1]
    assert arena.placed[-1][4] == float("inf")  # the kept result is never freed
    with reuse.Trace() as trace:  # y1 read again by the last call: alive to the end
        _calls(x, [0, 1, 2, 3, 4, 1])
    arena = trace.plan()
    offs = [p[5] for p in arena.placed]
    assert all(offs[0] != o for o in offs[1:]) and arena.nbytes == 3 * size


def test_capture_on_the_plan_replays_right():
    x = to_device(np.arange(1000, dtype=np.float32))
    with reuse.Trace() as trace:
        _calls(x, [0, 1, 2, 3, 4, 5])
    g = Graph()
    with g.capture(trace.plan(keep=[])) as _:
        out = _calls(x, [0, 1, 2, 3, 4, 5])
    x.copy_to_device(np.full(1000, 3, np.float32))
    g.replay()
    np.testing.assert_array_equal(out.copy_to_host(), np.full(1000, 3 * 64, np.float32))


def test_calls_that_do_not_repeat_are_refused():
    x = to_device(np.ones(256, np.float32))
    with reuse.Trace() as trace:
        _calls(x, [0, 1, 2])
    with pytest.raises(nbdnn.NbdnnError, match="traced"):  # another size allocated
        with Graph().capture(trace.plan()):
            nbdnn.scale_tensor(to_device(np.ones(8, np.float32)), 2.0)
            nbdnn.scale_tensor(x, 2.0)
    with reuse.Trace() as trace:
        _calls(x, [0, 1, 2])
    with pytest.raises(nbdnn.NbdnnError, match="lifetime"):  # y1 read after its last use
        with Graph().capture(trace.plan()):
            _calls(x, [0, 1, 1])
    with reuse.Trace() as trace:
        _calls(x, [0, 1])
    with pytest.raises(nbdnn.NbdnnError, match="differ"):  # fewer calls than traced
        with Graph().capture(trace.plan()):
            _calls(x, [0])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the simulator's NumPy scalars
def test_graphed_step_with_reuse_equals_plain_steps():
    """Four training steps (eager, traced, captured, replayed) of a conv / batch-norm
    / dropout / pool / linear model: reuse off and on give the same losses and weights
    (the same kernels on other addresses), the arena smaller than the traced step's
    allocations."""
    rng = np.random.default_rng(2)
    xs = rng.standard_normal((4, 2, 2, 4, 4)).astype(np.float32)
    ts = np.eye(3, dtype=np.float32)[rng.integers(0, 3, (4, 2))]

    def run(reuse_on):
        m = nn.Sequential([nn.Conv2d(2, 2, 3, padding=1, seed=3), nn.BatchNorm2d(2),
                           nn.ReLU(), nn.Dropout(0.25, seed=4), nn.MaxPool2d(2),
                           nn.Flatten(), nn.Linear(8, 3, seed=5)]).to("cuda")
        steps = nn.GraphedSteps(m, 2, (2, 4, 4), loss=nn.CrossEntropyLoss(),
                                optimizer=nn.SGD(m, 0.1, momentum=0.9), reuse=reuse_on)
        losses = [float(nn.move(steps.step(x, t), "cpu").reshape(())) for x, t in zip(xs, ts)]
        return losses, [nn.move(v, "cpu") for v in m.state().values()], steps

    plain, w_plain, _ = run(False)
    got, w_got, steps = run(True)
    assert got == plain
    for a, b in zip(w_plain, w_got):
        np.testing.assert_array_equal(a, b)
    assert "step" in steps._graphs and 0 < steps.arena_bytes < steps.traced_bytes


@pytest.mark.skipif(SIMULATOR, reason="the tensor-core paths need a GPU")
def test_bf16_channels_last_step_with_reuse_on_the_gpu():
    """A bf16 channels-last model's planned step (the tensor-core convolutions and
    GEMMs, whose operands a launch reads through tensor maps, batch norm's columns
    kernels, split-K workspaces): reuse off and on, the same losses bit for bit."""
    pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    xs = rng.standard_normal((5, 16, 14, 14, 16)).astype(np.float32)
    ts = np.eye(10, dtype=np.float32)[rng.integers(0, 10, (5, 16))]

    def run(reuse_on):
        m = nn.Sequential([nn.Conv2d(16, 64, 3, padding=1, seed=1, layout="NHWC"),
                           nn.BatchNorm2d(64, layout="NHWC"), nn.ReLU(),
                           nn.Conv2d(64, 128, 1, seed=2, layout="NHWC"),
                           nn.BatchNorm2d(128, layout="NHWC"), nn.ReLU(),
                           nn.GlobalAvgPool2d(layout="NHWC"), nn.Flatten(),
                           nn.Linear(128, 10, seed=3)]).to("cuda")
        steps = m.plan(16, (14, 14, 16), loss=nn.CrossEntropyLoss(),
                       optimizer=nn.SGD(m, 0.05, momentum=0.9), precision="bf16",
                       reuse=reuse_on)
        import torch
        return [float(torch.as_tensor(steps.step(torch.from_numpy(x).cuda().bfloat16(),
                                                 torch.from_numpy(t).cuda())).float()
                      .reshape(-1)[0]) for x, t in zip(xs, ts)], steps

    plain, _ = run(False)
    got, steps = run(True)
    assert got == plain
    assert 0 < steps.arena_bytes < steps.traced_bytes

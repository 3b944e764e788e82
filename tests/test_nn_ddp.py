"""nbdnn.nn's data-parallel training step (issue 27): two processes over gloo on the CPU
backend (float64), each its half of the batch, GradientAllReduce averaging the
gradients (each layer's started as its backward ends), give after a few SGD steps the
parameters one process gets on the whole batch; rank 1 starts from other weights and
the broadcast makes them rank 0's. train_step and GraphedSteps (eager on the CPU) both.
NCCL and CUDA graphs run on the two-GPU machine (perf/ddp.py,
examples/ddp_resnet.py)."""

import datetime
import os
import traceback

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import nbdnn  # noqa: E402
from nbdnn import nn  # noqa: E402
from nbdnn.cuda import SIMULATOR  # noqa: E402

STEPS, BATCH = 3, 8


def _net(seed=0):
    return nn.Sequential([nn.Conv2d(3, 4, 3, padding=1, seed=seed, dtype=np.float64), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(4 * 4 * 4, 5, seed=seed + 1, dtype=np.float64)])


def _batch():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((BATCH, 3, 8, 8))
    return x, np.eye(5)[rng.integers(0, 5, BATCH)]


def _train(model, x, onehot, sync, graphed):
    loss, opt = nn.CrossEntropyLoss(), nn.SGD(model, 0.1, momentum=0.9)
    if graphed:
        steps = nn.GraphedSteps(model, len(x), x.shape[1:], loss=loss, optimizer=opt,
                                allreduce=sync)
        return [float(np.ravel(steps.step(x, onehot))[0]) for _ in range(STEPS)]
    return [float(np.ravel(nn.train_step(model, loss, opt, x, onehot, allreduce=sync))[0])
            for _ in range(STEPS)]


def _worker(rank, world, store, path, graphed, device, n):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))
    try:
        model = _net(seed=10 * rank).to(device)  # (rank 1's weights differ: the
        sync = nn.GradientAllReduce(model)       # broadcast evens them)
        x, onehot = (a[:n] for a in _batch())
        half = slice(rank * n // world, (rank + 1) * n // world)
        _train(model, x[half], onehot[half], sync, graphed)
        np.savez(f"{path}.{rank}.npz", **model.state())
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    dist.barrier()
    os._exit(0)  # (no C++ teardown of gloo: with a barrier before destroy_process_group a
    # rank still aborted in it under CI's load, tests/test_torch_ddp.py)


@pytest.mark.parametrize("device,graphed", [("cpu", False), ("cpu", True), pytest.param(
    "cuda", True, marks=pytest.mark.skipif(not SIMULATOR, reason="gloo: the simulator's "
                                           "host-backed arrays; NCCL on two GPUs instead"))])
def test_two_processes_equal_one_on_the_whole_batch(tmp_path, device, graphed):
    """(cuda under the simulator: GraphedSteps' two graphs around the collectives.)"""
    path = str(tmp_path / "state")
    n = 2 if device == "cuda" else BATCH  # (the simulator: an image a process)
    mp.spawn(_worker, args=(2, str(tmp_path / "store"), path, graphed, device, n), nprocs=2)
    ranks = [np.load(f"{path}.{r}.npz") for r in range(2)]
    model = _net()
    x, onehot = (a[:n] for a in _batch())
    _train(model, x, onehot, None, graphed)
    for k, want in model.state().items():
        for r in ranks:
            np.testing.assert_allclose(r[k], want, rtol=1e-10, atol=1e-12, err_msg=k)


def test_needs_an_engine(monkeypatch, tmp_path):
    """No process group and no rank in the environment: a BadParamError naming both
    engines; ranks from the environment without a meeting file: one naming the file.
    Rank 0's id reaches the others through the file."""
    from nbdnn.nn import distributed
    if dist.is_initialized():
        pytest.skip("a process group exists")
    for k in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
              "NBDNN_NCCL_ID_FILE"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(nbdnn.BadParamError, match="no engine.*RANK and WORLD_SIZE"):
        nn.GradientAllReduce(_net())
    with pytest.raises(nbdnn.BadParamError, match="NBDNN_NCCL_ID_FILE"):
        distributed._shared_id(1, None, 1.0, None)
    path = str(tmp_path / "id")
    assert distributed._shared_id(0, path, 1.0, lambda: (7, 8, 9)) == (7, 8, 9)
    assert distributed._shared_id(1, path, 1.0, None) == (7, 8, 9)
    with pytest.raises(nbdnn.DeviceError, match="did not appear"):
        distributed._shared_id(1, str(tmp_path / "none"), 0.1, None)


@pytest.mark.skipif(not SIMULATOR, reason="a stand-in communicator over the simulator's "
                    "host-backed arrays; real NCCL runs on the two-GPU machine")
def test_nccl_communicator_joins_the_captured_step(monkeypatch):
    """With a cupy.cuda.nccl communicator (a stand-in here: two ranks holding these same
    gradients, so each sum is twice them) the planned step is one graph whose replays
    issue every all-reduce again, in order with the kernels (Graph.external), and the
    steps equal a single process's."""
    from nbdnn.nn import distributed
    calls = []

    def nccl(comm, what, a, stream, root=0):
        calls.append(what)
        if what == "allReduce":
            a._ary *= comm.size()  # (host memory: no nbdnn kernel, nothing recorded)
    monkeypatch.setattr(distributed, "_nccl", nccl)

    class Comm:
        def size(self):
            return 2
    x, onehot = (a[:2] for a in _batch())  # (2 images: the simulator's threads)
    losses = []
    for sync in (True, False):
        model = _net().to("cuda")
        ar = nn.GradientAllReduce(model, comm=Comm()) if sync else None
        steps = nn.GraphedSteps(model, 2, x.shape[1:], loss=nn.CrossEntropyLoss(),
                                optimizer=nn.SGD(model, 0.1, momentum=0.9), allreduce=ar)
        losses.append([float(np.ravel(nn.move(steps.step(x, onehot), "cpu"))[0])
                       for _ in range(3)])
        if sync:
            assert set(steps._graphs) == {"step"}  # (one graph: no "update" apart)
            grads = sum(len(m.params) for m in model.layers())
            assert calls.count("bcast") == grads  # (the parameters; no buffers here)
            assert calls.count("allReduce") == 3 * grads  # (eager, capture, a replay)
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-12)

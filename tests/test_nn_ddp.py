"""nbdnn.nn's data-parallel training step (issue 27): two processes over gloo on the CPU
backend (float64), each its half of the batch, GradientAllReduce averaging the
gradients (each layer's started as its backward ends), give after a few SGD steps the
parameters one process gets on the whole batch; rank 1 starts from other weights and
the broadcast makes them rank 0's. train_step and GraphedSteps (eager on the CPU) both.
NCCL and CUDA graphs run on the two-GPU machine (perf/ddp.py,
examples/ddp_resnet.py)."""
import os
import socket

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

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


def _worker(rank, world, port, path, graphed, device):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model = _net(seed=10 * rank).to(device)  # (rank 1's weights differ: the
        sync = nn.GradientAllReduce(model)       # broadcast evens them)
        x, onehot = _batch()
        half = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
        _train(model, x[half], onehot[half], sync, graphed)
        np.savez(f"{path}.{rank}.npz", **model.state())
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("device,graphed", [("cpu", False), ("cpu", True), pytest.param(
    "cuda", True, marks=pytest.mark.skipif(not SIMULATOR, reason="gloo: the simulator's "
                                           "host-backed arrays; NCCL on two GPUs instead"))])
def test_two_processes_equal_one_on_the_whole_batch(tmp_path, device, graphed):
    """(cuda under the simulator: GraphedSteps' two graphs around the collectives.)"""
    path = str(tmp_path / "state")
    mp.spawn(_worker, args=(2, _free_port(), path, graphed, device), nprocs=2)
    ranks = [np.load(f"{path}.{r}.npz") for r in range(2)]
    model = _net()
    x, onehot = _batch()
    _train(model, x, onehot, None, graphed)
    for k, want in model.state().items():
        for r in ranks:
            np.testing.assert_allclose(r[k], want, rtol=1e-10, atol=1e-12, err_msg=k)


def test_needs_a_process_group():
    if dist.is_initialized():
        pytest.skip("a process group exists")
    with pytest.raises(Exception, match="init_process_group"):
        nn.GradientAllReduce(_net())

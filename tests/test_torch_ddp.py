"""A converted model under torch.nn.parallel.DistributedDataParallel (issue 27): N
processes, each its shard of the batch, give after a few SGD steps the parameters one
process gets on the whole batch (DDP averages the gradients; the loss is a mean, the
shards equal). CPU: gloo between two processes on nbdnn's CPU reference, float64
(1e-10; CI runs it). CUDA: NCCL, a process a GPU, float32 with TF32 off (skipped with
fewer than two GPUs: the nvidia-h200-x2 machine runs it). The model has no batch norm:
DDP's batch norm uses each process's own statistics, which one process on the whole
batch cannot reproduce."""

import datetime
import os
import traceback

import pytest

torch = pytest.importorskip("torch")
nt = pytest.importorskip("nbdnn.torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402

STEPS, BATCH = 3, 8


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 8, 3, padding=1, groups=2), nn.GELU(), nn.Flatten(),
                         nn.LayerNorm(8 * 4 * 4), nn.Linear(8 * 4 * 4, 10))


def _batch(dtype):
    g = torch.Generator().manual_seed(1)
    return (torch.randn(BATCH, 3, 8, 8, generator=g, dtype=torch.float64).to(dtype),
            torch.randint(0, 10, (BATCH,), generator=g))


def _train(model, x, labels, steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), labels).backward()
        opt.step()


def _worker(rank, world, store, path, device, dtype):
    dev = torch.device(device, rank) if device == "cuda" else torch.device("cpu")
    if device == "cuda":
        torch.cuda.set_device(dev)
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    dist.init_process_group("nccl" if device == "cuda" else "gloo",
                            init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        _run(rank, world, path, dev, dtype, device)
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    dist.barrier()
    os._exit(0)  # (no C++ teardown of gloo: with a barrier before destroy_process_group,
    # a rank still aborted in it under CI's load, "terminate called without an active
    # exception"; the store file and the process go with the exit)


def _run(rank, world, path, dev, dtype, device):
    """The converted model's steps on this rank's shard; rank 0 saves its state."""
    model, _ = nt.convert(_net().to(dev, dtype))
    ddp = nn.parallel.DistributedDataParallel(
        model, device_ids=[rank] if device == "cuda" else None)
    x, labels = _batch(dtype)
    shard = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    _train(ddp, x[shard].to(dev), labels[shard].to(dev), STEPS)
    if rank == 0:
        torch.save({k: v.cpu() for k, v in model.state_dict().items()}, path)


@pytest.mark.parametrize("device,dtype,tol", [
    ("cpu", torch.float64, 1e-10),
    pytest.param("cuda", torch.float32, 1e-5, marks=pytest.mark.skipif(
        torch.cuda.device_count() < 2, reason="fewer than two GPUs for NCCL"))])
def test_converted_model_under_ddp_equals_one_process(tmp_path, device, dtype, tol):
    path = str(tmp_path / "rank0.pt")
    mp.spawn(_worker, args=(2, str(tmp_path / "store"), path, device, dtype), nprocs=2)
    got = torch.load(path)
    dev = torch.device(device)
    if device == "cuda":
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    model, _ = nt.convert(_net().to(dev, dtype))
    x, labels = _batch(dtype)
    _train(model, x.to(dev), labels.to(dev), STEPS)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(got[k], v.cpu(), rtol=tol, atol=tol, msg=k)

"""Data-parallel ResNet-50 training, one process a GPU, gradients averaged by NCCL.
Random images, no downloads.

    torchrun --nproc_per_node=2 examples/ddp_resnet.py --engine nbdnn.nn
    torchrun --nproc_per_node=2 examples/ddp_resnet.py --engine nbdnn.torch
    torchrun --nproc_per_node=2 examples/ddp_resnet.py --engine torch     # PyTorch alone

engines (each a bf16 training step, channels-last, SGD with momentum):
  nbdnn.nn     nbdnn's own ResNet-50 (nbdnn.nn.resnet50, NHWC), gradients averaged by
               nbdnn.nn.GradientAllReduce over torch.distributed, the step planned
               (GraphedSteps: two CUDA graphs around the all-reduce)
  nbdnn.torch  torchvision's ResNet-50 converted by nbdnn.torch.convert, under
               torch.nn.parallel.DistributedDataParallel, bf16 autocast
  torch        torchvision's ResNet-50 under DistributedDataParallel, bf16 autocast

Each rank trains on its own --batch images; rank 0 prints the images a second of the
timed steps over all ranks (--json: one JSON line, for perf/ddp.py). Without CUDA
(or --device cpu) the processes meet over gloo on the CPU backend: --model tiny keeps
that fast (a smoke test; tests/test_examples_ddp.py). NCCL's NVLink multicast stays off
(NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1) unless the environment says
otherwise.
"""
import argparse
import json
import os
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

SIZES = {"resnet50": 224, "tiny": 16}  # image side


def nbdnn_nn_step(args, device, rank):
    """(step(), batch): nbdnn.nn's planned step with GradientAllReduce."""
    from nbdnn import nn
    side, cuda = SIZES[args.model], device.type == "cuda"
    if args.model == "tiny":
        model = nn.resnet50(10, widths=(4, 4, 4, 4), blocks=(1, 1, 1, 1),
                            layout="NHWC" if cuda else "NCHW")
    else:
        model = nn.resnet50(layout="NHWC")
    model.to(str(device) if cuda else "cpu")
    sync = nn.GradientAllReduce(model)
    classes = 1000 if args.model == "resnet50" else 10
    rng = np.random.default_rng(rank)
    shape = (side, side, 3) if cuda else (3, side, side)
    x = rng.standard_normal((args.batch,) + shape).astype(np.float32)
    onehot = np.eye(classes, dtype=np.float32)[rng.integers(0, classes, args.batch)]
    if cuda:
        x, onehot = torch.from_numpy(x).to(device).bfloat16(), torch.from_numpy(onehot).to(device)
    steps = model.plan(args.batch, shape, loss=nn.CrossEntropyLoss(),
                       optimizer=nn.SGD(model, 0.01, momentum=0.9),
                       precision="bf16" if cuda else None, allreduce=sync)
    return lambda: steps.step(x, onehot)


def torch_step(args, device, rank, convert):
    """(step()): torchvision's ResNet-50 (or a small torch.nn net) under DDP, converted
    by nbdnn.torch where convert."""
    from torch import nn
    torch.manual_seed(0)
    if args.model == "tiny":
        model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                              nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(), nn.Linear(8, 10))
    else:
        import torchvision
        model = torchvision.models.resnet50()
    model = model.to(device, memory_format=torch.channels_last)
    if convert:
        import nbdnn.torch as nt
        model, _ = nt.convert(model)
    ddp = nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), 0.01, momentum=0.9)
    side, classes = SIZES[args.model], 1000 if args.model == "resnet50" else 10
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, 3, side, side, generator=g).to(
        device, memory_format=torch.channels_last)
    labels = torch.randint(0, classes, (args.batch,), generator=g).to(device)
    bf16 = device.type == "cuda"

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, torch.bfloat16, enabled=bf16):
            loss = nn.functional.cross_entropy(ddp(x), labels)
        loss.backward()
        opt.step()
        return loss
    return step


def scalar(loss):
    """A loss (a torch tensor, or an nbdnn.nn array on either backend) as a float."""
    if isinstance(loss, torch.Tensor):
        return float(loss.detach().float().reshape(-1)[0])
    from nbdnn import nn
    return float(np.ravel(nn.move(loss, "cpu"))[0])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=["nbdnn.nn", "nbdnn.torch", "torch"], default="nbdnn.nn")
    p.add_argument("--model", choices=sorted(SIZES), default="resnet50")
    p.add_argument("--batch", type=int, default=32, help="images a rank")
    p.add_argument("--steps", type=int, default=20, help="timed steps (after 3 warm-up)")
    p.add_argument("--device", choices=["cuda", "cpu"], default=None)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    cuda = (args.device or ("cuda" if torch.cuda.is_available() else "cpu")) == "cuda"
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        step = nbdnn_nn_step(args, device, rank) if args.engine == "nbdnn.nn" else \
            torch_step(args, device, rank, args.engine == "nbdnn.torch")
        for _ in range(3):  # (JIT, the graphs' capture, cuDNN's choices)
            step()
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        sync()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            loss = step()
        sync()
        seconds = time.perf_counter() - t0
        rate = torch.tensor([args.batch * args.steps / seconds], dtype=torch.float64,
                            device=device)
        dist.all_reduce(rate)  # (images a second over the ranks)
        if rank == 0:
            row = dict(engine=args.engine, model=args.model, world=world, batch=args.batch,
                       steps=args.steps, images_per_s=float(rate),
                       step_ms=1e3 * seconds / args.steps, loss=scalar(loss))
            print(json.dumps(row) if args.json else
                  f"{args.engine} {args.model}: {world} process(es) x {args.batch} images, "
                  f"{row['step_ms']:.2f} ms a step, {row['images_per_s']:.0f} images/s")
    finally:
        dist.barrier()  # (no rank tears gloo down while another still talks: SIGABRT)
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

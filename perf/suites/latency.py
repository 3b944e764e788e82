"""Batch-1 inference latency: the digits CNN (nbdnn/demo.py) at 1x1x8x8 and
ResNet-18 (nbdnn.nn.resnet18) at 1x3x224x224, fp32, eval mode: nbdnn eager and
nbdnn.cuda.Graph against PyTorch eager and PyTorch under a CUDA graph
(torch.cuda.graphs), same GPU, same run. Then one training step of the digits CNN at
batch 64 (forward, loss, backward, SGD with momentum): nbdnn eager, nbdnn graph,
PyTorch eager. Latency = host wall time from the call to the result being ready
(synchronize), the median of many calls after warm-up; nbdnn's inputs are torch
tensors, so its outputs come from torch's caching allocator. nbdnn eager is timed as
it runs (eager call plans) and with plans off.

    PYTHONPATH=. python perf/suites/latency.py [--reps 200] [--json F]
"""
import argparse
import json
import statistics
import time

import numpy as np
import torch
import torch.nn as tnn

from nbdnn import nn
from nbdnn.cuda import Graph
from nbdnn.demo import digits_cnn
from nbdnn.ops import _plan


def _latency(fn, reps):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def _torch_digits():
    return tnn.Sequential(
        tnn.Conv2d(1, 16, 3, padding=1), tnn.BatchNorm2d(16), tnn.ReLU(), tnn.MaxPool2d(2),
        tnn.Conv2d(16, 32, 3, padding=1), tnn.BatchNorm2d(32), tnn.ReLU(), tnn.MaxPool2d(2),
        tnn.Dropout(0.1), tnn.Flatten(), tnn.Linear(128, 10))


def _torch_resnet18():
    try:
        import torchvision
        return torchvision.models.resnet18()
    except ImportError:
        return None


def _torch_graphed(model, x):
    """model(x) captured in a CUDA graph (after warm-up on a side stream)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            model(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        model(x)
    return g.replay


def _eager(fn, reps):
    """nbdnn eager as it runs (calls replay their signature's plan, nbdnn/ops/_plan.py)
    and with plans off (every call through the whole front end)."""
    _plan.ENABLED = False
    try:
        full = _latency(fn, reps) * 1e3
    finally:
        _plan.ENABLED = True
    return {"nbdnn_eager_ms": _latency(fn, reps) * 1e3, "nbdnn_eager_no_plans_ms": full}


def _host(a):
    return a.detach().cpu().numpy() if hasattr(a, "detach") else a.copy_to_host()


def _train_step(reps, batch=64):
    """One digits training step at batch 64, nbdnn eager / graph and PyTorch eager."""
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.random((batch, 1, 8, 8), np.float32)).cuda()
    t = torch.from_numpy(np.eye(10, dtype=np.float32)[rng.integers(0, 10, batch)]).cuda()
    row = {"model": "digits CNN train step, batch 64"}
    for mode in ("eager", "graph"):
        model = digits_cnn().to("cuda")
        loss_fn, opt = nn.CrossEntropyLoss(), nn.SGD(model, 0.01, momentum=0.9)
        step = lambda: nn.train_step(model, loss_fn, opt, x, t)  # noqa: E731
        step()  # the optimizer's velocities
        if mode == "graph":
            g = Graph()
            with g.capture():
                step()
            row["nbdnn_graph_ms"] = _latency(g.replay, reps) * 1e3
        else:
            row.update(_eager(step, reps))
    theirs = _torch_digits().cuda().train()
    topt = torch.optim.SGD(theirs.parameters(), lr=0.01, momentum=0.9)
    labels = t.argmax(1)

    def torch_step():
        topt.zero_grad(set_to_none=True)
        tnn.functional.cross_entropy(theirs(x), labels).backward()
        topt.step()
    row["torch_eager_ms"] = _latency(torch_step, reps) * 1e3
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    for name, ours, theirs, shape in (("digits CNN", digits_cnn(), _torch_digits(), (1, 1, 8, 8)),
                                      ("ResNet-18", nn.resnet18(), _torch_resnet18(),
                                       (1, 3, 224, 224))):
        ours.to("cuda")
        x = torch.randn(*shape, device="cuda")
        row = {"model": name, **_eager(lambda: ours.forward(x), args.reps)}
        g = Graph()
        with g.capture():
            y = ours.forward(x)
        row["nbdnn_graph_ms"] = _latency(g.replay, args.reps) * 1e3
        row["graph_kernels"] = len(g)
        np.testing.assert_array_equal(_host(y), _host(ours.forward(x)))
        if theirs is not None:
            theirs = theirs.cuda().eval()
            with torch.no_grad():
                row["torch_eager_ms"] = _latency(lambda: theirs(x), args.reps) * 1e3
                row["torch_graph_ms"] = _latency(_torch_graphed(theirs, x), args.reps) * 1e3
        rows.append(row)
        print(" | ".join(f"{k} {v:.3f}" if isinstance(v, float) else str(v)
                         for k, v in row.items()), flush=True)
    rows.append(_train_step(args.reps))
    print(" | ".join(f"{k} {v:.3f}" if isinstance(v, float) else str(v)
                     for k, v in rows[-1].items()), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "reps": args.reps, "numpy": np.__version__}, f, indent=1)


if __name__ == "__main__":
    main()

"""Batch-1 inference latency (issue 5): the digits CNN (nbdnn/demo.py) at 1x1x8x8 and
ResNet-18 (nbdnn.nn.resnet18) at 1x3x224x224, fp32, eval mode: nbdnn eager against
PyTorch eager and PyTorch under a CUDA graph (torch.cuda.graphs), same GPU, same run.
Latency = host wall time from the call to the result being ready (synchronize), the
median of many calls after warm-up; nbdnn's input is a torch tensor, so its outputs
come from torch's caching allocator.

    PYTHONPATH=. python perf/latency.py [--reps 200] [--json F]
"""
import argparse
import json
import statistics
import time

import numpy as np
import torch
import torch.nn as tnn

from nbdnn import nn
from nbdnn.demo import digits_cnn


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
        row = {"model": name,
               "nbdnn_eager_ms": _latency(lambda: ours.forward(x), args.reps) * 1e3}
        if theirs is not None:
            theirs = theirs.cuda().eval()
            with torch.no_grad():
                row["torch_eager_ms"] = _latency(lambda: theirs(x), args.reps) * 1e3
                row["torch_graph_ms"] = _latency(_torch_graphed(theirs, x), args.reps) * 1e3
        rows.append(row)
        print(" | ".join(f"{k} {v:.3f}" if isinstance(v, float) else str(v)
                         for k, v in row.items()), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "reps": args.reps, "numpy": np.__version__}, f, indent=1)


if __name__ == "__main__":
    main()

"""Batch norm's channels-last kernels (nbdnn/cuda/batch_norm/columns.py: 8 channels a
thread, rows walked) against the general ones (batch_norm/sums.py's columns partials,
batch_norm's apply/dx: 4 elements a thread, a 64-bit `e % C` each), graph-timed on
ResNet-50's bf16 NHWC batch-norm shapes at batch 32, with PyTorch's (cuDNN,
channels_last) in the same run, and the columns path's error against PyTorch's.

Training = statistics + apply with relu (reads x twice, writes y: 6 B an element in
bf16, 4 B must move); backward = sums + dx with relu (reads dy, x twice, writes dx:
10 B, 6 B must move). "% of copy" counts the bytes that must move.

    PYTHONPATH=. python perf/experiments/bn_columns_ab.py
"""
import torch
import torch.nn.functional as F

import nbdnn
from nbdnn.bench import time_gpu, time_graph
from nbdnn.cuda.batch_norm import columns

SHAPES = [(112, 64), (56, 64), (56, 256), (28, 128), (28, 512), (14, 256), (14, 1024),
          (7, 512), (7, 2048)]
big = torch.empty(2 ** 27, dtype=torch.bfloat16, device="cuda")
big2 = torch.empty_like(big)
t_copy = time_gpu(lambda: big2.copy_(big))
bw = 2 * big.numel() * 2 / t_copy
print(f"copy 256 MiB: {bw / 1e12:.2f} TB/s", flush=True)
print(f"{'shape':>14} {'pass':>8} {'columns us':>10} {'general us':>10} {'torch us':>9} "
      f"{'cols %copy':>10} {'x general':>9} {'x torch':>7} {'err':>8}", flush=True)
tot = {"columns": 0.0, "general": 0.0, "torch": 0.0}
for H, C in SHAPES:
    g = torch.Generator(device="cuda").manual_seed(H * C)
    x = (torch.randn(32, H, H, C, device="cuda", generator=g) * 2 + 1).bfloat16()
    dy = torch.randn(32, H, H, C, device="cuda", generator=g).bfloat16()
    w = torch.rand(C, device="cuda", generator=g).bfloat16() + 0.5
    b = torch.randn(C, device="cuda", generator=g).bfloat16()
    y = torch.empty_like(x)
    nb = x.numel() * 2
    _, m, inv = nbdnn.batch_norm_train(x, w, b, layout="NHWC", activation="relu")
    fns = {"train": (4, lambda: nbdnn.batch_norm_train(x, w, b, layout="NHWC",
                                                       activation="relu", out=y)),
           "backward": (6, lambda: nbdnn.batch_norm_backward(dy, x, w, m, inv, bias=b,
                                                             layout="NHWC", activation="relu"))}
    # PyTorch: cuDNN's channels-last batch norm, relu after (autograd through both)
    xt = x.permute(0, 3, 1, 2)  # NCHW view of NHWC memory: channels_last
    xr = xt.detach().clone(memory_format=torch.channels_last).requires_grad_()
    out = F.relu(F.batch_norm(xr, None, None, w, b, True))
    dyt = dy.permute(0, 3, 1, 2)
    torch_fns = {"train": lambda: F.relu(F.batch_norm(xt, None, None, w, b, True)),
                 "backward": lambda: torch.autograd.grad(out, xr, dyt, retain_graph=True)}
    want = {"train": out.permute(0, 2, 3, 1).float(),
            "backward": torch.autograd.grad(out, xr, dyt, retain_graph=True)[0]
            .permute(0, 2, 3, 1).float()}
    for name, (bytes_an_el, fn) in fns.items():
        times = {}
        for path in ("columns", "general"):
            columns.ON = path == "columns"
            times[path] = time_graph(fn, reps=30, min_time=0.2)
            if path == "columns":
                got = fn()
                got = (y if name == "train" else got[0]).float()
                err = float((got - want[name]).abs().max() / want[name].abs().max())
        columns.ON = True
        times["torch"] = time_gpu(torch_fns[name], reps=30, min_time=0.2)
        for k in tot:
            tot[k] += times[k]
        print(f"{f'{H}x{H}x{C}':>14} {name:>8} {times['columns'] * 1e6:10.1f} "
              f"{times['general'] * 1e6:10.1f} {times['torch'] * 1e6:9.1f} "
              f"{bytes_an_el / 2 * nb / times['columns'] / bw:10.0%} "
              f"{times['general'] / times['columns']:9.2f} "
              f"{times['torch'] / times['columns']:7.2f} {err:8.1e}", flush=True)
print(f"sum over the shapes (us): columns {tot['columns'] * 1e6:.0f}, general "
      f"{tot['general'] * 1e6:.0f}, torch {tot['torch'] * 1e6:.0f}", flush=True)

"""The CPU reference's conv2d (nbdnn/cpu/conv.py: im2col views and a BLAS contraction,
accumulated in float64) against PyTorch's CPU convolution (float32, oneDNN) on the
same machine: the ResNet-50 layer set and MobileNet depthwise layers of perf/suites/conv.py
at a small batch, forward and both backward passes (PyTorch's as one autograd call,
its time split evenly as in perf/suites/conv.py). Median wall time of a few calls after one
warm-up; thread counts printed. Needs PyTorch (any build) for the comparison columns.

    PYTHONPATH=. python perf/suites/cpu_conv.py [--batch 4] [--layers 3x3] [--json F]
"""
import argparse
import json
import os
import statistics
import time

import numpy as np

import nbdnn
from conv_layers import DEPTHWISE, RESNET


def _median(fn, reps):
    fn()
    samples = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--layers", nargs="*", default=[])
    ap.add_argument("--json")
    args = ap.parse_args()
    torch = _torch()
    print(f"cores {os.cpu_count()}, numpy {np.__version__}"
          + (f", torch {torch.__version__} with {torch.get_num_threads()} threads" if torch
             else ", no PyTorch"), flush=True)
    rng = np.random.default_rng(0)
    rows = []
    for name, C, K, H, R, s, p, g in RESNET + DEPTHWISE:
        if args.layers and not any(t in name for t in args.layers):
            continue
        x = rng.standard_normal((args.batch, C, H, H), dtype=np.float32)
        w = rng.standard_normal((K, C // g, R, R), dtype=np.float32) * np.float32(0.1)
        kw = dict(stride=s, padding=p, groups=g)
        y = nbdnn.conv2d(x, w, **kw)
        dy = rng.standard_normal(y.shape, dtype=np.float32)
        row = {"layer": name, "batch": args.batch,
               "fwd_ms": 1e3 * _median(lambda: nbdnn.conv2d(x, w, **kw), args.reps),
               "data_ms": 1e3 * _median(lambda: nbdnn.conv_backward_data(dy, w, x.shape, **kw),
                                        args.reps),
               "filter_ms": 1e3 * _median(
                   lambda: nbdnn.conv_backward_filter(dy, x, w.shape, **kw), args.reps)}
        line = (f"{name:18} nbdnn fwd {row['fwd_ms']:8.1f} ms, bwd data {row['data_ms']:8.1f},"
                f" filter {row['filter_ms']:8.1f}")
        if torch is not None:
            F = torch.nn.functional
            xt = torch.from_numpy(x).requires_grad_()
            wt = torch.from_numpy(w).requires_grad_()
            with torch.no_grad():
                row["torch_fwd_ms"] = 1e3 * _median(lambda: F.conv2d(xt, wt, **kw), args.reps)
                yt = F.conv2d(xt, wt, **kw).numpy()
            out = F.conv2d(xt, wt, **kw)
            g_t = torch.from_numpy(dy)
            row["torch_bwd_ms"] = 1e3 * _median(
                lambda: torch.autograd.grad(out, (xt, wt), g_t, retain_graph=True), args.reps)
            row["rel_err"] = float(np.abs(y - yt).max() / np.abs(yt).max())
            half = row["torch_bwd_ms"] / 2
            line += (f" | torch fwd {row['torch_fwd_ms']:7.1f} ms (nbdnn at "
                     f"{row['torch_fwd_ms'] / row['fwd_ms']:.2f}x its speed), bwd "
                     f"{row['torch_bwd_ms']:7.1f} ms (data {half / row['data_ms']:.2f}x, filter "
                     f"{half / row['filter_ms']:.2f}x), err {row['rel_err']:.0e}")
        rows.append(row)
        print(line, flush=True)
    if torch is not None and rows:
        for part, sel in (("ResNet", lambda r: not r["layer"].startswith("dw")),
                          ("depthwise", lambda r: r["layer"].startswith("dw"))):
            means = []
            for key, tkey, div in (("fwd_ms", "torch_fwd_ms", 1),
                                   ("data_ms", "torch_bwd_ms", 2),
                                   ("filter_ms", "torch_bwd_ms", 2)):
                r = [r[tkey] / div / r[key] for r in rows if sel(r)]
                if r:
                    means.append(f"{key[:-3]} {np.exp(np.mean(np.log(r))):.2f}x")
            if means:
                print(f"geometric mean of nbdnn CPU speed / PyTorch CPU speed, {part}: "
                      + ", ".join(means))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

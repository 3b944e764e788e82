"""Every forward algorithm that applies, against cuDNN, over a grid of 3x3/1 layers
(batch x channels x map size): the measurements behind `_auto_forward`'s choice
between the implicit GEMM, winograd (F(2x2)) and winograd4 (F(4x4))
(perf/history/runs.md run V). fp32 NCHW, C = K, padding 1; nbdnn times are GPU times of a
captured nbdnn.cuda.Graph (no host time), cuDNN's are eager calls with
cudnn.benchmark on and TF32 off (one launch, its host time hidden by the flush).
Prints % of cuDNN per algorithm and marks auto's pick.

    PYTHONPATH=. python perf/suites/conv_algos.py [--batches 1 8 32] [--layers 64@56 128@28]
"""
import argparse

import torch
import torch.nn.functional as F

import nbdnn
from nbdnn.bench import time_gpu, time_graph
from nbdnn.cuda import conv as CV

ALGOS = ("implicit_gemm", "winograd", "winograd4")
LAYERS = ("32@56", "64@56", "64@112", "128@28", "256@14", "512@7")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", nargs="*", type=int, default=[1, 8, 32])
    ap.add_argument("--layers", nargs="*", default=list(LAYERS), help="C@H, e.g. 64@56")
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    for N in args.batches:
        for layer in args.layers:
            C, H = map(int, layer.split("@"))
            x = torch.randn(N, C, H, H, device="cuda")
            w = torch.randn(C, C, 3, 3, device="cuda") * 0.1
            t_ref = time_gpu(lambda: F.conv2d(x, w, padding=1), reps=15, min_time=0.05)
            g = CV.geometry(tuple(x.shape), tuple(w.shape), (1, 1), ((1, 1), (1, 1)), (1, 1),
                             1, "cross_correlation", False)
            pick = CV._auto_forward(g)
            y = torch.empty_like(x)
            parts = [f"N{N:4} {layer:>7} cuDNN {t_ref * 1e6:8.1f} us"]
            for algo in ALGOS:
                t = time_graph(lambda: nbdnn.conv2d(x, w, padding=1, algo=algo, out=y),
                               reps=15, min_time=0.05)
                parts.append(f"{algo}{'*' if algo == pick else ' '} {t_ref / t:5.0%}")
            print(" | ".join(parts), flush=True)
    print("* = auto's choice")


if __name__ == "__main__":
    main()

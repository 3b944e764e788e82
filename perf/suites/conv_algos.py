"""Every forward algorithm that applies, against cuDNN, over a grid of 3x3/1 layers
(batch x channels x map size): the measurements behind `_auto_forward`'s choice
between the implicit GEMM, winograd (F(2x2)) and winograd4 (F(4x4))
(measured through graphs), and "gemm" (im2col + the GEMM); --dtype / --nhwc for
the 16-bit and channels-last choices ("auto" takes the tensor cores there first).
C = K, padding 1; nbdnn times are GPU times of a captured nbdnn.cuda.Graph (no host
time), cuDNN's are eager calls with
cudnn.benchmark on and TF32 off (one launch, its host time hidden by the flush).
Prints % of cuDNN per algorithm and marks auto's pick (the algorithm whose kernels an
"auto" call launched) and the tensor cores' (tc).

    PYTHONPATH=. python perf/suites/conv_algos.py [--batches 1 8 32] [--layers 64@56 128@28]
        [--dtype bfloat16 --nhwc]
"""
import argparse

import torch
import torch.nn.functional as F

import nbdnn
from nbdnn.bench import time_gpu, time_graph
from nbdnn.cuda.runtime.launch.kernel import launched

ALGOS = ("implicit_gemm", "winograd", "winograd4", "gemm")
LAYERS = ("32@56", "64@56", "64@112", "128@28", "256@14", "512@7")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", nargs="*", type=int, default=[1, 8, 32])
    ap.add_argument("--layers", nargs="*", default=list(LAYERS), help="C@H, e.g. 64@56")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--nhwc", action="store_true", help="channels-last (16-bit on sm_90: "
                    "implicit_gemm is the tensor cores' im2col kernel)")
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    dt, layout = getattr(torch, args.dtype), "NHWC" if args.nhwc else "NCHW"
    for N in args.batches:
        for layer in args.layers:
            C, H = map(int, layer.split("@"))
            x = torch.randn(N, C, H, H, device="cuda").to(dt)
            w = (torch.randn(C, C, 3, 3, device="cuda") * 0.1).to(dt)
            if args.nhwc:  # torch channels_last; nbdnn (N, H, W, C) and (K, R, S, C)
                xn, wn = (t.permute(0, 2, 3, 1).contiguous() for t in (x, w))
                x, w = (t.to(memory_format=torch.channels_last) for t in (x, w))
            else:
                xn, wn = x, w
            t_ref = time_gpu(lambda: F.conv2d(x, w, padding=1), reps=15, min_time=0.05)
            y = torch.empty_like(xn)
            with launched() as auto:  # auto's pick: the algorithm whose kernels it ran
                nbdnn.conv2d(xn, wn, padding=1, layout=layout, out=y)
            parts = [f"N{N:4} {layer:>7} cuDNN {t_ref * 1e6:8.1f} us"]
            for algo in ALGOS:
                with launched() as names:
                    nbdnn.conv2d(xn, wn, padding=1, algo=algo, layout=layout, out=y)
                t = time_graph(lambda: nbdnn.conv2d(xn, wn, padding=1, algo=algo,
                                                    layout=layout, out=y),
                               reps=15, min_time=0.05)
                tc = "tc" if any(n.startswith(("wgmma", "mma")) for n in names) else ""
                parts.append(f"{algo}{'*' if names == auto else ' '}{tc} {t_ref / t:5.0%}")
            print(" | ".join(parts), flush=True)
    print("* = auto's choice; tc: ran on the tensor cores")


if __name__ == "__main__":
    main()

"""Issue 24, first look: the tensor-core convolution forward (nbdnn/cuda/conv/wgmma_conv.py
and the GEMM for stride-1 1x1 layers) over the ResNet-50 layer set at batch 32, 16-bit
channels-last, against cuDNN (torch conv2d, channels_last, cudnn.benchmark) in the same
run: GPU time by CUDA events after a 256 MiB flush (one launch a call, or two with
split-K), TFLOP/s, the ratio, the geometric mean; and the kernel each layer ran.

    PYTHONPATH=. python perf/experiments/conv_tc.py [--dtype bfloat16] [--batch 32]
"""
import argparse
import math
import sys

import torch
import torch.nn.functional as F

import nbdnn
from nbdnn.bench import time_gpu
from nbdnn.cuda.runtime.launch import launched

sys.path.insert(0, "perf/suites")
from conv_layers import RESNET  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    dt = getattr(torch, args.dtype)
    ratios = []
    print(f"{'layer':18} {'nbdnn':>8} {'cuDNN':>8} {'ratio':>6}  kernel")
    for name, C, K, H, R, s, p, _ in RESNET:
        if C % 8:  # (the 3-channel stem: not this kernel's)
            continue
        x = torch.randn(args.batch, C, H, H, device="cuda", dtype=dt) \
            .to(memory_format=torch.channels_last)
        w = (torch.randn(K, C, R, R, device="cuda", dtype=dt) / math.sqrt(C * R * R)) \
            .to(memory_format=torch.channels_last)
        xn, wn = x.permute(0, 2, 3, 1), w.permute(0, 2, 3, 1)  # NHWC views, contiguous
        with launched() as names:
            y = nbdnn.conv2d(xn, wn, stride=s, padding=p, layout="NHWC")
        ref = F.conv2d(x, w, stride=s, padding=p).permute(0, 2, 3, 1)
        err = float((y.float() - ref.float()).abs().max() / ref.float().abs().max())
        P = (H + 2 * p - R) // s + 1
        flops = 2 * args.batch * K * P * P * C * R * R
        t_n = time_gpu(lambda: nbdnn.conv2d(xn, wn, stride=s, padding=p, layout="NHWC", out=y))
        t_c = time_gpu(lambda: F.conv2d(x, w, stride=s, padding=p))
        ratios.append(t_c / t_n)
        print(f"{name:18} {flops / t_n / 1e12:8.1f} {flops / t_c / 1e12:8.1f} "
              f"{t_c / t_n:6.2f}  {','.join(n[:40] for n in names)} (err {err:.1e})",
              flush=True)
    print(f"geomean x cuDNN: {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f} "
          f"({args.dtype}, batch {args.batch})")


if __name__ == "__main__":
    main()

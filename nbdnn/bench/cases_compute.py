"""Benchmark cases of the compute-bound families (run by bench.run_suite): SGEMM and
conv2d forward, each with its flop count (2 per multiply-add), timed against
torch.matmul / torch.nn.functional.conv2d with TF32 off (cuDNN with
cudnn.benchmark). Sizes shrink with the suite's element budget n (the simulator's is
tiny); a case whose tensors do not fit n is left out."""
import math

import nbdnn
from .case import BenchCase
from .timing import torch_or_none


def torch_fp32():
    torch = torch_or_none()
    if torch is not None:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = True
    return torch


def matmul_cases(n):
    cases = []
    for label, (M, N, K) in (("square", (4096,) * 3), ("skinny", (64, 4096, 4096))):
        scale = min(1.0, math.sqrt(n / (M * K + K * N + M * N)))
        M, N, K = (max(1, int(v * scale)) for v in (M, N, K))

        def make(d, h, M=M, N=N, K=K):
            torch = torch_fp32()
            a, b = d["x"][:M * K].reshape(M, K), d["dy"][:K * N].reshape(K, N)
            c = d["y"][:M * N].reshape(M, N)
            ha, hb = h["x"][:M * K].reshape(M, K), h["dy"][:K * N].reshape(K, N)
            return {"gpu": lambda: nbdnn.matmul(a, b, out=c),
                    "cpu": lambda: nbdnn.matmul(ha, hb),
                    "torch": torch and (lambda: torch.matmul(a, b))}
        cases.append(BenchCase(f"matmul/{label}", "matmul", (M, N, K),
                               4 * (M * K + K * N + M * N), make, 2 * M * N * K))
    return cases


def conv_cases(n):
    cases = []
    # ResNet-50 stage 1 3x3 and a MobileNet depthwise 3x3, batch 32, NCHW
    for label, (B, C, K, H, G) in (("resnet_3x3_64", (32, 64, 64, 56, 1)),
                                   ("depthwise_3x3_128", (32, 128, 128, 56, 128))):
        if B * C * H * H > n or K * (C // G) * 9 > n:
            continue

        def make(d, h, B=B, C=C, K=K, H=H, G=G):
            torch = torch_fp32()
            x, y = d["x"][:B * C * H * H].reshape(B, C, H, H), d["y"][:B * K * H * H]
            w = d["dy"][:K * (C // G) * 9].reshape(K, C // G, 3, 3)
            y = y.reshape(B, K, H, H)
            hx = h["x"][:B * C * H * H].reshape(B, C, H, H)
            hw = h["dy"][:K * (C // G) * 9].reshape(K, C // G, 3, 3)
            F = torch.nn.functional if torch else None
            return {"gpu": lambda: nbdnn.conv2d(x, w, padding=1, groups=G, out=y),
                    "cpu": lambda: nbdnn.conv2d(hx, hw, padding=1, groups=G),
                    "torch": F and (lambda: F.conv2d(x, w, padding=1, groups=G))}
        cases.append(BenchCase(f"conv2d/{label}", "conv2d", (B, C, H, H, K),
                               4 * (B * C * H * H + K * C // G * 9 + B * K * H * H), make,
                               2 * B * K * H * H * C // G * 9))
    return cases


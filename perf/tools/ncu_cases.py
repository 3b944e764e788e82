"""One launch of each named kernel case, for Nsight Compute (H200): ResNet's 3x3 and
1x1 layers through the implicit GEMM (NCHW and NHWC), the 4096^2 SGEMM with the same
tile, the stem max pool, MobileNet depthwise 3x3 layers and layer_norm_backward; the
tensor-core GEMM on perf/suites/gemm.py's skinny, ragged and square bf16 shapes with
cuBLAS's kernel for the same product beside each (tc*), and float32 "tf32" with a
plain b (the parts pass, tf32nn). Each case launches once (numba compiles before the
launch).

    ncu --set full -k regex:"conv_igemm|gemm_|pool" -o prof \
        python3 perf/tools/ncu_cases.py igemm3x3 gemm4096 pool
"""
import sys

import torch

import nbdnn


def conv(C, K, H, R, p, nhwc=False, B=32):
    x = torch.randn(B, C, H, H, device="cuda")
    w = torch.randn(K, C, R, R, device="cuda") * 0.1
    if nhwc:
        x, w = x.permute(0, 2, 3, 1).contiguous(), w.permute(0, 2, 3, 1).contiguous()
    kw = dict(padding=p, algo="implicit_gemm", layout="NHWC" if nhwc else "NCHW")
    return lambda: nbdnn.conv2d(x, w, **kw)


def depthwise(C, H, B=32):
    x = torch.randn(B, C, H, H, device="cuda")
    w = torch.randn(C, 1, 3, 3, device="cuda")
    return lambda: nbdnn.conv2d(x, w, padding=1, groups=C)


def layer_norm_backward(rows, cols):
    x, dy = torch.randn(rows, cols, device="cuda"), torch.randn(rows, cols, device="cuda")
    scale = torch.randn(cols, device="cuda")
    _, mean, invstd = nbdnn.layer_norm(x, scale)
    return lambda: nbdnn.layer_norm_backward(dy, x, mean, invstd, scale)


def gemm(n):
    a, b = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
    return lambda: nbdnn.matmul(a, b)


def tensor_core(M, N, K, dtype=torch.bfloat16, math=None):
    """nbdnn's product and then torch's (cuBLAS) on the same operands."""
    a, b = torch.randn(M, K, device="cuda").to(dtype), torch.randn(K, N, device="cuda").to(dtype)
    kw = {"math": math} if math else {}

    def run():
        nbdnn.matmul(a, b, **kw)
        torch.matmul(a, b)
    return run


def pool(C, H, k, s, p, B=32):
    x = torch.randn(B, C, H, H, device="cuda")
    return lambda: nbdnn.pool2d(x, k, stride=s, padding=p)


CASES = {"igemm3x3": lambda: conv(128, 128, 28, 3, 1),
         "igemm3x3_nhwc": lambda: conv(128, 128, 28, 3, 1, nhwc=True),
         "igemm3x3_s3": lambda: conv(256, 256, 14, 3, 1),
         "igemm1x1": lambda: conv(256, 1024, 14, 1, 0),
         "gemm4096": lambda: gemm(4096),
         "pool": lambda: pool(64, 112, 3, 2, 1),
         "pool2": lambda: pool(256, 56, 2, 2, 0),
         "dw112": lambda: depthwise(64, 112), "dw28": lambda: depthwise(256, 28),
         "dw14": lambda: depthwise(512, 14), "dw7": lambda: depthwise(1024, 7),
         "lnbwd": lambda: layer_norm_backward(16384, 4096),
         "tc_tile": lambda: tensor_core(128, 256, 64),  # one tile, one k-tile: fixed cost
         "tc64": lambda: tensor_core(64, 4096, 4096),
         "tc256": lambda: tensor_core(256, 4096, 8192),
         "tc512": lambda: tensor_core(512, 8192, 1024),
         "tc1000": lambda: tensor_core(1000, 3000, 2040),
         "tc4096": lambda: tensor_core(4096, 4096, 4096),
         "tf32nn": lambda: tensor_core(4096, 4096, 4096, torch.float32, "tf32")}

if __name__ == "__main__":
    for name in sys.argv[1:] or CASES:
        fn = CASES[name]()
        fn()
        torch.cuda.synchronize()

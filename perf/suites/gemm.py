"""GEMM speed for every dtype and float32 math mode against cuBLAS in the same run
(the GEMM table). Rows:

    float32 ieee      nbdnn.matmul            cuBLAS fp32 (allow_tf32 off)
    float32 tf32      nbdnn.matmul(math=)     cuBLAS with allow_tf32 on (nt: b transposed,
                                              K-major: no rounding pass, TMA rounds)
    float32 3xtf32    nbdnn.matmul(math=)     cuBLAS fp32 (the accuracy it stands for)
    float16, bfloat16 nbdnn.matmul            cuBLAS (torch.matmul) in the same dtype: on
                      an sm_90 GPU the tensor-core kernel (nbdnn/cuda/matmul/tensor_core_gemm/wgmma_gemm.py)
    ... nt            the same with b transposed (K-major B: the other operand major)
    lm head bf16      GPT-2's LM head at 8 x 1024 tokens: logits = x (8192, 768) @ W^T
                      (W: (50257, 768)), dx = dlogits @ W, dW = dlogits^T @ x: rows of
                      50,257 elements (not 16-byte multiples: the padded copies and C
                      stored an element at a time) against torch.matmul
    mlp bf16          the transformer MLP block x (8192, 4096) @ W1 (4096, 16384) + b1,
                      gelu, @ W2 (16384, 4096) + b2: nbdnn's two calls with bias and gelu
                      fused against PyTorch eager (F.linear, F.gelu, F.linear)

Square 4096 and 8192, skinny M = 64..512 and ragged sizes; GPU time by CUDA events
(nbdnn.bench.time_gpu: median after warm-up, L2 evicted), TFLOP/s = 2 M N K / t, the
ratio to cuBLAS, the max relative error against cuBLAS's fp32 product.

    PYTHONPATH=. python3 perf/suites/gemm.py [--json F] [--quick] [--no-fp32] [--no-mlp]
        [--no-lm-head] [--shapes 64x4096x4096 ...] [--set matmul:mma_sync]
        [--set MODULE.NAME=VALUE]
"""
import argparse
import json
import os
import sys

import torch

import nbdnn
from nbdnn.bench import time_gpu

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import switches  # noqa: E402  (perf/tools/switches.py)

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (64, 4096, 4096), (512, 8192, 1024),
          (256, 4096, 8192), (1000, 3000, 2040), (1000, 3000, 1500), (4000, 4000, 4000)]
QUICK = SHAPES[:2]


def _rows(M, N, K, fp32):
    """(label, nbdnn run, cuBLAS run, output, fp32 operands, cuBLAS's tf32 flag)."""
    f32 = [torch.randn(M, K, device="cuda"), torch.randn(K, N, device="cuda")]
    if fp32:
        c32 = torch.empty(M, N, device="cuda")
        for mode in ("ieee", "tf32", "3xtf32"):
            yield (f"float32 {mode}", lambda m=mode: nbdnn.matmul(*f32, math=m, out=c32),
                   lambda: torch.matmul(*f32, out=c32), c32, f32, mode == "tf32")
        bt32 = f32[1].t().contiguous()  # b transposed (F.linear's weight): "tf32" runs no pass
        yield ("float32 tf32 nt", lambda: nbdnn.matmul(f32[0], bt32, trans_b=True, math="tf32",
                                                       out=c32),
               lambda: torch.matmul(f32[0], bt32.t(), out=c32), c32, f32, True)
    for dt in ("float16", "bfloat16"):
        x = [v.to(getattr(torch, dt)) for v in f32]
        bt = x[1].t().contiguous()
        c = torch.empty(M, N, device="cuda", dtype=x[0].dtype)
        yield (dt, lambda x=x, c=c: nbdnn.matmul(*x, out=c),
               lambda x=x, c=c: torch.matmul(*x, out=c), c, f32, False)
        yield (f"{dt} nt", lambda x=x, bt=bt, c=c: nbdnn.matmul(x[0], bt, trans_b=True, out=c),
               lambda x=x, bt=bt, c=c: torch.matmul(x[0], bt.t(), out=c), c, f32, False)


def lm_head():
    """GPT-2's LM head and its two gradients in bf16 (module docstring), each against
    torch.matmul on the same tensors."""
    g = torch.Generator(device="cuda").manual_seed(0)
    T, V, D = 8192, 50257, 768
    x = torch.randn(T, D, device="cuda", generator=g).bfloat16()
    w = (torch.randn(V, D, device="cuda", generator=g) / 32).bfloat16()
    dy = (torch.randn(T, V, device="cuda", generator=g) / 256).bfloat16()
    cases = {"lm head y": ((T, V, D), lambda: nbdnn.matmul(x, w, trans_b=True),
                           lambda: torch.matmul(x, w.t())),
             "lm head dx": ((T, D, V), lambda: nbdnn.matmul(dy, w),
                            lambda: torch.matmul(dy, w)),
             "lm head dW": ((V, D, T), lambda: nbdnn.matmul(dy, x, trans_a=True),
                            lambda: torch.matmul(dy.t(), x))}
    for label, ((M, N, K), ours, theirs) in cases.items():
        t, t_ref = time_gpu(ours), time_gpu(theirs)
        ref = theirs().float()
        err = float((ours().float() - ref).abs().max() / ref.abs().max())
        yield {"shape": (M, N, K), "row": label, "tflops": 2 * M * N * K / t / 1e12,
               "cublas_tflops": 2 * M * N * K / t_ref / 1e12, "ratio": t_ref / t,
               "rel_err": err}


def mlp_block():
    """The bf16 transformer MLP block, nbdnn (bias + gelu fused) against PyTorch eager."""
    import torch.nn.functional as F
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(8192, 4096, device="cuda", generator=g).bfloat16()
    w1 = (torch.randn(4096, 16384, device="cuda", generator=g) / 64).bfloat16()
    w2 = (torch.randn(16384, 4096, device="cuda", generator=g) / 128).bfloat16()
    b1, b2 = (torch.randn(n, device="cuda", generator=g).bfloat16() for n in (16384, 4096))
    w1t, w2t = w1.t().contiguous(), w2.t().contiguous()  # F.linear's (out, in) weights

    def ours():
        h = nbdnn.matmul(x, w1, bias=b1, activation="gelu")
        return nbdnn.matmul(h, w2, bias=b2)

    def theirs():
        return F.linear(F.gelu(F.linear(x, w1t, b1)), w2t, b2)
    t, t_ref = time_gpu(ours), time_gpu(theirs)
    ref = theirs().float()
    err = float((ours().float() - ref).abs().max() / ref.abs().max())
    flops = 2 * 2 * 8192 * 4096 * 16384
    return {"shape": (8192, 4096, 16384), "row": "mlp bf16", "tflops": flops / t / 1e12,
            "cublas_tflops": flops / t_ref / 1e12, "ratio": t_ref / t, "rel_err": err}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-fp32", action="store_true", help="only the 16-bit rows")
    p.add_argument("--shapes", nargs="+", help="MxNxK each (default: SHAPES)")
    p.add_argument("--no-mlp", action="store_true")
    p.add_argument("--no-lm-head", action="store_true")
    switches.add_argument(p)
    args = p.parse_args()
    switches.apply(args.set)
    out = []
    print(f"{'shape':>18} {'row':16} {'nbdnn':>8} {'cuBLAS':>8} {'ratio':>6} {'rel err':>8}")

    def show(row):
        out.append(row)
        print(f"{str(tuple(row['shape'])):>18} {row['row']:16} {row['tflops']:8.1f} "
              f"{row['cublas_tflops']:8.1f} {row['ratio']:6.2f} {row['rel_err']:8.1e}",
              flush=True)
    shapes = [tuple(int(v) for v in x.split("x")) for x in args.shapes] if args.shapes else \
        QUICK if args.quick else SHAPES
    for M, N, K in shapes:
        flops = 2 * M * N * K
        for label, ours, theirs, c, f32, tf32 in _rows(M, N, K, not args.no_fp32):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            t_ref = time_gpu(theirs)
            torch.backends.cuda.matmul.allow_tf32 = False
            t = time_gpu(ours)
            ours()
            torch.cuda.synchronize()
            ref = torch.matmul(*f32)
            err = float((c.float() - ref).abs().max() / ref.abs().max())
            show({"shape": (M, N, K), "row": label, "tflops": flops / t / 1e12,
                  "cublas_tflops": flops / t_ref / 1e12, "ratio": t_ref / t, "rel_err": err})
    if not args.no_lm_head:
        for row in lm_head():
            show(row)
    if not args.no_mlp:
        show(mlp_block())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()

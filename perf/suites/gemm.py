"""GEMM speed for every dtype and float32 math mode against cuBLAS in the same run
(issue 23's table). Rows:

    float32 ieee      nbdnn.matmul            cuBLAS fp32 (allow_tf32 off)
    float32 tf32      nbdnn.matmul(math=)     cuBLAS with allow_tf32 on
    float32 3xtf32    nbdnn.matmul(math=)     cuBLAS fp32 (the accuracy it stands for)
    float16           nbdnn.matmul            cuBLAS fp16
    float16 / bf16 T1 the tensor-core variant T1 (nbdnn/cuda/matmul/wgmma_gemm.py,
                      a @ bt^T) until nbdnn.matmul dispatches to it

Square 4096 and 8192, skinny M = 64..512 and ragged sizes; GPU time by CUDA events
(nbdnn.bench.time_gpu: median after warm-up, L2 evicted), TFLOP/s = 2 M N K / t, the
ratio to cuBLAS, the max relative error against cuBLAS's fp32 product.

    PYTHONPATH=. python3 perf/suites/gemm.py [--json F] [--quick]
"""
import argparse
import json

import torch

import nbdnn
from nbdnn.bench import time_gpu

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (64, 4096, 4096), (512, 8192, 1024),
          (1000, 3000, 2040)]
QUICK = SHAPES[:1] + SHAPES[2:3]


def _rows(M, N, K):
    """(label, nbdnn run, cuBLAS run, output, the tf32 flag cuBLAS runs with)."""
    f32 = [torch.randn(M, K, device="cuda"), torch.randn(K, N, device="cuda")]
    c32 = torch.empty(M, N, device="cuda")
    for mode in ("ieee", "tf32", "3xtf32"):
        yield (f"float32 {mode}", lambda m=mode: nbdnn.matmul(*f32, math=m, out=c32),
               lambda: torch.matmul(*f32, out=c32), c32, f32, mode == "tf32")
    h = [x.half() for x in f32]
    c16 = torch.empty(M, N, device="cuda", dtype=torch.float16)
    yield ("float16", lambda: nbdnn.matmul(*h, out=c16), lambda: torch.matmul(*h, out=c16),
           c16, f32, False)
    if K % 8 == 0 and N % 2 == 0:
        from numba import cuda
        from nbdnn.cuda.matmul import wgmma_gemm as W
        for dtype, tdt in (("float16", torch.float16), ("bfloat16", torch.bfloat16)):
            a, bt = f32[0].to(tdt), f32[1].t().contiguous().to(tdt)
            c = torch.empty(M, N, device="cuda", dtype=tdt)
            da, db = (cuda.as_cuda_array(x.view(torch.int16)) for x in (a, bt))
            dc = cuda.as_cuda_array(c.view(torch.int32).reshape(-1))
            yield (f"{dtype} T1", lambda da=da, db=db, dc=dc, dtype=dtype: W.gemm(
                da, db, dc, M, N, K, 1.0, dtype, torch.cuda.current_stream().cuda_stream),
                lambda a=a, bt=bt, c=c: torch.matmul(a, bt.t(), out=c), c, f32, False)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    out = []
    print(f"{'shape':>18} {'row':16} {'nbdnn':>8} {'cuBLAS':>8} {'ratio':>6} {'rel err':>8}")
    for M, N, K in QUICK if args.quick else SHAPES:
        flops = 2 * M * N * K
        for label, ours, theirs, c, f32, tf32 in _rows(M, N, K):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            t_ref = time_gpu(theirs)
            torch.backends.cuda.matmul.allow_tf32 = False
            t = time_gpu(ours)
            ours()
            torch.cuda.synchronize()
            ref = torch.matmul(*f32)
            err = float((c.float() - ref).abs().max() / ref.abs().max())
            row = {"shape": (M, N, K), "row": label, "tflops": flops / t / 1e12,
                   "cublas_tflops": flops / t_ref / 1e12, "ratio": t_ref / t, "rel_err": err}
            out.append(row)
            print(f"{str((M, N, K)):>18} {label:16} {row['tflops']:8.1f} "
                  f"{row['cublas_tflops']:8.1f} {row['ratio']:6.2f} {err:8.1e}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()

"""SGEMM speed: nbdnn.matmul against cuBLAS (torch.matmul, TF32 off) in the same run,
fp32, square 512-8192 and skinny M = 64; each tile config forced in turn, with its
registers and spills. TFLOP/s = 2*M*N*K / time.

    PYTHONPATH=. python perf/sgemm.py [--json F]
"""
import argparse
import json

import torch

import nbdnn
from nbdnn.bench import time_gpu
from nbdnn.cuda import matmul as MM

SHAPES = [(512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096),
          (8192, 8192, 8192), (64, 4096, 4096), (4096, 64, 4096), (64, 8192, 1024)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    for M, N, K in SHAPES:
        a = torch.randn(M, K, device="cuda")
        b = torch.randn(K, N, device="cuda")
        c = torch.empty(M, N, device="cuda")
        flops = 2 * M * N * K
        t_ref = time_gpu(lambda: torch.matmul(a, b, out=c))
        ref = torch.matmul(a, b)
        line = {"shape": (M, N, K), "cublas_tflops": flops / t_ref / 1e12}
        for size in ("large", "small", "tiny"):
            saved = MM._choose_size
            MM._choose_size = lambda *_, s=size: s
            try:
                nbdnn.matmul(a, b, out=c)
                err = float((c - ref).abs().max() / ref.abs().max())
                t = time_gpu(lambda: nbdnn.matmul(a, b, out=c))
                k, sig, cfg = MM._KERNELS[size, "float32"]
                line[size] = {"tflops": flops / t / 1e12, "vs_cublas": t_ref / t,
                              "rel_err": err, "cfg": cfg, **k.resources(sig)}
            finally:
                MM._choose_size = saved
        rows.append(line)
        best = max(line[s]["vs_cublas"] for s in ("large", "small", "tiny"))
        print(f"{M}x{N}x{K}: cuBLAS {line['cublas_tflops']:.1f} TFLOP/s; " + "; ".join(
            f"{s} {line[s]['tflops']:.1f} ({line[s]['vs_cublas']:.0%}, {line[s]['regs']} regs, "
            f"{line[s]['local_bytes']} B spill, err {line[s]['rel_err']:.1e})"
            for s in ("large", "small", "tiny")) + f"; best {best:.0%}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

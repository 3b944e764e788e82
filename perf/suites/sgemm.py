"""SGEMM speed: nbdnn.matmul against cuBLAS (torch.matmul, TF32 off) in the same run,
fp32, square 512-8192 and skinny M = 64. Per shape: the automatic plan (tile size and
split-K chunks, nbdnn.cuda.matmul.choose_tile), then each tile config forced in turn (with
the split-K the plan would give it), with registers and spills. TFLOP/s = 2*M*N*K / time.

    PYTHONPATH=. python perf/suites/sgemm.py [--json F]
"""
import argparse
import json

import torch

import nbdnn
from nbdnn.bench import time_gpu
from nbdnn.cuda import matmul as MM
from nbdnn.ops import _plan

SHAPES = [(512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096),
          (8192, 8192, 8192), (64, 4096, 4096), (4096, 64, 4096), (64, 8192, 1024),
          (64, 576, 100352)]
FORCED = ("large", "small", "tiny")


def _time(run, a, b, c, ref, flops, t_ref, k=None, sig=None):
    run()
    err = float((c - ref).abs().max() / ref.abs().max())
    t = time_gpu(run)
    row = {"tflops": flops / t / 1e12, "vs_cublas": t_ref / t, "rel_err": err}
    if k is not None:
        row.update(k.resources(sig))
    return row


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
        line = {"shape": (M, N, K), "cublas_tflops": flops / t_ref / 1e12,
                "plan": MM.choose_tile(M, N, K, 1, "float32", True)}
        line["auto"] = _time(lambda: nbdnn.matmul(a, b, out=c), a, b, c, ref, flops, t_ref)
        for size in FORCED:
            MM.FORCE_TILE = (size, None)  # with the split-K choose_tile gives that tile
            _plan.clear()
            try:
                k, sig, cfg = MM._KERNELS[size, "float32"]
                line[size] = _time(lambda: nbdnn.matmul(a, b, out=c), a, b, c, ref, flops,
                                   t_ref, k, sig)
                line[size]["splits"] = MM.choose_tile(M, N, K, 1, "float32", True)[1]
            finally:
                MM.FORCE_TILE = None
                _plan.clear()
        rows.append(line)
        print(f"{M}x{N}x{K}: cuBLAS {line['cublas_tflops']:.1f} TFLOP/s; auto {line['plan']} "
              f"{line['auto']['tflops']:.1f} ({line['auto']['vs_cublas']:.0%}); " + "; ".join(
                  f"{s}/{line[s]['splits']} {line[s]['tflops']:.1f} ({line[s]['vs_cublas']:.0%}, "
                  f"{line[s]['regs']} regs, {line[s]['local_bytes']} B spill, "
                  f"err {line[s]['rel_err']:.1e})" for s in FORCED), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

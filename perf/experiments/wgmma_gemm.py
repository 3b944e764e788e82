"""The tensor-core GEMM's knobs (nbdnn/cuda/matmul/wgmma_gemm.py) against cuBLAS in one
run: PERSISTENT (one block an SM looping over tiles, or a block a tile as T1) and
GROUP_M (tile rows of a group in the block order: 1 is T1's row order), bf16 and
fp16, square sizes, b plain (MN-major B) and transposed (K-major B). GPU time from
nbdnn.bench.time_gpu (CUDA events, median, L2 evicted), TFLOP/s and the ratio.

    PYTHONPATH=. python3 perf/experiments/wgmma_gemm.py [--sizes 4096 8192]

Found: run AD call 1 (T1 as it was: K-major B, in flight 0, row order): bf16 640 / 650
TFLOP/s at 4096 / 8192 (0.87x / 0.91x cuBLAS), fp16 633 / 631 (0.88x / 0.99x).
Run AD call 2 (T2, a block a tile; bf16, cuBLAS 747 / 688): one wgmma batch left in
flight (a knob then, since dropped) 550-625 against 619-654 waiting for all; GROUP_M 8
against row order 654 / 654 vs 649 / 619 (4096 / 8192, b plain), 651 / 651 vs 644 / 620
(b transposed). Run AD call 3 (persistent grid; bf16, ratio to cuBLAS, b / bT):
4096 persistent GROUP_M 8 0.90 / 0.96, a block a tile 0.86 / 0.84, persistent GROUP_M
16 0.86 / 0.85, persistent row order 0.85 / 0.92; 8192 0.92 / 0.93, 0.94 / 0.94,
0.95 / 0.96, 0.91 / 0.90. Shipped: persistent, GROUP_M 8."""
import argparse

import torch

import nbdnn
from nbdnn.bench import time_gpu
from nbdnn.cuda.matmul import wgmma_gemm as W
from nbdnn.ops import _plan


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192])
    p.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"])
    p.add_argument("--variants", nargs="+", default=["0,8", "1,8", "1,16", "1,1"],
                   help="PERSISTENT,GROUP_M pairs")
    args = p.parse_args()
    print(f"{'dtype':9} {'n':>5} {'b':2} {'pers.':>6} {'group':>5} {'nbdnn':>7} {'cuBLAS':>7} "
          f"{'ratio':>5}")
    for dt in args.dtypes:
        tdt = getattr(torch, dt)
        for n in args.sizes:
            a = torch.randn(n, n, device="cuda").to(tdt)
            b = torch.randn(n, n, device="cuda").to(tdt)
            bt = b.t().contiguous()
            c = torch.empty(n, n, device="cuda", dtype=tdt)
            ref = torch.matmul(a.float(), b.float())
            for layout in ("nn", "nt"):
                if layout == "nn":
                    def theirs():
                        torch.matmul(a, b, out=c)

                    def ours():
                        nbdnn.matmul(a, b, out=c)
                else:
                    def theirs():
                        torch.matmul(a, bt.t(), out=c)

                    def ours():
                        nbdnn.matmul(a, bt, trans_b=True, out=c)
                t_ref = time_gpu(theirs)
                for v in args.variants:
                    W.PERSISTENT, W.GROUP_M = (int(x) for x in v.split(","))
                    _plan.clear()
                    t = time_gpu(ours)
                    ours()
                    err = float((c.float() - ref).abs().max() / ref.abs().max())
                    tf, tf_ref = 2 * n ** 3 / t / 1e12, 2 * n ** 3 / t_ref / 1e12
                    print(f"{dt:9} {n:5d} {layout[1]:2} {W.PERSISTENT:6d} {W.GROUP_M:5d} "
                          f"{tf:7.1f} {tf_ref:7.1f} {tf / tf_ref:5.2f}  err {err:.1e}",
                          flush=True)
    W.PERSISTENT, W.GROUP_M = True, 8


if __name__ == "__main__":
    main()

"""The tensor-core GEMM's tile width and pipeline depth (wgmma_gemm.TILE = (BN,
STAGES)) against cuBLAS in one run, over the square, skinny and ragged shapes of
perf/suites/gemm.py: issue 23 asks for tile shapes and stages chosen from measurement.
BN 128 doubles the tiles of a problem that fills less than a wave (ragged 1000 x 3000:
96 tiles of 128 x 256 on 132 SMs) and frees shared memory for up to 6 stages. bf16, b
plain and transposed; GPU time from nbdnn.bench.time_gpu (CUDA events, median, L2
evicted); TFLOP/s, the ratio to cuBLAS, the error against float32 torch.

    PYTHONPATH=. python3 perf/experiments/wgmma_tiles.py [--tiles 256,4 128,4 ...] [--store]

--store: each tile twice, C by direct stores and by TMA stores (wgmma_gemm.TMA_STORE,
staged_store.py; a "ts" column).

Found (run AG call 3, bf16): 256 x 4 (shipped) best or tied but at 256 x 4096 x 8192,
where 128 x 5-6 gives 0.55-0.58 against 0.44-0.46x; no tile reaches 0.7x on the skinny
rows (table in perf/RESULTS.md). --store (run AH): TMA stores 0.93 / 0.94 at 4096^3,
0.95 / 1.04 at 8192^3, 0.86 / 0.86 at 512 x 8192 x 1024 against direct stores' 0.90 /
0.87, 0.91 / 1.00, 0.66 / 0.69 (b plain / transposed): the default since.
"""
import argparse

import torch

import nbdnn
from nbdnn.bench import time_gpu
from nbdnn.cuda.matmul import wgmma_gemm as W
from nbdnn.ops import _plan

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (64, 4096, 4096), (512, 8192, 1024),
          (256, 4096, 8192), (1000, 3000, 2040), (4000, 4000, 4000)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tiles", nargs="+", default=["256,4", "256,3", "128,4", "128,5", "128,6"])
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--store", action="store_true")
    args = p.parse_args()
    tdt = getattr(torch, args.dtype)
    tiles = [tuple(int(x) for x in t.split(",")) + (ts,) for t in args.tiles
             for ts in ((False, True) if args.store else (False,))]
    print(f"{'M x N x K':>18} {'b':2} {'cuBLAS':>7} " +
          " ".join(f"{f'{bn}x{s}' + (' ts' if ts else ''):>12}" for bn, s, ts in tiles) +
          "   (TFLOP/s, x cuBLAS)")
    for M, N, K in SHAPES:
        a = torch.randn(M, K, device="cuda").to(tdt)
        b = torch.randn(K, N, device="cuda").to(tdt)
        bt = b.t().contiguous()
        c = torch.empty(M, N, device="cuda", dtype=tdt)
        ref = torch.matmul(a.float(), b.float())
        flop = 2 * M * N * K
        for trans in (False, True):
            bb = bt if trans else b
            t_ref = time_gpu(lambda: torch.matmul(a, bb.t() if trans else bb, out=c))
            cells = []
            for bn, stages, ts in tiles:
                W.TILE, W.TMA_STORE = (bn, stages), ts
                _plan.clear()
                t = time_gpu(lambda: nbdnn.matmul(a, bb, trans_b=trans, out=c))
                nbdnn.matmul(a, bb, trans_b=trans, out=c)
                err = float((c.float() - ref).abs().max() / ref.abs().max())
                bad = "" if err < 1e-2 else " BAD"
                cells.append(f"{flop / t / 1e12:6.0f} {t_ref / t:4.2f}{bad}")
            print(f"{M:>5} x {N:>5} x {K:>5} {'t' if trans else 'n':2} "
                  f"{flop / t_ref / 1e12:7.0f} " + " ".join(f"{x:>12}" for x in cells),
                  flush=True)
    W.TILE, W.TMA_STORE = (256, 4), False


if __name__ == "__main__":
    main()

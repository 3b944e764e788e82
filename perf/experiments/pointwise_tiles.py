"""The tensor-core GEMM's tile and split for ResNet-50's 1x1 convolutions (issue 24: the
forward's geomean is 0.78x cuDNN; its 1x1 layers 0.57-0.81x, the 3x3 up to 1.03x).
A 1x1 NHWC convolution is one GEMM: x (N*H*W, C) @ w (K, C)^T. Its shapes are short
(K = C = 64-2048: 1-32 k-tiles) and their tile counts sit near a wave of 132 SMs
(s3 1024>256: 49 tiles of 128 x 256, 98 of 128 x 128), so the tile and the split
decide. For each layer's GEMM: cuDNN's convolution and cuBLAS's matmul, then nbdnn's
matmul with every (rows, width, chunks) forced, and as chosen (split_k.tile_width,
split), GPU time by CUDA events (median, L2 flushed), bf16.

    PYTHONPATH=. python3 perf/experiments/pointwise_tiles.py [--layers s3a s4b] [--quick]

The kernel's fixed cost a block and the wave quantisation both move with the tile; a
rule is read off this table, not modelled (split_k.tile_width's model put s4 2048>512
on 104 tiles of 128 x 64).
"""
import argparse

import torch

import nbdnn
from nbdnn.bench import time_gpu
from nbdnn.cuda.matmul import wgmma_gemm as W
from nbdnn.cuda.runtime.device import sm_count
from nbdnn.ops import _plan

# name: (M = N*H*W at batch 32, N = filters, K = channels)
LAYERS = {"s1a": (100352, 64, 64), "s1b": (100352, 256, 64), "s1c": (100352, 64, 256),
          "s2b": (25088, 512, 128), "s2c": (25088, 128, 512), "s3b": (6272, 1024, 256),
          "s3c": (6272, 256, 1024), "s4b": (1568, 2048, 512), "s4c": (1568, 512, 2048)}
STAGES = {256: 4, 192: 5, 128: 6, 64: 6}  # (gemm lowers them to fit shared memory)


def forced(bm, bn, chunks):
    """Patch wgmma_gemm's choices to (bm rows, bn wide, chunks of K); returns undo."""
    saved = (W.SKINNY_TILE, W.SKINNY_ROWS, W.tile_width, W.split)
    if bm == 64:
        W.SKINNY_TILE, W.SKINNY_ROWS = (bn, STAGES[bn], 64), 1 << 40
    else:
        W.SKINNY_TILE = None
        W.tile_width = lambda *a, **k: bn
    W.split = lambda tiles, K, BK: _chunks(K, BK, chunks)
    _plan.clear()

    def undo():
        W.SKINNY_TILE, W.SKINNY_ROWS, W.tile_width, W.split = saved
        _plan.clear()
    return undo


def _chunks(K, BK, n):
    chunk = -(-K // (n * BK)) * BK
    return -(-K // chunk), chunk


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", nargs="+", default=list(LAYERS))
    p.add_argument("--quick", action="store_true", help="widths 256/128, chunks 1/2 only")
    args = p.parse_args()
    widths = (256, 128) if args.quick else (256, 192, 128, 64)
    splits = (1, 2) if args.quick else (1, 2, 3, 4)
    print(f"SMs {sm_count()}; us (x cuDNN conv); 'chosen' is the shipped rule")
    for name in args.layers:
        M, N, K = LAYERS[name]
        x = torch.randn(M, K, device="cuda").bfloat16()
        w = torch.randn(N, K, device="cuda").bfloat16()
        y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        x4 = x.view(32, -1, 1, K).permute(0, 3, 1, 2)  # (n, C, HW, 1), channels-last
        w4 = w.view(N, K, 1, 1)
        ref = torch.matmul(x.float(), w.float().t())
        t_dnn = time_gpu(lambda: torch.nn.functional.conv2d(x4, w4))
        t_blas = time_gpu(lambda: torch.matmul(x, w.t(), out=y))
        flop = 2 * M * N * K
        cells = [f"cuDNN {t_dnn * 1e6:.1f} ({flop / t_dnn / 1e12:.0f} TF/s)",
                 f"cuBLAS {t_blas * 1e6:.1f} ({t_dnn / t_blas:.2f})"]
        ours = lambda: nbdnn.matmul(x, w, trans_b=True, out=y)  # noqa: E731

        def cell(label):
            t = time_gpu(ours)
            ours()
            err = float((y.float() - ref).abs().max() / ref.abs().max())
            return f"{label} {t * 1e6:.1f} ({t_dnn / t:.2f}){'' if err < 1e-2 else ' BAD'}"
        cells.append(cell("chosen"))
        print(f"\n{name} {M} x {N} x {K}: " + "  ".join(cells), flush=True)
        for bm in (128, 64):
            row = []
            for bn in widths:
                if bn > 64 * -(-N // 64) + 64 or (bm == 64 and bn not in (256, 128)):
                    continue  # (wider than N by a box; 64-row tiles: 256, 128 wide only,
                    # as tested, run AO's 64 x 64 tile read out of bounds)
                for n in splits:
                    if n > 1 and K < n * 128:
                        continue
                    undo = forced(bm, bn, n)
                    try:
                        row.append(cell(f"{bm}x{bn}/{n}"))
                    except Exception as e:  # (a config gemm cannot build: say so)
                        row.append(f"{bm}x{bn}/{n} {type(e).__name__}")
                    finally:
                        undo()
            print("  " + "  ".join(row), flush=True)


if __name__ == "__main__":
    main()

"""transform_tensor's swaps of two axes: the tiled transpose (cuda/tensor/transpose.py)
against the gather kernel it replaces (tensor.TILED_TRANSPOSE off) and torch's
permute().contiguous(), GPU time by graph replay (torch's one launch eager), GB/s counting one read and one write
of the tensor, on ResNet-50's shapes at batch 32: activations NCHW <-> NHWC and the
filters a stride-1 data gradient transposes (K, taps, C) -> (C, taps, K).

    PYTHONPATH=. python perf/experiments/transpose_ab.py
"""
import torch

import nbdnn
from nbdnn.bench import time_gpu, time_graph
from nbdnn.cuda import tensor as T

CASES = [("x 56x56x64 NCHW->NHWC", (32, 64, 56, 56), (0, 2, 3, 1)),
         ("x 28x28x512 NHWC->NCHW", (32, 28, 28, 512), (0, 3, 1, 2)),
         ("x 14x14x1024 NCHW->NHWC", (32, 1024, 14, 14), (0, 2, 3, 1)),
         ("w 3x3 512 (K,taps,C)->(C,taps,K)", (512, 9, 512), (2, 1, 0)),
         ("w 1x1 2048x512", (2048, 512), (1, 0)),
         ("w 3x3 64", (64, 9, 64), (2, 1, 0))]


def main():
    shipped = T.TILED_TRANSPOSE
    print(f"{'case':34} {'tiled GB/s':>10} {'gather':>8} {'torch':>8}  tiled x gather, x torch")
    for name, shape, perm in CASES:
        x = torch.randn(shape, device="cuda").to(torch.bfloat16)
        out = torch.empty([shape[p] for p in perm], device="cuda", dtype=torch.bfloat16)
        nbytes = 2 * x.numel() * x.element_size()
        times = {}
        for tiled in (True, False):
            T.TILED_TRANSPOSE = tiled
            nbdnn.transform_tensor(x, perm=perm, out=out)
            assert torch.equal(out, x.permute(*perm)), name
            times[tiled] = time_graph(lambda: nbdnn.transform_tensor(x, perm=perm, out=out))
        T.TILED_TRANSPOSE = shipped
        t_torch = time_gpu(lambda: out.copy_(x.permute(*perm)))  # (one launch: eager)
        print(f"{name:34} {nbytes / times[True] / 1e9:10.0f} {nbytes / times[False] / 1e9:8.0f} "
              f"{nbytes / t_torch / 1e9:8.0f}  {times[False] / times[True]:.2f}x, "
              f"{t_torch / times[True]:.2f}x", flush=True)


if __name__ == "__main__":
    main()

"""Where does float32's "3xtf32" lose accuracy on the GPU (issue 56, section 7)?

matmul(a, b) of random normal float32 n x n matrices against float64, for n = 512 ..
4096, in each way that isolates one suspect:
  ieee         the SIMT kernel's FMA (round to nearest at every add): the reference
               behaviour, error ~ sqrt(K)
  3xtf32 tc    the tensor-core kernel over the parts (what users get)
  3xtf32 simt  the same parts on the SIMT kernel (TENSOR_CORES off): the split with
               IEEE accumulation
  tf32 tc      TF32-exact inputs (no operand rounding): the tensor cores' accumulation
               alone
  tf32 simt    the same on the SIMT kernel
  cublas tf32  torch.matmul with allow_tf32 on the same TF32-exact inputs: the
               hardware's accumulation through NVIDIA's own kernel
Columns: max |c - c64| / max |c64|, and "shrink", the least-squares scale of c against
c64 less 1 (sum((c - c64) c64) / sum(c64^2)): a rounding that always moves toward zero
shows as a negative shrink growing with K, noise as a shrink near 0.

    PYTHONPATH=. python perf/experiments/tf32_accuracy.py [--sizes 512 1024 2048 4096]
"""
import argparse

import numpy as np
import torch

import nbdnn
from nbdnn.cuda import matmul as cm
from nbdnn.ops import _plan


def tf32_exact(x):
    u = x.view(np.uint32).copy()
    u = (u + 0xFFF + ((u >> 13) & 1)) & 0xFFFFE000
    return u.view(np.float32)


def measure(c, exact):
    c = c.astype(np.float64)
    err = float(np.abs(c - exact).max() / np.abs(exact).max())
    shrink = float(((c - exact) * exact).sum() / (exact * exact).sum())
    return err, shrink


def nbdnn_matmul(a, b, mode, tensor_cores):
    cm.TENSOR_CORES = tensor_cores
    _plan.clear()
    try:
        da, db = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
        return nbdnn.matmul(da, db, math=mode).cpu().numpy()
    finally:
        cm.TENSOR_CORES = True
        _plan.clear()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="*", default=[512, 1024, 2048, 4096])
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    print(f"{'n':>5} {'way':<12} {'max err':>10} {'shrink':>11}")
    for n in args.sizes:
        rng = np.random.default_rng(n)
        a = rng.standard_normal((n, n)).astype(np.float32)
        b = rng.standard_normal((n, n)).astype(np.float32)
        exact = a.astype(np.float64) @ b.astype(np.float64)
        at, bt = tf32_exact(a), tf32_exact(b)
        exact_t = at.astype(np.float64) @ bt.astype(np.float64)
        rows = [("ieee", nbdnn_matmul(a, b, "ieee", True), exact),
                ("3xtf32 tc", nbdnn_matmul(a, b, "3xtf32", True), exact),
                ("3xtf32 simt", nbdnn_matmul(a, b, "3xtf32", False), exact),
                ("tf32 tc", nbdnn_matmul(at, bt, "tf32", True), exact_t),
                ("tf32 simt", nbdnn_matmul(at, bt, "tf32", False), exact_t)]
        torch.backends.cuda.matmul.allow_tf32 = True
        c = (torch.from_numpy(at).cuda() @ torch.from_numpy(bt).cuda()).cpu().numpy()
        torch.backends.cuda.matmul.allow_tf32 = False
        rows.append(("cublas tf32", c, exact_t))
        for way, c, ex in rows:
            err, shrink = measure(c, ex)
            print(f"{n:>5} {way:<12} {err:10.2e} {shrink:11.2e}", flush=True)


if __name__ == "__main__":
    main()

"""3xtf32 on the wgmma kernel with its k-tile products added on the CUDA cores (promote,
nbdnn.cuda.matmul.PROMOTE_3XTF32) against the tensor cores accumulating (the kernel
before): GPU time by CUDA events (nbdnn.bench's time_gpu: median, the L2 flushed), TFLOP/s, error and
shrink against float64, beside cuBLAS in the same process (torch.matmul, TF32 off: IEEE
SGEMM; on: TF32). Also the registers and local memory of the promoted kernels, and
attention's 3xtf32 over 4096 keys, promoted or not (D 64: flash_tf32's mma.sync chain
along the keys, nbdnn.cuda.attention.flash_tf32.PROMOTE_3X; D 128: gemm.py's GEMMs).

    PYTHONPATH=. python perf/experiments/tf32_promote_ab.py [MxNxK ...]
"""
import numpy as np
import torch

import nbdnn
from nbdnn.bench.timing import time_gpu
from nbdnn.cuda import matmul as cm
from nbdnn.cuda.attention import flash_tf32 as fa
from nbdnn.cuda.runtime.launch import REGISTRY
from nbdnn.ops import _plan


def ms(fn):
    return 1e3 * time_gpu(fn, reps=20)


def errors(got, exact):
    got = got.double().cpu().numpy()
    err = float(np.abs(got - exact).max() / np.abs(exact).max())
    shrink = float(((got - exact) * exact).sum() / (exact * exact).sum())
    return err, shrink


def main():
    import sys
    sizes = [tuple(map(int, a.split("x"))) for a in sys.argv[1:]] or \
        [(4096, 4096, 4096), (8192, 8192, 4096), (256, 4096, 8192)]
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    for m, n, k in sizes:
        a = torch.randn(m, k, device="cuda")
        b = torch.randn(k, n, device="cuda")
        exact = (a.double() @ b.double()).cpu().numpy()
        flops = 2 * m * n * k
        rows = []
        for name, fn in (
                ("cublas ieee", lambda: torch.matmul(a, b)),
                ("nbdnn ieee", lambda: nbdnn.matmul(a, b, math="ieee"))):
            rows.append((name, ms(fn), errors(fn(), exact)))
        torch.backends.cuda.matmul.allow_tf32 = True
        rows.append(("cublas tf32", ms(lambda: torch.matmul(a, b)),
                     errors(torch.matmul(a, b), exact)))
        torch.backends.cuda.matmul.allow_tf32 = False
        for promote in (False, True):
            cm.PROMOTE_3XTF32 = promote
            _plan.clear()
            fn = lambda: nbdnn.matmul(a, b, math="3xtf32")  # noqa: E731
            rows.append((f"nbdnn 3xtf32 {'promoted' if promote else 'tc-accumulated'}",
                         ms(fn), errors(fn(), exact)))
        cm.PROMOTE_3XTF32 = True
        base = rows[0][1]
        for name, t, (err, shrink) in rows:
            print(f"{m}x{n}x{k} {name:28} {t:8.3f} ms {flops / t / 1e9:7.1f} TFLOP/s "
                  f"x cuBLAS-ieee {base / t:5.2f}  err {err:.2e} shrink {shrink:+.2e}",
                  flush=True)
    for kern in [k for k in REGISTRY if "_pr" in k.name]:
        print(kern.name, kern.resources(kern.sigs[0]))
    for D in (64, 128):
        q = torch.randn(2, 4, 1024, D, device="cuda")
        kv = torch.randn(2, 4, 4096, D, device="cuda")
        exact = torch.nn.functional.scaled_dot_product_attention(
            q.double(), kv.double(), kv.double()).cpu().numpy()
        for mode, promote in (("ieee", True), ("3xtf32", False), ("3xtf32", True)):
            cm.PROMOTE_3XTF32 = fa.PROMOTE_3X = promote
            _plan.clear()
            fn = lambda: nbdnn.scaled_dot_product_attention(q, kv, kv, math=mode)  # noqa: E731
            err, shrink = errors(fn()[0], exact)
            label = mode + ("" if mode == "ieee" else " promoted" if promote else " tc-acc")
            print(f"attention D {D}, 4096 keys, {label:18}: {ms(fn):7.3f} ms "
                  f"err {err:.2e} shrink {shrink:+.2e}", flush=True)


if __name__ == "__main__":
    main()

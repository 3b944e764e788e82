"""float32 on the tensor cores (math="tf32" / "3xtf32"): what the hardware does with
float32 bits that are not TF32, and where the time goes, against cuBLAS TF32 in the
same run.

1. Rounding: the tf32 wgmma kernel (nbdnn/cuda/matmul/wgmma_gemm.py) run directly on
   raw float32 operands, its TMA maps typed FLOAT32 or TFLOAT32, against float64
   products of the operands truncated to TF32, rounded to nearest even, or rounded
   ties away (cvt.rna, nbdnn's reference). The reference that matches to float32
   accumulation error (~1e-7 relative) is what the unit did.
2. Time at square sizes: the whole nbdnn.matmul(math=...) call, its operand pass
   (tf32_parts) alone, the GEMM alone on ready parts, cuBLAS TF32 (allow_tf32) and
   cuBLAS float32; TFLOP/s = 2 n^3 / t.

    PYTHONPATH=. python3 perf/experiments/tf32_gemm.py [--sizes 4096 8192]

Found (run AE, H200): FLOAT32 maps 1.37e-6 / 7.7e-4 / 7.7e-4 against truncation / RNE /
ties-away, TFLOAT32 maps 7.7e-4 / 1.36e-6 / 4.9e-5: the tensor cores truncate, TMA
through a TFLOAT32 map rounds to nearest even (so "tf32" is RNE and K-major operands
need no pass; TF32_MAP = "tfloat32"). 4096³: cuBLAS TF32 0.379 ms, nbdnn tf32 nt
0.419, nn 0.567; the GEMM alone 0.403 (either map), the parts pass for a and b 0.354
(0.72 TB/s: a branch around each load; since rewritten); 3xtf32 1.497 = GEMM 1.13 +
parts 0.44. Each mode now runs twice: tf32_parts' variant 3 and variant 4 (VECTOR,
written after run AI, float4 loads and stores).
"""
import argparse

import torch

import nbdnn
from nbdnn.bench import time_gpu
from nbdnn.cuda.matmul import tf32_parts as P
from nbdnn.cuda.matmul import wgmma_gemm as W
from nbdnn.ops import _plan


def _rounded(x, how):
    u = x.view(torch.int32)
    if how == "trunc":
        r = u & ~0x1FFF
    elif how == "rne":
        r = (u + 0xFFF + ((u >> 13) & 1)) & ~0x1FFF
    else:  # rna
        r = (u + 0x1000) & ~0x1FFF
    return r.view(torch.float32).double()


def rounding(n=512):
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(n, n, device="cuda", generator=g)
    bt = torch.randn(n, n, device="cuda", generator=g)
    refs = {how: _rounded(a, how) @ _rounded(bt, how).t() for how in ("trunc", "rne", "rna")}
    exact = a.double() @ bt.double().t()
    scale = float(exact.abs().max())
    print(f"rounding, {n}^3, max |c - ref| / max |ref|:")
    print(f"{'TMA type':10} " + " ".join(f"{h:>9}" for h in refs) + f" {'exact':>9}")
    for mt in ("float32", "tfloat32"):
        W.TF32_MAP = mt
        c = torch.empty(n, n, device="cuda")
        W.gemm(a, bt, c, False, True, None, None, 0.0, 1.0, 0.0, 0)
        torch.cuda.synchronize()
        errs = [float((c.double() - r).abs().max()) / scale for r in refs.values()]
        errs.append(float((c.double() - exact).abs().max()) / scale)
        print(f"{mt:10} " + " ".join(f"{e:9.2e}" for e in errs))
    W.TF32_MAP = "tfloat32"


def speed(n):
    a = torch.randn(n, n, device="cuda")
    b = torch.randn(n, n, device="cuda")
    c = torch.empty(n, n, device="cuda")
    flops = 2 * n ** 3
    rows = []
    torch.backends.cuda.matmul.allow_tf32 = True
    rows.append(("cuBLAS tf32", time_gpu(lambda: torch.matmul(a, b, out=c))))
    torch.backends.cuda.matmul.allow_tf32 = False
    rows.append(("cuBLAS fp32", time_gpu(lambda: torch.matmul(a, b, out=c))))
    bt = b.t().contiguous()
    shipped = P.VECTOR
    rows.append(("nbdnn tf32 nt (no pass)", time_gpu(
        lambda: nbdnn.matmul(a, bt, trans_b=True, math="tf32", out=c))))
    for mode in ("tf32", "3xtf32"):
        for vec in (False, True):  # tf32_parts' variant 3, then 4 (VECTOR: float4 moves)
            P.VECTOR, v = vec, " v4" if vec else " v3"
            _plan.clear()  # (a call's plan holds the pass it recorded: run AJ's first
            # timing of v4 replayed v3's plan)
            rows.append((f"nbdnn {mode}{v}", time_gpu(
                lambda m=mode: nbdnn.matmul(a, b, math=m, out=c))))
            rows.append((f"  parts pass{v}", time_gpu(
                lambda m=mode: (P.operand(a, True, 0, m, 0), P.operand(b, False, 1, m, 0)))))
        P.VECTOR = shipped
        _plan.clear()
        pa = P.operand(a, True, 0, mode, 0)
        pb = P.operand(b, False, 1, mode, 0)
        for mt in ("float32", "tfloat32"):
            W.TF32_MAP = mt
            rows.append((f"  gemm ({mt} map)", time_gpu(
                lambda: W.gemm(pa, pb, c, False, True, None, None, 0.0, 1.0, 0.0, 0))))
        W.TF32_MAP = "tfloat32"
    base = rows[0][1]
    print(f"\n{n}^3: {'row':22} {'ms':>8} {'TFLOP/s':>8} {'x cuBLAS tf32':>13}")
    for name, t in rows:
        print(f"{'':7}{name:22} {t * 1e3:8.3f} {flops / t / 1e12:8.1f} {base / t:13.2f}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192])
    args = p.parse_args()
    rounding()
    for n in args.sizes:
        speed(n)


if __name__ == "__main__":
    main()

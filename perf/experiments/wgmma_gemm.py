"""Variant T1 of the tensor-core GEMM (nbdnn/cuda/matmul/wgmma_gemm.py) against
cuBLAS (torch.matmul) in the same run: bf16 and fp16, square 4096 and 8192, GPU time
from CUDA events (median of 20 after warm-up), TFLOP/s and the ratio. Also checks the
result against torch's on each shape (max relative error).

    PYTHONPATH=. python3 perf/experiments/wgmma_gemm.py [--sizes 4096 8192]

Found: (not run yet; written for the first device call of issue 23's next session)."""
import argparse
import statistics



def main():
    import torch
    from numba import cuda
    from nbdnn.cuda.matmul import wgmma_gemm as W
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192])
    args = p.parse_args()
    for dtype, tdt in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        for n in args.sizes:
            a = torch.randn(n, n, device="cuda", dtype=tdt)
            bt = torch.randn(n, n, device="cuda", dtype=tdt)
            c = torch.empty(n, n, device="cuda", dtype=tdt)
            da = cuda.as_cuda_array(a.view(torch.int16))
            db = cuda.as_cuda_array(bt.view(torch.int16))
            c32 = cuda.as_cuda_array(c.view(torch.int32).reshape(-1))

            def ours():
                W.gemm(da, db, c32, n, n, n, 1.0, dtype, torch.cuda.current_stream().cuda_stream)

            def theirs():
                torch.matmul(a, bt.t())
            times = {}
            for name, fn in (("nbdnn", ours), ("cublas", theirs)):
                for _ in range(3):
                    fn()
                ts = []
                for _ in range(20):
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    fn()
                    e.record()
                    e.synchronize()
                    ts.append(s.elapsed_time(e) * 1e-3)
                times[name] = statistics.median(ts)
            ours()
            ref = torch.matmul(a.float(), bt.float().t())
            err = ((c.float() - ref).abs().max() / ref.abs().max()).item()
            tf = {k: 2 * n ** 3 / v / 1e12 for k, v in times.items()}
            print(f"{dtype:9s} {n:5d}: nbdnn {tf['nbdnn']:7.1f} TFLOP/s, cuBLAS {tf['cublas']:7.1f}"
                  f" ({tf['nbdnn'] / tf['cublas']:.2f}x), max rel err {err:.2e}", flush=True)


if __name__ == "__main__":
    main()

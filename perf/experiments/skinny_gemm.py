"""Where a skinny or ragged tensor-core GEMM's time goes, and which split-K settings
and tile serve it (issue 23: skinny / ragged >= 0.7x cuBLAS; run AG's tile sweep left
them at 0.45-0.72x). For each shape (perf/suites/gemm.py's non-square rows and two
more) and each variant of split_k's knobs (SPLIT_FILL, MIN_CHUNK, MAX_SPLITS) and the
tile (wgmma_gemm.TILE): the flushed event time against cuBLAS in the same run, the
split, and the kernels PyTorch's profiler (CUPTI) sees with their mean durations: the
GEMM kernel, split-K's sum, cuBLAS's kernels. bf16, b plain.

    PYTHONPATH=. python3 perf/experiments/skinny_gemm.py [--variants ship nosplit ...]
    PYTHONPATH=. python3 perf/experiments/skinny_gemm.py --fixed

Found (run AH, H200; `perf/history/2026-12-03-h200-runAH-call1-skinny.log`): the
split settings then shipped (chunks >= 512: 8 chunks at 64 x 4096 x 4096) lost to
chunks >= 1024 (4 chunks: 0.61 against 0.57x; M = 128: 0.53 against 0.42x), shipped
since; no split, smaller chunks, a fuller grid or the 128-wide tile did not help; in
kernel time alone nbdnn's 64 x 4096 x 4096 takes 15.7 + 4.9 us (GEMM + sum) against
cuBLAS's 8.4, and one 128 x 256 tile of one k-tile 6.3 us (TMA stores; 9.1 direct)
against 2.0 (--fixed; perf/experiments/gemm_timeline.py says where it goes).
Run AI (`...-runAI-call1-knobs.log`): TMA_STORE_F32, LEAN_SETUP and SKINNY_TILE
together ("all" then, "ship" now; "ah" the run-AH kernel): 64 x 4096 x 4096 0.61 ->
0.72x, 128 x 4096 x 4096 0.53 -> 0.66, 256 x 4096 x 8192 0.45 -> 0.60, 64 x 8192 x
8192 0.60 -> 0.72, 512 x 8192 x 1024 0.85 -> 0.90; one tile 6.3 -> 5.3 us.

--fixed: a block's fixed cost. One 128 x 256 tile (and one wave of them) with 1, 8 and
32 k-tiles, the kernel's duration under the profiler against cuBLAS's, with the
blocks' own tensor maps or host maps, TMA or direct stores, persistent or not: the
intercept is what a block pays besides its k-tiles.
"""
import argparse
import re

import torch
from torch.profiler import ProfilerActivity, profile

import nbdnn
from nbdnn.bench import time_gpu
from nbdnn.cuda.matmul import split_k as SK
from nbdnn.cuda.matmul import wgmma_gemm as W
from nbdnn.cuda.runtime.device import sm_count
from nbdnn.ops import _plan

SHAPES = [(64, 4096, 4096), (128, 4096, 4096), (256, 4096, 8192), (512, 8192, 1024),
          (1000, 3000, 2040), (64, 8192, 8192), (128, 256, 64),
          (100352, 64, 64), (25088, 128, 512)]  # (ResNet-50's 1x1 convolutions at batch 32)
SHIPPED = (SK.SPLIT_FILL, SK.MIN_CHUNK, SK.MAX_SPLITS, W.TILE)
KNOBS = {"TMA_STORE_F32": W.TMA_STORE_F32, "LEAN_SETUP": W.LEAN_SETUP,
         "SKINNY_TILE": W.SKINNY_TILE, "SKINNY_ROWS": W.SKINNY_ROWS,
         "CLUSTER_SPLIT": W.CLUSTER_SPLIT, "WIDTHS": SK.WIDTHS,
         "ONE_WAVE": SK.ONE_WAVE, "NARROW": SK.NARROW}  # (their shipped values)
# name: (SPLIT_FILL, MIN_CHUNK, MAX_SPLITS, TILE[, wgmma_gemm knobs]); "c1024" became the
# shipped split in run AH; the knobs written after run AH (TMA_STORE_F32, LEAN_SETUP,
# SKINNY_TILE), shipped since run AI: "ah" all three off, "nof32" / "nolean" / "nom64"
# one off
VARIANTS = {
    "ship": SHIPPED,
    "nosplit": (0.0, 1024, 16, (256, 4)),
    "c512": (0.5, 512, 16, (256, 4)),
    "c256": (0.5, 256, 16, (256, 4)),
    "fill1": (1.0, 256, 32, (256, 4)),
    "c1024": (0.5, 1024, 16, (256, 4)),
    "t128": (0.5, 512, 16, (128, 6)),
    "t128f1": (1.0, 256, 32, (128, 6)),
    "ah": SHIPPED + ({"TMA_STORE_F32": False, "LEAN_SETUP": False, "SKINNY_TILE": None},),
    "nof32": SHIPPED + ({"TMA_STORE_F32": False},),
    "nolean": SHIPPED + ({"LEAN_SETUP": False},),
    "nom64": SHIPPED + ({"SKINNY_TILE": None},),
    # written after run AI: split-K summed in a cluster (CLUSTER_SPLIT), the 64-row tile
    # up to M = 128 / 256 (SKINNY_ROWS), both; 192-wide tiles where they fit a wave
    "cluster": SHIPPED + ({"CLUSTER_SPLIT": True},),
    "rows128": SHIPPED + ({"SKINNY_ROWS": 128},),
    "rows256": SHIPPED + ({"SKINNY_ROWS": 256},),
    "cl128": SHIPPED + ({"CLUSTER_SPLIT": True, "SKINNY_ROWS": 128},),
    "cl256": SHIPPED + ({"CLUSTER_SPLIT": True, "SKINNY_ROWS": 256},),
    "w192": SHIPPED + ({"WIDTHS": (256, 192)},),  # (split_k.tile_width: 1000 x 3000)
    "wave": SHIPPED + ({"ONE_WAVE": True},),  # (split_k.split: chunks a wave holds)
    "clwave": SHIPPED + ({"ONE_WAVE": True, "CLUSTER_SPLIT": True, "SKINNY_ROWS": 256},),
    # run AJ turned on ONE_WAVE, WIDTHS (256, 192) and SKINNY_ROWS 128: "ai" as shipped in
    # run AI, "clust" the cluster's split-K on top
    "ai": SHIPPED + ({"ONE_WAVE": False, "WIDTHS": (256,), "SKINNY_ROWS": 64},),
    "clust": SHIPPED + ({"CLUSTER_SPLIT": True},),
    "narrow": SHIPPED + ({"NARROW": True},),  # (split_k.NARROW: 128 and 64 wide too)
}


def _set(v):
    SK.SPLIT_FILL, SK.MIN_CHUNK, SK.MAX_SPLITS, W.TILE = v[:4]
    for k, shipped in KNOBS.items():
        setattr(SK if k in ("WIDTHS", "ONE_WAVE", "NARROW") else W, k,
                (v[4] if len(v) > 4 else {}).get(k, shipped))
    _plan.clear()


def kernels(fn, calls=10):
    """[(kernel name, mean µs, launches a call)] of fn under the profiler."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return [(ev.key, ev.device_time_total / ev.count, ev.count / calls)
            for ev in prof.key_averages() if ev.device_time_total > 0]


def _short(name):
    m = re.search(r"(wgmma_gemm|_?splitk_sum|tf32_parts)\w*?(?=\d*[A-Z]|$)", name)
    return m.group(0)[:34] if m else name.split("(")[0][:34]


FIXED = {"ship": {}, "host_maps": {"OWN_MAPS": False}, "direct_store": {"TMA_STORE": False},
         "full_setup": {"LEAN_SETUP": False},
         "no_persist": {"PERSISTENT": False}}


def fixed():
    print("kernel durations (us) under the profiler: one tile, one wave of tiles")
    shapes = [(128, 256, k) for k in (64, 512, 2048)] + [(128, 256 * 132, 64),
                                                         (128, 256 * 132, 512)]
    for M, N, K in shapes:
        a = torch.randn(M, K, device="cuda").bfloat16()
        b = torch.randn(K, N, device="cuda").bfloat16()
        c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        cells = [f"cuBLAS {sum(us * k for _, us, k in kernels(lambda: torch.matmul(a, b, out=c))):.1f}"]
        for name, knobs in FIXED.items():
            old = {k: getattr(W, k) for k in knobs}
            for k, v in knobs.items():
                setattr(W, k, v)
            _plan.clear()
            ks = kernels(lambda: nbdnn.matmul(a, b, out=c))
            cells.append(f"{name} {sum(us * k for _, us, k in ks):.1f}")
            for k, v in old.items():
                setattr(W, k, v)
        print(f"{M:5} x {N:6} x {K:5}: " + "  ".join(cells), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--variants", nargs="+", default=list(VARIANTS))
    p.add_argument("--fixed", action="store_true")
    args = p.parse_args()
    if args.fixed:
        return fixed()
    print(f"SMs {sm_count()}; shipped split-K {SHIPPED[:3]}, tile {SHIPPED[3]}")
    for M, N, K in SHAPES:
        a = torch.randn(M, K, device="cuda").bfloat16()
        b = torch.randn(K, N, device="cuda").bfloat16()
        c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        ref = torch.matmul(a.float(), b.float())
        flop = 2 * M * N * K
        theirs = lambda: torch.matmul(a, b, out=c)  # noqa: E731
        t_ref = time_gpu(theirs)
        ks = ", ".join(f"{_short(n)} {us:.1f}" for n, us, _ in kernels(theirs))
        print(f"\n{M} x {N} x {K}: cuBLAS {t_ref * 1e6:.1f} us {flop / t_ref / 1e12:.0f} "
              f"TFLOP/s [{ks}]")
        for name in args.variants:
            v = VARIANTS[name]
            _set(v)
            bn = v[3][0]
            tiles = -(-M // W.BM) * -(-N // bn)
            splits, chunk = SK.split(tiles, K, W.BK)
            ours = lambda: nbdnn.matmul(a, b, out=c)  # noqa: E731
            t = time_gpu(ours)
            ours()
            err = float((c.float() - ref).abs().max() / ref.abs().max())
            ks = ", ".join(f"{_short(n)} {us:.1f}" + (f" x{k:g}" if k != 1 else "")
                           for n, us, k in kernels(ours))
            print(f"  {name:8} tiles {tiles:4} splits {splits:2} chunk {chunk:5}: "
                  f"{t * 1e6:7.1f} us {t_ref / t:4.2f}x{'' if err < 1e-2 else ' BAD'} [{ks}]",
                  flush=True)
    _set(SHIPPED)


if __name__ == "__main__":
    main()

"""Is the graph leak a race with autograd's device thread? (run BA: run AZ's leak of the
first convolution weight's AccumulateGrad node came and went between runs; the H100's
probe saw it once in float32 channels-last, params 0-2, and not in a fresh process.)
Hypothesis: on CUDA the backward runs on autograd's device thread, and the last
reference to a step's graph can be dropped there after loss.backward() has returned;
freeing nbdnn's Python autograd nodes needs the GIL, which the main thread holds while
it runs the next forward, and that forward reuses the parameters' AccumulateGrad nodes
still alive (the ones nearest the input are freed last). Counts, over TRIALS fresh
small nets each, how often a node survives: converted as usual, converted with the
backward on the calling thread, converted with a 20 ms sleep after each step (the GIL
free), and native PyTorch.

    PYTHONPATH=. python perf/experiments/graph_leak_race.py [TRIALS] [cpu]
"""
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "..", "tests")]
from test_torch_capture import kept_nodes  # noqa: E402

TRIALS = int(sys.argv[1]) if len(sys.argv) > 1 else 8
DEVICE = sys.argv[2] if len(sys.argv) > 2 else "cuda"


def count(label, fmt=torch.channels_last, bf16=True, threads=True, **kw):
    torch.autograd.set_multithreading_enabled(threads)
    leaks, t = [], time.perf_counter()
    for _ in range(TRIALS):
        kept, _ = kept_nodes(DEVICE, bf16, fmt, **kw)
        leaks.append(kept)
    torch.autograd.set_multithreading_enabled(True)
    n = sum(1 for k in leaks if k)
    print(f"{label:52}: {n}/{TRIALS} leaked {[k for k in leaks if k][:4]} "
          f"({time.perf_counter() - t:.1f} s)", flush=True)


def main():
    kept_nodes(DEVICE, True)  # (compiles)
    for fmt, bf16, name in ((torch.channels_last, True, "bf16 CL"),
                            (torch.channels_last, False, "fp32 CL")):
        count(f"{name} converted", fmt, bf16)
        count(f"{name} converted, backward on the calling thread", fmt, bf16, threads=False)
        count(f"{name} converted, 20 ms sleep after each step", fmt, bf16, settle=0.02)
        count(f"{name} native", fmt, bf16, native=True)


if __name__ == "__main__":
    main()

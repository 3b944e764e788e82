"""What kept a converted small net's AccumulateGrad nodes alive across CUDA steps? (Run
AZ: a unit test kept the first convolution weight's node on an H100; run BA's probe saw
parameters 0-2 kept once, with no holder in Python's view.) Counts, over TRIALS fresh
small nets each (tests/test_torch_capture.kept_nodes), how often a node survives, in
ways that tell three hypotheses apart:
- autograd's device thread (run BA): on CUDA the backward runs there and may drop the
  last reference to a step's graph after loss.backward() has returned; freeing nbdnn's
  Python nodes needs the GIL, which the main thread holds while its next forward reuses
  the nodes still alive. Ways: backward on the calling thread; a 20 ms sleep after
  each step (the GIL free); native PyTorch (C++ nodes, no GIL).
- a reference cycle (run BB): a step's graph held until the cyclic collector runs, a
  generation-0 collection mid-forward freeing it after the first layers fetched their
  nodes again. Ways: the collector off during the steps (a cycle then leaks every
  time), gc.collect() after each step (never); and a census of what one converted step
  leaves to the collector (gc.DEBUG_SAVEALL): types, tensors with autograd history,
  the code of frames and functions (a stored exception's traceback).
- the host sync (run BB): since run AZ's review each kept_nodes step reads the loss as
  a float, which waits for the GPU with the GIL released; run AZ's failing test did
  not. The ways again without it, and with torch.cuda.synchronize() in its place.
Last, run AZ's failing steps exactly: no sync and small_net's own draws (kept_nodes
redraws the first convolution after the other layers, so every weight differs).
Run BB (H100): 0 leaks in every way but the last, which was written after its calls.

    PYTHONPATH=. python perf/experiments/graph_leak_race.py [TRIALS] [cpu]
"""
import collections
import gc
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "..", "tests")]
from test_torch_capture import kept_nodes  # noqa: E402

TRIALS = int(sys.argv[1]) if len(sys.argv) > 1 else 8
DEVICE = sys.argv[2] if len(sys.argv) > 2 else "cuda"


def count(label, fmt=torch.channels_last, bf16=True, threads=True, collector=True, **kw):
    torch.autograd.set_multithreading_enabled(threads)
    leaks, t = [], time.perf_counter()
    for _ in range(TRIALS):
        gc.collect()
        if not collector:
            gc.disable()
        try:
            kept, _ = kept_nodes(DEVICE, bf16, fmt, **kw)
        finally:
            gc.enable()
        leaks.append(kept)
    torch.autograd.set_multithreading_enabled(True)
    n = sum(1 for k in leaks if k)
    print(f"{label:52}: {n}/{TRIALS} leaked {[k for k in leaks if k][:4]} "
          f"({time.perf_counter() - t:.1f} s)", flush=True)


types_frame = type(sys._getframe())


def census(fmt, bf16, native=False):
    """What a net's steps leave to the cyclic collector (after a first net has warmed
    the kernels and plans)."""
    kept_nodes(DEVICE, bf16, fmt, native=native)  # (warm: plans replay)
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        kept_nodes(DEVICE, bf16, fmt, native=native)
        gc.collect()
        garbage = list(gc.garbage)
    finally:
        gc.garbage.clear()
        gc.set_debug(0)
        gc.enable()
    types = collections.Counter(type(o).__name__ for o in garbage)
    history = sum(1 for o in garbage if isinstance(o, torch.Tensor) and o.grad_fn is not None)
    where = collections.Counter(
        o.f_code.co_filename.split("/nbdnn/")[-1] + ":" + o.f_code.co_name
        if isinstance(o, types_frame) else o.__code__.co_filename.split("/nbdnn/")[-1]
        for o in garbage if isinstance(o, types_frame) or hasattr(o, "__code__"))
    print(f"census {'native' if native else 'converted'} {'bf16' if bf16 else 'fp32'}: "
          f"{len(garbage)} objects in cycles, {history} tensors with history; "
          f"{types.most_common(12)}; frames/functions: {where.most_common(8)}", flush=True)


def main():
    kept_nodes(DEVICE, True)  # (compiles)
    for fmt, bf16, name in ((torch.channels_last, True, "bf16 CL"),
                            (torch.channels_last, False, "fp32 CL")):
        census(fmt, bf16)
        count(f"{name} converted", fmt, bf16)
        count(f"{name} converted, collector off during the steps", fmt, bf16, collector=False)
        count(f"{name} converted, gc.collect() after each step", fmt, bf16, after_step=gc.collect)
        count(f"{name} converted, backward on the calling thread", fmt, bf16, threads=False)
        count(f"{name} converted, 20 ms sleep after each step", fmt, bf16,
              after_step=lambda: time.sleep(0.02))
        count(f"{name} native", fmt, bf16, native=True)
        count(f"{name} native, collector off", fmt, bf16, native=True, collector=False)
    for fmt, bf16, name in ((torch.channels_last, True, "bf16 CL"),
                            (torch.channels_last, False, "fp32 CL")):
        count(f"{name} converted, no host sync", fmt, bf16, sync=False)
        count(f"{name} converted, no host sync, backward on the calling thread", fmt, bf16,
              sync=False, threads=False)
        count(f"{name} converted, no host sync, 20 ms sleep", fmt, bf16, sync=False,
              after_step=lambda: time.sleep(0.02))
        count(f"{name} converted, no host sync, torch.cuda.synchronize()", fmt, bf16,
              sync=False, after_step=torch.cuda.synchronize if DEVICE == "cuda" else None)
        count(f"{name} native, no host sync", fmt, bf16, native=True, sync=False)
        count(f"{name} converted, run AZ's steps (no sync, small_net's own draws)", fmt, bf16,
              sync=False, redraw=False)
        count(f"{name} native, run AZ's steps", fmt, bf16, native=True, sync=False,
              redraw=False)


if __name__ == "__main__":
    main()

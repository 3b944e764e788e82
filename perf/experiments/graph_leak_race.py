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
Run BB: every way above kept nothing, but each step ends with the loss read as a float
(kept_nodes' sync, added after run AZ's failing test, which had none): a host sync,
which waits for the GPU with the GIL released, so the device thread gets its turn.
The same ways without it come last ("no host sync"), beside torch.cuda.synchronize()
(the GIL released too) in its place; they kept nothing either (run BB, call 5). Last,
run AZ's failing steps exactly: no sync and small_net's own draws (kept_nodes now
redraws the first convolution after the other layers, so its weights and every later
draw differ from run AZ's).
Second hypothesis (run BB): a reference cycle holds each step's graph until Python's
cyclic collector runs, and a generation-0 collection that comes mid-forward frees it
only after the first layers have fetched their nodes again (the nodes nearest the
input were the ones kept). Counted with the collector off during the steps (a cycle
then leaks every time) and with gc.collect() after each step (never); and a census
of what one converted CUDA step leaves to the collector (gc.DEBUG_SAVEALL): object
types, tensors with autograd history, frames and tracebacks (a stored exception), and
the module that made each function or frame.

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


def census(fmt, bf16, native=False):
    """What one step (after 5 warm ones) leaves to the cyclic collector."""
    seen = {}

    def watch(model):
        seen["model"] = model
    kept_nodes(DEVICE, bf16, fmt, native=native, watch=watch)  # (warm: plans replay)
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


types_frame = type(sys._getframe())


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

"""Which part of nbdnn's CUDA path keeps a bf16 channels-last step's autograd graph alive
(run AZ, H100: tests/test_torch_capture.py's small net, 4 + 3 steps, left the first
convolution weight's AccumulateGrad node alive on CUDA; the CPU reference, with and
without bf16 autocast, leaves none, and so do nbdnn.torch's CUDA branches run on CPU
tensors with the reference standing in for nbdnn's ops, a CI test now). After the
default run (bf16 autocast, channels-last, a 3-channel input): the live graph tensors
and autograd.Function contexts and what refers to them (capture_probe.holders()), the
tensors every thread's eager call plans keep, the first convolution's last input and
output watched (alive after the steps?); then the same steps on fresh models: backward
on the calling thread, the stem's two narrow-channel paths off, 8 input channels,
float32 channels-last, bf16 NCHW, autocast's cast cache off, gc.collect() before the
count; the direct entries off, eager call plans off, both (kept_nodes). Run BA (H100):
no holder found, the leak intermittent (graph_leak_race.py counts it).

    PYTHONPATH=. python perf/experiments/graph_leak_probe.py [cpu]   (cpu: a dry run)
"""
import gc
import os
import sys
import weakref

import torch

from nbdnn.ops import _plan
from nbdnn.torch import _bridge

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "..", "tests")]
from capture_probe import graph_tensors, holders  # noqa: E402
from test_torch_capture import kept_nodes  # noqa: E402


DEVICE = sys.argv[1] if len(sys.argv) > 1 else "cuda"  # ("cpu": a dry run)


def steps(label, bf16=True, channels=3, fmt=torch.channels_last, cache=True, collect=False):
    """kept_nodes' steps on a fresh model, the parameters whose node survived printed."""
    kept, params = kept_nodes(DEVICE, bf16, fmt, channels, cache, collect)
    print(f"{label}: step-4 AccumulateGrad nodes survived for parameters {kept} "
          f"{[tuple(params[i].shape) for i in kept]}", flush=True)


def watched_first_conv():
    """The default steps with the first convolution's input and output watched through
    weak references: whether the last step's outlive it, and what holds them."""
    seen = {}

    def hook(module, args, out):
        seen["input"], seen["output"] = weakref.ref(args[0]), weakref.ref(out)
        seen["node"] = type(out.grad_fn).__name__
        seen["next"] = [type(f).__name__ for f, _ in out.grad_fn.next_functions]
    kept, _ = kept_nodes(DEVICE, True, watch=lambda model: model[0].register_forward_hook(hook))
    print(f"watched: kept {kept}; conv1's node {seen.get('node')} -> {seen.get('next')}",
          flush=True)
    for name in ("input", "output"):
        t = seen[name]()
        print(f"  conv1's last {name}: {'ALIVE' if t is not None else 'gone'}", flush=True)
        if t is not None:
            for chain in holders(t, skip=set()):
                print("    held by " + " <- ".join(chain), flush=True)
        del t


def plan_graph_refs():
    """Tensors the eager call plans of every thread keep (workspaces, fixed tables; the
    backward's plans live on autograd's device thread) that require grad, have a node
    or view another tensor: a plan holding a graph."""
    from nbdnn.cuda.runtime.plan_record import Recording
    kept, recs = 0, [o for o in gc.get_objects() if isinstance(o, Recording)]
    for rec in recs:
        for where in ("workspaces", "fixed"):
            for o in getattr(rec, where, {}).values():
                kept += 1
                if isinstance(o, torch.Tensor) and (o.requires_grad or o._base is not None):
                    print(f"  a plan keeps in {where} {tuple(o.shape)} {o.dtype} "
                          f"requires_grad={o.requires_grad} node={type(o.grad_fn).__name__}"
                          f" view={o._base is not None}", flush=True)
    print(f"plans: {len(recs)} recordings, {kept} arrays kept", flush=True)
    del recs


def switched(label, module, name, value):
    """steps() with module.name set to value (plans cleared before and after)."""
    old = getattr(module, name)
    setattr(module, name, value)
    _plan.clear()
    try:
        steps(label)
    finally:
        setattr(module, name, old)
        _plan.clear()


def live_contexts():
    """Live autograd.Function contexts (each is its graph node: alive, it keeps every
    node it reaches, AccumulateGrad ones included), with what holds them."""
    found = [o for o in gc.get_objects()
             if isinstance(o, torch.autograd.function.BackwardCFunction)]
    for c in found[:6]:
        print(f"  live context {type(c).__name__}", flush=True)
        for chain in holders(c, skip={id(found)}):
            print("    held by " + " <- ".join(chain), flush=True)
    n = len(found)
    del found
    return n


def main():
    steps("default (bf16 autocast, channels-last, 3 input channels)")
    print(f"live graph tensors: {graph_tensors()}", flush=True)
    print(f"live Function contexts: {live_contexts()}", flush=True)
    plan_graph_refs()
    watched_first_conv()
    threads = torch.autograd.is_multithreading_enabled()
    torch.autograd.set_multithreading_enabled(False)  # (backward on this thread)
    steps("backward on the calling thread, not autograd's device thread")
    torch.autograd.set_multithreading_enabled(threads)
    if DEVICE == "cuda":
        from nbdnn.cuda.conv import im2col_rows, im2col_words
        switched("the stem's padded columns off", im2col_words, "PAD_NARROW_CHANNELS", False)
        switched("the stem's row-staged im2col off", im2col_rows, "ON", False)
    steps("8 input channels", channels=8)
    steps("float32 channels-last", bf16=False)
    steps("bf16 NCHW", fmt=torch.contiguous_format)
    steps("autocast's cast cache off", cache=False)
    steps("gc.collect() before the count", collect=True)
    direct = dict(_bridge.DIRECT)
    _bridge.DIRECT.clear()
    _bridge.IMPLS.clear()
    steps("direct entries off")
    _bridge.DIRECT.update(direct)
    _bridge.IMPLS.clear()
    _plan.ENABLED = False
    steps("plans off")
    _bridge.DIRECT.clear()
    _bridge.IMPLS.clear()
    steps("both off")


if __name__ == "__main__":
    main()

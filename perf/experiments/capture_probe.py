"""Why a converted ResNet-50's bf16 channels-last training step failed to capture in
run AX's first call ("operation would make the legacy stream depend on a capturing
blocking stream", in backward; the same step's forward and a small tensor-core step
captured fine). While torch.cuda.graph captures, this logs every GPU-facing thing nbdnn
and numba do outside the capture stream: nbdnn kernel launches on the legacy stream
(handle 0), numba host-to-device copies, numba's pending deallocations flushed
(cuMemFree), each with the first lines of its stack, from any thread (backward runs on
autograd's device thread).

    PYTHONPATH=. python perf/experiments/capture_probe.py [--native-first] [--separate]
        [--collect] [--models] [--eager 5] [--batch 8]

Before capturing it lists the live tensors still in an autograd graph (PyTorch warned
that an earlier iteration's AccumulateGrad node was kept alive, which breaks a capture
when that node's stream is the legacy default stream), each with the chains of what
holds it up to a module global (run AY: run AX's listing showed the probe's own lists
and frames); --collect runs gc.collect() first (a reference cycle keeping the graph
alive would then be gone).

Run AX call 2 (H200, batch 8, after the derived-map plans): ours alone, native first
(shared parameters) and with gc.collect() all captured and replayed, no live graph
tensors, nothing off the capture stream; with no eager steps (--eager 0: the first
calls on the side stream) an illegal instruction: maps and tables copied on the legacy
stream and read on the non-blocking side stream before they landed (arrays.to_device
and tensormap now wait for the copy). The batch-32 failure of call 1 (before the plans
change) is not reproduced here; perf/history/2026-12-05-h200-runAX-call2-probe.log.

--native-first: capture native's step first (as torch_models.py does; the two models
share their parameters unless --separate, which converts a deep copy). --models:
torch_models.py's order exactly: native's eager steps, ours', then native's warm-up
and capture, then ours' (no eager steps between).

Each capture also reports how many parameters' AccumulateGrad nodes outlived the eager
steps (marked after them, still marked after the side-stream warm-up: something kept
an eager step's graph alive, and the capture's backward would sync with the legacy
stream). Run AY: nbdnn.torch now hands nbdnn's ops detached tensors
(tests/test_torch_capture.py), the suspected holder being something nbdnn keeps.
"""
import argparse
import copy
import gc
import inspect
import os
import sys
import threading
import traceback

import torch
from numba import cuda
from numba.cuda.cudadrv import driver as numba_driver

import nbdnn.torch as nt
from nbdnn.cuda.runtime import launch as _launch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "suites"))
from resnet50 import side_stream_warm_up  # noqa: E402
from torch_models import step_fn  # noqa: E402

CAPTURING = threading.Event()
SEEN = []


def note(what):
    if CAPTURING.is_set() and len(SEEN) < 12:
        stack = "".join(traceback.format_stack(limit=14)[:-2])
        SEEN.append(f"--- {what} (thread {threading.current_thread().name})\n{stack}")


def instrument():
    launch = _launch.Kernel.launch

    def watched_launch(self, sig, grid, block, stream, *args, **kw):
        if not stream:
            note(f"nbdnn launch of {self.name} on the legacy stream")
        return launch(self, sig, grid, block, stream, *args, **kw)
    _launch.Kernel.launch = watched_launch
    to_device = cuda.to_device

    def watched_to_device(*a, **kw):
        note("numba cuda.to_device")
        return to_device(*a, **kw)
    cuda.to_device = watched_to_device
    clear = numba_driver._PendingDeallocs.clear

    def watched_clear(self):
        if len(self) and not self.is_disabled:
            note(f"numba flushes {len(self)} pending deallocations")
        return clear(self)
    numba_driver._PendingDeallocs.clear = watched_clear


def graph_tensors():
    """Live tensors that are part of an autograd graph (grad_fn set, or a view of such a
    tensor) after a step: what keeps an earlier iteration's AccumulateGrad nodes
    (PyTorch's warning) alive, each with the chain of what refers to it (holders())."""
    found = [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and
             (o.grad_fn is not None or (o._base is not None and o._base.grad_fn is not None))]
    shown = found[:6]
    for t in shown:
        print(f"  live graph tensor {tuple(t.shape)} {t.dtype} "
              f"{type(t.grad_fn or t._base.grad_fn).__name__}", flush=True)
        for chain in holders(t, skip={id(found), id(shown)}):
            print("    held by " + " <- ".join(chain), flush=True)
        del t  # (no reference of the probe's own left behind)
    n = len(found)
    del found, shown
    return n


def holders(obj, skip, depth=4, width=3):
    """Chains of what refers to obj, up to `depth` steps, ignoring frames, the probe's
    own containers (`skip`: ids) and the lists gc hands back: each a list of labels (a
    type, or the module global or attribute a dict or object is)."""
    chains, objs, paths = [], [obj], [[]]  # (no tuples holding the objects: they
    # would be referrers themselves)
    skip = skip | {id(objs)}
    for _ in range(depth):
        nxt_objs, nxt_paths = [], []
        skip = skip | {id(nxt_objs)}
        for i in range(len(objs)):  # (no zip: its reused result tuple refers to o)
            o, chain = objs[i], paths[i]
            args = (o,)  # (get_referrers' own argument tuple refers to o: skipped)
            refs = [r for r in gc.get_referrers(*args) if id(r) not in skip and
                    r is not args and not inspect.isframe(r)]
            skip = skip | {id(refs)}
            if not refs and chain:
                chains.append(chain)
            for r in refs[:width]:
                label = _label(r)
                if label.startswith("module ") or len(chain) + 1 == depth:
                    chains.append(chain + [label])
                else:
                    nxt_objs.append(r)
                    nxt_paths.append(chain + [label])
        objs, paths = nxt_objs, nxt_paths
        skip = skip | {id(objs)}
    return chains[:8]


def _label(r):
    """What r is: a module-level global's name where one is r (or r's __dict__)."""
    for name, mod in list(sys.modules.items()):
        d = getattr(mod, "__dict__", None)
        if d is r:
            return f"module {name}"
        if d is not None:
            for k, v in d.items():
                if v is r:
                    return f"module {name}.{k}"
    return type(r).__name__


def mark(params):
    """Mark each parameter's AccumulateGrad node (made now if none is alive)."""
    for p in params:
        p.view_as(p).grad_fn.next_functions[0][0].metadata["probe"] = True


def marked(params):
    """How many parameters' AccumulateGrad nodes still carry mark()'s mark."""
    return sum("probe" in p.view_as(p).grad_fn.next_functions[0][0].metadata for p in params)


def eager_steps(name, model, x, labels, n):
    fn = step_fn(model, x, labels, True)
    for _ in range(n):  # (torch_models.py's eager rows before: nbdnn's plans)
        fn()
    torch.cuda.synchronize()
    print(f"{name}: {n} eager steps on the default stream", flush=True)


def capture(name, model, x, labels, collect=False, eager=5):
    params = list(model.parameters())
    fn = step_fn(model, x, labels, True)
    graph = torch.cuda.CUDAGraph
    original = graph.capture_begin

    def begin(self, *a, **kw):
        CAPTURING.set()
        return original(self, *a, **kw)
    graph.capture_begin = begin
    try:
        for _ in range(eager):  # (torch_models.py's eager rows before: nbdnn's plans)
            fn()
        torch.cuda.synchronize()
        mark(params)
        side_stream_warm_up(fn)
        print(f"{name}: {graph_tensors()} live graph tensors after warm-up; "
              f"{marked(params)} of {len(params)} AccumulateGrad nodes outlived the "
              "earlier steps", flush=True)
        if collect:
            print(f"{name}: gc.collect() freed {gc.collect()} objects; "
                  f"{graph_tensors()} live graph tensors now", flush=True)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        g.replay()
        torch.cuda.synchronize()
        print(f"{name}: captured and replayed", flush=True)
    except Exception as e:  # (what the capture hit, then what was seen)
        print(f"{name}: {type(e).__name__}: {str(e).splitlines()[0]}", flush=True)
    finally:
        CAPTURING.clear()
        graph.capture_begin = original
    for s in SEEN:
        print(s, flush=True)
    SEEN.clear()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--native-first", action="store_true")
    p.add_argument("--models", action="store_true", help="torch_models.py's order")
    p.add_argument("--separate", action="store_true")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--collect", action="store_true", help="gc.collect() before capturing")
    p.add_argument("--eager", type=int, default=5, help="eager steps on the default stream "
                   "first (torch_models.py's eager rows)")
    args = p.parse_args()
    import torchvision
    torch.manual_seed(0)
    native = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
    ours, _ = nt.convert(copy.deepcopy(native) if args.separate else native)
    x = torch.randn(args.batch, 3, 224, 224, device="cuda").contiguous(
        memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (args.batch,), device="cuda")
    instrument()
    if args.models:
        eager_steps("native", native.train(), x, labels, args.eager)
        eager_steps("nbdnn.torch", ours.train(), x, labels, args.eager)
        capture("native", native, x, labels, eager=0)
        capture("nbdnn.torch", ours, x, labels, args.collect, eager=0)
        return
    if args.native_first:
        capture("native", native.train(), x, labels, eager=args.eager)
    capture("nbdnn.torch", ours.train(), x, labels, args.collect, args.eager)


if __name__ == "__main__":
    main()

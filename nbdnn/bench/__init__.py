"""Timing and roofline figures for `nbdnn bench` and perf/.

GPU times come from CUDA events around the op, after warm-up (JIT, module load), as
the median of many runs; CPU times from perf_counter. Before each timed run the GPU
writes a 256 MiB buffer (as triton.testing.do_bench does): this evicts the inputs from
the 50 MB L2, so small tensors are timed cold, and it keeps the GPU busy while the host
enqueues the start event, the op and the stop event, so the events time the GPU's
work and not the caller's Python (without it, a 20 us host front end showed up as
~5-10% of a 0.3 ms kernel, more on a slow host). Every GPU row is set against the
device copy bandwidth measured in the same run on a buffer of the same size (copy
speed depends on size: 3.7-3.8 TB/s at 256 MiB, 4.1-4.2 TB/s at 1 GiB on an H200)
and, when PyTorch is installed, against the PyTorch equivalent on the same data.
"""
import dataclasses
import json
import math
import os
from typing import Optional

import numpy as np

from .._files import atomic_write
from ..ops.registry import select
from .case import BenchCase
from .timing import (torch_or_none, torch_f, copy_bandwidth, graph_replay, host_cost,  # noqa: F401
                     host_costs, time_cpu, time_gpu, time_graph, graph_or_none)


@dataclasses.dataclass
class Row:
    op: str
    shape: str
    dtype: str
    bytes: int                       # the fewest bytes the op must move
    gpu_s: float
    copy_bw: float
    torch_s: Optional[float] = None
    cpu_s: Optional[float] = None
    flops: int = 0
    timing: str = "eager"            # or "graph": nbdnn's call replayed from a graph

    @property
    def gbps(self):
        return self.bytes / self.gpu_s / 1e9

    @property
    def pct_copy(self):
        return 100 * self.bytes / self.gpu_s / self.copy_bw

    @property
    def tflops(self):
        return self.flops / self.gpu_s / 1e12 if self.flops else None

    def as_dict(self):
        d = dataclasses.asdict(self)
        d.update(gbps=self.gbps, pct_copy=self.pct_copy, tflops=self.tflops,
                 vs_torch=(self.torch_s / self.gpu_s) if self.torch_s else None,
                 vs_cpu=(self.cpu_s / self.gpu_s) if self.cpu_s else None)
        return d


def format_table(rows):
    head = (f"{'op':<28} {'shape':<18} {'dtype':<8} {'GPU ms':>9} {'GB/s':>8} {'%copy':>6} "
            f"{'TFLOP/s':>8} {'torch ms':>9} {'vs torch':>8} {'CPU ms':>9} {'GPU/CPU':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        d = r.as_dict()
        t = f"{r.torch_s * 1e3:9.3f} {d['vs_torch']:7.2f}x" if r.torch_s else f"{'-':>9} {'-':>8}"
        c = f"{r.cpu_s * 1e3:9.2f} {d['vs_cpu']:7.0f}x" if r.cpu_s else f"{'-':>9} {'-':>8}"
        f = f"{r.tflops:8.2f}" if r.flops else f"{'-':>8}"
        lines.append(f"{r.op:<28} {r.shape:<18} {r.dtype:<8} {r.gpu_s * 1e3:9.3f} "
                     f"{r.gbps:8.0f} {r.pct_copy:5.0f}% {f} {t} {c}")
    return "\n".join(lines)


def _finite(v):
    """JSON has no NaN or infinity: null for an unmeasured or undefined figure; NumPy
    numbers as Python's."""
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


def save_json(rows, path, meta):
    """The rows and meta as JSON at path, written atomically (the text is made first: a
    row that cannot be written leaves the old file as it was)."""
    text = json.dumps(_finite({"meta": meta, "rows": [r.as_dict() for r in rows]}), indent=1,
                      allow_nan=False)
    with atomic_write(path, "w") as f:
        f.write(text)


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(rows) + 1.5))
    labels = [f"{r.op} {r.shape}" for r in rows]
    ax.barh(labels, [r.pct_copy for r in rows], label="nbdnn")
    if any(r.torch_s for r in rows):
        ax.barh(labels, [100 * r.bytes / r.torch_s / r.copy_bw if r.torch_s else 0
                         for r in rows], alpha=0.5, label="PyTorch")
    ax.axvline(100, color="k", lw=0.8)
    ax.set_xlabel("% of device copy bandwidth (same run)")
    ax.invert_yaxis()
    ax.legend()
    fig.tight_layout()
    with atomic_write(path) as f:
        fig.savefig(f, dpi=120, format=os.path.splitext(path)[1][1:] or "png")


# ---- the suite ------------------------------------------------------------------------
# A case is a BenchCase (bench/case.py). Its `make` gets device arrays (torch tensors
# when PyTorch is installed, so the PyTorch row times the very same buffers) and host
# copies.

def _elementwise_cases(n):
    import nbdnn
    cases = []
    for mode, tname in (("relu", "relu"), ("gelu", "gelu"), ("sigmoid", "sigmoid")):
        def fwd(d, h, mode=mode, tname=tname):
            F = torch_f()
            return {"gpu": lambda: nbdnn.activation(d["x"], mode, out=d["y"]),
                    "cpu": lambda: nbdnn.activation(h["x"], mode),
                    "torch": F and (lambda: getattr(F, tname)(d["x"]))}

        def bwd(d, h, mode=mode):
            torch = torch_or_none()
            tb = None
            if torch is not None:
                aten = torch.ops.aten
                tb = {"relu": lambda: aten.threshold_backward(d["dy"], d["x"], 0),
                      "gelu": lambda: aten.gelu_backward(d["dy"], d["x"]),
                      "sigmoid": lambda: aten.sigmoid_backward(d["dy"], d["y"])}[mode]
            return {"gpu": lambda: nbdnn.activation_backward(d["dy"], d["x"], mode=mode,
                                                             out=d["y"]),
                    "cpu": lambda: nbdnn.activation_backward(h["dy"], h["x"], mode=mode),
                    "torch": tb}
        cases.append(BenchCase(f"activation/{mode}", "activation", (n,), 8 * n, fwd))
        cases.append(BenchCase(f"activation_backward/{mode}", "activation_backward", (n,),
                               12 * n, bwd))
    return cases


def run_suite(ops=None, *, cpu=True, size_mb=None, progress=None, graph=False,
              dtype="float32"):
    """Time every case on the GPU (and CPU, PyTorch); returns Rows. graph: time nbdnn's
    GPU call as the replay of a captured graph, its GPU time alone (an eager call of
    several launches can take longer on the host than the flush hides); PyTorch's
    stay eager (one launch a call, hidden by the flush), as does any nbdnn call that
    cannot be captured (its row says timing "eager"). dtype: the buffers' dtype (the
    same shapes as float32's, bytes scaled by the itemsize); a case whose op does not
    take it (an NbdnnError) is left out, reported through `progress`."""
    from nbdnn.errors import NbdnnError
    from nbdnn.cuda import SIMULATOR
    from nbdnn.cuda.runtime.memory import arrays as _arrays
    if size_mb is None:
        size_mb = 0.01 if SIMULATOR else 1024
    n = max(256, int(size_mb * 2 ** 20) // 4)
    from .cases_elementwise import reduce_cases, softmax_cases
    from .cases_compute import conv_cases, matmul_cases
    from .cases_norm import bn_cases, other_norm_cases, pool_cases, row_norm_cases
    cases = (_elementwise_cases(n) + reduce_cases(n) + softmax_cases(n) + matmul_cases(n)
             + conv_cases(n) + pool_cases(n) + bn_cases(n) + row_norm_cases(n)
             + other_norm_cases(n))
    if ops:  # the same choice of names as `nbdnn check` (ops/registry.py select)
        cases = select(cases, ops)
    rng = np.random.default_rng(0)
    host32 = {"x": rng.standard_normal(n, dtype=np.float32),
              "dy": rng.standard_normal(n, dtype=np.float32)}
    host = {k: v.astype(dtype) for k, v in host32.items()}
    torch = torch_or_none()
    if torch is not None:
        tdt = getattr(torch, dtype)
        dev = {k: torch.from_numpy(v).cuda().to(tdt) for k, v in host32.items()}
        dev["y"] = torch.empty_like(dev["x"])
    else:
        dev = {k: _arrays.to_device(v) for k, v in host.items()}
        dev["y"] = _arrays.empty(dev["x"], (n,), dtype)
    scale = np.dtype(dtype).itemsize / 4  # (the cases count float32 bytes)
    rows = []
    for i, (label, _, shape, nbytes, make, flops) in enumerate(cases):
        if progress:
            progress(i, len(cases), label)
        nbytes = int(nbytes * scale)
        timer = time_cpu if SIMULATOR else time_gpu
        try:
            fns = make(dev, host)
            gpu_fn = (graph_or_none(fns["gpu"]) if graph else None) or fns["gpu"]
            gpu_s = timer(gpu_fn)
        except NbdnnError as e:
            if progress:
                progress(i, len(cases), f"{label}: left out ({type(e).__name__}: {e})")
            continue
        torch_s = None
        if fns.get("torch") and not SIMULATOR:
            try:  # (a peer that refuses this dtype mix leaves its column empty)
                torch_s = time_gpu(fns["torch"])
            except (RuntimeError, TypeError):
                torch_s = None
        cpu_s = time_cpu(fns["cpu"], warmup=0, reps=2, min_time=0) if cpu else None
        bw = copy_bandwidth(max(nbytes // 2, 4)) if not SIMULATOR else float("nan")
        rows.append(Row(label, "x".join(map(str, shape)), dtype, nbytes, gpu_s, bw,
                        torch_s, cpu_s, flops,
                        "graph" if gpu_fn is not fns["gpu"] else "eager"))
    if progress:
        progress(len(cases), len(cases), "done")
    return rows

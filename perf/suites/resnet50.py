"""ResNet-50 end to end in 16 bits: nbdnn.nn.resnet50 channels-last against
torchvision's resnet50 in channels_last, same GPU, same run.

Inference (eval, batch 32 and 1): nbdnn with batch norm folded into the convolutions
(nn.fold_batch_norm) under a CUDA graph (nn.GraphedSteps.forward), against PyTorch
eager and PyTorch under a CUDA graph, the model in bf16 (`.bfloat16()`). Training
(batch 32): nbdnn's mixed-precision step (Sequential.plan(precision="bf16"): bf16
parameters and activations, float32 masters, SGD with momentum, float32 loss) graphed,
against PyTorch eager under torch.autocast(bfloat16) with float32 parameters, and
under a CUDA graph. GPU time: CUDA events around 20 back-to-back calls, the median of
15 such (per call). Memory: PyTorch's torch.cuda.max_memory_allocated over its step;
nbdnn's, the device memory in use after its graphed step (its graphs keep every
activation, gradient and workspace) less that before the model existed, measured
first, with PyTorch's cache emptied (torch tensors hold nbdnn's bf16 arrays).
Then a breakdown of nbdnn's folded forward by top-level layer (eager, CUDA events
between layers: launch gaps count) and the bf16 logits' error against float32.

    PYTHONPATH=. python perf/suites/resnet50.py [--batch 32] [--json F] [--no-train]
        [--no-nbdnn] [--set MODULE.NAME=VALUE ...]   (perf/tools/switches.py)
"""
import argparse
import gc
import json
import os
import sys
import statistics

import numpy as np
import torch
import torch.nn.functional as F

from nbdnn import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import switches  # noqa: E402  (perf/tools/switches.py)


def gpu_ms(fn, reps=20, rounds=15):
    """Median GPU time of fn() in ms (CUDA events around `reps` calls, `rounds` times)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / reps)
    return statistics.median(times)


def side_stream_warm_up(fn, n=3):
    """fn() n times on a side stream, as PyTorch asks before a capture."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(n):
            fn()
    torch.cuda.current_stream().wait_stream(s)


def torch_graphed(fn, before_capture=None):
    """fn() captured in a CUDA graph after warm-up on a side stream; its replay.
    before_capture(): run between the two (nbdnn.torch.fresh_accumulators)."""
    side_stream_warm_up(fn)
    if before_capture is not None:
        before_capture()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def used_bytes():
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return total - free


def nbdnn_rows(batch, train, rows):
    """nbdnn's inference (batch and 1) and training step; the logits' error."""
    base = used_bytes()
    model = nn.resnet50(layout="NHWC").to("cuda")
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((batch, 224, 224, 3), np.float32)).cuda()
    ref = torch.as_tensor(nn.fold_batch_norm(model).forward(x, train=False)).float()
    model.to_precision("bf16")
    folded = nn.fold_batch_norm(model)
    for b in (batch, 1):
        steps = nn.GraphedSteps(folded, b, (224, 224, 3))
        xb = x[:b].bfloat16()
        logits = torch.as_tensor(steps.forward(xb)).float()
        if b == batch:
            rows["bf16_logits_rel_err"] = float((logits - ref).norm() / ref.norm())
        replay = steps._graphs["forward"].replay
        rows[f"infer_b{b}_nbdnn_graph_ms"] = gpu_ms(replay)
    # breakdown: each top-level layer's time in the folded forward (eager)
    h, parts = x.bfloat16(), []
    folded.forward(h, train=False)  # (warm: a first eager call records its plan)
    for layer in folded.seq:
        layer.forward(h, train=False)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(5):
            y = layer.forward(h, train=False)
        e1.record()
        e1.synchronize()
        parts.append((type(layer).__name__, tuple(torch.as_tensor(y).shape),
                      round(e0.elapsed_time(e1) / 5, 4)))
        h = y
    rows["nbdnn_layers_ms"] = parts
    if train:
        target = torch.from_numpy(np.eye(1000, dtype=np.float32)[rng.integers(0, 1000, batch)])
        target = target.cuda()
        gc.collect()  # (the inference steps above)
        before = torch.cuda.memory_allocated()
        steps = model.plan(batch, (224, 224, 3), loss=nn.CrossEntropyLoss(),
                           optimizer=nn.SGD(model, 0.01, momentum=0.9), precision="bf16")
        xb = x.bfloat16()
        for _ in range(3):
            loss = steps.step(xb, target)
        rows["train_nbdnn_loss"] = float(torch.as_tensor(loss).float().reshape(-1)[0])
        rows["train_b%d_nbdnn_graph_ms" % batch] = gpu_ms(steps._graphs["step"].replay)
        rows["train_nbdnn_memory_MiB"] = (used_bytes() - base) / 2 ** 20
        # the step's arrays (nbdnn allocates like its inputs: torch's allocator here;
        # the bf16 parameters, 49 MiB, existed before); the figure above also holds the
        # loaded kernels' code, the inference models and torch's cache
        rows["train_nbdnn_arrays_MiB"] = (torch.cuda.memory_allocated() - before) / 2 ** 20
        if getattr(steps, "arena_bytes", 0):  # (nn.train.REUSE_BUFFERS: the shared arena)
            rows["train_nbdnn_arena_MiB"] = steps.arena_bytes / 2 ** 20
            rows["train_nbdnn_traced_MiB"] = steps.traced_bytes / 2 ** 20


def torch_rows(batch, train, rows):
    import torchvision
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((batch, 3, 224, 224), np.float32)).cuda()
    x = x.to(memory_format=torch.channels_last)
    torch.backends.cudnn.benchmark = True
    m16 = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
    m16 = m16.bfloat16().eval()
    with torch.no_grad():
        for b in (batch, 1):
            xb = x[:b].bfloat16()
            rows[f"infer_b{b}_torch_eager_ms"] = gpu_ms(lambda: m16(xb))
            rows[f"infer_b{b}_torch_graph_ms"] = gpu_ms(torch_graphed(lambda: m16(xb)))
    m16 = None  # (free it before the training model)
    if not train:
        return
    base = torch.cuda.memory_allocated() - x.numel() * x.element_size()  # (x: the step's)
    model = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), 0.01, momentum=0.9)
    labels = torch.from_numpy(rng.integers(0, 1000, batch)).cuda()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", torch.bfloat16):
            loss = F.cross_entropy(model(x), labels)
        loss.backward()
        opt.step()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    # less what was allocated before the model: one measurement's 7873 MiB counted nbdnn's
    # arrays still alive (they come from torch's allocator when fed torch tensors)
    rows["train_torch_memory_MiB"] = (torch.cuda.max_memory_allocated() - base) / 2 ** 20
    rows[f"train_b{batch}_torch_eager_ms"] = gpu_ms(step, reps=5, rounds=9)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--json")
    p.add_argument("--no-train", action="store_true")
    p.add_argument("--no-nbdnn", action="store_true", help="PyTorch's rows alone")
    switches.add_argument(p)
    a = p.parse_args()
    switches.apply(a.set)
    rows = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version()}
    if not a.no_nbdnn:
        nbdnn_rows(a.batch, not a.no_train, rows)
    gc.collect()  # (nbdnn's steps hold cycles: free them before PyTorch's rows)
    torch.cuda.empty_cache()
    torch_rows(a.batch, not a.no_train, rows)
    for k, v in rows.items():
        if k != "nbdnn_layers_ms":
            print(f"{k:32} {v:.4g}" if isinstance(v, float) else f"{k:32} {v}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    b = a.batch
    if a.no_nbdnn:
        return
    for k in (f"infer_b{b}", "infer_b1"):
        print(f"{k}: nbdnn graph / torch eager {rows[k + '_nbdnn_graph_ms'] / rows[k + '_torch_eager_ms']:.2f}, "
              f"/ torch graph {rows[k + '_nbdnn_graph_ms'] / rows[k + '_torch_graph_ms']:.2f}")
    if not a.no_train:
        print(f"train b{b}: nbdnn graph / torch eager autocast "
              f"{rows[f'train_b{b}_nbdnn_graph_ms'] / rows[f'train_b{b}_torch_eager_ms']:.2f}")
    print("nbdnn folded forward by layer (eager, ms):")
    for name, shape, ms in rows["nbdnn_layers_ms"]:
        print(f"  {name:16} {str(shape):22} {ms:8.3f}")


if __name__ == "__main__":
    main()

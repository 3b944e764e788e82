"""nbdnn inside PyTorch (issue 26): what nbdnn.torch costs and gives.

--host: host cost of one call on small CUDA tensors: the bare nbdnn op (torch tensors on
PyTorch's default stream, replayed by nbdnn's eager call plans: "planned" lists the
states of its signatures, Plan where replayed), the nbdnn.torch function (its eager
path: a direct call of the custom op's implementation), the same with autograd
recording (inputs requiring grad), and the torch.nn.functional call it replaces; 40
rounds, each timing 50 calls of every one in turn; "added" is the median over rounds of
nbdnn.torch's excess over the bare op in the same round (a loaded host's drift cancels).
The issue's goal: <= 3 us over the bare op. --cpu: the same on CPU tensors (nbdnn's
reference; the wrappers' own cost there, and a dry run of the script without a GPU).
--models: torchvision's ResNet-50 (random weights), native and nbdnn.torch.convert-ed,
training step (forward, cross-entropy, backward, SGD) at batch B in each --configs (fp32
with PyTorch's default TF32 convolutions; bf16 autocast, NCHW or channels-last), eager
and replayed from a torch.cuda.CUDAGraph, GPU ms by CUDA events (median); first the
converted eval logits against native's (fp32, TF32 off for the check).

    PYTHONPATH=. python perf/suites/torch_models.py [--host [--profile] [--cpu]] [--models]
        [--batch 32]
"""
import argparse
import os
import sys

import torch

import nbdnn
import nbdnn.torch as nt
from nbdnn.bench import host_costs
from nbdnn.ops._plan import plans_of_this_thread

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from resnet50 import gpu_ms, torch_graphed  # noqa: E402  (perf/suites/resnet50.py)

F = torch.nn.functional


def plan_states(op):
    """The eager call plan states of op's signatures on this thread (Plan: replayed)."""
    fn = getattr(op, "unplanned", op)
    return ", ".join(sorted(type(v).__name__ if v.__class__ not in (int, str) else str(v)
                            for k, v in plans_of_this_thread().items() if k[0] is fn))


def host_rows(profile=False, dev="cuda"):
    x = torch.randn(1024, device=dev)  # (small: the host's cost, not the GPU's)
    xg = x.clone().requires_grad_()
    a, w, b = (torch.randn(32, 64, device=dev), torch.randn(64, 64, device=dev),
               torch.randn(64, device=dev))
    img, k = torch.randn(1, 16, 8, 8, device=dev), torch.randn(16, 16, 3, 3, device=dev)
    tf32 = "tf32" if torch.backends.cudnn.allow_tf32 and dev == "cuda" else "ieee"  # (what
    # nt.conv2d runs)
    g = w[0]  # (layer norm's weight, made once: a view costs ~1 us a call)
    if dev == "cpu":  # (the bare op on the tensors' NumPy views)
        xn, an, wn, bn, gn, imgn, kn = (t.numpy() for t in (x, a, w, b, g, img, k))
    else:
        xn, an, wn, bn, gn, imgn, kn = x, a, w, b, g, img, k
    # (the bare calls: the arguments nbdnn.torch's CUDA path gives the op, so "added" is
    # the wrapper's own time, not a difference in the op's plan signature)
    cases = {  # name: (the nbdnn op, bare, wrapped, wrapped with autograd, native)
        "relu 1k": (nbdnn.activation, lambda: nbdnn.activation(xn, "relu", coef=0.0),
                    lambda: nt.relu(x), lambda: nt.relu(xg), lambda: F.relu(x)),
        "linear 32x64x64": (nbdnn.matmul, lambda: nbdnn.matmul(an, wn, trans_b=True, bias=bn),
                            lambda: nt.linear(a, w, b), None, lambda: F.linear(a, w, b)),
        "conv2d 1x16x8x8, 3x3": (nbdnn.conv2d,
                                 lambda: nbdnn.conv2d(imgn, kn, None, padding=1, math=tf32),
                                 lambda: nt.conv2d(img, k, padding=1), None,
                                 lambda: F.conv2d(img, k, padding=1)),
        "layer_norm 32x64": (nbdnn.layer_norm,
                             lambda: nbdnn.layer_norm(an, gn, bn, ndim=1, eps=1e-5),
                             lambda: nt.layer_norm(a, (64,), g, b), None,
                             lambda: F.layer_norm(a, (64,), g, b)),
    }
    print("host us a call (median of 40 rounds of 50 calls each, the four in turn)")
    print("call                   | bare nbdnn | nbdnn.torch | + autograd | torch F | added "
          "| planned")
    for name, (op, bare, wrapped, graded, native) in cases.items():
        fns = [bare, wrapped] + [f for f in (graded, native) if f is not None]
        us, excess = host_costs(fns, sync=torch.cuda.synchronize if dev == "cuda" else
                                lambda: None)
        us, excess = [u * 1e6 for u in us], [e * 1e6 for e in excess]
        if graded is None:
            us.insert(2, float("nan"))
        print(f"{name:22} | {us[0]:10.1f} | {us[1]:11.1f} | {us[2]:10.1f} | {us[3]:7.1f} | "
              f"{excess[0]:5.1f} | {plan_states(op)}", flush=True)
    if profile:  # where a wrapped call's host time goes (the functions of 2000 calls)
        import cProfile
        import pstats
        for name, (_, _, wrapped, graded, _) in cases.items():
            for f in (wrapped, graded):
                if f is not None:
                    p = cProfile.Profile()
                    p.runcall(lambda: [f() for _ in range(2000)])
                    print(f"--- {name}{' + autograd' if f is graded else ''}: 2000 calls")
                    pstats.Stats(p).sort_stats("tottime").print_stats(12)


def step_fn(model, x, labels, bf16):
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def step():
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16, cache_enabled=False):
            # (no cast cache: a captured graph must redo the weights' casts each replay)
            loss = F.cross_entropy(model(x), labels)
        loss.backward()
        opt.step()
    return step


CONFIGS = {  # name -> (bf16 autocast, channels-last)
    "fp32": (False, False), "bf16": (True, False), "bf16-cl": (True, True)}


def model_rows(batch, configs):
    import torchvision
    torch.manual_seed(0)
    native = torchvision.models.resnet50().cuda()
    ours, report = nt.convert(native)
    print(f"converted {len(report.converted)}, native {len(report.native)}: "
          f"{sorted({t for _, t, _ in report.native})}", flush=True)
    x = torch.randn(batch, 3, 224, 224, device="cuda")
    labels = torch.randint(0, 1000, (batch,), device="cuda")
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    with torch.no_grad():
        want, got = native.eval()(x), ours.eval()(x)
    print(f"eval logits fp32: max rel error {float((got - want).abs().max() / want.abs().max()):.2e}",
          flush=True)
    torch.backends.cudnn.allow_tf32 = True  # (PyTorch's default for convolutions)
    for config in configs:
        bf16, last = CONFIGS[config]
        fmt = torch.channels_last if last else torch.contiguous_format
        xs = x.contiguous(memory_format=fmt)
        for mode in ("eager", "graphed"):
            ms = []
            for m in (native, ours):
                m.train().to(memory_format=fmt)
                fn = step_fn(m, xs, labels, bf16)
                timed = torch_graphed(fn, lambda: nt.fresh_accumulators(m)) \
                    if mode == "graphed" else fn  # (eager steps' nodes: nbdnn/torch/capture.py)
                ms.append(gpu_ms(timed, reps=5, rounds=7))
            print(f"ResNet-50 train step B {batch} {config:7} {mode:7}: native {ms[0]:7.2f} ms "
                  f"| nbdnn.torch {ms[1]:7.2f} ms | {ms[0] / ms[1]:.2f}x native's speed",
                  flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--host", action="store_true")
    p.add_argument("--models", action="store_true")
    p.add_argument("--profile", action="store_true", help="--host: cProfile each wrapped call")
    p.add_argument("--cpu", action="store_true", help="--host on CPU tensors (the reference)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--configs", nargs="+", default=["fp32", "bf16-cl"], choices=sorted(CONFIGS),
                   help="fp32; bf16 autocast; bf16-cl: autocast, model and input channels-last")
    args = p.parse_args()
    if args.host or not args.models:
        host_rows(args.profile, "cpu" if args.cpu else "cuda")
    if args.models:
        model_rows(args.batch, args.configs)


if __name__ == "__main__":
    main()

"""nbdnn.torch's own host cost on any machine, GPU or not: the Python that a wrapped
call runs around the nbdnn op on PyTorch's CUDA path, with the op replaced by a stub.

A CUDA call's host time is the wrapper (this), the nbdnn op's eager call plan (its
signature and replay: perf/suites/torch_models.py --host on the GPU) and the launches.
Without a GPU the wrapper's CUDA branch cannot run as it is (its tensors are on the
CPU), so this builds it from nbdnn/torch/_bridge.py's own run(): the same source with
`like.is_cuda` taken as true and PyTorch's current stream as the default (0), given to
every wrapper; nbdnn's ops become stubs returning a preallocated result (the
matrix-product stubs stand in PRODUCTS, so the TF32 flag reads are counted). Rows:
the stub called bare as torch_models.py calls the op, then through nbdnn.torch, then
with autograd recording; µs a call, the best of 7 repeats of 20 000 calls (timeit).

    PYTHONPATH=. python perf/experiments/torch_wrapper_cost.py [--profile NAME]
"""
import argparse
import cProfile
import inspect
import pstats
import timeit
import types

import torch

import nbdnn
import nbdnn.torch as nt
from nbdnn.torch import _bridge, _ops_conv

F = torch.nn.functional


def cuda_branch_on_cpu():
    """_bridge._run's source (run()'s body) with the CUDA branch taken for CPU tensors,
    stream 0."""
    src = inspect.getsource(_bridge._run)
    for old, new in (("def _run(", "def run_as_cuda("),
                     ('BACKEND == "cpu" or not like.is_cuda', "False"),
                     ("_raw_stream(", "(lambda device: 0)(")):
        assert old in src, f"_bridge._run no longer has {old!r}: update this experiment"
        src = src.replace(old, new)
    scope = dict(vars(_bridge))
    exec(src, scope)
    return scope["run_as_cuda"]


def stub_ops(results):
    """nbdnn's ops the cases call -> stubs returning results[name]; the real ones back."""
    real = {n: getattr(nbdnn, n) for n in results}
    stubs = {n: (lambda r: lambda *a, **k: r)(r) for n, r in results.items()}
    products = {stubs[n]: _bridge.PRODUCTS[f] for n, f in real.items() if f in _bridge.PRODUCTS}
    return real, stubs, products


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--profile", choices=("relu", "linear", "conv2d", "layer_norm"))
    args = p.parse_args()
    x = torch.randn(1024)
    xg = x.clone().requires_grad_()
    a, w, b = torch.randn(32, 64), torch.randn(64, 64), torch.randn(64)
    ag, wg, bg = (t.clone().requires_grad_() for t in (a, w, b))
    img, k = torch.randn(1, 16, 8, 8), torch.randn(16, 16, 3, 3)
    y, ln = torch.empty(32, 64), (torch.empty(32, 64), torch.empty(32), torch.empty(32))
    results = {"activation": torch.empty(1024), "matmul": y, "conv2d": torch.empty(1, 16, 8, 8),
               "layer_norm": ln}
    real, stubs, products = stub_ops(results)
    body = _bridge._run
    convs = _ops_conv.CONVS
    try:
        _bridge._run = cuda_branch_on_cpu()  # (run and run_as call it)
        for n, s in stubs.items():
            setattr(nbdnn, n, s)
        _ops_conv.CONVS = {**convs, 2: stubs["conv2d"]}
        _bridge.PRODUCTS.update(products)
        s = types.SimpleNamespace(**stubs)
        cases = {  # name: (bare, wrapped, with autograd)
            "relu": (lambda: s.activation(x, "relu"), lambda: nt.relu(x), lambda: nt.relu(xg)),
            "linear": (lambda: s.matmul(a, w, trans_b=True, bias=b), lambda: nt.linear(a, w, b),
                       lambda: nt.linear(ag, wg, bg)),
            "conv2d": (lambda: s.conv2d(img, k, padding=(1, 1)),
                       lambda: nt.conv2d(img, k, padding=1), None),
            "layer_norm": (lambda: s.layer_norm(a, w[0], b),
                           lambda: nt.layer_norm(a, (64,), w[0], b), None),
        }
        print("us a call   | bare stub | nbdnn.torch | + autograd | added")
        for name, fns in cases.items():
            us = [min(timeit.repeat(f, number=20000, repeat=7)) / 20000 * 1e6 if f else
                  float("nan") for f in fns]
            print(f"{name:11} | {us[0]:9.2f} | {us[1]:11.2f} | {us[2]:10.2f} | "
                  f"{us[1] - us[0]:5.2f}", flush=True)
        if args.profile:
            prof = cProfile.Profile()
            f = cases[args.profile][1]
            prof.runcall(lambda: [f() for _ in range(20000)])
            pstats.Stats(prof).sort_stats("tottime").print_stats(16)
    finally:
        _bridge._run = body
        for n, f in real.items():
            setattr(nbdnn, n, f)
        _ops_conv.CONVS = convs
        for st in products:
            del _bridge.PRODUCTS[st]


if __name__ == "__main__":
    main()

"""nbdnn.torch's own host cost on any machine, GPU or not: the Python that a wrapped
call runs around the nbdnn op on PyTorch's CUDA path, with the op replaced by a stub.

A CUDA call's host time is the wrapper (this), the nbdnn op's eager call plan (its
signature and replay: perf/suites/torch_models.py --host on the GPU) and the launches.
Without a GPU the wrapper's CUDA branch cannot run as it is (its tensors are on the
CPU), so `stream_of` (which tells run() and the direct entries where a call runs)
answers PyTorch's default stream (0) for every tensor; nbdnn's ops become stubs
returning a preallocated result (the matrix-product stubs stand in PRODUCTS, so the
TF32 flag reads are counted). Rows: the stub called bare as torch_models.py calls the
op (with the arguments nbdnn.torch gives it), then through nbdnn.torch, then with
autograd recording; µs a call, the best of 7 repeats of 20 000 calls (timeit).

    PYTHONPATH=. python perf/experiments/torch_wrapper_cost.py [--profile NAME]
"""
import argparse
import cProfile
import pstats
import timeit
import types

import torch

import nbdnn
import nbdnn.torch as nt
from nbdnn.torch import _bridge, _ops_basic, _ops_conv, _ops_norm

F = torch.nn.functional


STREAM_USERS = (_bridge, _ops_basic, _ops_conv, _ops_norm)  # (modules whose direct entries
# or run() ask stream_of)


def cuda_branch_on_cpu():
    """Every module's stream_of answering 0 (the legacy default stream) for any tensor:
    run() and the direct entries take their CUDA branch for CPU tensors. Returns a
    function that puts the real one back."""
    real = _bridge.stream_of
    for m in STREAM_USERS:
        m.stream_of = lambda t: 0

    def restore():
        for m in STREAM_USERS:
            m.stream_of = real
    return restore


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
    g = w[0]
    ag, wg, bg = (t.clone().requires_grad_() for t in (a, w, b))
    img, k = torch.randn(1, 16, 8, 8), torch.randn(16, 16, 3, 3)
    y, ln = torch.empty(32, 64), (torch.empty(32, 64), torch.empty(32), torch.empty(32))
    results = {"activation": torch.empty(1024), "matmul": y, "conv2d": torch.empty(1, 16, 8, 8),
               "layer_norm": ln}
    real, stubs, products = stub_ops(results)
    convs = _ops_conv.CONVS
    restore = cuda_branch_on_cpu()
    try:
        for n, s in stubs.items():
            setattr(nbdnn, n, s)
        _ops_conv.CONVS = {**convs, 2: stubs["conv2d"]}
        _bridge.PRODUCTS.update(products)
        s = types.SimpleNamespace(**stubs)
        cases = {  # name: (bare, wrapped, with autograd)
            "relu": (lambda: s.activation(x, "relu", coef=0.0), lambda: nt.relu(x),
                     lambda: nt.relu(xg)),
            "linear": (lambda: s.matmul(a, w, trans_b=True, bias=b), lambda: nt.linear(a, w, b),
                       lambda: nt.linear(ag, wg, bg)),
            "conv2d": (lambda: s.conv2d(img, k, None, padding=1),
                       lambda: nt.conv2d(img, k, padding=1), None),
            "layer_norm": (lambda: s.layer_norm(a, g, b, ndim=1, eps=1e-5),
                           lambda: nt.layer_norm(a, (64,), g, b), None),
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
        restore()
        for n, f in real.items():
            setattr(nbdnn, n, f)
        _ops_conv.CONVS = convs
        for st in products:
            del _bridge.PRODUCTS[st]


if __name__ == "__main__":
    main()

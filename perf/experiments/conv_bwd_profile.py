"""Where a convolution's backward passes spend their GPU time, layer by layer: for each
ResNet-50 layer (bf16 NHWC, batch 32; perf/suites/conv_layers.py), one eager
conv_backward_data and one conv_backward_filter after warm-up, each under
torch.profiler (CUPTI sees numba's launches), every kernel with its GPU time, beside
cuDNN's kernels for the same gradient (aten.convolution_backward with one output).
Run AN measured the sums (perf/suites/conv.py: data 0.50x, filter 0.41x cuDNN,
geomean); this says which kernels and how many make them.

    PYTHONPATH=. python perf/experiments/conv_bwd_profile.py [--layers 1x1 s4]
        [--set MODULE.NAME=VALUE ...]   (perf/tools/switches.py)
"""
import argparse
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import nbdnn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "suites"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import switches  # noqa: E402  (perf/tools/switches.py)
from conv_layers import RESNET  # noqa: E402


def kernels(fn):
    """[(name, us)] of the GPU kernels fn() runs, in order (after one warm-up call)."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [(e.name, e.device_time if hasattr(e, "device_time") else e.cuda_time)
            for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def show(label, ks):
    print(f"  {label:7} {sum(us for _, us in ks):8.1f} us in {len(ks)} kernels: " +
          "; ".join(f"{n[:48]} {us:.1f}" for n, us in ks))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", nargs="*", default=[])
    switches.add_argument(p)
    a = p.parse_args()
    switches.apply(a.set)
    torch.backends.cudnn.benchmark = True
    for name, C, K, H, R, s, pad, g in RESNET:
        if a.layers and not any(t in name for t in a.layers):
            continue
        x = torch.randn(32, C, H, H, device="cuda").bfloat16() \
            .to(memory_format=torch.channels_last)
        w = (torch.randn(K, C, R, R, device="cuda") * 0.1).bfloat16() \
            .to(memory_format=torch.channels_last)
        y = torch.nn.functional.conv2d(x, w, stride=s, padding=pad)
        dy = torch.randn_like(y)
        xn, wn, dyn = (t.permute(0, 2, 3, 1).contiguous() for t in (x, w, dy))
        kw = dict(stride=s, padding=pad, layout="NHWC")
        dx, dw = torch.empty_like(xn), torch.empty_like(wn)
        print(name, flush=True)
        show("data", kernels(lambda: nbdnn.conv_backward_data(dyn, wn, tuple(xn.shape),
                                                             out=dx, **kw)))
        show("filter", kernels(lambda: nbdnn.conv_backward_filter(dyn, xn, tuple(wn.shape),
                                                                 out=dw, **kw)))
        for label, mask in (("cuDNN d", [True, False, False]), ("cuDNN f", [False, True, False])):
            show(label, kernels(lambda: torch.ops.aten.convolution_backward(
                dy, x, w, None, [s, s], [pad, pad], [1, 1], False, [0, 0], 1, mask)))


if __name__ == "__main__":
    main()

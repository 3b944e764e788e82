"""Run AK's training-step fixes on the GPU, quickly, each against torch (error) and
timed (CUDA events, median of 10 after warm-up), batch 32, bf16 channels-last: filter
gradients of ResNet-50's stem (padded im2col rows, the tensor-core GEMM) and of 3x3
layers (im2col_words.py; and wgmma_conv.backward_filter where C % 64 == 0), the stem's
forward through padded columns (im2col_words.PAD_NARROW_CHANNELS), max pool's
backward (pool_argmax).

    PYTHONPATH=. python perf/experiments/bwd_fixes_check.py [pool]   (pool: that alone)
"""
import statistics
import sys

import torch
import torch.nn.functional as F

import nbdnn
from nbdnn.cuda.conv import im2col_words, wgmma_conv
from nbdnn.cuda.runtime.launch import launched


def ms(fn, reps=10):
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def err(a, b):
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


FILTER_DEFAULT = wgmma_conv.FILTER_ON_TENSOR_CORES
PAD_DEFAULT = im2col_words.PAD_NARROW_CHANNELS
if sys.argv[1:] != ["pool"]:
    torch.manual_seed(0)
    for name, (C, K, H, R, s, p) in {"stem 7x7/2": (3, 64, 224, 7, 2, 3),
                                     "s1 3x3 64": (64, 64, 56, 3, 1, 1),
                                     "s2 3x3 128 /2": (128, 128, 56, 3, 2, 1),
                                     "s3 3x3 256": (256, 256, 14, 3, 1, 1)}.items():
        x = torch.randn(32, C, H, H, device="cuda").bfloat16().to(memory_format=torch.channels_last)
        w = (torch.randn(K, C, R, R, device="cuda") * 0.1).bfloat16().to(
            memory_format=torch.channels_last).requires_grad_()
        y = F.conv2d(x, w, stride=s, padding=p)
        dy = torch.randn_like(y)
        (gw,) = torch.autograd.grad(y, (w,), dy, retain_graph=True)
        xn, dyn = x.permute(0, 2, 3, 1), dy.permute(0, 2, 3, 1).contiguous()
        ws = (K, R, R, C)
        wgmma_conv.FILTER_ON_TENSOR_CORES = False  # (im2col columns and the GEMM)
        with launched() as names:
            dw = nbdnn.conv_backward_filter(dyn, xn, ws, stride=s, padding=p, layout="NHWC")
        t = ms(lambda: nbdnn.conv_backward_filter(dyn, xn, ws, stride=s, padding=p, layout="NHWC",
                                                  out=dw))
        tt = ms(lambda: torch.autograd.grad(y, (w,), dy, retain_graph=True))
        print(f"{name}: filter gradient err {err(dw, gw.permute(0, 2, 3, 1)):.1e}, {t:.3f} ms "
              f"(torch {tt:.3f} ms, x{tt / t:.2f}) {names}", flush=True)
        if C % 64 == 0:  # the tensor-core filter gradient (wgmma_conv.FILTER_ON_TENSOR_CORES)
            wgmma_conv.FILTER_ON_TENSOR_CORES = True
            try:
                with launched() as names:
                    dw = nbdnn.conv_backward_filter(dyn, xn, ws, stride=s, padding=p,
                                                    layout="NHWC")
                t = ms(lambda: nbdnn.conv_backward_filter(dyn, xn, ws, stride=s, padding=p,
                                                          layout="NHWC", out=dw))
                print(f"{name}: on the tensor cores err {err(dw, gw.permute(0, 2, 3, 1)):.1e}, "
                      f"{t:.3f} ms (x{tt / t:.2f} torch) {names}", flush=True)
            finally:
                wgmma_conv.FILTER_ON_TENSOR_CORES = FILTER_DEFAULT

    # the stem's forward: SIMT implicit GEMM, or padded columns and the tensor-core GEMM
    x = torch.randn(32, 3, 224, 224, device="cuda").bfloat16().to(memory_format=torch.channels_last)
    w = (torch.randn(64, 3, 7, 7, device="cuda") * 0.1).bfloat16().to(memory_format=torch.channels_last)
    b = torch.randn(64, device="cuda").bfloat16()
    ref = torch.relu(F.conv2d(x, w, b, stride=2, padding=3)).permute(0, 2, 3, 1)
    tt = ms(lambda: torch.relu(F.conv2d(x, w, b, stride=2, padding=3)))
    xn, wn = x.permute(0, 2, 3, 1), w.permute(0, 2, 3, 1)
    for on in (False, True):
        im2col_words.PAD_NARROW_CHANNELS = on
        with launched() as names:
            y = nbdnn.conv2d(xn, wn, b, stride=2, padding=3, layout="NHWC", activation="relu")
        t = ms(lambda: nbdnn.conv2d(xn, wn, b, stride=2, padding=3, layout="NHWC",
                                    activation="relu", out=y))
        print(f"stem forward, padded columns {on}: err {err(y, ref):.1e}, {t:.3f} ms (torch "
              f"conv+relu {tt:.3f} ms, x{tt / t:.2f}) {names}", flush=True)
    im2col_words.PAD_NARROW_CHANNELS = PAD_DEFAULT

x = torch.randn(32, 64, 112, 112, device="cuda").bfloat16().to(memory_format=torch.channels_last)
xr = x.detach().requires_grad_()
y = F.max_pool2d(xr, 3, 2, 1)
dy = torch.randn_like(y)
(gx,) = torch.autograd.grad(y, (xr,), dy, retain_graph=True)
xn, dyn = x.permute(0, 2, 3, 1), dy.permute(0, 2, 3, 1).contiguous()
with launched() as names:
    dx = nbdnn.pool_backward(dyn, xn, 3, stride=2, padding=1, layout="NHWC")
t = ms(lambda: nbdnn.pool_backward(dyn, xn, 3, stride=2, padding=1, layout="NHWC", out=dx))
tt = ms(lambda: torch.autograd.grad(y, (xr,), dy, retain_graph=True))
print(f"max pool 3x3/2 backward err {err(dx, gx.permute(0, 2, 3, 1)):.1e}, {t:.3f} ms "
      f"(torch {tt:.3f} ms, x{tt / t:.2f}) {names}", flush=True)

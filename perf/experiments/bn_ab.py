"""Batch norm's channels-first fast path (nbdnn/cuda/batch_norm/planes.py) against the general
kernels (_bn_sums + batch_norm's apply/dx) on 64x256x64x64 fp32, both graph-timed, with
a copy of the tensor and PyTorch in the same run; then the depthwise 7x7/14x14 layers
against a copy of the same tensor (the floor behind a 2x-cuDNN goal there).
perf/history/runs.md run W.

    PYTHONPATH=. python perf/experiments/bn_ab.py
"""
import torch
import torch.nn.functional as F
import nbdnn
from nbdnn.bench import time_gpu, time_graph
from nbdnn.cuda import batch_norm as BN
from nbdnn.cuda.runtime.launch import REGISTRY

B, C, H = 64, 256, 64
x = torch.randn(B, C, H, H, device="cuda")
dy = torch.randn_like(x)
y = torch.empty_like(x)
w, b = torch.ones(C, device="cuda"), torch.zeros(C, device="cuda")
mean, var = torch.zeros(C, device="cuda"), torch.ones(C, device="cuda")
nbytes = x.numel() * 4
t_copy = time_gpu(lambda: y.copy_(x))
bw = 2 * nbytes / t_copy
print(f"copy 256 MiB: {t_copy*1e6:.1f} us, {bw/1e12:.2f} TB/s", flush=True)
t_ti = time_gpu(lambda: F.batch_norm(x, mean, var, w, b))
t_tt = time_gpu(lambda: F.batch_norm(x, mean, var, w, b, True))
xr = x.clone().requires_grad_()
out = F.batch_norm(xr, None, None, w, b, True)
t_tb = time_gpu(lambda: torch.autograd.grad(out, xr, dy, retain_graph=True))
print(f"torch infer {t_ti*1e6:.1f} train {t_tt*1e6:.1f} backward(autograd) {t_tb*1e6:.1f} us", flush=True)
_, m, inv = nbdnn.batch_norm_train(x, w, b)
cases = {"infer": (2, lambda: nbdnn.batch_norm_infer(x, w, b, mean, var, out=y), t_ti),
         "train": (2, lambda: nbdnn.batch_norm_train(x, w, b, mean, var, out=y), t_tt),
         "backward": (3, lambda: nbdnn.batch_norm_backward(dy, x, w, m, inv), t_tb)}
real = BN._planes
for path in ("fast", "general"):
    BN._planes = real if path == "fast" else (lambda *a: False)
    for name, (passes, fn, tt) in cases.items():
        t = time_graph(fn, reps=30, min_time=0.3)
        te = time_gpu(fn, reps=30, min_time=0.3)
        print(f"{path:8} {name:9} graph {t*1e6:7.1f} us  {passes*nbytes/t/bw:5.0%} of copy  "
              f"{tt/t:5.2f}x torch | eager {te*1e6:7.1f} us", flush=True)
BN._planes = real
# correctness vs torch on this shape
yt = F.batch_norm(x, None, None, w, b, True)
yn, m2, i2 = nbdnn.batch_norm_train(x, w, b)
print("train max err", float((yn - yt).abs().max()), flush=True)
dxt, = torch.autograd.grad(out, xr, dy)
dxn = nbdnn.batch_norm_backward(dy, x, w, m2, i2)[0]
print("dx max err", float((dxn - dxt).abs().max()), float(dxt.abs().max()), flush=True)
for k in REGISTRY:
    nm = k.pyfunc.__name__
    if "planes_vec" in nm and "float32" in k.sigs[0].split(",")[0]:
        print(nm, k.resources(k.sigs[0]), flush=True)
# depthwise copy floor
for Cd, Hd in ((1024, 7), (512, 14)):
    xd = torch.randn(32, Cd, Hd, Hd, device="cuda")
    yd = torch.empty_like(xd)
    wd = torch.randn(Cd, 1, 3, 3, device="cuda")
    tc = time_gpu(lambda: yd.copy_(xd))
    ra = lambda: nbdnn.activation(xd, "relu", out=yd)
    tre, trg = time_gpu(ra), time_graph(ra)
    tr = time_graph(lambda: nbdnn.conv2d(xd, wd, padding=1, groups=Cd, out=yd), min_time=0.2)
    torch.backends.cudnn.benchmark = True
    tcd = time_gpu(lambda: F.conv2d(xd, wd, padding=1, groups=Cd))
    tz = time_gpu(lambda: yd.zero_())
    print(f"dw {Cd}@{Hd}: copy {tc*1e6:.1f} us, zero_ {tz*1e6:.1f} us, rows {tr*1e6:.1f} us "
          f"({tc/tr:.0%} of copy speed), cuDNN {tcd*1e6:.1f} us; nbdnn relu eager {tre*1e6:.1f} "
          f"graph {trg*1e6:.1f} us", flush=True)

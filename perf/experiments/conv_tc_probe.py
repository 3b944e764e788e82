"""Which factor breaks the tensor-core convolution (run AJ's failing case 3x9x11x72 *
96x3x3x72, stride 2): one factor changed at a time; max |y - ref| / max |ref| each."""
import numpy as np
import torch
import torch.nn.functional as F

import nbdnn
from nbdnn.cuda.conv import wgmma_conv
from nbdnn.cuda.runtime.launch import launched

wgmma_conv.VERIFIED_ONLY = False  # (every case through the im2col kernel)

CASES = {  # name: (N, H, W, C, K, R, stride, pad)
    "fail": (3, 9, 11, 72, 96, 3, 2, 1),
    "C64": (3, 9, 11, 64, 96, 3, 2, 1),
    "s1": (3, 9, 11, 72, 96, 3, 1, 1),
    "K128": (3, 9, 11, 72, 128, 3, 2, 1),
    "bigM": (12, 9, 11, 72, 96, 3, 2, 1),
    "C64s1": (3, 9, 11, 64, 96, 3, 1, 1),
    "C64s1K64": (3, 9, 11, 64, 64, 3, 1, 1),
    "sq": (3, 10, 10, 64, 64, 3, 1, 1),
    "case0": (2, 14, 14, 64, 64, 3, 1, 1),
    "case0N1": (1, 14, 14, 64, 64, 3, 1, 1),
}
for name, (N, H, W, C, K, R, s, p) in CASES.items():
    torch.manual_seed(0)
    x = torch.randn(N, C, H, W, device="cuda").bfloat16().to(memory_format=torch.channels_last)
    w = (torch.randn(K, C, R, R, device="cuda") / (C * R * R) ** 0.5).bfloat16() \
        .to(memory_format=torch.channels_last)
    ref = F.conv2d(x.float(), w.float(), stride=s, padding=p).permute(0, 2, 3, 1)
    y = torch.full(ref.shape, 7.0, device="cuda", dtype=torch.bfloat16)
    with launched() as names:
        nbdnn.conv2d(x.permute(0, 2, 3, 1), w.permute(0, 2, 3, 1), stride=s, padding=p,
                     layout="NHWC", out=y)
    torch.cuda.synchronize()
    err = float((y.float() - ref).abs().max() / ref.abs().max())
    untouched = float((y == 7.0).float().mean())
    print(f"{name:10} M={ref.shape[0] * ref.shape[1] * ref.shape[2]:5} err {err:9.2e} "
          f"untouched {untouched:.2f}  {names}", flush=True)

# The convolution-order epilogue (conv=2, "_co"): bias + relu, alpha, beta with z = y,
# a residual; on a ResNet 3x3 layer (stride 1, 128-row tiles), checked against torch.
torch.manual_seed(1)
x = torch.randn(4, 64, 14, 14, device="cuda").bfloat16().to(memory_format=torch.channels_last)
w = (torch.randn(128, 64, 3, 3, device="cuda") / 24).bfloat16().to(
    memory_format=torch.channels_last)
b = torch.randn(128, device="cuda")
base = F.conv2d(x.float(), w.float(), padding=1).permute(0, 2, 3, 1)
z0 = torch.randn(base.shape, device="cuda").bfloat16()
for name, kw, ref in (
        ("bias_relu", dict(bias=b, activation="relu"), torch.relu(base + b)),
        ("alpha", dict(alpha=0.5), 0.5 * base),
        ("beta", dict(alpha=0.5, beta=0.25, out=z0.clone()), 0.5 * base + 0.25 * z0.float()),
        ("residual", dict(residual=z0, bias=b, activation="relu"),
         torch.relu(base + z0.float() + b))):
    kw = dict(kw)
    bias = kw.pop("bias", None)
    with launched() as names:
        y = nbdnn.conv2d(x.permute(0, 2, 3, 1), w.permute(0, 2, 3, 1), bias, padding=1,
                         layout="NHWC", **kw)
    torch.cuda.synchronize()
    y = torch.as_tensor(y, device="cuda") if not isinstance(y, torch.Tensor) else y
    err = float((y.float() - ref).abs().max() / ref.abs().max())
    print(f"{name:10} err {err:9.2e}  {names}", flush=True)

# The SASS of every convolution kernel built above: wgmma (HGMMA) and no local memory.
import re  # noqa: E402
from nbdnn.cuda.runtime.launch import REGISTRY  # noqa: E402
for k in REGISTRY:
    if k.name.startswith("wgmma_conv") and k.sigs:
        try:
            sass = k.dispatcher.compile(k.sigs[0]).inspect_sass()
        except Exception as e:  # (nvdisasm missing)
            print(k.name, "no SASS:", e)
            break
        ops = re.findall(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\d+\s+)?([A-Z0-9_.]+)", sass, re.M)
        print(k.name, " ".join(f"{op} {sum(1 for o in ops if o.startswith(op))}"
                               for op in ("HGMMA", "LDL", "STL", "UTMALDG", "UTMASTG")))

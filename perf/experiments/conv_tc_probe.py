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

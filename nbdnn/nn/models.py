"""Models built from nbdnn.nn's layers (re-exported there)."""
import numpy as np

from .blocks import BasicBlock, Bottleneck
from .layers import BatchNorm2d, Conv2d, Flatten, GlobalAvgPool2d, Linear, MaxPool2d, ReLU
from .sequential import Sequential


def resnet18(num_classes=1000, *, seed=0, dtype=np.float32, layout="NCHW"):
    """ResNet-18 for (N, 3, H, W) images: conv 7x7/2 - BN - ReLU - max pool 3/2, four
    stages of two basic blocks (64, 128, 256, 512 channels; stride 2 from the second
    stage), global average pool, linear. Layer seeds are seed, seed + 1, ... layout
    "NHWC": (N, H, W, 3) images, every layer channels-last (the same weights)."""
    seeds = iter(range(seed, seed + 100, 3))
    kw = dict(dtype=dtype, layout=layout)
    layers = [Conv2d(3, 64, 7, stride=2, padding=3, bias=False, seed=next(seeds), **kw),
              BatchNorm2d(64, **kw), ReLU(), MaxPool2d(3, 2, 1, layout=layout)]
    C = 64
    for K in (64, 128, 256, 512):
        for b in range(2):
            layers.append(BasicBlock(C, K, stride=2 if b == 0 and K != 64 else 1,
                                     seed=next(seeds), **kw))
            C = K
    layers += [GlobalAvgPool2d(layout=layout), Flatten(),
               Linear(512, num_classes, seed=next(seeds), dtype=dtype)]
    return Sequential(layers)


def resnet50(num_classes=1000, *, seed=0, dtype=np.float32, layout="NCHW",
             widths=(64, 128, 256, 512), blocks=(3, 4, 6, 3)):
    """ResNet-50 for (N, 3, H, W) images (torchvision's v1.5): the ResNet-18 stem, four
    stages of bottleneck blocks (3, 4, 6, 3 of them; widths 64-512, outputs 4 times
    that; stride 2 on the first block's 3x3 from the second stage), global average
    pool, linear. widths / blocks shrink it for tests. Layer seeds and layout as
    resnet18's (16-bit NHWC: the tensor-core convolutions on sm_90)."""
    seeds = iter(range(seed, seed + 400, 4))
    kw = dict(dtype=dtype, layout=layout)
    layers = [Conv2d(3, widths[0], 7, stride=2, padding=3, bias=False, seed=next(seeds),
                     **kw),
              BatchNorm2d(widths[0], **kw), ReLU(), MaxPool2d(3, 2, 1, layout=layout)]
    C = widths[0]
    for stage, (width, n) in enumerate(zip(widths, blocks)):
        for b in range(n):
            layers.append(Bottleneck(C, width, stride=2 if b == 0 and stage else 1,
                                     seed=next(seeds), **kw))
            C = 4 * width
    layers += [GlobalAvgPool2d(layout=layout), Flatten(),
               Linear(C, num_classes, seed=next(seeds), dtype=dtype)]
    return Sequential(layers)

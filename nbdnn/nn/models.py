"""Models built from nbdnn.nn's layers (re-exported there)."""
import numpy as np

from .layers import (BasicBlock, BatchNorm2d, Conv2d, Flatten, GlobalAvgPool2d, Linear,
                     MaxPool2d, ReLU, Sequential)


def resnet18(num_classes=1000, *, seed=0, dtype=np.float32):
    """ResNet-18 for (N, 3, H, W) images: conv 7x7/2 - BN - ReLU - max pool 3/2, four
    stages of two basic blocks (64, 128, 256, 512 channels; stride 2 from the second
    stage), global average pool, linear. Layer seeds are seed, seed + 1, ..."""
    seeds = iter(range(seed, seed + 100, 3))
    layers = [Conv2d(3, 64, 7, stride=2, padding=3, bias=False, seed=next(seeds), dtype=dtype),
              BatchNorm2d(64, dtype=dtype), ReLU(), MaxPool2d(3, stride=2, padding=1)]
    C = 64
    for K in (64, 128, 256, 512):
        for b in range(2):
            layers.append(BasicBlock(C, K, stride=2 if b == 0 and K != 64 else 1,
                                     seed=next(seeds), dtype=dtype))
            C = K
    layers += [GlobalAvgPool2d(), Flatten(), Linear(512, num_classes, seed=next(seeds),
                                                    dtype=dtype)]
    return Sequential(layers)

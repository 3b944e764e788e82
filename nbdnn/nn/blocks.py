"""ResNet's blocks for nbdnn.nn (re-exported there): the basic block (ResNet-18/34) and
the bottleneck (ResNet-50), each a body and a shortcut of nbdnn.nn layers."""
import numpy as np

import nbdnn

from .layers import BatchNorm2d, Conv2d, Layer, ReLU
from .sequential import Sequential


class BasicBlock(Layer):
    """ResNet's basic block: y = relu(bn(conv3x3(relu(bn(conv3x3(x))))) + shortcut(x)),
    the shortcut x itself or, when the shape changes, bn(conv1x1/stride(x))."""

    def __init__(self, C, K, *, stride=1, seed=0, dtype=np.float32, layout="NCHW"):
        super().__init__()
        kw = dict(dtype=dtype, layout=layout)
        self.body = Sequential([
            Conv2d(C, K, 3, stride=stride, padding=1, bias=False, seed=seed, **kw),
            BatchNorm2d(K, **kw), ReLU(),
            Conv2d(K, K, 3, padding=1, bias=False, seed=seed + 1, **kw),
            BatchNorm2d(K, **kw)])
        self.shortcut = None if C == K and stride == 1 else Sequential([
            Conv2d(C, K, 1, stride=stride, bias=False, seed=seed + 2, **kw),
            BatchNorm2d(K, **kw)])
        self.relu = ReLU()

    def layers(self):
        return [self] + self.body.layers() + (self.shortcut.layers() if self.shortcut
                                              else []) + self.relu.layers()

    def forward(self, x, train=False):
        s = x if self.shortcut is None else self.shortcut.forward(x, train)
        return self.relu.forward(nbdnn.add_tensor(s, self.body.forward(x, train)), train)

    def backward(self, dy, need_dx=True):
        g = self.relu.backward(dy)
        dx = self.body.backward(g, need_dx)
        ds = g if self.shortcut is None else self.shortcut.backward(g, need_dx)
        return nbdnn.add_tensor(ds, dx) if need_dx else None


class Bottleneck(Layer):
    """ResNet-50's bottleneck block (torchvision's v1.5: the stride on the 3x3):
    y = relu(bn(conv1x1(relu(bn(conv3x3/stride(relu(bn(conv1x1(x))))))) + shortcut(x)),
    C -> width -> width -> 4 width channels; the shortcut x itself or, when the shape
    changes, bn(conv1x1/stride(x))."""

    def __init__(self, C, width, *, stride=1, seed=0, dtype=np.float32,
                 layout="NCHW"):
        super().__init__()
        kw = dict(dtype=dtype, layout=layout)
        K = 4 * width
        self.body = Sequential([
            Conv2d(C, width, 1, bias=False, seed=seed, **kw),
            BatchNorm2d(width, **kw), ReLU(),
            Conv2d(width, width, 3, stride=stride, padding=1, bias=False, seed=seed + 1, **kw),
            BatchNorm2d(width, **kw), ReLU(),
            Conv2d(width, K, 1, bias=False, seed=seed + 2, **kw),
            BatchNorm2d(K, **kw)])
        self.shortcut = None if C == K and stride == 1 else Sequential([
            Conv2d(C, K, 1, stride=stride, bias=False, seed=seed + 3, **kw),
            BatchNorm2d(K, **kw)])
        self.relu = ReLU()

    layers, forward, backward = BasicBlock.layers, BasicBlock.forward, BasicBlock.backward

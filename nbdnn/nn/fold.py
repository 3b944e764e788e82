"""Batch norm folded into the convolutions for inference (re-exported by nbdnn.nn):
`fold_batch_norm(model)` returns an eval-only model whose convolutions carry their
batch norms, their ReLUs and, in ResNet blocks, the residual add, in one fused call
each (cuDNN's conv + bias + activation with z; on sm_90 the tensor-core convolution's
epilogue does it from the accumulators).

A convolution y = conv(x, w) + b followed by batch norm with running statistics
(mean, var), scale g and bias beta:

    bn(y) = g (conv(x, w) + b - mean) / sqrt(var + eps) + beta
          = conv(x, w * s[k]) + (b - mean) s + beta,   s = g / sqrt(var + eps)

per output channel k. A block relu(bn2(conv2(..)) + shortcut(x)) becomes
conv2d(.., w2', b2', residual=shortcut(x), activation="relu"). The folded weights are
computed in float64 on the host and rounded once to the model's dtype.
"""
import numpy as np

import nbdnn

from .blocks import BasicBlock, Bottleneck
from .layers import Activation, BatchNorm2d, Conv2d, Layer, move
from .sequential import Sequential
from .precision import device_of_any


class FoldedConv(Layer):
    """y = act(conv2d(x, w) + b [+ residual]): a convolution with its batch norm folded
    in (eval only; backward is not defined)."""

    def __init__(self, w, b, kw, activation=None):
        super().__init__()
        self.params.update(w=w, b=b)
        self.kw, self.activation = kw, activation

    def forward(self, x, train=False, residual=None):
        if train:
            raise nbdnn.BadParamError("FoldedConv: a folded model is for inference (train=False)")
        return nbdnn.conv2d(x, self.params["w"], self.params["b"], residual=residual,
                            activation=self.activation, **self.kw)


class FoldedBlock(Layer):
    """A ResNet block with its batch norms folded: the body's convolutions (ReLU fused
    but in the last), the shortcut's, and the last convolution adding the shortcut and
    applying the ReLU in its epilogue."""

    def __init__(self, body, shortcut):
        super().__init__()
        self.body, self.shortcut = body, shortcut

    def layers(self):
        return [self] + [m for f in self.body + ([self.shortcut] if self.shortcut else [])
                         for m in f.layers()]

    def forward(self, x, train=False):
        s = x if self.shortcut is None else self.shortcut.forward(x, train)
        y = x
        for f in self.body[:-1]:
            y = f.forward(y, train)
        return self.body[-1].forward(y, train, residual=s)


def _fold(conv, bn, activation=None):
    """FoldedConv of a Conv2d and the BatchNorm2d after it (module docstring)."""
    dev = device_of_any(conv.params["w"])
    w = np.asarray(move(conv.params["w"], "cpu"), np.float64)
    dtype = np.asarray(move(conv.params["w"], "cpu")).dtype
    K = w.shape[0]
    b = np.asarray(move(conv.params["b"], "cpu"), np.float64) if "b" in conv.params else \
        np.zeros(K)
    p = {k: np.asarray(move(v, "cpu"), np.float64) for k, v in
         list(bn.params.items()) + list(bn.buffers.items())}
    s = p["scale"] / np.sqrt(p["var"] + bn.eps)
    wf = (w * s.reshape((K,) + (1,) * (w.ndim - 1))).astype(dtype)
    bf = ((b - p["mean"]) * s + p["bias"]).astype(dtype)
    return FoldedConv(move(wf, dev), move(bf, dev), dict(conv.kw), activation)


def _fold_seq(layers):
    """[FoldedConv | layer]: each Conv2d - BatchNorm2d [- ReLU] run folded."""
    out, i = [], 0
    while i < len(layers):
        m = layers[i]
        if isinstance(m, Conv2d) and i + 1 < len(layers) and \
                isinstance(layers[i + 1], BatchNorm2d):
            relu = i + 2 < len(layers) and isinstance(layers[i + 2], Activation) and \
                layers[i + 2].mode == "relu"
            out.append(_fold(m, layers[i + 1], "relu" if relu else None))
            i += 3 if relu else 2
        elif isinstance(m, (BasicBlock, Bottleneck)):
            body = _fold_seq(m.body.seq)
            body[-1].activation = "relu"  # (the block's ReLU, after the residual add)
            short = None if m.shortcut is None else _fold_seq(m.shortcut.seq)[0]
            out.append(FoldedBlock(body, short))
            i += 1
        else:
            out.append(m)
            i += 1
    return out


def fold_batch_norm(model):
    """An inference copy of `model` (a Sequential) with every Conv2d - BatchNorm2d
    [- ReLU] and every ResNet block's residual ReLU fused into single convolution calls
    (module docstring); the original is unchanged. Parameters live on the model's device."""
    if not isinstance(model, Sequential):
        raise nbdnn.BadParamError("fold_batch_norm: needs an nn.Sequential model")
    return Sequential(_fold_seq(model.seq))

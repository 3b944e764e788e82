"""nbdnn.nn's Sequential (re-exported there): layers applied in order, their
parameters, save/load, and `plan`: the training step captured as a graph in a chosen
precision (nbdnn/nn/train.py's GraphedSteps, nbdnn/nn/precision.py)."""
import numpy as np

import nbdnn

from . import checkpoint
from .layers import Layer, copy_into, move

PRECISIONS = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


class Sequential(Layer):
    """Layers applied in order; backward runs them in reverse."""

    def __init__(self, layers):
        super().__init__()
        self.seq = list(layers)

    def layers(self):
        return [self] + [m for layer in self.seq for m in layer.layers()]

    def forward(self, x, train=False):
        for layer in self.seq:
            x = layer.forward(x, train)
        return x

    def backward(self, dy, need_dx=True, after=None):
        """dx (None where not need_dx); after(layer), where given, as soon as each
        layer's gradients exist (GradientAllReduce starts averaging them there)."""
        for i, layer in enumerate(reversed(self.seq)):
            dy = layer.backward(dy, need_dx or i < len(self.seq) - 1)
            if after is not None:
                after(layer)
        return dy

    def to_precision(self, precision):
        """Cast every parameter to "fp32", "bf16" or "fp16" in place (on its device;
        batch norm's running statistics stay in the compute dtype, float32). Make the
        optimizer after, or before: its float32 masters start from the parameters at
        its first step."""
        dtype = PRECISIONS.get(precision)
        if dtype is None:
            raise nbdnn.BadParamError(f"to_precision: precision must be one of "
                                      f"{tuple(PRECISIONS)}, got {precision!r}")
        for m in self.layers():
            for k, v in m.params.items():
                if str(v.dtype).rpartition(".")[2] != dtype:
                    m.params[k] = nbdnn.cast_tensor(v, dtype)
            m.grads = {}
        return self

    def plan(self, batch_size, input_shape, *, loss, optimizer, precision=None, graph=None,
             reuse=None, allreduce=None):
        """The training (and inference) step on fixed buffers, captured as CUDA graphs
        on the CUDA backend (nn.GraphedSteps), in `precision` ("fp32", "bf16", "fp16";
        None: the parameters' own): the model is cast to it (to_precision), 16-bit
        parameters get float32 master weights in the optimizer, and "fp16" gets a
        LossScaler when the optimizer has none, so its skip and growth replay on the
        device with the rest of the step. reuse: GraphedSteps' buffer sharing;
        allreduce: its data-parallel gradient averaging (nbdnn/nn/distributed.py)."""
        from .precision import LossScaler  # (sequential <- precision <- layers: no circle)
        from .train import GraphedSteps
        if precision is not None:
            self.to_precision(precision)
        if precision == "fp16" and getattr(optimizer, "scaler", None) is None:
            optimizer.scaler = optimizer.masters.scaler = LossScaler()
        return GraphedSteps(self, batch_size, input_shape, loss=loss, optimizer=optimizer,
                            graph=graph, reuse=reuse, allreduce=allreduce)

    def parameters(self):
        """(layer, name) of every parameter, in a fixed order."""
        return [(m, k) for m in self.layers() for k in m.params]

    def state(self):
        """name -> host array of every parameter and buffer (for numpy.savez)."""
        out = {}
        for i, m in enumerate(self.layers()):
            for kind, d in (("p", m.params), ("b", m.buffers)):
                for k, v in d.items():
                    out[f"{i}.{kind}.{k}"] = move(v, "cpu")
        return out

    def save(self, path):
        """Every parameter and buffer to `path` (".npz" is added when the name lacks
        it), keys as state() names them; atomic: the previous file stays whole until
        the new one is complete (nbdnn/nn/checkpoint.py). Returns the path written."""
        return checkpoint.write(path, self.state())

    def load(self, path):
        """Parameters and buffers from save(), copied into the model's own arrays (on
        its device; GraphedSteps' captured graphs keep working). `path` with or without
        ".npz", as save() took it. Atomic: every entry is read and checked (present,
        the model's shape, a dtype of the model's kind; no key the model lacks) before any
        is written; a missing, truncated, corrupted or foreign file is an NbdnnError
        naming the file (and the key), found from the zip's and the arrays' headers
        before their data is read (nbdnn/nn/checkpoint.py)."""
        want = {f"{i}.{kind}.{k}": v for i, m in enumerate(self.layers())
                for kind, d in (("p", m.params), ("b", m.buffers)) for k, v in d.items()}
        arrays = checkpoint.read(checkpoint.resolve(path), want)
        for key, v in want.items():  # only now: nothing is written from a bad file
            copy_into(v, arrays[key])
        return self

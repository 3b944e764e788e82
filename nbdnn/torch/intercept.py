"""nbdnn.torch.functional_calls(): the torch.nn.functional calls a model makes itself
(transformers' attention and GELU, timm's blocks) run on nbdnn within the context, as
convert's modules do for the modules it replaces.

    with nbdnn.torch.functional_calls() as calls:
        y = model(x)
    print(calls.report())   # which functions ran on nbdnn, which stayed native and why

A TorchFunctionMode maps each supported function to nbdnn.torch.functional's; a call
nbdnn cannot take with PyTorch's meaning (a NotSupportedError, an unsupported dtype or
shape) runs PyTorch's own function and is counted, never raised."""
import collections

import torch
from torch.overrides import TorchFunctionMode

from ..errors import NbdnnError
from . import functional as nf

F = torch.nn.functional
# PyTorch's function -> nbdnn.torch's (the same signature); torch.* aliases included
MAP = {getattr(F, n): getattr(nf, n) for n in nf.__all__ if hasattr(F, n)}


def _softmax(input, dim, dtype=None):  # (torch.softmax's and Tensor.softmax's signature:
    return nf.softmax(input, dim, dtype=dtype)  # dtype third, where F's has _stacklevel)


def _log_softmax(input, dim, dtype=None):
    return nf.log_softmax(input, dim, dtype=dtype)


MAP.update({torch.relu: nf.relu, torch.sigmoid: nf.sigmoid, torch.tanh: nf.tanh,
            torch.softmax: _softmax, torch.log_softmax: _log_softmax,
            torch.conv1d: nf.conv1d, torch.conv2d: nf.conv2d, torch.conv3d: nf.conv3d,
            torch.Tensor.softmax: _softmax, torch.Tensor.log_softmax: _log_softmax,
            torch.Tensor.relu: nf.relu,
            # products with a layer's weight: x @ W, torch.matmul(x, W), addmm(b, x, W)
            torch.matmul: nf.matmul, torch.Tensor.matmul: nf.matmul,
            torch.Tensor.__matmul__: nf.matmul, torch.addmm: nf.addmm,
            torch.Tensor.addmm: nf.addmm})
# torch.nn.functional's other functions: seen and left to PyTorch (the report says so)
OTHERS = {getattr(F, n) for n in dir(F) if not n.startswith("_") and
          callable(getattr(F, n)) and getattr(F, n) not in MAP and
          getattr(getattr(F, n), "__module__", "") == "torch.nn.functional"}


def _nested(args, kwargs):
    """Whether a call's tensors include a nested one (nbdnn's ops take dense tensors;
    PyTorch runs such calls natively)."""
    return any(isinstance(a, torch.Tensor) and a.is_nested
               for a in (*args, *kwargs.values()))


class FunctionalCalls(TorchFunctionMode):
    """The mode: .nbdnn counts the calls nbdnn ran by function name, .native the calls it
    left to PyTorch by (name, reason): the mapped functions it could not take and the
    torch.nn.functional functions nbdnn.torch does not have."""

    def __init__(self):
        super().__init__()
        self.nbdnn, self.native = collections.Counter(), collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        ours = MAP.get(func)
        if ours is not None and _nested(args, kwargs):
            self.native[(func.__name__, "nested tensors")] += 1
        elif ours is not None:
            try:
                out = ours(*args, **kwargs)
            except (NbdnnError, TypeError) as e:  # (TypeError: an argument nbdnn.torch's
                # signature lacks, e.g. a newer PyTorch keyword)
                self.native[(func.__name__, str(e).split(": ", 1)[-1])] += 1
            else:
                self.nbdnn[func.__name__] += 1
                return out
        elif func in OTHERS:
            self.native[(func.__name__, "nbdnn.torch has no such function")] += 1
        return func(*args, **kwargs)

    def report(self):
        lines = [f"nbdnn {n}: {c}" for n, c in sorted(self.nbdnn.items())]
        lines += [f"native {n} ({why}): {c}" for (n, why), c in sorted(self.native.items())]
        return "\n".join(lines)


def functional_calls():
    """The context manager (a FunctionalCalls mode; `with ... as calls`)."""
    return FunctionalCalls()

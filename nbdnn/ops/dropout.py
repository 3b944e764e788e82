"""dropout / dropout_backward with a counter-based generator (Philox4x32-10): the CPU
reference and the GPU kernel produce the same mask bit for bit for the same (seed,
offset). The formulas are in nbdnn/cpu/dropout.py."""
import numbers

import numpy as np

from ..errors import BadParamError, DtypeError, fail
from .registry import op
from ._common import Call, same_shape, scalar
from .._vocab import BF16_DTYPES

U64 = 2 ** 64


def _p(op, p):
    return scalar(op, "p", p, low=0.0, high=1.0)


def uint64_arg(op, name, v):
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not 0 <= v < U64:
        fail(BadParamError, op, name, "an int in [0, 2**64)" +
             (" or a 1-element uint64 array" if name == "offset" else ""), repr(v))
    return int(v)


@op("dropout", backward="dropout_backward", in_place=("x",))
def dropout(x, p, *, seed, offset=0, out=None, backend=None, stream=None):
    """(y, mask): y = x * mask / (1 - p), mask (uint8, x's shape) = 1 where the element
    is kept, with probability 1 - p. seed and offset (ints in [0, 2**64)) select the
    random stream: the same pair gives the same mask on every backend and every run;
    advance offset (e.g. by the element count) between calls that need fresh masks.

    offset may also be a counter: a 1-element uint64 array on x's side (NumPy for the
    CPU, a device array for CUDA). The op then reads the offset from it when it runs
    and adds x.size to it afterwards (mod 2**64), so successive calls, and successive
    replays of a captured CUDA graph, draw fresh masks: the same masks as int offsets
    0, n, 2n, ... on every backend. out: y's buffer."""
    op = "dropout"
    counter = hasattr(offset, "shape") and not isinstance(offset, numbers.Integral)
    c = Call(op, backend, stream, x=x, out=out,
             **({"offset": offset} if counter else {}))
    shape, dtype = c.array("x", x, BF16_DTYPES)
    p = _p(op, p)
    seed = uint64_arg(op, "seed", seed)
    if counter:  # updated in place: c.out checks shape, dtype, contiguity, writeability
        offset = c.out(offset, (1,), np.dtype(np.uint64), "offset")
    else:
        offset = uint64_arg(op, "offset", offset)
    out = c.out(out, shape, dtype)
    return c.run("dropout", x, p, seed, offset, out=out, inplace=(3,) if counter else ())


@op("dropout", in_place=("dy",))
def dropout_backward(dy, mask, p, *, out=None, backend=None, stream=None):
    """dx = dy / (1 - p) where mask is nonzero, exactly 0 where it is 0 (Inf and NaN in
    dy too), given the forward's mask (uint8) and p."""
    op = "dropout_backward"
    c = Call(op, backend, stream, dy=dy, mask=mask, out=out)
    shape, dtype = c.array("dy", dy, BF16_DTYPES)
    mshape, mdtype = c.array("mask", mask, dtypes=None)
    if mdtype != np.uint8:
        fail(DtypeError, op, "mask.dtype", "uint8 (dropout's mask)", mdtype.name)
    same_shape(op, ["dy", "mask"], [shape, mshape])
    p = _p(op, p)
    out = c.out(out, shape, dtype)
    return c.run("dropout_backward", dy, mask, p, out=out)

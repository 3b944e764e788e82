"""dropout / dropout_backward with a counter-based generator (Philox4x32-10): the CPU
reference and the GPU kernel produce the same mask bit for bit for the same (seed,
offset). The formulas are in nbdnn/cpu/dropout.py."""
import numbers

import numpy as np

from ..errors import BadParamError, DtypeError, fail
from ._common import Call, same_shape, scalar

U64 = 2 ** 64


def _p(op, p):
    return scalar(op, "p", p, low=0.0, high=1.0)


def _u64(op, name, v):
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not 0 <= v < U64:
        fail(BadParamError, op, name, "an int in [0, 2**64)", repr(v))
    return int(v)


def dropout(x, p, *, seed, offset=0, out=None, backend=None, stream=None):
    """(y, mask): y = x * mask / (1 - p), mask (uint8, x's shape) = 1 where the element
    is kept, with probability 1 - p. seed and offset (ints in [0, 2**64)) select the
    random stream: the same pair gives the same mask on every backend and every run;
    advance offset (e.g. by the element count) between calls that need fresh masks.
    out: y's buffer."""
    op = "dropout"
    c = Call(op, "dropout", backend, stream, x=x, out=out)
    shape, dtype = c.array("x", x)
    p = _p(op, p)
    seed, offset = _u64(op, "seed", seed), _u64(op, "offset", offset)
    out = c.out(out, shape, dtype)
    return c.run("dropout", x, p, seed, offset, out=out)


def dropout_backward(dy, mask, p, *, out=None, backend=None, stream=None):
    """dx = dy * mask / (1 - p), given the forward's mask and p."""
    op = "dropout_backward"
    c = Call(op, "dropout", backend, stream, dy=dy, mask=mask, out=out)
    shape, dtype = c.array("dy", dy)
    mshape, mdtype = c.array("mask", mask, dtypes=None)
    if mdtype != np.uint8:
        fail(DtypeError, op, "mask.dtype", "uint8 (dropout's mask)", mdtype.name)
    same_shape(op, ["dy", "mask"], [shape, mshape])
    p = _p(op, p)
    out = c.out(out, shape, dtype)
    return c.run("dropout_backward", dy, mask, p, out=out)

"""lrn / lrn_backward: cross-channel local response normalisation with cuDNN's window
and defaults. The formulas are in nbdnn/cpu/lrn.py."""
import numbers

from ..errors import BadParamError, ShapeError, fail
from .registry import op
from .._vocab import BF16_DTYPES
from ._common import Call, choice, same_dtype, same_shape, scalar


def _params(op, shape, n, alpha, beta, k, layout):
    if len(shape) < 3:
        fail(ShapeError, op, "x.ndim", ">= 3 (N, C, spatial axes)", len(shape))
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or not 1 <= n <= 16:
        fail(BadParamError, op, "n", "an int in [1, 16] (cuDNN's lrnN range)", repr(n))
    alpha = scalar(op, "alpha", alpha, low=0.0)  # < 0 could take a root of a negative sum
    beta = scalar(op, "beta", beta, low=0.01)
    k = scalar(op, "k", k, low=1e-5)
    choice(op, "layout", layout, ("NCHW", "NHWC"))
    return int(n), alpha, beta, k, layout == "NHWC"


@op("lrn", backward="lrn_backward")
def lrn(x, n=5, alpha=1e-4, beta=0.75, k=2.0, *, layout="NCHW", out=None, backend=None,
        stream=None):
    """y = x / (k + alpha/n * sum of x^2 over the channel window)^beta; the window of
    channel c is c - n//2 ... c + (n-1)//2 (symmetric for odd n, as cuDNN's)."""
    op = "lrn"
    c = Call(op, backend, stream, x=x, out=out)
    shape, dtype = c.array("x", x, BF16_DTYPES)
    args = _params(op, tuple(shape), n, alpha, beta, k, layout)
    return c.run("lrn", x, *args, out=c.out(out, tuple(shape), dtype))


@op("lrn")
def lrn_backward(dy, x, n=5, alpha=1e-4, beta=0.75, k=2.0, *, layout="NCHW", out=None,
                 backend=None, stream=None):
    """dx for y = lrn(x, n, alpha, beta, k) given dy."""
    op = "lrn_backward"
    c = Call(op, backend, stream, dy=dy, x=x, out=out)
    shape, dtype = c.array("x", x, BF16_DTYPES)
    dshape, ddtype = c.array("dy", dy, BF16_DTYPES)
    same_shape(op, ["x", "dy"], [tuple(shape), tuple(dshape)])
    same_dtype(op, ["x", "dy"], [dtype, ddtype])
    args = _params(op, tuple(shape), n, alpha, beta, k, layout)
    return c.run("lrn_backward", dy, x, *args, out=c.out(out, tuple(shape), dtype))

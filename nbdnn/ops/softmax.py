"""softmax / softmax_backward: cuDNN's cudnnSoftmaxForward/Backward over any axis.

algo "fast" (CUDNN_SOFTMAX_FAST: exp without max subtraction), "accurate"
(CUDNN_SOFTMAX_ACCURATE: max-subtracted) and "log" (CUDNN_SOFTMAX_LOG: log-softmax).
axis=1 on an NCHW tensor is cuDNN's CHANNEL mode; axis=-1 is the row softmax of
attention and classifiers. The formulas are in nbdnn/cpu/softmax.py.
The CUDA kernels' paths: nbdnn/cuda/softmax/__init__.py (`forced(name)` runs one).
"""
from .._vocab import BF16_DTYPES, SOFTMAX_ALGOS as ALGOS
from ..errors import BadParamError, fail
from .registry import op
from ._common import Call, blend_params, choice, normalize_axis, same_dtype, same_shape

def _axis(op, name, axis, shape):
    if len(shape) == 0:
        fail(BadParamError, op, f"{name}.ndim", ">= 1 (softmax needs an axis)", 0)
    return normalize_axis(op, "axis", axis, len(shape))


@op("softmax", backward="softmax_backward", in_place=("x",))
def softmax(x, axis=1, *, algo="accurate", alpha=1.0, beta=0.0, out=None,
            backend=None, stream=None):
    """y = alpha * softmax(x, axis) + beta * out. axis 1 by default: cuDNN's CHANNEL
    mode over NCHW; -1 for rows (attention, classifiers).

    fast: exp(x) / sum exp(x); accurate: exp(x - max) / sum exp(x - max);
    log: x - max - log(sum exp(x - max)). x: any shape (ndim >= 1),
    float16/bfloat16/float32/float64. Returns y (or `out`) of x's shape and dtype."""
    op = "softmax"
    c = Call(op, backend, stream, x=x, out=out)
    shape, dtype = c.array("x", x, BF16_DTYPES)
    axis = _axis(op, "x", axis, shape)
    choice(op, "algo", algo, ALGOS)
    alpha, beta = blend_params(op, alpha, beta, out)
    out = c.out(out, shape, dtype)
    return c.run("softmax", x, axis, algo, alpha=alpha, beta=beta, out=out)


@op("softmax", in_place=("dy", "y"))
def softmax_backward(dy, y, axis=1, *, algo="accurate", alpha=1.0, beta=0.0, out=None,
                     backend=None, stream=None):
    """dx = alpha * dL/dx + beta * out, given y = softmax(x) (log-softmax for "log").

    fast/accurate: dx = y * (dy - sum(dy * y, axis)); log: dx = dy - exp(y) * sum(dy,
    axis). dy, y: the same shape and dtype."""
    op = "softmax_backward"
    c = Call(op, backend, stream, dy=dy, y=y, out=out)
    dshape, ddtype = c.array("dy", dy, BF16_DTYPES)
    shape, dtype = c.array("y", y, BF16_DTYPES)
    same_shape(op, ["y", "dy"], [shape, dshape])
    same_dtype(op, ["y", "dy"], [dtype, ddtype])
    axis = _axis(op, "y", axis, shape)
    choice(op, "algo", algo, ALGOS)
    alpha, beta = blend_params(op, alpha, beta, out)
    out = c.out(out, shape, dtype)
    return c.run("softmax_backward", dy, y, axis, algo, alpha=alpha, beta=beta, out=out)

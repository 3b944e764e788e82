"""activation / activation_backward: cuDNN's cudnnActivationForward/Backward modes plus
the modern ones (swish, gelu, gelu_tanh, softplus). The formulas are in
nbdnn/cpu/activation.py."""
from .registry import op
from ..errors import BadParamError, fail
from ._common import Call, blend_params, choice, same_dtype, same_shape, scalar
from .._vocab import ACTIVATION_DEFAULT_COEF as DEFAULT_COEF, ACTIVATION_MODES as MODES, \
    BF16_DTYPES


_NO_COEF = frozenset(m for m in MODES if m not in DEFAULT_COEF)


def _coef(op, mode, coef):
    if type(mode) is str and mode in _NO_COEF:  # relu, sigmoid, ...: the common case
        return 0.0
    choice(op, "mode", mode, MODES)
    if mode not in DEFAULT_COEF:
        return 0.0
    if coef is None:
        return DEFAULT_COEF[mode]
    if mode == "clipped_relu":
        return scalar(op, "coef (clipped_relu ceiling)", coef, low=0.0)
    if mode == "clamp":
        return scalar(op, "coef (clamp bound)", coef, low=0.0)
    if mode == "softplus":
        return scalar(op, "coef (softplus beta)", coef, low=0.0, low_open=True)
    return scalar(op, f"coef ({mode})", coef)


def fused_coef(op, activation, coef):
    """The coef of an op's fused activation (conv, matmul, batch norm): 0.0 without one;
    a coef given without an activation is a BadParamError (it would do nothing)."""
    if activation is None:
        if coef is not None:
            fail(BadParamError, op, "coef", "None without an activation (it is the "
                 "activation's parameter)", repr(coef))
        return 0.0
    choice(op, "activation", activation, MODES)  # (named as the fusing op names it)
    return _coef(op, activation, coef)


@op("activation", backward="activation_backward", in_place=("x",))
def activation(x, mode="relu", *, coef=None, alpha=1.0, beta=0.0, out=None,
               backend=None, stream=None):
    """y = alpha * f(x) + beta * out, elementwise; f by `mode`, parameterised by `coef`
    (leaky_relu slope 0.01, clipped_relu ceiling 6, elu alpha 1, swish/softplus beta 1,
    clamp bound 1: min(max(x, -c), c)).

    x: any shape, float16/bfloat16/float32/float64. Returns y (or `out`) of x's shape
    and dtype."""
    op = "activation"
    coef = _coef(op, mode, coef)
    alpha, beta = blend_params(op, alpha, beta, out)
    c = Call(op, backend, stream, x=x, out=out)
    shape, dtype = c.array("x", x, BF16_DTYPES)
    out = c.out(out, shape, dtype)
    return c.run("activation", x, mode, coef, alpha=alpha, beta=beta, out=out)


@op("activation", in_place=("dy", "x", "y"))
def activation_backward(dy, x, y=None, mode="relu", *, coef=None, alpha=1.0, beta=0.0,
                        out=None, backend=None, stream=None):
    """dx = alpha * dy * f'(x) + beta * out.

    The derivative is computed from x for every mode (exact, and one array less to
    read); y, the forward output, is accepted for cuDNN's argument list and checked
    for shape, but not read."""
    op = "activation_backward"
    c = Call(op, backend, stream, dy=dy, x=x, y=y, out=out)
    dshape, ddtype = c.array("dy", dy, BF16_DTYPES)
    shape, dtype = c.array("x", x, BF16_DTYPES)
    names, shapes, dtypes = ["x", "dy"], [shape, dshape], [dtype, ddtype]
    if y is not None:
        yshape, ydtype = c.array("y", y, BF16_DTYPES)
        names.append("y"), shapes.append(yshape), dtypes.append(ydtype)
    same_shape(op, names, shapes)
    same_dtype(op, names, dtypes)
    coef = _coef(op, mode, coef)
    alpha, beta = blend_params(op, alpha, beta, out)
    out = c.out(out, shape, dtype)
    return c.run("activation_backward", dy, x, mode, coef, alpha=alpha, beta=beta, out=out)

"""matmul / matmul_backward: batched GEMM with broadcasting and a fused epilogue
(bias, activation, alpha/beta blend), as cuBLASLt's matmul with epilogues. The
formulas are in nbdnn/cpu/matmul.py."""
import numpy as np

from .._vocab import BF16_DTYPES
from ..errors import ShapeError, fail
from .registry import op
from ._common import Call, blend_params, flag, out_tuple, same_dtype
from .activation import fused_coef
from .._math_mode import resolve as _math


def _dims(op, a_shape, b_shape, trans_a, trans_b):
    """(batch shape, M, K, N) of op(a) @ op(b); ShapeError when they do not fit."""
    a_shape, b_shape = tuple(a_shape), tuple(b_shape)  # the simulator's shapes index
    for name, s in (("a", a_shape), ("b", b_shape)):
        if len(s) < 2:
            fail(ShapeError, op, f"{name}.ndim", ">= 2 (a matrix or a batch of them)", len(s))
    M, K = (a_shape[-1], a_shape[-2]) if trans_a else (a_shape[-2], a_shape[-1])
    Kb, N = (b_shape[-1], b_shape[-2]) if trans_b else (b_shape[-2], b_shape[-1])
    if K != Kb:
        fail(ShapeError, op, "b.shape", f"K = {K} rows in op(b) to match op(a) "
             f"(a {tuple(a_shape)}, trans_a={trans_a}, trans_b={trans_b})", tuple(b_shape))
    if a_shape[:-2] == b_shape[:-2]:  # no broadcasting (2-D operands among them)
        return a_shape[:-2], M, K, N
    try:
        batch = np.broadcast_shapes(tuple(a_shape[:-2]), tuple(b_shape[:-2]))
    except ValueError:
        fail(ShapeError, op, "batch axes", "broadcastable (NumPy rules)",
             f"a {tuple(a_shape)}, b {tuple(b_shape)}")
    return tuple(batch), M, K, N


@op("matmul", backward="matmul_backward")
def matmul(a, b, *, trans_a=False, trans_b=False, bias=None, activation=None, coef=None,
           math=None, alpha=1.0, beta=0.0, out=None, backend=None, stream=None):
    """c = alpha * act(op(a) @ op(b) + bias) + beta * out.

    a: (..., M, K) ((..., K, M) with trans_a); b: (..., K, N) ((..., N, K) with
    trans_b); batch axes broadcast. bias: (N,) or None. activation: None or an
    activation mode (nbdnn.activation's names; `coef` as there). float16 and
    bfloat16 (float32 accumulation; on an sm_90 GPU the tensor cores, wgmma), float32,
    float64; a, b, bias of one dtype. math: float32's mode,
    "ieee", "tf32" or "3xtf32" (None: the current default; nbdnn/_math_mode.py).
    Returns c of shape (batch..., M, N) and a's dtype (or `out`)."""
    op = "matmul"
    c = Call(op, backend, stream, a=a, b=b, bias=bias, out=out)
    a_shape, dtype = c.array("a", a, BF16_DTYPES)
    b_shape, b_dtype = c.array("b", b, BF16_DTYPES)
    same_dtype(op, ["a", "b"], [dtype, b_dtype])
    trans_a, trans_b = flag(op, "trans_a", trans_a), flag(op, "trans_b", trans_b)
    batch, M, K, N = _dims(op, a_shape, b_shape, trans_a, trans_b)
    if bias is not None:
        bias_shape, bias_dtype = c.array("bias", bias, BF16_DTYPES)
        if tuple(bias_shape) != (N,):
            fail(ShapeError, op, "bias.shape", f"(N,) = ({N},)", tuple(bias_shape))
        same_dtype(op, ["a", "bias"], [dtype, bias_dtype])
    coef = fused_coef(op, activation, coef)
    math = _math(op, math)
    alpha, beta = blend_params(op, alpha, beta, out)
    out = c.out(out, batch + (M, N), dtype)
    return c.run("matmul", a, b, trans_a, trans_b, bias, activation, coef, math, alpha=alpha,
                 beta=beta, out=out)


@op("matmul")
def matmul_backward(dc, a, b, *, trans_a=False, trans_b=False, bias=False, math=None,
                    alpha=1.0, beta=0.0, out=None, backend=None, stream=None):
    """Gradients of c = op(a) @ op(b) + bias given dc = dL/dc (before any activation:
    apply activation_backward first). Returns (da, db), or (da, db, dbias) when
    bias=True, of a's, b's and (N,) shapes; each = alpha * gradient + beta * out[i]
    when out is a tuple of arrays of those shapes. math: as matmul's, for both
    products."""
    op = "matmul_backward"
    bias = flag(op, "bias", bias)
    outs = out_tuple(op, out, ("da", "db") + (("dbias",) if bias else ()))
    c = Call(op, backend, stream, dc=dc, a=a, b=b,
             **{f"out[{i}]": o for i, o in enumerate(outs)})
    dc_shape, dc_dtype = c.array("dc", dc, BF16_DTYPES)
    a_shape, dtype = c.array("a", a, BF16_DTYPES)
    b_shape, b_dtype = c.array("b", b, BF16_DTYPES)
    same_dtype(op, ["a", "b", "dc"], [dtype, b_dtype, dc_dtype])
    trans_a, trans_b = flag(op, "trans_a", trans_a), flag(op, "trans_b", trans_b)
    batch, M, K, N = _dims(op, a_shape, b_shape, trans_a, trans_b)
    if tuple(dc_shape) != batch + (M, N):
        fail(ShapeError, op, "dc.shape", f"the shape of c, {batch + (M, N)}", tuple(dc_shape))
    math = _math(op, math)
    alpha, beta = blend_params(op, alpha, beta, out)
    shapes = [tuple(a_shape), tuple(b_shape)] + ([(N,)] if bias else [])
    if out is not None:
        outs = tuple(c.out(o, s, dtype, f"out[{i}]") for i, (o, s) in
                     enumerate(zip(outs, shapes)))
    return c.run("matmul_backward", dc, a, b, trans_a, trans_b, bias, math, alpha=alpha,
                 beta=beta, out=outs or None)

"""The float32 math mode of matrix products: cuDNN's mathType, PyTorch's allow_tf32.

    "ieee"    float32 FMA (the default: what verification needs)
    "tf32"    each operand rounded to TF32 (10 mantissa bits, to nearest, ties to
              even: what Hopper's TMA does loading float32 through a TFLOAT32 tensor
              map, so operands that are already K-major reach the tensor cores with
              no rounding pass), products accumulated in float32
    "3xtf32"  each operand split into a TF32 head and a TF32 tail (x = hi + lo), the
              three products hi*hi + hi*lo + lo*hi accumulated in float32: float32
              accuracy (the dropped lo*lo is ~2^-22 of a product) at TF32 speed

The mode applies to float32 operands (matmul, matmul_backward, the convolutions and
their gradients: through their "gemm" algorithm; attention in a later issue); float16 and bfloat16 always multiply on tensor cores with float32
accumulation and float64 stays IEEE. `math=` on a call wins; otherwise the innermost
`math_mode(...)` block of this thread, otherwise the process default `set_math(...)`.
The CPU reference applies the same rounding and split, so both backends agree to
accumulation error, not to TF32 error.

The mode is process state a call reads: an eager call plan's signature carries
`get_math()` (ops/_plan.py), so a plan learnt in one mode never answers in another.
This module sits in the lowest layer (errors and _vocab only) so ops/ reads it without
an import up.
"""
import contextlib
import threading

from ._vocab import MATH_MODES
from .errors import BadParamError, fail


def _checked(op, name, value, choices=MATH_MODES):
    """value when it is one of the modes, else a BadParamError naming op and name."""
    if not isinstance(value, str) or value not in choices:
        fail(BadParamError, op, name, f"one of {', '.join(map(repr, choices))}", repr(value))
    return value

_default = ["ieee"]
_local = threading.local()


def set_math(mode):
    """Set the process default math mode ("ieee", "tf32" or "3xtf32")."""
    _default[0] = _checked("set_math", "mode", mode)


def get_math():
    """The math mode a call without `math=` uses here and now."""
    return getattr(_local, "mode", None) or _default[0]


@contextlib.contextmanager
def math_mode(mode):
    """`with nbdnn.math_mode("tf32"): ...`: this thread's calls inside use `mode`."""
    mode = _checked("math_mode", "mode", mode)
    outer = getattr(_local, "mode", None)
    _local.mode = mode
    try:
        yield mode
    finally:
        _local.mode = outer


def resolve(op, math):
    """The mode a call runs in: its `math=` (checked) or the current default."""
    return get_math() if math is None else _checked(op, "math", math)


def resolve_for(op, math, dtype, algo, algos):
    """resolve(); float32's TF32 modes only with an algorithm in `algos` (those that
    run them: conv's "auto" and "gemm"), else a BadParamError."""
    math = resolve(op, math)
    if math != "ieee" and str(dtype) == "float32" and algo not in algos:
        fail(BadParamError, op, "algo", f"one of {', '.join(map(repr, algos))} with math "
             f"'{math}' (the algorithms that run it)", repr(algo))
    return math

"""Activation forward and backward: one elementwise kernel per (mode, direction, dtype).

Traffic per element (float32): forward reads x and writes y (8 B; +4 B when beta != 0
reads y); backward reads dy and x and writes dx (12 B). A few flops per element, so
both are bound by memory bandwidth (H200: ~4 TB/s copy). Each thread moves GROUPS
vectors of 4 elements with 16-byte loads/stores (`load4`/`store4`): with one scalar
per thread a 1 GiB ReLU reached 61% of copy bandwidth, with 4 scalars 92% (NOTES).
Measured here (H200, relu forward, % of copy, docs/decisions.md "diagnose"; run-to-run spread
~2 points): GROUPS x BLOCK = 2x128 96%, 2x256 96%, 4x128 95%, 4x256 91-93%, 8x128 96%,
2x512 90%. Unaligned views (pointer not a multiple of 16 B) and the tail take the
scalar path inside the same kernel.

Arithmetic runs in float32 for float16/bfloat16/float32 storage and float64 for
float64 (bfloat16 arrays are passed as their uint16 bits and widened / rounded by
intrinsics.widen / narrow; its vectors are 8 bytes, like float16's). The
formulas are written to stay finite for |x| up to 1e4 and beyond (sigmoid by the sign
of x, softplus as max(z, 0) + log1p(exp(-|z|)), gelu_tanh's derivative saturated past
|x| > 10) and to propagate NaN as the CPU reference does (`0 if x < 0 else x`).
"""
import functools
import math

import numpy as np
from numba import cuda, float32, float64

from .runtime.simulator import SIMULATOR
from .runtime.device_code.intrinsics import (array_type, load4, narrow, store4, vector_alignment,
    widen)
from .runtime.launch.kernel import Kernel
from .runtime.memory.arrays import dtype_of, empty, ptr_size
from .runtime.launch.codegen import compile_source
from .._vocab import ACTIVATION_MODES as MODES, BF16_DTYPES as DTYPES

BLOCK = 32 if SIMULATOR else 128  # (the simulator starts an OS thread a CUDA thread)
GROUPS = 2  # 4-element vectors per thread, all loaded before the first store


def device_functions(t):
    """mode -> (forward(x, c), derivative(x, c)) device functions in compute type t."""
    zero, one, half = t(0), t(1), t(0.5)
    inv_sqrt2, inv_sqrt_2pi = t(1 / math.sqrt(2)), t(1 / math.sqrt(2 * math.pi))
    k_tanh, k_cubic, k_cubic3 = t(math.sqrt(2 / math.pi)), t(0.044715), t(3 * 0.044715)
    ten, three, six, sixth, third = t(10), t(3), t(6), t(1 / 6), t(1 / 3)
    dev = cuda.jit(device=True)

    @dev
    def relu6_shift(x):  # min(max(x + 3, 0), 6), NaN through
        r = x + three
        return zero if r < zero else (six if r > six else r)

    @dev
    def sigmoid(x):
        e = math.exp(-abs(x))
        s = one / (one + e)
        return s if x >= zero else e * s

    fns = {
        "identity": (lambda x, c: x, lambda x, c: one),
        "relu": (lambda x, c: zero if x < zero else x,
                 lambda x, c: zero if x <= zero else one),
        "leaky_relu": (lambda x, c: x * c if x < zero else x,
                       lambda x, c: one if x > zero else c),
        "clipped_relu": (lambda x, c: zero if x < zero else (c if x > c else x),
                         lambda x, c: one if (x > zero and x < c) else zero),
        "clamp": (lambda x, c: -c if x < -c else (c if x > c else x),
                  lambda x, c: one if (x > -c and x < c) else zero),
        "elu": (lambda x, c: x if x > zero else c * math.expm1(x),
                lambda x, c: one if x > zero else c * math.exp(x)),
        "sigmoid": (lambda x, c: sigmoid(x),
                    lambda x, c: sigmoid(x) * (one - sigmoid(x))),
        "tanh": (lambda x, c: math.tanh(x),
                 lambda x, c: one - math.tanh(x) * math.tanh(x)),
        "swish": (lambda x, c: x * sigmoid(c * x),
                  lambda x, c: sigmoid(c * x) * (one + c * x * (one - sigmoid(c * x)))),
        "gelu": (lambda x, c: half * x * (one + math.erf(x * inv_sqrt2)),
                 lambda x, c: (half * (one + math.erf(x * inv_sqrt2))
                               + x * inv_sqrt_2pi * math.exp(-half * x * x))),
        "gelu_tanh": (
            lambda x, c: half * x * (one + math.tanh(k_tanh * (x + k_cubic * x * x * x))),
            lambda x, c: ((one if x > zero else zero) if abs(x) > ten else
                          _gelu_tanh_grad(x, half, one, k_tanh, k_cubic, k_cubic3))),
        "softplus": (lambda x, c: ((c * x if c * x > zero else zero)
                                   + math.log1p(math.exp(-abs(c * x)))) / c,
                     lambda x, c: sigmoid(c * x)),
        "hardswish": (lambda x, c: x * relu6_shift(x) / six,
                      lambda x, c: zero if x <= -three else (x * third + half if x < three
                                                             else one)),
        "hardsigmoid": (lambda x, c: relu6_shift(x) / six,
                        lambda x, c: sixth if (x > -three and x < three) else zero),
    }
    return {m: (dev(f), dev(d)) for m, (f, d) in fns.items()}


def _gelu_tanh_grad(x, half, one, k, k3, k33):
    th = math.tanh(k * (x + k3 * x * x * x))
    return half * (one + th) + half * x * (one - th * th) * k * (one + k33 * x * x)


_gelu_tanh_grad = cuda.jit(device=True)(_gelu_tanh_grad)


def _kernel_source(backward):
    """Source of the elementwise kernel, unrolled over GROUPS vectors per thread, in a
    grid-stride loop over a grid sized to fill the GPU once (see _grid).

    All loads of an iteration are issued before any store: x/dy and y/dx may alias
    (out=x), so the compiler may not hoist a later load above an earlier store by
    itself; with one vector in flight per thread the forward pass stopped at ~92% of
    copy bandwidth. The tail (and unaligned views) run the scalar loop."""
    ins = ["dy", "x"] if backward else ["x"]
    o = "dx" if backward else "y"
    val = ("alpha * widen(d{k}) * f(widen(x{k}), coef)" if backward else
           "alpha * f(widen(x{k}), coef)")
    L = [f"def kernel({', '.join(ins)}, {o}, n, alpha, beta, coef, aligned):",
         "    g0 = cuda.blockIdx.x * (GROUPS * BLOCK) + cuda.threadIdx.x",
         "    step = cuda.gridDim.x * (GROUPS * BLOCK)",
         "    while g0 * 4 < n:",
         "        if aligned != 0 and (g0 + (GROUPS - 1) * BLOCK) * 4 + 4 <= n:"]
    ind = " " * 12
    for j in range(GROUPS):
        for name, pre in (("x", "x"), ("dy", "d")):
            if name in ins:
                L.append(f"{ind}{', '.join(f'{pre}{4 * j + k}' for k in range(4))} = "
                         f"load4({name}, g0 + {j} * BLOCK)")
    for j in range(GROUPS):
        L.append(f"{ind}{', '.join(f'b{4 * j + k}' for k in range(4))} = "
                 f"load4({o}, g0 + {j} * BLOCK) if beta != 0 else (zero, zero, zero, zero)")
    for j in range(GROUPS):
        vals = ", ".join(f"narrow({val.format(k=4 * j + k)} + beta * widen(b{4 * j + k}), {o})"
                         for k in range(4))
        L.append(f"{ind}store4({o}, g0 + {j} * BLOCK, ({vals}))")
    sval = ("alpha * widen(dy[e]) * f(widen(x[e]), coef)" if backward else
            "alpha * f(widen(x[e]), coef)")
    L += ["        else:",
          "            for j in range(GROUPS):",
          "                i = (g0 + j * BLOCK) * 4",
          "                for e in range(i, min(i + 4, n)):",
          f"                    r = {sval}",
          "                    if beta != 0:",
          f"                        r += beta * widen({o}[e])",
          f"                    {o}[e] = narrow(r, {o})",
          "        g0 += step"]
    return "\n".join(L)


_SOURCES = {d: _kernel_source(d) for d in (False, True)}


def _make_kernel(f, ct, backward, bf16=False):
    # x, y (dy, x, dx): (n,) flat.  y = alpha*f(x) + beta*y;  dx = alpha*dy*f'(x) + beta*dx
    # loads widen, stores narrow (runtime/device_code/intrinsics.py; bfloat16: the arrays hold its
    # bits, so its kernels' stored zero is the uint16 0)
    ns = {"cuda": cuda, "load4": load4, "store4": store4, "GROUPS": GROUPS, "BLOCK": BLOCK,
          "f": f, "widen": widen, "narrow": narrow, "zero": np.uint16(0) if bf16 else ct(0),
          "min": min}
    d = "backward" if backward else "forward"
    k = compile_source("kernel", _SOURCES[backward], ns,
                       label=f"activation_{d}_{'bfloat16' if bf16 else ct}", about={
        "what": f"activation {d}, compute type {ct}{', bfloat16 storage' if bf16 else ''}",
        "traffic": f"per element {'3 reads + 1 write' if backward else '1 read + 1 write'}"
                   " (+1 read with beta != 0); GROUPS 16-byte vectors a thread in flight",
        "why": "one elementwise kernel for every mode: f is the mode's device function"})
    k.__name__ = "activation_backward" if backward else "activation_forward"
    return k


@functools.lru_cache(maxsize=None)
def fused(npt, derivative=False):
    """act_fn(x, mode, coef), or its derivative act_grad(x, mode, coef), as one device
    function: a chain over MODES by index (any other mode returns x). The fused
    activation of the matmul, convolution and batch norm epilogues (mode -1: none)."""
    fns = device_functions(npt)
    name, prefix, k = ("act_grad", "g_", 1) if derivative else ("act_fn", "f_", 0)
    lines = [f"def {name}(x, mode, coef):"]
    for i, m in enumerate(MODES):
        lines += [f"    if mode == {i}:", f"        return {prefix}{m}(x, coef)"]
    lines.append("    return x")
    ns = {f"{prefix}{m}": fns[m][k] for m in MODES}
    fn = compile_source(name, "\n".join(lines) + "\n", ns, label=f"{name}_{np.dtype(npt).name}",
                        about={
        "what": f"the fused epilogue's activation{' derivative' if derivative else ''}, "
                f"{np.dtype(npt).name}",
        "why": "kernels take the mode as an int argument: one compiled kernel serves all"})
    return cuda.jit(device=True)(fn)


def _compute_type(dtype):
    return "float64" if dtype == "float64" else "float32"


def _build():
    fwd, bwd = {}, {}
    for ct_name, ct, npt in (("float32", float32, np.float32), ("float64", float64, np.float64)):
        fns = device_functions(npt)
        for t in (d for d in DTYPES if _compute_type(d) == ct_name):
            bf16, a = t == "bfloat16", array_type(t)
            fs = f"void({a}[::1], {a}[::1], int64, {ct_name}, {ct_name}, {ct_name}, int64)"
            bs = (f"void({a}[::1], {a}[::1], {a}[::1], int64, {ct_name}, {ct_name}, "
                  f"{ct_name}, int64)")
            for mode, (f, d) in fns.items():
                fwd[mode, np.dtype(t)] = (Kernel(_make_kernel(f, ct, False, bf16), [fs]), fs)
                bwd[mode, np.dtype(t)] = (Kernel(_make_kernel(d, ct, True, bf16), [bs]), bs)
    return fwd, bwd


_FORWARD, _BACKWARD = _build()
_ALIGN = {n: vector_alignment(n) for n in (2, 4, 8)}  # itemsize -> bytes
_PER_BLOCK, _MAX_GRID = 4 * GROUPS * BLOCK, 2 ** 31 - 1


def _grid(n):
    """One pass: every block handles GROUPS * BLOCK * 4 elements once. (A resident grid
    of 8 blocks per SM looping over the tensor measured 86% of copy bandwidth forward
    against 91-93% for this full grid; the grid-stride loop remains only so that any
    grid-size cap stays correct.)"""
    g = (n + _PER_BLOCK - 1) // _PER_BLOCK  # n >= 1: callers launch nothing for n == 0
    return g if g < _MAX_GRID else _MAX_GRID


def _launch(table, mode, arrays, out, alpha, beta, coef, stream):
    """arrays: the inputs (x, or dy and x); out: the result buffer or None. Every eager
    activation call runs this: no per-call work that a table can hold."""
    x = arrays[-1]
    dtype = dtype_of(x)
    kernel, sig = table[mode, dtype]
    y = out if out is not None else empty(x, x.shape, dtype)
    ps = tuple(map(ptr_size, (*arrays, y)))  # (pointer, count): the fast path's form
    n = ps[0][1]
    if n:
        anyptr = 0
        for p, _ in ps:
            anyptr |= p
        aligned = int(anyptr % _ALIGN[dtype.itemsize] == 0)
        kernel.launch(sig, _grid(n), BLOCK, stream, *((*arrays, y) if SIMULATOR else ps), n,
                      alpha, beta, coef, aligned, owners=(*arrays, y))
    return y


def activation(x, mode, coef, *, alpha, beta, out, stream):
    """y = alpha * act(x) + beta * out; x contiguous (ops made it so)."""
    return _launch(_FORWARD, mode, (x,), out, alpha, beta, coef, stream)


def activation_backward(dy, x, mode, coef, *, alpha, beta, out, stream):
    """dx = alpha * dy * act'(x) + beta * out."""
    return _launch(_BACKWARD, mode, (dy, x), out, alpha, beta, coef, stream)

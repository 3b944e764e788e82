"""Pool backward, fast path: 1-d and 2-d windows of at most fast.MAX_TAPS taps with the
window geometry (size, stride, leading padding, dilation) and the mode compiled in,
32-bit offsets and multiply-high index splits (as pool/fast.py's forward).

- pool_argmax_fast: one thread an output, idx[o] = the first maximal tap of window o
  (int8: taps <= 64; -1 when the window holds none), NaN rules as pool's window():
  a NaN tap wins when `propagate` or when the window holds no number.
- pool_bwd_fast: one thread an input element (x's order: consecutive threads write
  consecutive dx), over the taps (r, s) whose stride arithmetic lands on it: the output
  row ph = (ih + QH - r DH) / SH when that divides (one unsigned test: a negative
  numerator wraps past PH), likewise pw; max adds dy[o] where idx[o] is that tap, the
  averages dy[o] / count(o), count from the window's rows and columns inside the
  (padded) input. Every tap loads from a clamped valid address and is masked after
  (no branch around a load). No atomics: deterministic.

Why: the general kernels (pool/__init__.py) split 64-bit indices five ways and the
landing arithmetic divides by runtime strides: max pool's backward in ResNet-50's bf16
training step (3x3/2 over 32 x 112 x 112 x 64) took 1.83 ms against PyTorch's 0.39
(CUDA events). Traffic, 3x3/2 max, bf16: argmax reads x (51 MB) and writes
idx (6.4 MB); the gather reads dy and idx (12.8 + 6.4 MB, each element ~2.25 times,
from L1/L2) and writes dx (51 MB).
"""
import functools
import math

from numba import cuda, float32, float64

from ..runtime.memory.arrays import dtype_name
from ..runtime.simulator import SIMULATOR
from ..runtime.device_code import stencil as _stencil
from ..runtime.device_code.intrinsics import array_type, narrow, widen
from ..runtime.launch.kernel import Kernel
from ..runtime.launch.codegen import compile_source
from .fast import MAX_TAPS

BLOCK = 32 if SIMULATOR else 256
DIV = _stencil.DIV


def usable(nd, K, x_size, y_size):
    """1-d/2-d windows of <= MAX_TAPS taps, indices < 2**31 (the magic divisions)."""
    return nd <= 2 and math.prod(K) <= MAX_TAPS and max(x_size, y_size) < 2 ** 31


def _argmax_lines(KH, KW):
    """Source lines: best = the first maximal inside tap (pool's window() rules)."""
    body = ["acc, best, nan_tap = NEG, -1, -1"]
    for r in range(KH):
        for s in range(KW):
            t, v, ok = r * KW + s, f"v{r}_{s}", f"in{r} & jn{s}"
            body += [f"nan_tap = {t} if ({ok}) & ({v} != {v}) & (nan_tap < 0) else nan_tap",
                     f"take = ({ok}) & ({v} == {v}) & ((best < 0) | ({v} > acc))",
                     f"acc = {v} if take else acc", f"best = {t} if take else best"]
    return body + ["if nan_tap >= 0 and (propagate != 0 or best < 0):", "    best = nan_tap"]


def argmax_source(last, KH, KW, SH, SW, QH, QW, DH, DW):
    ind = "        "
    body = _stencil.split_lines(last, 1) + [f"h0 = I(ph) * {SH} - {QH}",
                                            f"w0 = I(pw) * {SW} - {QW}"]
    body += _stencil.load_lines(_stencil.row_offsets(KH, SH, DH, 1), KW, DW)
    body += _argmax_lines(KH, KW) + ["idx[U(yb)] = best"]
    return ("def pool_argmax_fast(x, idx, H, W, C, PH, PW, PP, total, m_C, s_C, m_PW, s_PW, "
            "m_PP, s_PP, propagate):\n"
            "    i = U(cuda.blockIdx.x) * U(cuda.blockDim.x) + U(cuda.threadIdx.x)\n"
            "    if i < U(total):\n" + "".join(ind + line + "\n" for line in body))


def _landing_lines(axis, K, S, Q, D, P):
    """Source lines: {axis}o{j} (the output along the axis whose tap j lands on the
    element's coordinate {axis}i, clamped to 0) and {axis}k{j} (whether one does)."""
    body = []
    for j in range(K):
        a = f"W32(I({axis}i) + {Q - j * D})"  # (negative: wraps to >= 2**31, past P)
        if S == 1:
            body += [f"{axis}u{j} = {a}", f"{axis}k{j} = {axis}u{j} < U32({P})"]
        else:
            body += [f"{axis}a{j} = {a}", f"{axis}u{j} = U32({axis}a{j} // {S})",
                     f"{axis}k{j} = ({axis}u{j} * {S} == {axis}a{j}) & ({axis}u{j} < U32({P}))"]
        body.append(f"{axis}o{j} = {axis}u{j} if {axis}k{j} else U32(0)")
    return body


def _count_lines(axis, K, S, Q, D, lo, hi):
    """Source lines: {axis}n{j}, the taps of the window at output {axis}o{j} inside
    [lo, hi) along the axis (the averages' divisor, one factor)."""
    return [f"{axis}n{j} = " + " + ".join(
        f"(1 if {lo} <= I({axis}o{j}) * {S} + {t * D - Q} < {hi} else 0)" for t in range(K))
        for j in range(K)]


def bwd_source(last, KH, KW, SH, SW, QH, QW, DH, DW, mode, divisor=0):
    """mode 0 max (dy and idx), 1 avg counting padding, 2 avg excluding it; divisor:
    the averages' (0: each window's count)."""
    ind = "        "
    if last:
        split = [f"q = {DIV.format(a='i', b='C')}", "c = U32(i - q * C)",
                 f"r = {DIV.format(a='q', b='W')}", "wi = U32(q - r * W)",
                 f"n = {DIV.format(a='r', b='H')}", "hi = U32(r - n * H)",
                 "ob = U32(n * PH * PW * C + c)", "os_h, os_w = U32(PW * C), U32(C)"]
    else:
        split = [f"q = {DIV.format(a='i', b='W')}", "wi = U32(i - q * W)",
                 f"p = {DIV.format(a='q', b='H')}", "hi = U32(q - p * H)",
                 "ob = U32(p * PH * PW)", "os_h, os_w = U32(PW), U32(1)"]
    body = split + _landing_lines("h", KH, SH, QH, DH, "PH") + \
        _landing_lines("w", KW, SW, QW, DW, "PW")
    if mode and not divisor:
        hi_h, hi_w = ("EH", "EW") if mode == 1 else ("H", "W")
        body += _count_lines("h", KH, SH, QH, DH, -QH if mode == 1 else 0, hi_h)
        body += _count_lines("w", KW, SW, QW, DW, -QW if mode == 1 else 0, hi_w)
    body.append("acc = ZERO")
    for r in range(KH):
        for s in range(KW):
            body += [f"o = U(U32(ob + ho{r} * os_h + wo{s} * os_w))",
                     "g = widen(dy[o])", f"ok = hk{r} & wk{s}"]
            if mode == 0:
                body.append(f"acc += g if ok & (idx[o] == {r * KW + s}) else ZERO")
            elif divisor:
                body.append(f"acc += g / CT({divisor}) if ok else ZERO")
            else:
                body.append(f"acc += g / CT(hn{r} * wn{s}) if ok else ZERO")
    body += ["v = alpha * acc", "if beta != ZERO:", "    v += beta * widen(dx[i])",
             "dx[i] = narrow(v, dx)"]
    return ("def pool_bwd_fast(dy, idx, dx, H, W, C, PH, PW, EH, EW, total, m_C, s_C, m_W, "
            "s_W, m_H, s_H, alpha, beta):\n"
            "    i = U(cuda.blockIdx.x) * U(cuda.blockDim.x) + U(cuda.threadIdx.x)\n"
            "    if i < U(total):\n" + "".join(ind + line + "\n" for line in body))


def _ints(n):
    return ", ".join(["int64"] * n)


@functools.lru_cache(maxsize=None)
def kernel(kind, dtype, last, geometry, mode=0, divisor=0):
    """(Kernel, signature) of pool_argmax_fast (kind "argmax") or pool_bwd_fast ("bwd")
    for geometry (KH, KW, SH, SW, QH, QW, DH, DW) and the averages' divisor (0: each
    window's count); built once per key."""
    ct_name = "float64" if dtype == "float64" else "float32"
    CT = float64 if ct_name == "float64" else float32
    ns = {"cuda": cuda, "CT": CT, "ZERO": CT(0), "NEG": CT(-math.inf),
          "I": _stencil.I64, "U": _stencil.U,
          "U32": _stencil.U32, "W32": _stencil.W32, "widen": widen, "narrow": narrow}
    a = array_type(dtype)
    config = f"{dtype}, {'channels last' if last else 'channels first'}, window {geometry}"
    if kind == "argmax":
        name, src = "pool_argmax_fast", argmax_source(bool(last), *geometry)
        sig = f"void({a}[::1], int8[::1], {_ints(14)})"  # (13 sizes, propagate)
        about = {"config": config, "traffic": "x once, idx (int8) once",
                 "why": "the windows' first maxima once, for the gather (module docstring)"}
    else:
        name, src = "pool_bwd_fast", bwd_source(bool(last), *geometry, mode, divisor)
        sig = f"void({a}[::1], int8[::1], {a}[::1], {_ints(14)}, {ct_name}, {ct_name})"
        about = {"config": f"{config}, mode {mode}, divisor {divisor}", "traffic": "dy (and idx) ~k/s times "
                 "an axis from cache, dx once", "why": "module docstring"}
    compile_source(name, src, ns, about=about)
    return Kernel(ns[name], [sig]), sig


def ptx_examples():
    """tests/test_ptx.py (CI's time: one kernel a path): argmax, each mode's gather in
    both layouts between them, 3x3/2 padding 1; a 2x2/2 float64 gather."""
    g = (3, 3, 2, 2, 1, 1, 1, 1)
    kernel("argmax", "bfloat16", 1, g)
    for dtype, last, mode in (("float32", 0, 1), ("float32", 1, 2), ("bfloat16", 1, 0)):
        kernel("bwd", dtype, last, g, mode)
    kernel("bwd", "float64", 1, (2, 2, 2, 2, 0, 0, 1, 1), 0)


def backward(dy, x, dx, g, alpha, beta, stream, scratch):
    """dx from dy for the call's PoolGeometry g (geometry.py; `usable`);
    scratch(shape) allocates idx (max)."""
    C, H, W, PH, PW = g.C, g.H, g.W, g.PH, g.PW
    geometry = g.window2d
    dtype, last, mode = dtype_name(x), g.last, g.mode
    y_total, x_total = g.N * C * PH * PW, g.N * C * H * W
    idx = scratch(y_total if mode == 0 else 1)  # (the averages read none)
    if mode == 0:
        k, sig = kernel("argmax", dtype, last, geometry)
        k.launch(sig, -(-y_total // BLOCK), BLOCK, stream, x, idx, H, W, C, PH, PW, PH,
                 y_total, *_stencil.magic_args(C, PW, PH), g.propagate)
    k, sig = kernel("bwd", dtype, last, geometry, mode, g.div if mode else 0)
    k.launch(sig, -(-x_total // BLOCK), BLOCK, stream, dy, idx, dx, H, W, C, PH, PW, g.eh,
             g.ew, x_total, *_stencil.magic_args(C, W, H), alpha, beta)
    return dx

"""Pool forward, fast path: 1-d and 2-d windows of at most MAX_TAPS taps with the
window geometry (size, stride, leading padding, dilation) and the mode compiled in.

A thread computes RPT vertically neighbouring outputs (ph, ph + 1, ...): their windows
share rows (3x3/2: 4 outputs read 9 rows, not 12), and a thread keeps that many more
bytes in flight. Its index is split by multiplying high with magic numbers (2
divisions for NCHW, 3 for NHWC; _stencil.magic) and every offset is 32-bit (usable()
checks the sizes), so a load's address is one wide multiply-add. The source is
generated: each row's and column's offset and validity (one unsigned test) are
computed once, then every tap loads from a clamped valid address (no branch around a
load: all are in flight together) and is masked after (runtime/device_code/stencil.py). Max skips
NaNs with fmax and finds them with one unordered test over the window; the rare
window holding a NaN decides between NaN and the largest number afterwards.

Measured on the H200 (fp32, batch 32, NCHW), against
the general kernel in pool.py and PyTorch/cuDNN in the same run:
- max 3x3/2 on 64x112x112: 190 -> 49 us (72% of copy bandwidth; PyTorch 104 us);
- avg 3x3/2: 200 -> 45 us (78%; PyTorch 91 us);
- max 2x2/2 on 256x56x56: 205 -> 39 us (90%; PyTorch 81 us).
A/B: 1 output a thread 83-89 us on the 3x3/2 max, 2: 67, 3: 64, 4: 58, 6:
65, 8: 59; blocks of 128 beat 256 and 512 by 1-8%. one unsigned 32-bit test a
tap row and column (was two signed 64-bit ones) took the 3x3/2 rows from 58/57 to
52/51 us, the multiply-high split (was two 32-bit divisions, ~20 instructions and a
zero test each) to 49/45 us. Loading
each row's three stride-2 taps as one 8-byte pair plus a warp shuffle (a warp touches
2 cache lines, not up to 9) was correct and 3-10% slower: not L1-bound either.
Traffic (3x3/2, float32): x read once from DRAM (the rows shared between threads
come from L2, the columns shared between neighbouring windows from L1), y written
once. Kernels are built per (dtype, layout, geometry, mode, rows a thread) on first
use; ResNet's 3x3/2 and 2x2/2 windows in float32 are registered at import (the PTX and
spill tests compile them; the float16/float64 forms ran on the H200).
"""
import functools
import math

from numba import cuda, float32, float64
from numba.cuda import libdevice

from ..runtime.simulator import SIMULATOR
from ..runtime.device_code import stencil as _stencil
from ..runtime.device_code.intrinsics import array_type, narrow, widen
from ..runtime.launch.kernel import Kernel
from ..runtime.launch.codegen import compile_source

MAX_TAPS = 64
BLOCK = 32 if SIMULATOR else 128


def usable(nd, K, x_size, y_size):
    """The fast path takes 1-d/2-d windows of <= MAX_TAPS taps, 32-bit offsets (and
    indices < 2**31, as the magic-number divisions need)."""
    return nd <= 2 and math.prod(K) <= MAX_TAPS and max(x_size, 2 * y_size) < 2 ** 32


RPT = 4         # outputs a thread at most: vertical neighbours share rows of taps
MAX_LOADS = 40  # taps a thread loads at most (registers)


def rows_per_thread(KH, KW, SH, DH, PH):
    return _stencil.rows_per_thread(KH, KW, SH, DH, PH, RPT, MAX_LOADS)


def _reduce(taps, mode, divisor=0):
    """Source lines: v = the window value over taps [(row j, column s)]; the averages
    divide by divisor where it is not 0, else by the window's count."""
    if mode == 0:
        # outside taps become -inf; fmax skips NaNs, one unordered test per pair finds
        # them; `seen` (a number among the taps) is needed only when NaNs are skipped
        body = [f"w{j}_{s} = v{j}_{s} if in{j} & jn{s} else NEG" for j, s in taps]
        body += ["mx = NEG"] + [f"mx = FMAX(mx, w{j}_{s})" for j, s in taps]
        body += ["nan = " + " | ".join(f"(w{j}_{s} != w{j}_{s})" for j, s in taps), "v = mx",
                 "if nan:",
                 "    seen = " + " | ".join(f"(w{j}_{s} == w{j}_{s}) & in{j} & jn{s}"
                                            for j, s in taps),
                 "    v = NAN if propagate != 0 or not seen else mx"]
        return body
    total = ["sm = ZERO"] + [f"sm += v{j}_{s} if in{j} & jn{s} else ZERO" for j, s in taps]
    if divisor:
        return total + [f"v = sm / CT({divisor})"]
    rows, cols = sorted({j for j, _ in taps}), sorted({s for _, s in taps})
    if mode == 2:
        nr = " + ".join(f"(1 if in{j} else 0)" for j in rows)
        nc = " + ".join(f"(1 if jn{s} else 0)" for s in cols)
    else:  # taps inside the padded extent [-pad_pre, size + pad_post)
        nr = " + ".join(f"(1 if ih{j} < EH else 0)" for j in rows)
        nc = " + ".join(f"(1 if iw{s} < EW else 0)" for s in cols)
    return total + [f"cnt = ({nr}) * ({nc})", "v = sm / CT(cnt) if cnt > 0 else ZERO"]


def source(last, KH, KW, SH, SW, QH, QW, DH, DW, mode, rpt=1, divisor=0):
    """Kernel source for one geometry; mode 0 max, 1 avg (padding counted), 2 avg
    excluding padding (nbdnn._vocab.POOL_MODES); rpt outputs a thread (ph, ph + 1, ...);
    divisor: the averages' (0: each window's count)."""
    ind = "        "
    offs = _stencil.row_offsets(KH, SH, DH, rpt)
    body = _stencil.split_lines(last, rpt) + [
        f"h0 = I(ph) * {SH} - {QH}", f"w0 = I(pw) * {SW} - {QW}"] + \
        _stencil.load_lines(offs, KW, DW)
    for o in range(rpt):
        taps = [(offs.index(o * SH + r * DH), s) for r in range(KH) for s in range(KW)]
        body += [f"if ph + {o} < PH:"] + ["    " + b for b in _reduce(taps, mode, divisor) + [
            "r = alpha * v", f"yi = U(U32(yb + {o} * ys))", "if beta != ZERO:",
            "    r += beta * widen(y[yi])", "y[yi] = narrow(r, y)"]]
    return ("def pool_fwd_fast(x, y, H, W, C, PH, PW, PP, EH, EW, total, m_C, s_C, m_PW, s_PW, "
            "m_PP, s_PP, propagate, alpha, beta):\n"
            "    i = U(cuda.blockIdx.x) * U(cuda.blockDim.x) + U(cuda.threadIdx.x)\n"
            "    if i < U(total):\n" + "".join(ind + line + "\n" for line in body))


def _fmax_simulated(a, b):
    """fmaxf's semantics (the number when one operand is NaN)."""
    return b if a != a else a if b != b else max(a, b)


_INT = "int64, " * 16


@functools.lru_cache(maxsize=None)
def kernel(dtype, last, geometry, mode, rpt, divisor=0):
    """(Kernel, signature) of pool_fwd_fast for geometry (KH, KW, SH, SW, QH, QW, DH,
    DW) and the averages' divisor (0: each window's count); built once per key."""
    ct_name = "float64" if dtype == "float64" else "float32"
    CT = float64 if ct_name == "float64" else float32
    fmax = libdevice.fmax if ct_name == "float64" else libdevice.fmaxf
    ns = {"cuda": cuda, "CT": CT, "FMAX": _fmax_simulated if SIMULATOR else fmax,
          "ZERO": CT(0), "NEG": CT(-math.inf), "NAN": CT(math.nan),
          "I": _stencil.I64, "U": _stencil.U, "U32": _stencil.U32,
          "W32": _stencil.W32, "widen": widen, "narrow": narrow}
    compile_source("pool_fwd_fast", source(bool(last), *geometry, mode, rpt, divisor), ns,
                   about={
        "config": f"{dtype}, {'channels last' if last else 'channels first'}, {mode}, "
                  f"window geometry {geometry}, {rpt} outputs a thread, divisor {divisor}",
        "why": "the window geometry compiled in (module docstring): rows shared between "
               "a thread's outputs"})
    a = array_type(dtype)
    sig = f"void({a}[::1], {a}[::1], {_INT}{ct_name}, {ct_name})"
    return Kernel(ns["pool_fwd_fast"], [sig]), sig


def ptx_examples():
    """One kernel per code path of the generator (tests/test_ptx.py builds these before
    compiling the registry): every dtype, layout and mode, a 3x3/2 window with padding 1
    at 2 rows a thread and a 2x2/2 one at 1."""
    from ..._vocab import FLOAT_DTYPES, POOL_MODES
    for dtype in FLOAT_DTYPES:
        for last in (0, 1):
            for mode in POOL_MODES:
                kernel(dtype, last, (3, 3, 2, 2, 1, 1, 1, 1), mode, 2)
    kernel("float32", 0, (2, 2, 2, 2, 0, 0, 1, 1), "max", 1)
    for mode in POOL_MODES:  # (bfloat16 differs from float32 only in its loads and stores)
        kernel("bfloat16", 1, (3, 3, 2, 2, 1, 1, 1, 1), mode, 2)


def launch(x, y, dtype, last, geometry, mode, H, W, C, PH, PW, EH, EW, propagate, alpha,
           beta, stream, divisor=0):
    rpt = rows_per_thread(geometry[0], geometry[1], geometry[2], geometry[6], PH)
    PP = -(-PH // rpt)
    total = math.prod(int(s) for s in y.shape) // PH * PP  # threads
    k, sig = kernel(dtype, last, geometry, mode, rpt, divisor if mode else 0)
    k.launch(sig, -(-total // BLOCK), BLOCK, stream, x, y, H, W, C, PH, PW, PP, EH, EW, total,
             *_stencil.magic_args(C, PW, PP), propagate, alpha, beta)


for _g in ((3, 3, 2, 2, 1, 1, 1, 1), (2, 2, 2, 2, 0, 0, 1, 1)):  # float32: CI's PTX time
    for _mode in (0, 1):
        kernel("float32", False, _g, _mode, rows_per_thread(*_g[:3], _g[6], 56))

"""Depthwise forward, variant 3 `dw_rows`: channels-first layers, one thread per rpt
vertically neighbouring outputs of a plane, consecutive lanes on consecutive output
columns.

Why a third variant: variant 2 (`dw_tile`, a 4x4 block of outputs a thread) puts 4
threads on a 7x7 plane and 16 on a 14x14 one. Nsight Compute on 1024 channels at 7x7:
1357 instructions a warp in one dependent chain, 5 warps a
scheduler (92 registers), 1.3 waves, DRAM 7% busy: latency-bound at ~1x cuDNN, and a
warp's lanes spread over 8 planes. Here a thread loads the (rpt - 1) * SH + R rows of
S taps its outputs' windows share (3x3/1, rpt 8: 30 loads for 8 outputs) and keeps
~50-100 registers, so 8-10 warps a scheduler hide the loads' latency. Every index is
32-bit; the split divides by multiplying high with magic numbers computed on the host
(_stencil.magic: ~3 instructions where a 32-bit division takes ~20 and a zero test),
and one unsigned compare tests a tap row or column: with the flip compiled in, these
took the kernel from 7.8 M to 5.0 M instructions at 1024@7.

rpt: up to RPT rows (MAX_LOADS taps a thread), fewer while the grid would not fill
the GPU once (WAVE threads an SM). Measured (fp32, batch 32, GPU time): 3x3/1
on 112x112 to 28x28 2.6-3.0x cuDNN (rpt 7-8, 2.0-2.6 TB/s), 14x14 1.9x, 7x7 1.65x
(rpt 4: 159% against 139% at rpt 7); 3x3/2 1.1-1.55x; 5x5/1 at 14x14 2.2x.

The kernel is generated per (dtype, window R x S, stride, dilation, flip, rpt), with
the padding and sizes at run time, on first use (runtime/device_code/stencil.py: index
split, clamped loads); float32 3x3/1 at rpt 4 is registered at import (PTX test). Traffic: x once
from DRAM (rows shared between threads from L1/L2), y written once; 2 * R * S flops an
output.
"""
import functools

from ..runtime.simulator import SIMULATOR
from ..runtime.device_code import stencil as _stencil
from ..runtime.device_code.intrinsics import array_type
from ..runtime.launch.kernel import Kernel
from ..runtime.launch.codegen import compile_source
from .source_names import namespace

BLOCK = 32 if SIMULATOR else 128
RPT = 8          # outputs a thread at most (a knob: 1 forces one row a thread)
MAX_LOADS = 64   # taps a thread loads at most (registers)
WAVE = 16 if SIMULATOR else 2048  # threads an SM holds (rpt_for)
_MAGIC = ("PW", "PP", "K", "M")  # the divisors of the index split


def usable(g, x_size, y_size):
    """Channels-first 1-d/2-d depthwise (C/g == 1) layers, windows of at most 64 taps,
    sizes < 2**31 (32-bit offsets, magic-number divisions)."""
    N, C, K, G, D, H, W, T, R, S = g[:10]
    return C == G and g.planar and not g.last and R * S <= 64 and \
        max(x_size, y_size) < 2 ** 31


def source(R, S, SH, SW, DH, DW, flip, rpt):
    """Kernel source: y[n, k, ph + o, pw] for o < rpt from one load of the rows their
    windows share; flip: the filter flipped (mode "convolution"); plain calls (alpha
    1, beta 0, no activation) add the bias inline."""
    offs = _stencil.row_offsets(R, SH, DH, rpt)
    div = _stencil.DIV
    body = _stencil.split_lines(False, rpt) + [
        f"n = {div.format(a='p', b='K')}", "k = U32(p - n * K)",
        "if K != C:",  # channel multiplier M = K / C: input channel k // M
        f"    base = U32((n * C + {div.format(a='k', b='M')}) * H * W)",
        f"h0 = I(ph) * {SH} - qh", f"w0 = I(pw) * {SW} - qw"]
    body += _stencil.load_lines(offs, S, DW)
    body += [f"v{j}_{s} = v{j}_{s} if in{j} & jn{s} else ZERO" for j in range(len(offs))
             for s in range(S)]
    body += [f"wb = U(U32(k * {R * S}))"]
    body += [f"wt{r}_{s} = widen(w[wb + U({R * S - 1 - r * S - s if flip else r * S + s})])"
             for r in range(R) for s in range(S)]
    body += ["bb = widen(bias[k]) if has_bias else ZERO",
             "plain = alpha == CT(1) and beta == ZERO and act < 0"]
    for o in range(rpt):  # (backward data, exact: a non-finite sum through window_sum)
        taps = [(offs.index(o * SH + r * DH), r, s) for r in range(R) for s in range(S)]
        body += [f"if ph + {o} < PH:", "    acc = ZERO"]
        body += [f"    acc += v{j}_{s} * wt{r}_{s}" for j, r, s in taps]
        body += ["    if exact != 0 and not abs(acc) < INF:",
                 f"        acc = window_sum(x, w, base, wb, h0 + {o * SH}, w0, H, W, {R}, {S}, "
                 f"{DH}, {DW}, xs_h, xs_w, {int(flip)})"]
        body += [f"    yi = U(U32(yb + {o} * ys))", "    if plain:", "        y[yi] = narrow(acc + bb, y)",
                 "    else:", "        epilogue(acc, y, z, bias, yi, k, has_bias, has_z, act, "
                 "coef, alpha, beta)"]
    magic = "".join(f"m_{d}, s_{d}, " for d in _MAGIC)
    return (f"def dw_rows(x, w, y, bias, z, H, W, C, K, PH, PW, PP, qh, qw, total, {magic}"
            "has_bias, has_z, act, coef, alpha, beta, exact):\n"
            "    i = U(cuda.blockIdx.x) * U(cuda.blockDim.x) + U(cuda.threadIdx.x)\n"
            "    if i < U(total):\n" + "".join(f"        {line}\n" for line in body))


_INTS = "int64, " * (10 + 2 * len(_MAGIC))


@functools.lru_cache(maxsize=None)
def kernel(dtype, ct_name, geometry, rpt):
    """(Kernel, signature) of dw_rows for geometry (R, S, SH, SW, DH, DW, flip), built in the
    generated convolution kernels' names for compute type ct_name (source_names.py)."""
    ns = dict(namespace(ct_name))
    R, S, SH, SW, DH, DW, flip = geometry
    compile_source("dw_rows", source(*geometry, rpt), ns, about={
        "config": f"{dtype}, window {R}x{S}, stride {SH}x{SW}, dilation {DH}x{DW}, "
                  f"flip {flip}, {rpt} outputs a thread",
        "traffic": f"a thread loads {((rpt - 1) * SH + (R - 1) * DH + 1) * S} taps for "
                   f"{rpt} outputs ({2 * R * S * rpt} flops)",
        "why": "variant 3 (module docstring): rows shared between a thread's outputs"})
    a = f"{array_type(dtype)}[::1]"
    sig = f"void({a}, {a}, {a}, {a}, {a}, {_INTS}int64, int64, int64, {ct_name}, {ct_name}, " \
          f"{ct_name}, int64)"
    return Kernel(ns["dw_rows"], [sig]), sig


def ptx_examples():
    """Kernels of every code path for tests/test_ptx.py: each dtype at 3x3/1 (4 rows a
    thread), 3x3/2 and flipped 5x5/1 dilated 2 (2 rows)."""
    from ..._vocab import FLOAT_DTYPES
    for dtype in FLOAT_DTYPES:
        ct = "float64" if dtype == "float64" else "float32"
        kernel(dtype, ct, (3, 3, 1, 1, 1, 1, 0), 4)
        kernel(dtype, ct, (3, 3, 2, 2, 1, 1, 0), 2)
        kernel(dtype, ct, (5, 5, 1, 1, 2, 2, 1), 2)
    kernel("bfloat16", "float32", (3, 3, 1, 1, 1, 1, 0), 4)  # (float32's, other loads)


def rpt_for(g, sm_count):
    """Outputs a thread for geometry g: as many as RPT and MAX_LOADS allow (rows of taps
    shared, more bytes in flight a thread), fewer while the grid would not fill the
    GPU once (1024 channels at 7x7: 4 rows a thread, 158% of cuDNN, against 139% at 7)."""
    N, K, PH, PW = g.N, g.K, g.PH, g.PW
    rpt = _stencil.rows_per_thread(g.R, g.S, g.sh, g.dh, PH, RPT, MAX_LOADS)
    while rpt > 1 and N * K * -(-PH // rpt) * PW < sm_count * WAVE:
        rpt = _stencil.rows_per_thread(g.R, g.S, g.sh, g.dh, PH, rpt - 1, MAX_LOADS)
    return rpt


def launch(x, y, w, bias, z, g, tail, dtype, ct_name, stream, sm_count, exact=0):
    """y = epilogue(depthwise conv of x); g the conv geometry, tail (has_bias, has_z,
    act, coef, alpha, beta); exact: a non-finite output is summed again over the taps
    inside x alone (backward data's rule; source_names.window_sum)."""
    N, C, K, G, D, H, W, T, R, S, PD, PH, PW = g[:13]
    sh, sw, qh, qw, dh, dw, flip = g.sh, g.sw, g.qh, g.qw, g.dh, g.dw, g.flip
    rpt = rpt_for(g, sm_count)
    PP = -(-PH // rpt)
    total = N * K * PP * PW
    if total == 0:
        return
    k, sig = kernel(dtype, ct_name, (R, S, sh, sw, dh, dw, flip), rpt)
    k.launch(sig, -(-total // BLOCK), BLOCK, stream, x, w, y, bias, z, H, W, C, K, PH, PW,
             PP, qh, qw, total, *_stencil.magic_args(PW, PP, K, K // C), *tail, exact)

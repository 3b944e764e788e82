"""Generated-source pieces shared by the stencil kernels: pool forward's fast path
(pool/fast.py) and depthwise convolution's row kernel (conv/depthwise_rows.py).

A thread owns rpt vertically neighbouring outputs (ph, ph + 1, ...) of one plane, so
their windows share rows of taps (3x3/1: 4 outputs read 6 rows, not 12). Its index is
split by multiplying high with magic numbers the host computes (magic()) and every
offset is 32-bit (the callers check sizes), so a load's address is one wide
multiply-add. Each row's and column's
offset and validity are computed once; every tap then loads from a clamped, valid
address (no branch around a load: a thread's loads are all in flight together) and is
masked after.
"""
import functools

from numba import cuda, int64, uint32, uint64

from ..simulator import SIMULATOR

# DIV's casts (the simulator's Python ints need none)
U32, U = (int, int) if SIMULATOR else (uint32, uint64)
I64 = int if SIMULATOR else int64  # signed 64-bit, for coordinates that may be negative
# {a} // {b} as a multiply-high by the divisor's magic number (kernel arguments m_{b},
# s_{b} from magic(); {a} < 2**31): 3 instructions where a 32-bit division takes ~20
# and a zero test
DIV = "U32((U(U32({a})) * U(U32(m_{b}))) >> U(s_{b}))"


@cuda.jit(device=True)
def div(a, m, s):
    """DIV as a device function, for kernels that are not generated source."""
    return U32((U(U32(a)) * U(U32(m))) >> U(s))
# a value's low 32 bits, unsigned (the simulator's stand-in wraps as uint32 does)
W32 = (lambda v: int(v) & 0xFFFFFFFF) if SIMULATOR else uint32


@functools.lru_cache(maxsize=4096)  # every eager pool and depthwise call asks
def rows_per_thread(KH, KW, SH, DH, PH, rpt_max, max_loads):
    """Outputs a thread computes: at most rpt_max, fewer when their windows' loads would
    pass max_loads (registers) or the map has fewer rows; balanced so that the last
    group of rows is not mostly empty (PH = 14, rpt_max = 8: 7 and 7, not 8 and 6)."""
    rpt = max(1, min(rpt_max, PH))
    while rpt > 1 and len({o * SH + r * DH for o in range(rpt) for r in range(KH)}) * KW > \
            max_loads:
        rpt -= 1
    return -(-PH // -(-PH // rpt))


def magic(d):
    """(m, s) with n // d == (n * m) >> s for 0 <= n < 2**31, m < 2**32 (Granlund and
    Montgomery's round-up method: m = ceil(2**s / d), s = 31 + ceil(log2 d); the
    error n * (m * d - 2**s) / (d * 2**s) < 1 / d never crosses an integer)."""
    s = 31 + (d - 1).bit_length()
    return -(-(1 << s) // d), s


@functools.lru_cache(maxsize=256)
def magic_args(*divisors):
    """The kernel arguments m_d, s_d of each divisor d, in order."""
    return tuple(v for d in divisors for v in magic(d))


def split_lines(last, rpt):
    """Source lines: (n or plane p, ph, pw[, c]) of thread i; base: x's offset of the
    window's plane (channels first) or channel (last); yb: y's offset of the first
    output, ys: the stride between the outputs of a thread. Needs H, W, C, PH, PW and
    PP (groups of rpt rows, ceil(PH / rpt)), and the magic numbers of PW, PP (and C,
    channels last)."""
    if last:
        return [f"q = {DIV.format(a='i', b='C')}", "c = U32(i - q * C)",
                f"r = {DIV.format(a='q', b='PW')}", "pw = U32(q - r * PW)",
                f"n = {DIV.format(a='r', b='PP')}", f"ph = U32((r - n * PP) * {rpt})",
                "base = U32(n * H * W * C + c)", "xs_w, xs_h = U32(C), U32(W * C)",
                "yb, ys = U32(((n * PH + ph) * PW + pw) * C + c), U32(PW * C)"]
    return [f"q = {DIV.format(a='i', b='PW')}", "pw = U32(i - q * PW)",
            f"p = {DIV.format(a='q', b='PP')}", f"ph = U32((q - p * PP) * {rpt})",
            "base = U32(p * H * W)", "xs_w, xs_h = U32(1), U32(W)",
            "yb, ys = U32((p * PH + ph) * PW + pw), U32(PW)"]


def row_offsets(KH, SH, DH, rpt):
    """The window rows (offsets from the first output's top row) rpt outputs read."""
    return sorted({o * SH + r * DH for o in range(rpt) for r in range(KH)})


def load_lines(offs, KW, DW):
    """Source lines loading v{j}_{s}, row offs[j] and column s of the window from h0,
    w0 (in{j} and jn{s} say whether the tap lies inside x; the value is then loaded
    from a clamped address, to be masked by the caller)."""
    body = []  # (one unsigned 32-bit test a row or column: W32 wraps negatives)
    for j, off in enumerate(offs):
        body += [f"ih{j} = h0 + {off}", f"hr{j} = W32(ih{j})", f"in{j} = hr{j} < U32(H)",
                 f"ro{j} = U32(base + (hr{j} if in{j} else U32(0)) * xs_h)"]
    for s in range(KW):
        body += [f"iw{s} = w0 + {s * DW}", f"wc{s} = W32(iw{s})", f"jn{s} = wc{s} < U32(W)",
                 f"co{s} = U32((wc{s} if jn{s} else U32(0)) * xs_w)"]
    return body + [f"v{j}_{s} = widen(x[U(U32(ro{j} + co{s}))])" for j in range(len(offs))
                   for s in range(KW)]

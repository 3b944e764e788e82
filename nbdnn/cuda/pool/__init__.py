"""Pooling on the GPU for every geometry (1-3 d, stride, per-side padding, dilation,
ceil mode, NCHW and NHWC); the formulas are in nbdnn/cpu/pool.py.

- forward, 1-d and 2-d windows of up to 64 taps: pool/fast.py (the geometry compiled
  in, several output rows a thread, 32-bit offsets, multiply-high index split).
- forward, the rest (3-d, larger windows, 2**32 elements and more): a block BY output
  rows of one plane, BX threads along the contiguous axis (pw for NCHW, c for NHWC;
  consecutive threads write consecutive addresses), so the block's indices are divided
  once; a thread scans its window branch-free with unconditional clamped loads.
- indices (max pooling's return_indices): pool_argmax with its tap placed in the input
  plane (int64), one thread an output.
- backward, 1-d and 2-d windows of up to 64 taps: pool/fast_bwd.py (the geometry
  compiled in, as the forward's fast path).
- backward, the rest: one thread an input element gathers, over the window taps whose
  stride arithmetic lands on it, dy[p] / count (avg) or dy[p] when it is window p's
  first maximal element - no atomics, deterministic. Max finds each window's first
  maximal tap once first (pool_argmax: an int32 a window) and the gather compares taps
  with it: rescanning every window from every input it covers took 4.9 ms in
  ResNet-50's bf16 training step (its profile, 7.5% of it; a 3x3/2 window covers
  an input 2.25 times on average, each rescan 9 loads).
Every kernel here sees 3 spatial axes (1-d and 2-d get leading axes of size 1).
Traffic: forward reads x once from DRAM and writes y; backward reads dy ~k/s times a
tap axis and x (max) once a window, and writes dx.

Verified on the H200 (crosscheck, PyTorch comparisons, determinism).
The general forward kernel was instruction-bound (Nsight Compute: ~645
instructions an output at 25% occupancy, DRAM 7% busy; 190-205 us on ResNet's pools,
0.39-0.54x PyTorch); _pool_fast runs them in 39-49 us, 72-90% of copy bandwidth
(perf/RESULTS.md).
"""
import functools
import math
from typing import NamedTuple

from numba import cuda, float32, float64

from ..runtime import variants
from ..runtime.memory.arrays import dtype_name, empty, size
from ..runtime.launch.grid import MAX_BLOCKS, U, launch, landing, split, strides
from ..runtime.simulator import SIMULATOR
from ..runtime.variants import Variant
from . import fast as _pool_fast
from . import fast_bwd as _pool_fast_bwd
from .geometry import PoolGeometry
from ..runtime.device_code.intrinsics import array_type, narrow, widen
from ..runtime.launch.kernel import Kernel
from ..._vocab import BF16_DTYPES as DTYPES
from ..._vocab import POOL_MODES as MODES

BX, BY = (8, 4) if SIMULATOR else (32, 8)  # forward block: contiguous axis x rows


@cuda.jit(device=True)
def _count(a, k, d, lo, hi):
    """Taps j < k with lo <= a + j*d < hi."""
    n = 0
    for j in range(k):
        if lo <= a + j * d < hi:
            n += 1
    return n


@cuda.jit(device=True)
def _window_count(ad, ah, aw, KD, KH, KW, dd, dh, dw, D, H, W, qd, qh, qw, ed, eh, ew,
                  exclude_pad):
    """Positions of a window inside the input (exclude_pad) or the padded input."""
    if exclude_pad:
        return _count(ad, KD, dd, 0, D) * _count(ah, KH, dh, 0, H) * _count(aw, KW, dw, 0, W)
    return (_count(ad, KD, dd, -qd, ed) * _count(ah, KH, dh, -qh, eh) *
            _count(aw, KW, dw, -qw, ew))


def _kernels(CT):
    ZERO, NEG = CT(0), CT(-math.inf)

    @cuda.jit(device=True)
    def window(x, base, ad, ah, aw, D, H, W, KD, KH, KW, dd, dh, dw, xd, xh, xw, mode,
               propagate):
        """(sum or max, first maximal tap or -1) of one window; ad/ah/aw its corner.
        Every tap loads (outside taps read a clamped, valid address and are then
        ignored): with a fixed window the unrolled loads are all in flight at once."""
        acc = NEG if mode == 0 else ZERO
        best, tap, nan_tap = -1, 0, -1
        for t in range(KD):
            idd = ad + t * dd
            okd = 0 <= idd < D
            od = (idd if okd else 0) * xd
            for r in range(KH):
                ih = ah + r * dh
                okh = okd and 0 <= ih < H
                oh = od + (ih if 0 <= ih < H else 0) * xh
                for s in range(KW):
                    iw = aw + s * dw
                    okw = 0 <= iw < W
                    v = widen(x[base + oh + (iw if okw else 0) * xw])
                    if okh and okw:
                        if mode != 0:
                            acc += v
                        elif v != v:
                            if nan_tap < 0:
                                nan_tap = tap
                        elif best < 0 or v > acc:
                            acc, best = v, tap
                    tap += 1
        if mode == 0 and nan_tap >= 0 and (propagate != 0 or best < 0):
            return CT(math.nan), nan_tap
        return acc, best

    @cuda.jit(device=True)
    def window_fwd(x, base, ad, ah, aw, D, H, W, KD, KH, KW, dd, dh, dw, xd, xh, xw, mode,
                   propagate):
        """The forward's window value (max, or sum for the averages), branch-free: every
        tap loads from a clamped valid address and is masked after, max tracks whether
        a NaN or a number was seen instead of the first maximal tap (window() above,
        which the backward needs)."""
        mx, sm, nan, seen = NEG, ZERO, False, False
        for t in range(KD):
            idd = ad + t * dd
            okd = (idd >= 0) & (idd < D)
            od = (idd if okd else 0) * xd
            for r in range(KH):
                ih = ah + r * dh
                inh = (ih >= 0) & (ih < H)
                okh = okd & inh
                oh = od + (ih if inh else 0) * xh
                for s in range(KW):
                    iw = aw + s * dw
                    okw = (iw >= 0) & (iw < W)
                    v = widen(x[U(base + oh + (iw if okw else 0) * xw)])
                    ok = okh & okw
                    num = ok & (v == v)
                    nan |= ok & (v != v)
                    seen |= num
                    mx = v if num & (v > mx) else mx
                    sm += v if ok else ZERO
        if mode != 0:
            return sm
        if nan and (propagate != 0 or not seen):
            return CT(math.nan)
        return mx

    def pool_fwd(x, y, N, C, D, H, W, KD, KH, KW, PD, PH, PW, sd, sh, sw, qd, qh, qw,
                 ed, eh, ew, dd, dh, dw, last, mode, propagate, div, alpha, beta):
        # a block BY output rows (NCHW: ph; NHWC: pw) of one plane (NCHW: (n, c, pd);
        # NHWC: (n, pd, ph)), BX threads along the contiguous axis (pw; c) looping over
        # it: the block's indices are divided once, not per output
        tx, ty = cuda.threadIdx.x % BX, cuda.threadIdx.x // BX
        xn, xc, xd, xh, xw = strides(C, D, H, W, last)
        bands = -(-(PW if last else PH) // BY)
        planes = N * PD * (PH if last else C)
        b = cuda.blockIdx.x
        while b < planes * bands:
            p, band = b // bands, b % bands
            row = band * BY + ty
            if last:
                ph, q = p % PH, p // PH
                pd, n = q % PD, q // PD
                pw, c0, cols, cstep = row, tx, C, BX
                ok = pw < PW
            else:
                pd, nc = p % PD, p // PD
                n, c = nc // C, nc % C
                ph, c0, cols, cstep = row, tx, PW, BX
                ok = ph < PH
            ad, ah = pd * sd - qd, ph * sh - qh
            j = c0
            while ok and j < cols:
                if last:
                    c, pw = j, row
                else:
                    pw = j
                aw = pw * sw - qw
                v = window_fwd(x, n * xn + c * xc, ad, ah, aw, D, H, W, KD, KH, KW, dd, dh,
                               dw, xd, xh, xw, mode, propagate)
                if mode != 0:
                    cnt = div if div != 0 else _window_count(
                        ad, ah, aw, KD, KH, KW, dd, dh, dw, D, H, W, qd, qh, qw, ed, eh, ew,
                        mode == 2)
                    v = v / CT(cnt) if cnt != 0 else ZERO
                i = ((((n * PD + pd) * PH + ph) * PW + pw) * C + c if last else
                     (((n * C + c) * PD + pd) * PH + ph) * PW + pw)
                r = alpha * v
                if beta != ZERO:
                    r += beta * widen(y[U(i)])
                y[U(i)] = narrow(r, y)
                j += cstep
            b += cuda.gridDim.x

    def pool_argmax(x, idx, N, C, D, H, W, KD, KH, KW, PD, PH, PW, sd, sh, sw, qd, qh, qw,
                    ed, eh, ew, dd, dh, dw, last, mode, propagate, div, flat):
        # idx[o] = the first maximal tap of output o's window (-1: none), y's order; flat:
        # that element's flat index d H W + h W + w in its (n, c) plane instead (pool_indices)
        xn, xc, xd, xh, xw = strides(C, D, H, W, last)
        total = N * C * PD * PH * PW
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        while i < total:
            n, c, pd, ph, pw = split(i, C, PD, PH, PW, last)
            ad, ah, aw = pd * sd - qd, ph * sh - qh, pw * sw - qw
            _, best = window(x, n * xn + c * xc, ad, ah, aw, D, H, W, KD, KH, KW, dd, dh, dw,
                             xd, xh, xw, 0, propagate)
            if flat != 0 and best >= 0:
                t, rs = best // (KH * KW), best % (KH * KW)
                best = ((ad + t * dd) * H + ah + rs // KW * dh) * W + aw + rs % KW * dw
            idx[i] = best
            i += cuda.gridDim.x * cuda.blockDim.x

    def pool_bwd(dy, idx, dx, N, C, D, H, W, KD, KH, KW, PD, PH, PW, sd, sh, sw, qd, qh,
                 qw, ed, eh, ew, dd, dh, dw, last, mode, propagate, div, alpha, beta):
        # one input element a thread gathers over the windows whose taps land on it: max
        # (mode 0) takes dy where pool_argmax's idx names the tap, the averages dy / count
        yn, yc, yd, yh, yw = strides(C, PD, PH, PW, last)
        total = N * C * D * H * W
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        while i < total:
            n, c, idd, ih, iw = split(i, C, D, H, W, last)
            acc = ZERO
            for t in range(KD):
                pd = landing(idd, qd, t, dd, sd, PD)
                for r in range(KH if pd >= 0 else 0):
                    ph = landing(ih, qh, r, dh, sh, PH)
                    for s in range(KW if ph >= 0 else 0):
                        pw = landing(iw, qw, s, dw, sw, PW)
                        if pw >= 0:
                            o = n * yn + c * yc + pd * yd + ph * yh + pw * yw
                            if mode != 0:
                                acc += widen(dy[o]) / CT(div if div != 0 else _window_count(
                                    pd * sd - qd, ph * sh - qh, pw * sw - qw, KD, KH, KW, dd,
                                    dh, dw, D, H, W, qd, qh, qw, ed, eh, ew, mode == 2))
                            elif idx[o] == (t * KH + r) * KW + s:
                                acc += widen(dy[o])
            v = alpha * acc
            if beta != ZERO:
                v += beta * widen(dx[i])
            dx[i] = narrow(v, dx)
            i += cuda.gridDim.x * cuda.blockDim.x

    return {"fwd": pool_fwd, "bwd": pool_bwd, "argmax": pool_argmax, "indices": pool_argmax}


_GEOM = ", ".join(["int64"] * 27)


def _build():
    table = {}
    for ct_name, CT in (("float32", float32), ("float64", float64)):
        kernels = _kernels(CT)
        for t in (d for d in DTYPES if (d == "float64") == (ct_name == "float64")):
            a = f"{array_type(t)}[::1]"
            sigs = {"fwd": f"void({a}, {a}, {_GEOM}, {ct_name}, {ct_name})",
                    "bwd": f"void({a}, int32[::1], {a}, {_GEOM}, {ct_name}, {ct_name})",
                    "argmax": f"void({a}, int32[::1], {_GEOM}, int64)",
                    "indices": f"void({a}, int64[::1], {_GEOM}, int64)"}
            for name, sig in sigs.items():
                table[name, t] = (Kernel(kernels[name], [sig]), sig)
    return table


_KERNELS = _build()


@functools.lru_cache(maxsize=1024)
def _geometry(x_shape, K, stride, pads, dilation, last, P, mode, propagate, divisor=0):
    """The 27 ints the kernels take (3 spatial axes, leading ones of size 1; the last the
    averages' divisor, 0 for each window's count); remembered per call geometry
    (validated tuples: every eager call asks)."""
    nd = len(K)
    N, C = x_shape[0], (x_shape[-1] if last else x_shape[1])
    S = tuple(x_shape[1:-1]) if last else tuple(x_shape[2:])
    lead = 3 - nd
    S3, K3, P3 = (1,) * lead + S, (1,) * lead + K, (1,) * lead + tuple(P)
    st, dl = (1,) * lead + tuple(stride), (1,) * lead + tuple(dilation)
    pre = (0,) * lead + tuple(a for a, _ in pads)
    end = S3[:lead] + tuple(s + b for s, (_, b) in zip(S, pads))
    return PoolGeometry(*(N, C), *S3, *K3, *P3, *st, *pre, *end, *dl, int(last),
                        MODES.index(mode), int(propagate), int(divisor))


class Call(NamedTuple):
    """One call as the variants take it: g the kernels' geometry; forward: x -> y;
    backward: dy, x -> dx."""
    x: object
    g: PoolGeometry
    alpha: float
    beta: float
    stream: object
    y: object = None
    dy: object = None
    dx: object = None

    @property
    def window(self):
        """The window's taps along its own axes (1, 2 or 3 of them)."""
        K = (self.g.KD, self.g.KH, self.g.KW)
        return K[3 - self.rank:]

    @property
    def rank(self):
        return len(self.x.shape) - 2


def _fast_forward(c):
    g = c.g
    _pool_fast.launch(c.x, c.y, dtype_name(c.x), g.last, g.window2d, g.mode, g.H, g.W, g.C,
                      g.PH, g.PW, g.eh, g.ew, g.propagate, c.alpha, c.beta, c.stream, g.div)


def _general_forward(c):
    g = c.g
    rows, planes = (g.PW, g.N * g.PD * g.PH) if g.last else (g.PH, g.N * g.PD * g.C)
    k, sig = _KERNELS["fwd", dtype_name(c.x)]
    k.launch(sig, min(planes * -(-rows // BY), MAX_BLOCKS), BX * BY, c.stream, c.x, c.y, *g,
             c.alpha, c.beta)


FORWARD = (  # in order of preference
    Variant("fast", lambda c: _pool_fast.usable(c.rank, c.window, size(c.x), size(c.y)),
            _fast_forward,
            "fast.py: 1-d and 2-d windows of up to 64 taps, the geometry compiled in"),
    Variant("general", lambda c: True, _general_forward,
            "a block BY output rows of one plane, every geometry"),
)


def _general_backward(c):
    g, shape = c.g, tuple(int(v) for v in c.dy.shape)
    max_ = g.mode == MODES.index("max") and size(c.dy)  # (the windows' maxima found once
    # each; no windows: no maxima)
    idx = empty(c.x, shape if max_ else (1,), "int32")
    if max_:
        launch(_KERNELS, "argmax", dtype_name(c.x), math.prod(shape), c.stream, c.x, idx, *g,
               0)
    launch(_KERNELS, "bwd", dtype_name(c.x), size(c.x), c.stream, c.dy, idx, c.dx, *g,
           c.alpha, c.beta)


BACKWARD = (  # in order of preference
    Variant("fast", lambda c: _pool_fast_bwd.usable(c.rank, c.window, size(c.x), size(c.dy)),
            lambda c: _pool_fast_bwd.backward(c.dy, c.x, c.dx, c.g, c.alpha, c.beta, c.stream,
                                              lambda n: empty(c.x, (n,), "int8")),
            "fast_bwd.py: 1-d and 2-d windows of up to 64 taps, the geometry compiled in"),
    Variant("general", lambda c: True, _general_backward,
            "a thread an input element gathers over the windows on it (max: each window's "
            "first maximum found once first)"),
)


def forced(name):
    """Inside (this thread): pooling runs the variant `name` (of FORWARD and BACKWARD), or
    raises NotSupportedError where its kernels cannot take a call (runtime/variants.py)."""
    return variants.forced("pool", name, variants.names(FORWARD, BACKWARD))


def pool_forward(x, K, stride, pads, dilation, mode, ceil_mode, propagate, last, P, *,
                 alpha, beta, out, stream, divisor=0):
    x_shape = tuple(int(s) for s in x.shape)
    y_shape = (x_shape[0],) + tuple(P) + (x_shape[-1],) if last else x_shape[:2] + tuple(P)
    y = out if out is not None else empty(x, y_shape, dtype_name(x))
    if math.prod(y_shape):
        c = Call(x, _geometry(x_shape, K, stride, pads, dilation, last, P, mode, propagate,
                              divisor), alpha, beta, stream, y=y)
        variants.choose("pool", "pool", FORWARD, c).run(c)
    return y


def pool_backward(dy, x, K, stride, pads, dilation, mode, ceil_mode, propagate, last, P, *,
                  alpha, beta, out, stream, divisor=0):
    x_shape = tuple(int(s) for s in x.shape)
    dx = out if out is not None else empty(x, x_shape, dtype_name(x))
    c = Call(x, _geometry(x_shape, K, stride, pads, dilation, last, P, mode, propagate,
                          divisor), alpha, beta, stream, dy=dy, dx=dx)
    if size(dy):
        variants.choose("pool", "pool_backward", BACKWARD, c).run(c)
    elif size(dx):  # (no windows: dx = beta dx, the general gather of no terms)
        _general_backward(c)
    return dx


def pool_indices(x, K, stride, pads, dilation, mode, ceil_mode, propagate, last, P, *, out,
                 stream):
    x_shape = tuple(int(s) for s in x.shape)
    y_shape = (x_shape[0],) + tuple(P) + (x_shape[-1],) if last else x_shape[:2] + tuple(P)
    idx = out if out is not None else empty(x, y_shape, "int64")
    if math.prod(y_shape):
        g = _geometry(x_shape, K, stride, pads, dilation, last, P, mode, propagate)
        launch(_KERNELS, "indices", dtype_name(x), math.prod(y_shape), stream, x, idx, *g, 1)
    return idx

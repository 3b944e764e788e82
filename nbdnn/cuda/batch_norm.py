"""Batch normalisation on the GPU; the formulas are in nbdnn/cpu/batch_norm.py.

x is addressed as (N, C, L): element (n, c, l) at (n*C + c)*L + l in the planes layout
(NCHW), (n*L + l)*C + c in the columns layout (NHWC; per_activation is columns with
C = an image's size, L = 1). Kernels (traffic per element, float32):
- statistics (_bn_sums.py): chunk partials then an in-order merge; reads x once (4 B).
- apply: a thread 4 consecutive elements, 16-byte loads and stores when the layout
  lets 4 elements share a channel (planes, L % 4 == 0) or take 4 consecutive channels
  (columns, C % 4 == 0) and the pointers are aligned; act(scale*(x-mean)*invstd + bias
  + z), blended. Reads x (and z, and y when beta != 0), writes y: 8 B.
  Training = statistics + apply (12 B against 8 B that must move: at most 67% of copy
  bandwidth); inference = apply alone.
- backward sums (_bn_sums.py): sums of dyh and dyh*xhat (dyh = dy*act'(pre), pre
  recomputed), chunk partials then in order: reads dy and x (8 B); dbias, dscale.
- backward dx: as apply, reads dy and x, writes dx (and dz): 12 B. Backward moves 20 B
  against 12 B that must: at most 60% of copy bandwidth.
Every sum runs in a fixed order (block trees, chunks merged in order, no atomics):
deterministic.
"""
import math

import numpy as np
from numba import cuda, float32, float64

from . import SIMULATOR
from . import activation as _act
from . import _bn_sums
from ._arrays import dtype_name, empty, ptr
from ._intrinsics import load4, store4, vector_alignment
from ._launch import Kernel
from .matmul import _act_source

BLOCK = 32 if SIMULATOR else 256
DTYPES = ("float16", "float32", "float64")


def _chains(nt):
    """act_fn(x, mode, coef) and its derivative act_grad over nbdnn's activation modes."""
    fns = _act._device_functions(nt)
    ns = {f"{p}{m}": fns[m][k] for m in _act.MODES for p, k in (("f_", 0), ("g_", 1))}
    for name, prefix in (("act_fn", "f_"), ("act_grad", "g_")):
        exec(compile(_act_source(_act.MODES, name, prefix), f"<nbdnn batch_norm {name}>",
                     "exec"), ns)
    return cuda.jit(device=True)(ns["act_fn"]), cuda.jit(device=True)(ns["act_grad"])


def _kernels(CT, nt):
    act_fn, act_grad = _chains(nt)
    ZERO, ONE = CT(0), CT(1)

    @cuda.jit(device=True)
    def pre(x, z, scale, bias, mean, inv, i, c, has_scale, has_bias, has_z):
        """(pre-activation, xhat) of element i (channel c)."""
        xhat = (CT(x[i]) - mean[c]) * inv
        v = xhat * (CT(scale[c]) if has_scale else ONE)
        if has_bias:
            v += CT(bias[c])
        if has_z:
            v += CT(z[i])
        return v, xhat

    @cuda.jit(device=True)
    def channel(e, C, L, columns):
        return e % C if columns else (e // L) % C

    @cuda.jit(device=True)
    def out_value(xv, zv, yv, c, scale, bias, mean, sv, eps, is_var, has_scale, has_bias,
                  act, coef, alpha, beta):
        """alpha * act(scale*(x - mean)*invstd + bias + z) + beta * y, channel c."""
        inv = ONE / math.sqrt(sv[c] + eps) if is_var else sv[c]
        v = (CT(xv) - mean[c]) * inv * (CT(scale[c]) if has_scale else ONE) + CT(zv)
        if has_bias:
            v += CT(bias[c])
        if act >= 0:
            v = act_fn(v, act, coef)
        r = alpha * v
        if beta != ZERO:
            r += beta * CT(yv)
        return r

    @cuda.jit(device=True)
    def dx_value(dyv, xv, zv, c, scale, bias, mean, invstd, sums, M, has_scale, has_bias,
                 act, coef):
        """(dx, dz) of one element of channel c."""
        xhat = (CT(xv) - mean[c]) * invstd[c]
        k = CT(scale[c]) if has_scale else ONE
        g = CT(dyv)
        if act >= 0:
            p = xhat * k + CT(zv)
            if has_bias:
                p += CT(bias[c])
            g *= act_grad(p, act, coef)
        return k * invstd[c] / M * (M * g - sums[2 * c] - xhat * sums[2 * c + 1]), g

    def bn_apply(x, y, z, scale, bias, mean, sv, N, C, L, columns, eps, is_var, has_scale,
                 has_bias, has_z, act, coef, alpha, beta, vec):
        # a thread 4 consecutive elements (one 16-byte access per array when vec: the 4
        # share a channel (planes) or take 4 consecutive ones (columns))
        total = N * C * L
        g = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        while 4 * g < total:
            e = 4 * g
            if vec != 0:
                x0, x1, x2, x3 = load4(x, g)
                z0 = z1 = z2 = z3 = y0 = y1 = y2 = y3 = ZERO
                if has_z:
                    a0, a1, a2, a3 = load4(z, g)
                    z0, z1, z2, z3 = CT(a0), CT(a1), CT(a2), CT(a3)
                if beta != ZERO:
                    a0, a1, a2, a3 = load4(y, g)
                    y0, y1, y2, y3 = CT(a0), CT(a1), CT(a2), CT(a3)
                c = channel(e, C, L, columns)
                d = 1 if columns else 0
                r0 = out_value(x0, z0, y0, c, scale, bias, mean, sv, eps, is_var, has_scale,
                               has_bias, act, coef, alpha, beta)
                r1 = out_value(x1, z1, y1, c + d, scale, bias, mean, sv, eps, is_var,
                               has_scale, has_bias, act, coef, alpha, beta)
                r2 = out_value(x2, z2, y2, c + 2 * d, scale, bias, mean, sv, eps, is_var,
                               has_scale, has_bias, act, coef, alpha, beta)
                r3 = out_value(x3, z3, y3, c + 3 * d, scale, bias, mean, sv, eps, is_var,
                               has_scale, has_bias, act, coef, alpha, beta)
                store4(y, g, (r0, r1, r2, r3))
            else:
                for i in range(e, min(e + 4, total)):
                    y[i] = out_value(x[i], z[i] if has_z else ZERO,
                                     y[i] if beta != ZERO else ZERO, channel(i, C, L, columns),
                                     scale, bias, mean, sv, eps, is_var, has_scale, has_bias,
                                     act, coef, alpha, beta)
            g += cuda.gridDim.x * cuda.blockDim.x

    def bn_bwd_dx(dy, x, z, scale, bias, mean, invstd, sums, dx, dz, N, C, L, columns,
                  has_scale, has_bias, has_z, act, coef, vec):
        total = N * C * L
        M = CT(N * L)
        g = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        while 4 * g < total:
            e = 4 * g
            if vec != 0:
                d0, d1, d2, d3 = load4(dy, g)
                x0, x1, x2, x3 = load4(x, g)
                z0 = z1 = z2 = z3 = ZERO
                if has_z:
                    a0, a1, a2, a3 = load4(z, g)
                    z0, z1, z2, z3 = CT(a0), CT(a1), CT(a2), CT(a3)
                c = channel(e, C, L, columns)
                d = 1 if columns else 0
                r0, g0 = dx_value(d0, x0, z0, c, scale, bias, mean, invstd, sums, M,
                                  has_scale, has_bias, act, coef)
                r1, g1 = dx_value(d1, x1, z1, c + d, scale, bias, mean, invstd, sums, M,
                                  has_scale, has_bias, act, coef)
                r2, g2 = dx_value(d2, x2, z2, c + 2 * d, scale, bias, mean, invstd, sums, M,
                                  has_scale, has_bias, act, coef)
                r3, g3 = dx_value(d3, x3, z3, c + 3 * d, scale, bias, mean, invstd, sums, M,
                                  has_scale, has_bias, act, coef)
                store4(dx, g, (r0, r1, r2, r3))
                if has_z:
                    store4(dz, g, (g0, g1, g2, g3))
            else:
                for i in range(e, min(e + 4, total)):
                    r, gi = dx_value(dy[i], x[i], z[i] if has_z else ZERO,
                                     channel(i, C, L, columns), scale, bias, mean, invstd,
                                     sums, M, has_scale, has_bias, act, coef)
                    dx[i] = r
                    if has_z:
                        dz[i] = gi
            g += cuda.gridDim.x * cuda.blockDim.x

    ks = _bn_sums.kernels(CT, pre, act_grad)
    ks.update(apply=bn_apply, bwd_dx=bn_bwd_dx)
    return ks


def _build():
    table = {}
    for ct, CT, nt in (("float32", float32, np.float32), ("float64", float64, np.float64)):
        ks = _kernels(CT, nt)
        for t in (d for d in DTYPES if (d == "float64") == (ct == "float64")):
            a, s = f"{t}[::1]", f"{ct}[::1]"
            geo = "int64, int64, int64, int64"  # N, C, L, columns
            ins = f"{a}, {a}, {a}, {a}, {a}, {s}, {s}"  # dy|x, x|y, z, scale, bias, mean, sv
            flags = "int64, int64, int64, int64"  # has_scale, has_bias, has_z, act
            part = f"void({ins}, {s}, {s}, int64, int64, int64, {flags}, {ct})"
            sigs = {"stats_planes": part, "stats_columns": part, "bwd_planes": part,
                    "bwd_columns": part,
                    "stats_final": f"void({a}, {s}, {s}, {s}, {s}, {s}, {s}, {geo}, {ct}, "
                                   f"{ct}, int64)",
                    "bwd_final": f"void({s}, {s}, {a}, {a}, {s}, {geo})",
                    "apply": f"void({ins}, {geo}, {ct}, int64, int64, int64, int64, int64, "
                             f"{ct}, {ct}, {ct}, int64)",
                    "bwd_dx": f"void({ins}, {s}, {a}, {a}, {geo}, {flags}, {ct}, int64)"}
            for name, sig in sigs.items():
                table[name, t] = (Kernel(ks[name], [sig]), sig)
    return table


_KERNELS = _build()


def _ncl(x, mode, last):
    """(N, C, L, columns): columns when a channel's elements are C apart (NHWC, or
    per_activation: C = an image's size, L = 1)."""
    shape = tuple(int(s) for s in x.shape)
    if mode == "per_activation":
        return shape[0], math.prod(shape[1:]), 1, 1
    C = shape[-1] if last else shape[1]
    L = math.prod(shape) // max(1, shape[0] * C)
    return shape[0], C, L, int(bool(last) or L == 1)


def _vec(geo, arrays):
    """1 when every array takes 16-byte accesses of 4 elements sharing a channel
    (planes, L % 4 == 0) or on 4 consecutive channels (columns, C % 4 == 0)."""
    N, C, L, columns = geo
    if (C if columns else L) % 4:
        return 0
    a = 0
    for arr in arrays:
        a |= ptr(arr)
    return int(a % vector_alignment(np.dtype(dtype_name(arrays[0])).itemsize) == 0)


def _grid(total):
    return min(max(1, -(-total // (4 * BLOCK))), 2 ** 31 - 1)


def _apply(x, y, z, scale, bias, mean, sv, geo, eps, is_var, act, coef, alpha, beta, stream):
    N, C, L, columns = geo
    k, sig = _KERNELS["apply", dtype_name(x)]
    mode = -1 if act is None else _act.MODES.index(act)
    if N * C * L:
        vec = _vec(geo, [a for a in (x, y, z) if a is not None])
        k.launch(sig, _grid(N * C * L), BLOCK, stream, x, y, z if z is not None else x,
                 scale if scale is not None else x, bias if bias is not None else x, mean, sv,
                 N, C, L, columns, eps, int(is_var), int(scale is not None),
                 int(bias is not None), int(z is not None), mode, coef, alpha, beta, vec)
    return y


def _partials(kind, x, ins, p_dtype, geo, flags, stream):
    """Per-chunk partials (p1, p2), each (chunks, C) in the compute dtype."""
    N, C, L, columns = geo
    _, nch = _bn_sums.chunking(N, L, columns)
    p1, p2 = empty(x, (nch * C,), p_dtype), empty(x, (nch * C,), p_dtype)
    k, sig = _KERNELS[f"{kind}_{'columns' if columns else 'planes'}", dtype_name(x)]
    grid, block = _bn_sums.launch_shape(C, nch, columns)
    k.launch(sig, grid, block, stream, *ins, p1, p2, N, C, L, *flags)
    return p1, p2


def batch_norm_train(x, scale, bias, running_mean, running_var, residual, momentum, eps,
                     mode, last, act, coef, *, out, stream):
    dtype = dtype_name(x)
    ct = "float64" if dtype == "float64" else "float32"
    geo = _ncl(x, mode, last)
    N, C, L, columns = geo
    pshape = tuple(int(s) for s in x.shape[1:]) if mode == "per_activation" else (C,)
    mean, invstd = empty(x, pshape, ct), empty(x, pshape, ct)
    y = out if out is not None else empty(x, x.shape, dtype)
    if not N * C * L:
        return y, mean, invstd
    has_run = running_mean is not None or running_var is not None
    scratch = None if running_mean is not None and running_var is not None else \
        empty(x, pshape, ct)  # stands in for a running statistic not given
    p1, p2 = _partials("stats", x, (x, x, x, x, x, mean, mean), ct, geo, (0, 0, 0, -1, 0.0),
                   stream)
    k, sig = _KERNELS["stats_final", dtype]
    k.launch(sig, -(-C // BLOCK), BLOCK, stream, x, p1, p2, mean, invstd,
             running_mean if running_mean is not None else scratch,
             running_var if running_var is not None else scratch, N, C, L, columns, eps,
             momentum, int(has_run))
    _apply(x, y, residual, scale, bias, mean, invstd, geo, eps, False, act, coef, 1.0, 0.0,
           stream)
    return y, mean, invstd


def batch_norm_infer(x, scale, bias, mean, var, residual, eps, mode, last, act, coef, *,
                     alpha, beta, out, stream):
    y = out if out is not None else empty(x, x.shape, dtype_name(x))
    return _apply(x, y, residual, scale, bias, mean, var, _ncl(x, mode, last), eps, True, act,
                  coef, alpha, beta, stream)


def batch_norm_backward(dy, x, scale, bias, mean, invstd, residual, mode, last, act, coef, *,
                        out, stream):
    dtype = dtype_name(x)
    geo = _ncl(x, mode, last)
    N, C, L, columns = geo
    pshape = tuple(int(s) for s in x.shape[1:]) if mode == "per_activation" else (C,)
    shapes = (tuple(x.shape), pshape, pshape) + ((tuple(x.shape),) if residual is not None
                                                  else ())
    res = out if out is not None else tuple(empty(x, s, dtype) for s in shapes)
    dx, dscale, dbias = res[:3]
    dz = res[3] if residual is not None else dx
    if not N * C * L:
        return tuple(res)
    m = -1 if act is None else _act.MODES.index(act)
    flags = (int(scale is not None), int(bias is not None), int(residual is not None), m, coef)
    z = residual if residual is not None else x
    ins = (x, dy, z, scale if scale is not None else x, bias if bias is not None else x, mean,
           invstd)
    ct = dtype_name(mean)
    p1, p2 = _partials("bwd", x, ins, ct, geo, flags, stream)
    sums = empty(x, (2 * C,), ct)
    k, sig = _KERNELS["bwd_final", dtype]
    k.launch(sig, -(-C // BLOCK), BLOCK, stream, p1, p2, dscale, dbias, sums, *geo)
    k, sig = _KERNELS["bwd_dx", dtype]
    vec = _vec(geo, [a for a in (dy, x, dx, residual) if a is not None])
    k.launch(sig, _grid(N * C * L), BLOCK, stream, dy, x, z, *ins[3:], sums, dx, dz, *geo,
             *flags, vec)
    return tuple(res)

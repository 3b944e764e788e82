"""Batch normalisation on the GPU; the formulas are in nbdnn/cpu/batch_norm.py.

x is addressed as (N, C, L): element (n, c, l) at (n*C + c)*L + l channels-first,
(n*L + l)*C + c channels-last (spatial mode; per_activation is C = an image's size,
L = 1). Four kernels:
- stats: a block a channel sums x - x[first], then (x - mean)^2 (shifted two-pass:
  float32 keeps mean 1e4, std 1 over N*L past 2**24), over the M = N*L elements in order; thread 0 writes
  saved_mean/saved_invstd and updates the running statistics. Reads x twice.
- apply: a thread an element in memory order: act(scale*(x-mean)*invstd + bias + z),
  blended (training and inference; inference derives invstd from var).
- backward sums: a block a channel sums dyh and dyh*xhat (dyh = dy*act'(pre), pre
  recomputed), writing dbias and dscale; backward dx: a thread an element.
Every sum runs in a fixed order (block tree, no atomics): deterministic.
Channels-last spatial statistics read a channel's elements C apart (uncoalesced);
the speed of these kernels is not yet measured.

Not yet run on hardware (verified in the simulator): the session that wrote this had
spent its device time.
"""
import math

import numpy as np
from numba import cuda, float32, float64

from . import SIMULATOR
from . import activation as _act
from ._arrays import dtype_name, empty
from ._launch import Kernel
from ._reduce import SHM, device_functions
from .matmul import _act_source

BLOCK = 32 if SIMULATOR else 256
DTYPES = ("float16", "float32", "float64")


@cuda.jit(device=True)
def _offset(n, c, l, C, L, last):
    return (n * L + l) * C + c if last else (n * C + c) * L + l


def _chains(nt):
    """act_fn(x, mode, coef) and its derivative act_grad over nbdnn's activation modes."""
    fns = _act._device_functions(nt)
    ns = {f"{p}{m}": fns[m][k] for m in _act.MODES for p, k in (("f_", 0), ("g_", 1))}
    for name, prefix in (("act_fn", "f_"), ("act_grad", "g_")):
        exec(compile(_act_source(_act.MODES, name, prefix), f"<nbdnn batch_norm {name}>",
                     "exec"), ns)
    return cuda.jit(device=True)(ns["act_fn"]), cuda.jit(device=True)(ns["act_grad"])


def _kernels(CT, nt):
    grp_sum = device_functions(nt)["grp_sum"]
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

    def bn_stats(x, mean, invstd, rmean, rvar, N, C, L, last, eps, momentum, has_running):
        c, t, T = cuda.blockIdx.x, cuda.threadIdx.x, cuda.blockDim.x
        shm = cuda.shared.array(SHM, CT)
        M = N * L
        # shifted by the channel's first element: a thread's partial sums stay near 0
        # even for mean 1e4 over N*L past 2**24 (float32 would lose the mean's digits)
        x0 = CT(x[_offset(0, c, 0, C, L, last)])
        s = ZERO
        for m in range(t, M, T):
            s += CT(x[_offset(m // L, c, m % L, C, L, last)]) - x0
        mu = x0 + grp_sum(s, T, shm) / CT(M)
        q = ZERO
        for m in range(t, M, T):
            d = CT(x[_offset(m // L, c, m % L, C, L, last)]) - mu
            q += d * d
        var = grp_sum(q, T, shm) / CT(M)
        if t == 0:
            mean[c] = mu
            invstd[c] = ONE / math.sqrt(var + eps)
            if has_running:
                unbiased = var * CT(M) / CT(M - 1) if M > 1 else var
                rmean[c] = (ONE - momentum) * rmean[c] + momentum * mu
                rvar[c] = (ONE - momentum) * rvar[c] + momentum * unbiased

    def bn_apply(x, y, z, scale, bias, mean, sv, N, C, L, last, eps, is_var, has_scale,
                 has_bias, has_z, act, coef, alpha, beta):
        total = N * C * L
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        while i < total:  # memory order
            c = i % C if last else (i // L) % C
            inv = ONE / math.sqrt(sv[c] + eps) if is_var else sv[c]
            v, _ = pre(x, z, scale, bias, mean, inv, i, c, has_scale, has_bias, has_z)
            if act >= 0:
                v = act_fn(v, act, coef)
            r = alpha * v
            if beta != ZERO:
                r += beta * CT(y[i])
            y[i] = r
            i += cuda.gridDim.x * cuda.blockDim.x

    def bn_bwd_sums(dy, x, z, scale, bias, mean, invstd, dscale, dbias, sums, N, C, L, last,
                    has_scale, has_bias, has_z, act, coef):
        c, t, T = cuda.blockIdx.x, cuda.threadIdx.x, cuda.blockDim.x
        shm = cuda.shared.array(SHM, CT)
        sg, sgx = ZERO, ZERO
        for m in range(t, N * L, T):
            i = _offset(m // L, c, m % L, C, L, last)
            v, xhat = pre(x, z, scale, bias, mean, invstd[c], i, c, has_scale, has_bias,
                          has_z)
            g = CT(dy[i]) * (act_grad(v, act, coef) if act >= 0 else ONE)
            sg += g
            sgx += g * xhat
        sg = grp_sum(sg, T, shm)
        sgx = grp_sum(sgx, T, shm)
        if t == 0:  # sums keeps them unrounded for dx (float16 outputs would lose bits
            dbias[c] = sg     # that invstd then amplifies)
            dscale[c] = sgx
            sums[2 * c] = sg
            sums[2 * c + 1] = sgx

    def bn_bwd_dx(dy, x, z, scale, bias, mean, invstd, sums, dx, dz, N, C, L, last,
                  has_scale, has_bias, has_z, act, coef):
        total = N * C * L
        M = CT(N * L)
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        while i < total:
            c = i % C if last else (i // L) % C
            v, xhat = pre(x, z, scale, bias, mean, invstd[c], i, c, has_scale, has_bias,
                          has_z)
            g = CT(dy[i]) * (act_grad(v, act, coef) if act >= 0 else ONE)
            k = (CT(scale[c]) if has_scale else ONE) * invstd[c] / M
            dx[i] = k * (M * g - sums[2 * c] - xhat * sums[2 * c + 1])
            if has_z:
                dz[i] = g
            i += cuda.gridDim.x * cuda.blockDim.x

    return {"stats": bn_stats, "apply": bn_apply, "bwd_sums": bn_bwd_sums, "bwd_dx": bn_bwd_dx}


def _build():
    table = {}
    for ct, CT, nt in (("float32", float32, np.float32), ("float64", float64, np.float64)):
        ks = _kernels(CT, nt)
        for t in (d for d in DTYPES if (d == "float64") == (ct == "float64")):
            a, s = f"{t}[::1]", f"{ct}[::1]"
            i4 = "int64, int64, int64, int64"  # N, C, L, last
            sigs = {"stats": f"void({a}, {s}, {s}, {s}, {s}, {i4}, {ct}, {ct}, int64)",
                    "apply": f"void({a}, {a}, {a}, {a}, {a}, {s}, {s}, {i4}, {ct}, int64, "
                             f"int64, int64, int64, int64, {ct}, {ct}, {ct})",
                    "bwd_sums": f"void({a}, {a}, {a}, {a}, {a}, {s}, {s}, {a}, {a}, {s}, {i4}, "
                                f"int64, int64, int64, int64, {ct})",
                    "bwd_dx": f"void({a}, {a}, {a}, {a}, {a}, {s}, {s}, {s}, {a}, {a}, "
                              f"{i4}, int64, int64, int64, int64, {ct})"}
            for name, sig in sigs.items():
                table[name, t] = (Kernel(ks[name], [sig]), sig)
    return table


_KERNELS = _build()


def _ncl(x, mode, last):
    shape = tuple(int(s) for s in x.shape)
    if mode == "per_activation":
        return shape[0], math.prod(shape[1:]), 1, 0
    C = shape[-1] if last else shape[1]
    return shape[0], C, math.prod(shape) // max(1, shape[0] * C), int(last)


def _grid(total):
    return min(max(1, -(-total // BLOCK)), 2 ** 31 - 1)


def _apply(x, y, z, scale, bias, mean, sv, geo, eps, is_var, act, coef, alpha, beta, stream):
    N, C, L, last = geo
    k, sig = _KERNELS["apply", dtype_name(x)]
    mode = -1 if act is None else _act.MODES.index(act)
    if N * C * L:
        k.launch(sig, _grid(N * C * L), BLOCK, stream, x, y, z if z is not None else x,
                 scale if scale is not None else x, bias if bias is not None else x, mean, sv,
                 N, C, L, last, eps, int(is_var), int(scale is not None),
                 int(bias is not None), int(z is not None), mode, coef, alpha, beta)
    return y


def batch_norm_train(x, scale, bias, running_mean, running_var, residual, momentum, eps,
                     mode, last, act, coef, *, out, stream):
    dtype = dtype_name(x)
    ct = "float64" if dtype == "float64" else "float32"
    geo = _ncl(x, mode, last)
    N, C, L, lst = geo
    pshape = tuple(int(s) for s in x.shape[1:]) if mode == "per_activation" else (C,)
    mean, invstd = empty(x, pshape, ct), empty(x, pshape, ct)
    has_run = running_mean is not None or running_var is not None
    scratch = None if running_mean is not None and running_var is not None else \
        empty(x, pshape, ct)  # stands in for a running statistic not given
    k, sig = _KERNELS["stats", dtype]
    k.launch(sig, C, BLOCK, stream, x, mean, invstd,
             running_mean if running_mean is not None else scratch,
             running_var if running_var is not None else scratch, N, C, L, lst, eps,
             momentum, int(has_run))
    y = out if out is not None else empty(x, x.shape, dtype)
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
    N, C, L, lst = _ncl(x, mode, last)
    pshape = tuple(int(s) for s in x.shape[1:]) if mode == "per_activation" else (C,)
    shapes = (tuple(x.shape), pshape, pshape) + ((tuple(x.shape),) if residual is not None
                                                  else ())
    res = out if out is not None else tuple(empty(x, s, dtype) for s in shapes)
    dx, dscale, dbias = res[:3]
    dz = res[3] if residual is not None else dx
    m = -1 if act is None else _act.MODES.index(act)
    flags = (int(scale is not None), int(bias is not None), int(residual is not None), m, coef)
    ins = (dy, x, residual if residual is not None else x, scale if scale is not None else x,
           bias if bias is not None else x, mean, invstd)
    sums = empty(x, (2 * max(C, 1),), dtype_name(mean))
    k, sig = _KERNELS["bwd_sums", dtype]
    if C:
        k.launch(sig, C, BLOCK, stream, *ins, dscale, dbias, sums, N, C, L, lst, *flags)
    k, sig = _KERNELS["bwd_dx", dtype]
    if N * C * L:
        k.launch(sig, _grid(N * C * L), BLOCK, stream, *ins, sums, dx, dz, N, C, L, lst,
                 *flags)
    return tuple(res)

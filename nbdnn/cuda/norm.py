"""layer_norm / rms_norm on the GPU: x viewed as (rows, L), a block a row.

Forward: pass 1 sums x (layer_norm only) for the mean, pass 2 sums (x - mean)^2 (the
two-pass variance: exact for mean 1e4, std 1 in float32), pass 3 writes y with scale
and bias; the block's thread 0 saves the statistics. Backward: one block a row sums
g = dy*scale and g*xhat, then writes dx; dscale and dbias come from a column kernel
(a thread a normalised element, summing over the rows in order: deterministic).
Reads per element: 3 forward (2 for rms), 2 of x and dy backward; rows of up to a few
thousand elements stay in L1/L2 between the passes. Not yet run on hardware.
"""
import math

import numpy as np
from numba import cuda, float32, float64

from . import SIMULATOR
from ._arrays import dtype_name, empty
from ._launch import Kernel
from ._reduce import SHM, device_functions

BLOCK = 32 if SIMULATOR else 256
MAX_GRID = 2 ** 31 - 1


def _kernels(CT, f):
    grp_sum = f["grp_sum"]
    ZERO, ONE = CT(0), CT(1)

    def norm_fwd(x, y, scale, bias, st1, st2, rows, L, eps, centred, has_scale, has_bias):
        row, t, T = cuda.blockIdx.x, cuda.threadIdx.x, cuda.blockDim.x
        shm = cuda.shared.array(SHM, CT)
        base = row * L
        mean = ZERO
        if centred:
            s = ZERO
            for i in range(t, L, T):
                s += CT(x[base + i])
            mean = grp_sum(s, T, shm) / CT(L)
        q = ZERO
        for i in range(t, L, T):
            d = CT(x[base + i]) - mean
            q += d * d
        inv = ONE / math.sqrt(grp_sum(q, T, shm) / CT(L) + eps)
        if t == 0:
            st1[row] = mean if centred else inv
            st2[row] = inv
        for i in range(t, L, T):
            v = (CT(x[base + i]) - mean) * inv
            if has_scale:
                v *= CT(scale[i])
            if has_bias:
                v += CT(bias[i])
            y[base + i] = v

    def norm_bwd(dy, x, st1, st2, scale, dx, rows, L, centred, has_scale):
        row, t, T = cuda.blockIdx.x, cuda.threadIdx.x, cuda.blockDim.x
        shm = cuda.shared.array(SHM, CT)
        base = row * L
        mean = st1[row] if centred else ZERO
        inv = st2[row]
        sg, sgx = ZERO, ZERO
        for i in range(t, L, T):
            g = CT(dy[base + i]) * (CT(scale[i]) if has_scale else ONE)
            sg += g
            sgx += g * (CT(x[base + i]) - mean) * inv
        sg = grp_sum(sg, T, shm) / CT(L)
        sgx = grp_sum(sgx, T, shm) / CT(L)
        for i in range(t, L, T):
            g = CT(dy[base + i]) * (CT(scale[i]) if has_scale else ONE)
            v = g - (CT(x[base + i]) - mean) * inv * sgx
            if centred:
                v -= sg
            dx[base + i] = v * inv

    def norm_params_bwd(dy, x, st1, st2, dscale, dbias, rows, L, centred):
        l = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if l < L:
            a, b = ZERO, ZERO
            for r in range(rows):
                d = CT(dy[r * L + l])
                a += d * (CT(x[r * L + l]) - (st1[r] if centred else ZERO)) * st2[r]
                b += d
            dscale[l] = a
            dbias[l] = b

    return {"fwd": norm_fwd, "bwd": norm_bwd, "params_bwd": norm_params_bwd}


def _build():
    table = {}
    for ct, CT, nt in (("float32", float32, np.float32), ("float64", float64, np.float64)):
        ks = _kernels(CT, device_functions(nt))
        for t in (d for d in ("float16", "float32", "float64") if (d == "float64") == (ct == "float64")):
            a, s = f"{t}[::1]", f"{ct}[::1]"
            sigs = {"fwd": f"void({a}, {a}, {a}, {a}, {s}, {s}, int64, int64, {ct}, int64, "
                           "int64, int64)",
                    "bwd": f"void({a}, {a}, {s}, {s}, {a}, {a}, int64, int64, int64, int64)",
                    "params_bwd": f"void({a}, {a}, {s}, {s}, {a}, {a}, int64, int64, int64)"}
            for name, sig in sigs.items():
                table[name, t] = (Kernel(ks[name], [sig]), sig)
    return table


_KERNELS = _build()


def _split(x, ndim):
    shape = tuple(int(s) for s in x.shape)
    lead = shape[:len(shape) - ndim]
    return lead, math.prod(lead), math.prod(shape[len(shape) - ndim:])


def _forward(x, scale, bias, ndim, eps, out, stream, centred):
    dtype = dtype_name(x)
    ct = "float64" if dtype == "float64" else "float32"
    lead, rows, L = _split(x, ndim)
    y = out if out is not None else empty(x, x.shape, dtype)
    st1, st2 = empty(x, lead, ct), empty(x, lead, ct)
    if rows and L:
        if rows > MAX_GRID:
            from ..errors import NotSupportedError
            raise NotSupportedError(f"{rows} rows exceed the grid limit {MAX_GRID}")
        k, sig = _KERNELS["fwd", dtype]
        k.launch(sig, rows, BLOCK, stream, x, y, scale if scale is not None else x,
                 bias if bias is not None else x, st1, st2, rows, L, eps, int(centred),
                 int(scale is not None), int(bias is not None))
    return (y, st1, st2) if centred else (y, st2)


def layer_norm(x, scale, bias, ndim, eps, *, out, stream):
    return _forward(x, scale, bias, ndim, eps, out, stream, True)


def rms_norm(x, scale, bias, ndim, eps, *, out, stream):
    return _forward(x, scale, bias, ndim, eps, out, stream, False)


def _backward(dy, x, st1, st2, scale, ndim, out, stream, centred):
    dtype = dtype_name(x)
    lead, rows, L = _split(x, ndim)
    tail = tuple(int(s) for s in x.shape)[len(lead):]
    dx, dscale, dbias = out if out is not None else (
        empty(x, x.shape, dtype), empty(x, tail, dtype), empty(x, tail, dtype))
    if rows and L:
        k, sig = _KERNELS["bwd", dtype]
        k.launch(sig, rows, BLOCK, stream, dy, x, st1, st2, scale if scale is not None else x,
                 dx, rows, L, int(centred), int(scale is not None))
    if L:
        k, sig = _KERNELS["params_bwd", dtype]
        k.launch(sig, -(-L // BLOCK), BLOCK, stream, dy, x, st1, st2, dscale, dbias, rows, L,
                 int(centred))
    return dx, dscale, dbias


def layer_norm_backward(dy, x, mean, invstd, scale, ndim, *, out, stream):
    return _backward(dy, x, mean, invstd, scale, ndim, out, stream, True)


def rms_norm_backward(dy, x, invrms, scale, ndim, *, out, stream):
    return _backward(dy, x, invrms, invrms, scale, ndim, out, stream, False)

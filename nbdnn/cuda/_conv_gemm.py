"""Convolution algorithm "gemm": explicit im2col into a workspace, the matmul kernel,
then an epilogue pass (nbdnn.cuda.conv's docstring lists the algorithms).

    cols[g, m, kx] = x at output position m's tap kx (0 in the padding)    (G, M, Kr)
    raw[g]         = cols[g] @ W_g^T, W_g = the group's filters as stored   (G, M, K/g)
    y[n, k, p]     = act(alpha * raw + beta * z + bias[k])                  y's layout

M = N*P, Kr = C/g*T*R*S in the filters' storage order, so W_g is w reshaped. The
workspace is G*M*(Kr + K/g) elements (`workspace_elements`): Kr/(C/g) = T*R*S times
the input and the raw output besides. float16 rounds raw to float16 before the
epilogue (one rounding more than the fused algorithms).
"""
import numpy as np
from numba import cuda

from . import SIMULATOR
from ._arrays import dtype_name, empty
from ._conv_index import split, strides

BLOCK = 64 if SIMULATOR else 256
MAX_BLOCKS = 2 ** 31 - 1


def workspace_elements(g):
    """Scratch elements for geometry g (nbdnn.cuda.conv._geometry's 24 ints)."""
    N, C, K, G = g[:4]
    T, R, S, PD, PH, PW = g[7:13]
    M = N * PD * PH * PW
    return G * M * (C // G * T * R * S + K // G)


def make_epilogue(CT, act_fn):
    """y[o] = act(alpha * acc + beta * z[o] + bias[k]), z = residual or y itself."""
    ZERO = CT(0)

    @cuda.jit(device=True)
    def epilogue(acc, y, z, bias, o, k, has_bias, has_z, act, coef, alpha, beta):
        v = alpha * acc
        if beta != ZERO:
            v += beta * CT(z[o] if has_z else y[o])
        if has_bias:
            v += CT(bias[k])
        if act >= 0:
            v = act_fn(v, act, coef)
        y[o] = v
    return epilogue


def kernels(CT, act_fn):
    ZERO = CT(0)
    epilogue = make_epilogue(CT, act_fn)

    def conv_im2col(x, cols, N, C, K, G, D, H, W, T, R, S, PD, PH, PW, sd, sh, sw, qd, qh,
                    qw, dd, dh, dw, flip, last):
        Cg = C // G
        M, Kr = N * PD * PH * PW, Cg * T * R * S
        xn, xc, xd, xh, xw = strides(C, D, H, W, last)
        total = G * M * Kr
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        while i < total:
            kx = i % Kr
            q = i // Kr
            m = q % M
            g = q // M
            n, _, pd, ph, pw = split(m, 1, PD, PH, PW, False)
            if last:
                _, t, r, s, c = split(kx, T, R, S, Cg, False)
            else:
                _, c, t, r, s = split(kx, Cg, T, R, S, False)
            if flip:
                t, r, s = T - 1 - t, R - 1 - r, S - 1 - s
            idd, ih, iw = pd * sd + t * dd - qd, ph * sh + r * dh - qh, pw * sw + s * dw - qw
            v = ZERO
            if 0 <= idd < D and 0 <= ih < H and 0 <= iw < W:
                v = CT(x[n * xn + (g * Cg + c) * xc + idd * xd + ih * xh + iw * xw])
            cols[i] = v
            i += cuda.gridDim.x * cuda.blockDim.x

    def conv_gemm_epilogue(raw, y, bias, z, N, K, G, PD, PH, PW, last, has_bias, has_z, act,
                           coef, alpha, beta):
        Kg, M = K // G, N * PD * PH * PW
        total = N * K * PD * PH * PW
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        while i < total:  # i runs over y in memory order
            n, k, pd, ph, pw = split(i, K, PD, PH, PW, last)
            g = k // Kg
            m = ((n * PD + pd) * PH + ph) * PW + pw
            epilogue(CT(raw[(g * M + m) * Kg + k - g * Kg]), y, z, bias, i, k, has_bias,
                     has_z, act, coef, alpha, beta)
            i += cuda.gridDim.x * cuda.blockDim.x

    return {"im2col": conv_im2col, "gemm_epilogue": conv_gemm_epilogue}


def signatures(t, ct, geom):
    a = f"{t}[::1]"
    return {"im2col": f"void({a}, {a}, {geom})",
            "gemm_epilogue": f"void({a}, {a}, {a}, {a}, int64, int64, int64, int64, int64, "
                             f"int64, int64, int64, int64, int64, {ct}, {ct}, {ct})"}


def forward(table, gemm, x, w, y, bias, residual, g, act, coef, alpha, beta, stream):
    """im2col, GEMM, epilogue; g: the 24 geometry ints; act: a mode index or -1."""
    N, C, K, G = g[:4]
    T, R, S, PD, PH, PW = g[7:13]
    M, Kg, Kr = N * PD * PH * PW, K // G, C // G * T * R * S
    dtype = dtype_name(x)
    cols = empty(x, (G, M, Kr), dtype)
    k, sig = table["im2col", dtype]
    grid = min(-(-(G * M * Kr) // BLOCK), MAX_BLOCKS)
    k.launch(sig, grid, BLOCK, stream, x, cols, *g)
    raw = gemm(cols, w.reshape((G, Kg, Kr)), False, True, None, None, 0.0, 1.0, 0.0, None,
               stream)
    k, sig = table["gemm_epilogue", dtype]
    grid = min(-(-int(np.prod(y.shape)) // BLOCK), MAX_BLOCKS)
    k.launch(sig, grid, BLOCK, stream, raw, y, bias if bias is not None else y,
             residual if residual is not None else y, N, K, G, PD, PH, PW, g[-1],
             int(bias is not None), int(residual is not None), act, coef, alpha, beta)

"""Convolution algorithm "direct", forward and both backward passes: one thread an
output element (grid-stride), every geometry and layout through the shared index
helpers (nbdnn/cuda/runtime/launch/grid.py); the reference-speed algorithm and the fallback
of the others (nbdnn/cuda/conv/__init__.py's docstring has their traffic and registers).
- forward: y[n, k, p] gathers C/g * T*R*S products, then the epilogue
  act(alpha * acc + beta * z + bias), z = residual or the previous y.
- backward data: dx[n, c, s] gathers, over the K/g filters of c's group and every tap
  whose stride arithmetic lands on s, dy * w' (no atomics: deterministic).
- backward filter: dw[k, c, t] sums dy * x over N and the output positions, one
  thread a filter element (deterministic; little parallelism when K*C/g*R*S is small).
Forward and backward filter multiply a padded tap's zero like any value (0 * inf =
nan, the reference's x_pad); backward data visits only the terms that exist
(nbdnn/cpu/conv.py states the rule every algorithm follows).
"""
from numba import cuda

from . import gemm as _conv_gemm
from ..runtime.launch.grid import landing as _landing, split as _split, strides as _strides
from ..runtime.device_code.intrinsics import narrow, widen


def kernels(CT, act_fn):
    """{"fwd", "bwd_data", "bwd_filter"}: the direct kernels in compute type CT."""
    ZERO = CT(0)
    epilogue = _conv_gemm.make_epilogue(CT, act_fn)

    def conv_fwd(x, w, y, bias, z, N, C, K, G, D, H, W, T, R, S, PD, PH, PW, sd, sh, sw,
                 qd, qh, qw, dd, dh, dw, flip, last, has_bias, has_z, act, coef, alpha,
                 beta):
        Cg, Kg = C // G, K // G
        xn, xc, xd, xh, xw = _strides(C, D, H, W, last)
        wk, wc, wt, wr, ws = _strides(Cg, T, R, S, last)
        yn, yc, yd, yh, yw = _strides(K, PD, PH, PW, last)
        total = N * K * PD * PH * PW
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        while i < total:
            n, k, pd, ph, pw = _split(i, K, PD, PH, PW, last)
            c0 = (k // Kg) * Cg
            acc = ZERO
            for c in range(Cg):
                for t in range(T):
                    idd = pd * sd + t * dd - qd
                    for r in range(R):
                        ih = ph * sh + r * dh - qh
                        for s in range(S):
                            iw = pw * sw + s * dw - qw
                            xv = ZERO  # a padded tap is a zero that takes part (0 * inf = nan)
                            if 0 <= idd < D and 0 <= ih < H and 0 <= iw < W:
                                xv = widen(x[n * xn + (c0 + c) * xc + idd * xd + ih * xh + iw * xw])
                            ft, fr, fs = (T - 1 - t, R - 1 - r, S - 1 - s) if flip else (t, r, s)
                            acc += xv * widen(w[k * wk + c * wc + ft * wt + fr * wr + fs * ws])
            epilogue(acc, y, z, bias, n * yn + k * yc + pd * yd + ph * yh + pw * yw, k,
                     has_bias, has_z, act, coef, alpha, beta)
            i += cuda.gridDim.x * cuda.blockDim.x

    def conv_bwd_data(dy, w, dx, N, C, K, G, D, H, W, T, R, S, PD, PH, PW, sd, sh, sw,
                      qd, qh, qw, dd, dh, dw, flip, last, alpha, beta):
        Cg, Kg = C // G, K // G
        xn, xc, xd, xh, xw = _strides(C, D, H, W, last)
        wk, wc, wt, wr, ws = _strides(Cg, T, R, S, last)
        yn, yc, yd, yh, yw = _strides(K, PD, PH, PW, last)
        total = N * C * D * H * W
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        while i < total:
            n, c, idd, ih, iw = _split(i, C, D, H, W, last)
            k0, cl = (c // Cg) * Kg, c % Cg
            acc = ZERO
            for t in range(T):
                pd = _landing(idd, qd, t, dd, sd, PD)
                for r in range(R if pd >= 0 else 0):
                    ph = _landing(ih, qh, r, dh, sh, PH)
                    for s in range(S if ph >= 0 else 0):
                        pw = _landing(iw, qw, s, dw, sw, PW)
                        if pw >= 0:
                            ft, fr, fs = (T - 1 - t, R - 1 - r, S - 1 - s) if flip else (t, r, s)
                            yo = n * yn + pd * yd + ph * yh + pw * yw
                            wo = cl * wc + ft * wt + fr * wr + fs * ws
                            for k in range(k0, k0 + Kg):
                                acc += widen(dy[yo + k * yc]) * widen(w[wo + k * wk])
            o = n * xn + c * xc + idd * xd + ih * xh + iw * xw
            v = alpha * acc
            if beta != ZERO:
                v += beta * widen(dx[o])
            dx[o] = narrow(v, dx)
            i += cuda.gridDim.x * cuda.blockDim.x

    def conv_bwd_filter(dy, x, dwt, N, C, K, G, D, H, W, T, R, S, PD, PH, PW, sd, sh, sw,
                        qd, qh, qw, dd, dh, dw, flip, last, alpha, beta):
        Cg, Kg = C // G, K // G
        xn, xc, xd, xh, xw = _strides(C, D, H, W, last)
        wk, wc, wt, wr, ws = _strides(Cg, T, R, S, last)
        yn, yc, yd, yh, yw = _strides(K, PD, PH, PW, last)
        total = K * Cg * T * R * S
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        while i < total:
            k, c, ft, fr, fs = _split(i, Cg, T, R, S, last)
            t, r, s = (T - 1 - ft, R - 1 - fr, S - 1 - fs) if flip else (ft, fr, fs)
            xc0 = (k // Kg) * Cg + c
            acc = ZERO
            for n in range(N):
                for pd in range(PD):
                    idd = pd * sd + t * dd - qd
                    for ph in range(PH):
                        ih = ph * sh + r * dh - qh
                        for pw in range(PW):
                            iw = pw * sw + s * dw - qw
                            xv = ZERO  # a padded x is a zero that takes part, as forward
                            if 0 <= idd < D and 0 <= ih < H and 0 <= iw < W:
                                xv = widen(x[n * xn + xc0 * xc + idd * xd + ih * xh + iw * xw])
                            acc += widen(dy[n * yn + k * yc + pd * yd + ph * yh + pw * yw]) * xv
            o = k * wk + c * wc + ft * wt + fr * wr + fs * ws
            v = alpha * acc
            if beta != ZERO:
                v += beta * widen(dwt[o])
            dwt[o] = narrow(v, dwt)
            i += cuda.gridDim.x * cuda.blockDim.x

    return {"fwd": conv_fwd, "bwd_data": conv_bwd_data, "bwd_filter": conv_bwd_filter}

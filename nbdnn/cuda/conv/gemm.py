"""Convolution algorithm "gemm": explicit im2col into a workspace, the matmul kernel,
then an epilogue pass (nbdnn.cuda.conv's docstring lists the algorithms); and the
backward passes through the same GEMM:

    rows[g, m, k]  = dy at output position m, filter g*K/g + k                 (G, M, K/g)
    dW_g           = rows_g^T @ cols_g   (backward filter; sums over M in order)
    dcols_g        = rows_g @ W_g, then dx gathers its taps' dcols (col2im, no atomics)


    cols[g, m, kx] = x at output position m's tap kx (0 in the padding)    (G, M, Kr)
    raw[g]         = cols[g] @ W_g^T, W_g = the group's filters as stored   (G, M, K/g)
    y[n, k, p]     = act(alpha * raw + beta * z + bias[k])                  y's layout

M = N*P, Kr = C/g*T*R*S in the filters' storage order, so W_g is w reshaped. The
workspace is G*M*(Kr + K/g) elements: Kr/(C/g) = T*R*S times
the input and the raw output besides. float16 rounds raw to float16 before the
epilogue (one rounding more than the fused algorithms).
"""
import numpy as np
from numba import cuda

from ..runtime.arrays import dtype_name, empty
from ..runtime.grid import landing, launch, split, strides
from ..runtime.intrinsics import array_type, narrow, widen
from ..runtime.strided import contiguous
from . import col2im_quads as _quads, col2im_rows as _col2im_rows
from . import im2col_words as _words
from ..tensor import add_tensor, reduce_tensor


def make_epilogue(CT, act_fn):
    """y[o] = act(alpha * acc + beta * z[o] + bias[k]), z = residual or y itself."""
    ZERO = CT(0)

    @cuda.jit(device=True)
    def epilogue(acc, y, z, bias, o, k, has_bias, has_z, act, coef, alpha, beta):
        v = alpha * acc
        if beta != ZERO:
            v += beta * widen(z[o] if has_z else y[o])
        if has_bias:
            v += widen(bias[k])
        if act >= 0:
            v = act_fn(v, act, coef)
        y[o] = narrow(v, y)
    return epilogue


def kernels(CT, act_fn):
    ZERO = CT(0)
    epilogue = make_epilogue(CT, act_fn)

    def conv_im2col(x, cols, N, C, K, G, D, H, W, T, R, S, PD, PH, PW, sd, sh, sw, qd, qh,
                    qw, dd, dh, dw, flip, last, row):
        # cols (G, M, row): row >= Kr, the columns past Kr zero (a 16-byte row for TMA)
        Cg = C // G
        M, Kr = N * PD * PH * PW, Cg * T * R * S
        xn, xc, xd, xh, xw = strides(C, D, H, W, last)
        total = G * M * row
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        while i < total:
            g, _, _, m, kx = split(i, 1, 1, M, row, False)
            if kx >= Kr:
                cols[i] = narrow(ZERO, cols)
                i += cuda.gridDim.x * cuda.blockDim.x
                continue
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
                v = widen(x[n * xn + (g * Cg + c) * xc + idd * xd + ih * xh + iw * xw])
            cols[i] = narrow(v, cols)
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
            epilogue(widen(raw[(g * M + m) * Kg + k - g * Kg]), y, z, bias, i, k, has_bias,
                     has_z, act, coef, alpha, beta)
            i += cuda.gridDim.x * cuda.blockDim.x

    def conv_y_to_rows(dy, rows, N, K, G, PD, PH, PW, last):
        # rows[g, m, k] = dy[n, g*Kg + k, p] (the epilogue's map, read in dy's order)
        Kg, M = K // G, N * PD * PH * PW
        total = N * K * PD * PH * PW
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        while i < total:
            n, k, pd, ph, pw = split(i, K, PD, PH, PW, last)
            g = k // Kg
            rows[(g * M + ((n * PD + pd) * PH + ph) * PW + pw) * Kg + k - g * Kg] = dy[i]
            i += cuda.gridDim.x * cuda.blockDim.x

    def conv_col2im(dcols, dx, N, C, K, G, D, H, W, T, R, S, PD, PH, PW, sd, sh, sw, qd, qh,
                    qw, dd, dh, dw, flip, last, alpha, beta):
        # dx[n, c, s] = sum over the (m, kx) whose tap lands on s of dcols[g, m, kx]:
        # a gather in a fixed order (no atomics)
        Cg = C // G
        M, Kr = N * PD * PH * PW, Cg * T * R * S
        total = N * C * D * H * W
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        while i < total:
            n, c, idd, ih, iw = split(i, C, D, H, W, last)
            g, cl = c // Cg, c % Cg
            acc = ZERO
            for t in range(T):
                pd = landing(idd, qd, t, dd, sd, PD)
                for r in range(R if pd >= 0 else 0):
                    ph = landing(ih, qh, r, dh, sh, PH)
                    for s in range(S if ph >= 0 else 0):
                        pw = landing(iw, qw, s, dw, sw, PW)
                        if pw >= 0:
                            ft, fr, fs = (T - 1 - t, R - 1 - r, S - 1 - s) if flip else (t, r, s)
                            kx = ((ft * R + fr) * S + fs) * Cg + cl if last else \
                                ((cl * T + ft) * R + fr) * S + fs
                            m = ((n * PD + pd) * PH + ph) * PW + pw
                            acc += widen(dcols[(g * M + m) * Kr + kx])
            v = alpha * acc
            if beta != ZERO:
                v += beta * widen(dx[i])
            dx[i] = narrow(v, dx)
            i += cuda.gridDim.x * cuda.blockDim.x

    return {"im2col": conv_im2col, "gemm_epilogue": conv_gemm_epilogue,
            "y_to_rows": conv_y_to_rows, "col2im": conv_col2im}


def signatures(t, ct, geom):
    a = f"{array_type(t)}[::1]"
    return {"im2col": f"void({a}, {a}, {geom}, int64)",
            "gemm_epilogue": f"void({a}, {a}, {a}, {a}, int64, int64, int64, int64, int64, "
                             f"int64, int64, int64, int64, int64, {ct}, {ct}, {ct})",
            "y_to_rows": f"void({a}, {a}, int64, int64, int64, int64, int64, int64, int64)",
            "col2im": f"void({a}, {a}, {geom}, {ct}, {ct})"}


def _dims(g):
    N, C, K, G = g[:4]
    T, R, S, PD, PH, PW = g[7:13]
    return N, C, K, G, N * PD * PH * PW, K // G, C // G * T * R * S, PD, PH, PW


def _rows(table, dy, g, stream):
    """dy as (G, M, K/g) rows: the GEMM's view of the output gradient (channels-last
    with one group: dy as stored, no copy)."""
    N, C, K, G, M, Kg, Kr, PD, PH, PW = _dims(g)
    if g.last and G == 1:
        return dy.reshape((1, M, Kg))
    rows = empty(dy, (G, M, Kg), dtype_name(dy))
    launch(table, "y_to_rows", dtype_name(dy), N * K * PD * PH * PW, stream, dy, rows, N, K,
            G, PD, PH, PW, g.last)
    return rows


def _cols(table, x, g, stream, row=None):
    """x's im2col columns (G, M, row), row >= Kr (default Kr) with zero columns past Kr
    (2-d channels-last, one group: whole words a thread, conv/im2col_words.py)."""
    N, C, K, G, M, Kg, Kr, *_ = _dims(g)
    row = row or Kr
    if _words.usable(g):
        return _words.columns(x, g, row, stream)
    cols = empty(x, (G, M, row), dtype_name(x))
    launch(table, "im2col", dtype_name(x), G * M * row, stream, x, cols, *g, row)
    return cols


def backward_filter(table, gemm, dy, x, dw, g, alpha, beta, stream):
    """dW_g = rows_g^T @ cols_g: a GEMM over the M = N*P output positions. 16-bit rows
    of Kr columns that are not 16-byte multiples (a 7x7 stem's 147 = 3 channels x 49
    taps) are padded with zero columns to one: the tensor-core GEMM's TMA needs
    16-byte rows, the SIMT GEMM it fell to took 33 ms for ResNet-50's stem at batch
    32 (half the training step); the product's first Kr columns are then
    blended into dW."""
    N, C, K, G, M, Kg, Kr, *_ = _dims(g)
    dwg = dw.reshape((G, Kg, Kr))
    rows = _rows(table, dy, g, stream)
    if dtype_name(x) not in ("float16", "bfloat16") or Kr % 8 == 0:
        gemm(rows, _cols(table, x, g, stream), True, False, None, None, 0.0, alpha, beta,
             dwg, stream)
        return
    part = gemm(rows, _cols(table, x, g, stream, -(-Kr // 8) * 8), True, False, None, None,
                0.0, alpha, 0.0, None, stream)
    add_tensor(contiguous(part[:, :, :Kr], stream), dwg, alpha=1.0, beta=beta, out=dwg,
               stream=stream)


def _one_by_one(g):
    """A 1x1 filter at stride 1 with no padding: the output positions are the input's."""
    N, C, K, G, M, Kg, Kr, PD, PH, PW = _dims(g)
    return Kr == C // G and (g.sd, g.sh, g.sw) == (1, 1, 1) and \
        not any((g.qd, g.qh, g.qw)) and (g.D, g.H, g.W) == (PD, PH, PW)


def backward_data_1x1(gemm, dy, w, dx, g, alpha, beta, stream):
    """Channels-last, one group, 1x1 at stride 1 with no padding: dx = dy @ W over the
    M = N*P rows as stored, W (K, C) as stored (an MN-major B for the tensor cores),
    where the stride-1 path (_data_as_forward) copies W transposed first. Mode and
    dilation do not matter to one tap. False, doing nothing, otherwise."""
    if not (g.last and g.G == 1 and _one_by_one(g)):
        return False
    M = g.N * g.PD * g.PH * g.PW
    gemm(dy.reshape((M, g.K)), w.reshape((g.K, g.C)), False, False, None, None, 0.0, alpha,
         beta, dx.reshape((M, g.C)), stream)
    return True


def backward_filter_1x1(gemm, dy, x, dw, g, alpha, beta, stream):
    """A 1x1 filter with stride 1 and no padding needs no im2col: channels-last (one
    group) dW = dy^T @ x over the M = N*P rows as stored; channels-first dW_g = sum over
    n of dy[n, g] @ x[n, g]^T, a batched GEMM (N*G products over P) whose products are
    summed in batch order (deterministic). Channels-first needs P >= 128 (a shorter
    reduction leaves the GEMM mostly epilogue and the N*K*C/g partials outweigh it)
    and float32/float64 (float16 partials would round N times).
    False, doing nothing, otherwise."""
    N, C, K, G, M, Kg, Kr, PD, PH, PW = _dims(g)
    P = PD * PH * PW
    if not _one_by_one(g):
        return False
    last = g.last
    if last and G == 1:
        gemm(dy.reshape((M, K)), x.reshape((M, C)), True, False, None, None, 0.0, alpha, beta,
             dw.reshape((K, C)), stream)
        return True
    if last or P < 128 or dtype_name(dy) in ("float16", "bfloat16"):  # (one rounding, not N)
        return False
    parts = gemm(dy.reshape((N * G, Kg, P)), x.reshape((N * G, Kr, P)), False, True, None,
                 None, 0.0, 1.0, 0.0, None, stream)
    reduce_tensor(parts.reshape((N, G * Kg, Kr)), "add", (0,), False, False, alpha=alpha,
                  beta=beta, out=dw.reshape((K, Kr)), stream=stream)
    return True


def backward_data(table, gemm, dy, w, dx, g, alpha, beta, stream):
    """dcols_g = rows_g @ W_g, then col2im gathers them into dx (four channels a thread
    where conv/col2im_quads.py takes the geometry; narrow channels a block an input
    row, conv/col2im_rows.py, with the filter as rows padded to 16 bytes so that
    16-bit GEMMs run on the tensor cores)."""
    N, C, K, G, M, Kg, Kr, *_ = _dims(g)
    dtype = dtype_name(dy)
    row = -(-Kr // 8) * 8 if dtype in ("float16", "bfloat16") else Kr
    if _words.usable(g) and _col2im_rows.usable(g, dtype, int(np.prod(dx.shape)), M * row):
        dcols = gemm(dy.reshape((M, K)), _words.filter_rows(w, row, stream).reshape((K, row)),
                     False, False, None, None, 0.0, 1.0, 0.0, None, stream)
        _col2im_rows.col2im(dcols, dx, g, row, alpha, beta, stream)
        return
    dcols = gemm(_rows(table, dy, g, stream), w.reshape((G, Kg, Kr)), False, False, None,
                 None, 0.0, 1.0, 0.0, None, stream)
    if _quads.usable(g, int(np.prod(dx.shape)), G * M * Kr):
        _quads.col2im(dcols, dx, g, alpha, beta, stream)
        return
    launch(table, "col2im", dtype_name(dy), int(np.prod(dx.shape)), stream, dcols, dx, *g,
            alpha, beta)


def forward(table, gemm, x, w, y, bias, residual, g, act, coef, alpha, beta, stream):
    """im2col, GEMM, epilogue; g: the 24 geometry ints; act: a mode index or -1."""
    N, C, K, G, M, Kg, Kr, PD, PH, PW = _dims(g)
    raw = gemm(_cols(table, x, g, stream), w.reshape((G, Kg, Kr)), False, True, None, None,
               0.0, 1.0, 0.0, None, stream)
    launch(table, "gemm_epilogue", dtype_name(x), int(np.prod(y.shape)), stream, raw, y,
            bias if bias is not None else y, residual if residual is not None else y, N, K,
            G, PD, PH, PW, g.last, int(bias is not None), int(residual is not None), act,
            coef, alpha, beta)

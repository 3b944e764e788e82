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
import dataclasses

import numpy as np
from numba import cuda

from ..runtime import variants
from ..runtime.memory.arrays import dtype_name, empty, size
from ..runtime.launch.grid import I, U32, landing, launch, split, split32, strides
from ..runtime.device_code.intrinsics import array_type, narrow, widen
from ..runtime.memory.strided import contiguous
from ..runtime.simulator import SIMULATOR
from ..runtime.variants import Variant
from . import col2im_quads as _quads, col2im_rows as _col2im_rows_kernel
from . import im2col_rows as _im2col_rows_kernel, im2col_words as _words
from .geometry import geometry
from ..tensor import add_tensor, reduce_tensor, transform_into


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

    @cuda.jit(device=True)
    def gathered(dcols, base, tap_stride, pos_stride, idd, ih, iw, T, R, S, PD, PH, PW, sd,
                 sh, sw, qd, qh, qw, dd, dh, dw, flip):
        # the sum, in a fixed order, of the columns' elements whose tap lands on input
        # position (idd, ih, iw): dcols[base + tap tap_stride + position pos_stride], tap
        # (t, r, s) flattened as stored (flipped for a convolution), position (pd, ph, pw)
        acc = ZERO
        for t in range(T):
            pd = landing(idd, qd, t, dd, sd, PD)
            for r in range(R if pd >= 0 else 0):
                ph = landing(ih, qh, r, dh, sh, PH)
                for s in range(S if ph >= 0 else 0):
                    pw = landing(iw, qw, s, dw, sw, PW)
                    if pw >= 0:
                        ft, fr, fs = (T - 1 - t, R - 1 - r, S - 1 - s) if flip else (t, r, s)
                        acc += widen(dcols[base + ((ft * R + fr) * S + fs) * tap_stride +
                                           ((pd * PH + ph) * PW + pw) * pos_stride])
        return acc

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

    def conv_im2col_t(x, cols, N, C, K, G, D, H, W, T, R, S, PD, PH, PW, sd, sh, sw, qd,
                      qh, qw, dd, dh, dw, flip, last, joint):
        # cols (N, G, Kr, P): each image's columns transposed, its P positions contiguous
        # (channels-first x read along its rows; a K-major operand over the positions);
        # joint: (G, Kr, N, P), every image's positions of a column in one row.
        # Block (BX, BY): threads over a plane's w and rows h, so a warp's lanes hold
        # consecutive positions (coalesced stores; loads along x's rows) and no lane
        # divides; grid (row blocks, Kr, N*G): a block's column row (image, group,
        # channel, tap) is split once, on the block's uniform values; a thread loops over
        # its rows' pd and the grid's row stride. (A thread an element split by 64-bit
        # divisions, then a thread's first position split by 32-bit ones and stepped,
        # bound this kernel on integer division: 16.1, then 8.1 ms of ResNet-50's float32
        # training step on an H100, ~300 GB/s.)
        Cg = I(U32(C) // U32(G))
        P, Kr = PD * PH * PW, Cg * T * R * S
        kx, ng = cuda.blockIdx.y, cuda.blockIdx.z
        n = I(U32(ng) // U32(G))
        g = ng - n * G
        _, c, t, r, s = split32(kx, Cg, T, R, S, False)
        if flip:
            t, r, s = T - 1 - t, R - 1 - r, S - 1 - s
        plane = (n * C + g * Cg + c) * D
        row = ((g * Kr + kx) * N + n) * P if joint else (ng * Kr + kx) * P
        ld, lh, lw = t * dd - qd, r * dh - qh, s * dw - qw  # the tap's offsets
        for pd in range(PD):
            idd = pd * sd + ld
            ph = cuda.blockIdx.x * cuda.blockDim.y + cuda.threadIdx.y
            while ph < PH:
                ih = ph * sh + lh
                inside = 0 <= idd < D and 0 <= ih < H
                at = ((plane + idd) * H + ih) * W
                out = row + (pd * PH + ph) * PW
                pw = cuda.threadIdx.x
                while pw < PW:
                    iw = pw * sw + lw
                    v = ZERO
                    if inside and 0 <= iw < W:
                        v = widen(x[at + iw])
                    cols[out + pw] = narrow(v, cols)
                    pw += cuda.blockDim.x
                ph += cuda.gridDim.x * cuda.blockDim.y

    def conv_col2im_t(dcols, dx, N, C, K, G, D, H, W, T, R, S, PD, PH, PW, sd, sh, sw, qd,
                      qh, qw, dd, dh, dw, flip, last, alpha, beta):
        # dx[n, g Cg + c, s] = alpha sum over the taps landing on s of dcols[n, g, (c, tap),
        # p] + beta dx: im2col_t's columns (N, G, Kr, P) gathered back, in a fixed order
        # (no atomics). Block and grid over dx's plane as im2col_t's over the columns'
        # (row blocks, Cg, N*G): no lane divides (landing: strides 1 and 2 without one)
        Cg = I(U32(C) // U32(G))
        P, Kr = PD * PH * PW, Cg * T * R * S
        c, ng = cuda.blockIdx.y, cuda.blockIdx.z
        n = I(U32(ng) // U32(G))
        g = ng - n * G
        plane = ((n * C + g * Cg + c) * D) * H * W
        rows = (ng * Kr + c * T * R * S) * P
        for idd in range(D):
            ih = cuda.blockIdx.x * cuda.blockDim.y + cuda.threadIdx.y
            while ih < H:
                iw = cuda.threadIdx.x
                while iw < W:
                    acc = gathered(dcols, rows, P, 1, idd, ih, iw, T, R, S, PD, PH, PW, sd,
                                   sh, sw, qd, qh, qw, dd, dh, dw, flip)
                    o = plane + (idd * H + ih) * W + iw
                    v = alpha * acc
                    if beta != ZERO:
                        v += beta * widen(dx[o])
                    dx[o] = narrow(v, dx)
                    iw += cuda.blockDim.x
                ih += cuda.gridDim.x * cuda.blockDim.y

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
            # kx: (tap, channel) channels-last, (channel, tap) channels-first
            acc = gathered(dcols, (g * M + n * PD * PH * PW) * Kr + (cl if last else
                           cl * T * R * S), Cg if last else 1, Kr, idd, ih, iw, T, R, S, PD,
                           PH, PW, sd, sh, sw, qd, qh, qw, dd, dh, dw, flip)
            v = alpha * acc
            if beta != ZERO:
                v += beta * widen(dx[i])
            dx[i] = narrow(v, dx)
            i += cuda.gridDim.x * cuda.blockDim.x

    return {"im2col": conv_im2col, "im2col_t": conv_im2col_t, "col2im_t": conv_col2im_t,
            "gemm_epilogue": conv_gemm_epilogue,
            "y_to_rows": conv_y_to_rows, "col2im": conv_col2im}


def signatures(t, ct, geom):
    a = f"{array_type(t)}[::1]"
    return {"im2col": f"void({a}, {a}, {geom}, int64)",
            "im2col_t": f"void({a}, {a}, {geom}, int64)",
            "col2im_t": f"void({a}, {a}, {geom}, {ct}, {ct})",
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


@dataclasses.dataclass
class Columns:
    """An im2col call as COLUMNS' variants take it: x's columns (G, M, row) for
    ConvGeometry g, row >= Kr with zero columns past Kr."""
    table: object
    x: object
    g: object
    row: int
    stream: object

    @property
    def item(self):
        dtype = dtype_name(self.x)
        return 2 if dtype in ("float16", "bfloat16") else np.dtype(dtype).itemsize


def _im2col(c):
    N, C, K, G, M, Kg, Kr, *_ = _dims(c.g)
    cols = empty(c.x, (G, M, c.row), dtype_name(c.x))
    launch(c.table, "im2col", dtype_name(c.x), G * M * c.row, c.stream, c.x, cols, *c.g, c.row)
    return cols


def _im2col_rows(c):
    cols = empty(c.x, (1, c.g.N * c.g.PH * c.g.PW, c.row), dtype_name(c.x))
    _im2col_rows_kernel.columns(c.x, cols, c.g, c.row, c.item, c.stream)
    return cols


COLUMNS = (  # in order of preference; run(c) returns the columns
    Variant("im2col_rows", lambda c: _words.usable(c.g) and c.g.N * c.g.PH * c.g.PW > 0 and
            _im2col_rows_kernel.usable(c.g, c.row, c.item), _im2col_rows,
            "im2col_rows.py: narrow channels (a pixel not a multiple of 8 bytes), a block an "
            "output row through shared memory"),
    Variant("im2col_words", lambda c: _words.usable(c.g),
            lambda c: _words.columns(c.x, c.g, c.row, c.stream),
            "im2col_words.py: 2-d channels-last of one group, whole words a thread"),
    Variant("im2col", lambda c: True, _im2col, "one element a thread, every geometry"),
)


def columns(table, x, g, stream, row=None):
    """x's im2col columns (G, M, row), row >= Kr (default Kr) with zero columns past Kr:
    the first usable variant of COLUMNS."""
    c = Columns(table, x, g, row or _dims(g)[6], stream)
    return variants.choose("conv", "im2col", COLUMNS, c).run(c)


COLUMN_BLOCK = 32 if SIMULATOR else 256  # im2col_t's and col2im_t's threads a block at
# most (the simulator runs a thread an OS thread)
COLUMN_ROWS = 4  # their rows a thread at most (a block's column row split, amortised)
MAX_GRID_YZ = 65535  # a grid's y and z extents: im2col_t's Kr rows and N*G images


def _plane_blocks(H, W):
    """((row blocks,), (BX, BY, 1)): im2col_t's and col2im_t's block over an H x W plane,
    BX threads along w (a loop past COLUMN_BLOCK), BY rows of them (a 7x7 plane: one
    block of 49 threads; 56x56: 56 x 4, each thread 4 rows of 14 blocks)."""
    bx = max(1, min(W, COLUMN_BLOCK))
    by = max(1, min(H, COLUMN_BLOCK // bx))
    return (max(1, -(-H // (by * COLUMN_ROWS))),), (bx, by, 1)


def forward_1x1_usable(g):
    """forward_1x1's calls: channels-first, a 1x1 filter at stride 1 without padding."""
    return not g.last and _one_by_one(g)


def forward_1x1(gemm, x, w, y, g, alpha, beta, stream):
    """Channels-first 1x1 at stride 1 without padding: y[n, g] = alpha W_g @ x[n, g] +
    beta y[n, g] over the P positions as stored, a batched GEMM (N*G products of
    (K/g, C/g) @ (C/g, P), W_g broadcast over n) that writes y in place. The columns
    path moves x twice (im2col's transpose), then the raw product twice more (its
    epilogue's transpose back to NCHW); this reads x and writes y once (float32's TF32
    modes: tf32_parts rounds x into a K-major copy first, one transpose)."""
    N, C, K, G, M, Kg, Kr, PD, PH, PW = _dims(g)
    P = PD * PH * PW
    gemm(w.reshape((G, Kg, Kr)), x.reshape((N, G, Kr, P)), False, False, None, None, 0.0,
         alpha, beta, y.reshape((N, G, Kg, P)), stream)


def backward_filter(table, gemm, dy, x, dw, g, alpha, beta, stream):
    """dW_g = rows_g^T @ cols_g: a GEMM over the M = N*P output positions. 16-bit rows
    of Kr columns that are not 16-byte multiples (a 7x7 stem's 147 = 3 channels x 49
    taps) are padded with zero columns to one: the tensor-core GEMM's TMA needs
    16-byte rows, the SIMT GEMM it fell to took 33 ms for ResNet-50's stem at batch
    32 (half the training step); the product's first Kr columns are then
    blended into dW. 1x1 filters at stride 1 without padding: backward_filter_1x1 (no
    im2col) where it takes them."""
    if filter_1x1_usable(g, dtype_name(dy)):
        return backward_filter_1x1(gemm, dy, x, dw, g, alpha, beta, stream)
    N, C, K, G, M, Kg, Kr, *_ = _dims(g)
    dwg = dw.reshape((G, Kg, Kr))
    rows = _rows(table, dy, g, stream)
    if dtype_name(x) not in ("float16", "bfloat16") or Kr % 8 == 0:
        gemm(rows, columns(table, x, g, stream), True, False, None, None, 0.0, alpha, beta,
             dwg, stream)
        return
    part = gemm(rows, columns(table, x, g, stream, -(-Kr // 8) * 8), True, False, None, None,
                0.0, alpha, 0.0, None, stream)
    add_tensor(contiguous(part[:, :, :Kr], stream), dwg, alpha=1.0, beta=beta, out=dwg,
               stream=stream)


def _one_by_one(g):
    """A 1x1 filter at stride 1 with no padding: the output positions are the input's."""
    N, C, K, G, M, Kg, Kr, PD, PH, PW = _dims(g)
    return Kr == C // G and (g.sd, g.sh, g.sw) == (1, 1, 1) and \
        not any((g.qd, g.qh, g.qw)) and (g.D, g.H, g.W) == (PD, PH, PW)


def data_1x1_usable(g):
    """backward_data_1x1's calls: channels-last, one group, 1x1 at stride 1, no padding."""
    return g.last and g.G == 1 and _one_by_one(g)


def backward_data_1x1(gemm, dy, w, dx, g, alpha, beta, stream):
    """dx = dy @ W over the M = N*P rows as stored, W (K, C) as stored (an MN-major B for
    the tensor cores), where the stride-1 path (conv's as_forward) copies W transposed
    first. Mode and dilation do not matter to one tap (`data_1x1_usable`)."""
    M = g.N * g.PD * g.PH * g.PW
    gemm(dy.reshape((M, g.K)), w.reshape((g.K, g.C)), False, False, None, None, 0.0, alpha,
         beta, dx.reshape((M, g.C)), stream)


def backward_data_1x1_channels_first(gemm, dy, w, dx, g, alpha, beta, stream):
    """forward_1x1's data gradient (`forward_1x1_usable`): dx[n, g] = alpha W_g^T @
    dy[n, g] + beta dx[n, g], a batched GEMM over the P positions as stored (the columns
    path copies dy into rows and gathers dx back by col2im)."""
    N, C, K, G, M, Kg, Kr, PD, PH, PW = _dims(g)
    P = PD * PH * PW
    gemm(w.reshape((G, Kg, Kr)), dy.reshape((N, G, Kg, P)), True, False, None, None, 0.0,
         alpha, beta, dx.reshape((N, G, Kr, P)), stream)


def filter_1x1_usable(g, dtype):
    """backward_filter_1x1's calls: a 1x1 filter with stride 1 and no padding;
    channels-first needs P >= 128 (a shorter reduction leaves the GEMM mostly epilogue
    and the N*K*C/g partials outweigh it) and float32/float64 (float16 partials would
    round N times)."""
    if not _one_by_one(g):
        return False
    P = g.PD * g.PH * g.PW
    return (g.last and g.G == 1) or \
        (not g.last and P >= 128 and dtype not in ("float16", "bfloat16"))


def backward_filter_1x1(gemm, dy, x, dw, g, alpha, beta, stream):
    """A 1x1 filter with stride 1 and no padding needs no im2col (`filter_1x1_usable`):
    channels-last (one group) dW = dy^T @ x over the M = N*P rows as stored;
    channels-first dW_g = sum over n of dy[n, g] @ x[n, g]^T, a batched GEMM (N*G
    products over P) whose products are summed in batch order (deterministic)."""
    N, C, K, G, M, Kg, Kr, PD, PH, PW = _dims(g)
    P = PD * PH * PW
    if g.last and G == 1:
        gemm(dy.reshape((M, K)), x.reshape((M, C)), True, False, None, None, 0.0, alpha, beta,
             dw.reshape((K, C)), stream)
        return
    parts = gemm(dy.reshape((N * G, Kg, P)), x.reshape((N * G, Kr, P)), False, True, None,
                 None, 0.0, 1.0, 0.0, None, stream)
    reduce_tensor(parts.reshape((N, G * Kg, Kr)), "add", (0,), False, False, alpha=alpha,
                  beta=beta, out=dw.reshape((K, Kr)), stream=stream)


def columns_t(table, x, g, stream, joint=False):
    """x's im2col columns of each image transposed, (N*G, Kr, P), position-contiguous
    rows (im2col_t; `forward_positions_usable`'s grid limits); joint: (G, Kr, N*P),
    a column's positions in every image in one row."""
    N, C, K, G, M, Kg, Kr, PD, PH, PW = _dims(g)
    P = PD * PH * PW
    cols = empty(x, (G, Kr, N * P) if joint else (N * G, Kr, P), dtype_name(x))
    k, sig = table["im2col_t", dtype_name(x)]
    grid, block = _plane_blocks(PH, PW)
    k.launch(sig, grid + (Kr, N * G), block, stream, x, cols, *g, int(joint))
    return cols


def forward_positions_usable(g, dtype):
    """forward_positions' calls: channels-first float32 with more than one tap, a stride
    or a padding (1x1 at stride 1: forward_1x1, no columns), within im2col_t's grid."""
    N, C, K, G, M, Kg, Kr, *_ = _dims(g)
    return not g.last and dtype == "float32" and not _one_by_one(g) and \
        Kr <= MAX_GRID_YZ and N * G <= MAX_GRID_YZ


def forward_positions(table, gemm, x, w, y, g, alpha, beta, stream):
    """y[n, g] = alpha W_g @ cols[n, g] + beta y[n, g] over image n's transposed columns
    (Kr, P): a batched GEMM that writes y in place, channels-first (the columns path's
    raw product and its transposing epilogue pass are not needed). Where the filters
    take few channels (a 3-channel stem, a strided 1x1) the columns are x's few items
    moved once more; TF32 modes copy them K-major (tf32_parts) as they did the
    columns path's."""
    N, C, K, G, M, Kg, Kr, PD, PH, PW = _dims(g)
    cols = columns_t(table, x, g, stream)
    gemm(w.reshape((G, Kg, Kr)), cols.reshape((N, G, Kr, PD * PH * PW)), False, False, None,
         None, 0.0, alpha, beta, y.reshape((N, G, Kg, PD * PH * PW)), stream)


def data_positions_usable(g, dtype):
    """backward_data_positions' calls: forward_positions' (channels-first float32, more
    than one tap, a stride or a padding), C/g and the planes within col2im_t's grid."""
    return forward_positions_usable(g, dtype) and g.C // g.G <= MAX_GRID_YZ and \
        g.D * g.H * g.W < 2 ** 31


def backward_data_positions(table, gemm, dy, w, dx, g, alpha, beta, stream):
    """dcols[n, g] = W_g^T @ dy[n, g] (Kr, P), image n's columns transposed, a batched
    GEMM over dy as stored; col2im_t gathers them into dx (the columns path copies dy
    into rows first and its col2im reads the columns across their rows)."""
    N, C, K, G, M, Kg, Kr, PD, PH, PW = _dims(g)
    P = PD * PH * PW
    dcols = gemm(w.reshape((G, Kg, Kr)), dy.reshape((N, G, Kg, P)), True, False, None, None,
                 0.0, 1.0, 0.0, None, stream)
    k, sig = table["col2im_t", dtype_name(dx)]
    grid, block = _plane_blocks(g.H, g.W)
    k.launch(sig, grid + (C // G, N * G), block, stream, dcols, dx, *g, alpha, beta)


def filter_positions_usable(g, dtype):
    """backward_filter_positions' calls: channels-first float32 within im2col_t's grid,
    but 1x1 filters at stride 1 over P >= 128 positions (backward_filter_1x1 takes them
    with x as stored, no columns)."""
    N, C, K, G, M, Kg, Kr, PD, PH, PW = _dims(g)
    if g.last or dtype != "float32" or Kr > MAX_GRID_YZ or N * G > MAX_GRID_YZ:
        return False
    return not _one_by_one(g) or PD * PH * PW < 128


def backward_filter_positions(table, gemm, dy, x, dw, g, alpha, beta, stream):
    """dW_g = sum over n of dy[n, g] @ cols[n, g]^T over the transposed columns
    (im2col_t: positions contiguous, as dy's are in channels-first), both operands
    K-major over the positions as written (TF32 modes take them without tf32_parts'
    transposed copies; the columns path's rows and columns are MN-major there), in one
    of two forms, whichever moves fewer extra items:
    - per image: a batched GEMM, the N products (N K Kr partials) summed in batch order;
    - joint (few positions, many columns: ResNet's 7x7 layers): dy copied to (G, K/g,
      N P) and the columns written (G, Kr, N P), one GEMM over all N P positions (the
      copy's N K P items, no partials).
    Deterministic either way."""
    N, C, K, G, M, Kg, Kr, PD, PH, PW = _dims(g)
    P = PD * PH * PW
    if Kr <= P:  # (the partials' N K Kr items against dy's copy's N K P)
        cols = columns_t(table, x, g, stream)
        parts = gemm(dy.reshape((N * G, Kg, P)), cols, False, True, None, None, 0.0, 1.0, 0.0,
                     None, stream)
        reduce_tensor(parts.reshape((N, G * Kg, Kr)), "add", (0,), False, False, alpha=alpha,
                      beta=beta, out=dw.reshape((K, Kr)), stream=stream)
        return
    cols = columns_t(table, x, g, stream, joint=True)
    rows = empty(dy, (G, Kg, N * P), dtype_name(dy))
    transform_into(dy, (N, G, Kg, P), (1, 2, 0, 3), rows, 1.0, 0.0, stream)
    gemm(rows, cols, False, True, None, None, 0.0, alpha, beta, dw.reshape((G, Kg, Kr)), stream)


def filter_rows(table, w, row, stream):
    """w (K, *spatial, C) channels-last, any spatial rank (1-3), as (1, K, row): each
    filter's taps-major, zero past them - the im2col of one window covering the whole
    filter (a K-image batch of the filter's spatial size, stride 1)."""
    shape = tuple(int(v) for v in w.shape)
    C, nd = shape[-1], len(shape) - 2
    gw = geometry(shape, (1,) + shape[1:-1] + (C,), (1,) * nd, ((0, 0),) * nd, (1,) * nd, 1,
                  "cross_correlation", True)
    return columns(table, w, gw, stream, row)


@dataclasses.dataclass
class Col2im:
    """The data gradient's GEMM and col2im as COL2IM's variants take them."""
    table: object
    gemm: object
    dy: object
    w: object
    dx: object
    g: object
    alpha: float
    beta: float
    stream: object

    @property
    def row(self):
        """A column row's length: Kr, padded to 16 bytes for 16-bit data (the
        tensor-core GEMM's TMA rows)."""
        Kr = _dims(self.g)[6]
        return -(-Kr // 8) * 8 if dtype_name(self.dy) in ("float16", "bfloat16") else Kr


def _dcols(c):
    """dcols_g = rows_g @ W_g (G, M, Kr)."""
    N, C, K, G, M, Kg, Kr, *_ = _dims(c.g)
    return c.gemm(_rows(c.table, c.dy, c.g, c.stream), c.w.reshape((G, Kg, Kr)), False, False,
                  None, None, 0.0, 1.0, 0.0, None, c.stream)


def _col2im_rows(c):
    M, K = _dims(c.g)[4], c.g.K
    dcols = c.gemm(c.dy.reshape((M, K)),
                   filter_rows(c.table, c.w, c.row, c.stream).reshape((K, c.row)), False, False,
                   None, None, 0.0, 1.0, 0.0, None, c.stream)
    _col2im_rows_kernel.col2im(dcols, c.dx, c.g, c.row, c.alpha, c.beta, c.stream)


def _col2im(c):
    launch(c.table, "col2im", dtype_name(c.dy), size(c.dx), c.stream, _dcols(c), c.dx, *c.g,
           c.alpha, c.beta)


COL2IM = (  # in order of preference
    Variant("col2im_rows", lambda c: _words.usable(c.g) and _col2im_rows_kernel.usable(
        c.g, dtype_name(c.dy), size(c.dx), _dims(c.g)[4] * c.row), _col2im_rows,
            "col2im_rows.py: narrow channels, a block an input row, the filter as rows "
            "padded to 16 bytes (16-bit GEMMs on the tensor cores)"),
    Variant("col2im_quads", lambda c: _quads.usable(c.g, size(c.dx),
                                                    c.g.G * _dims(c.g)[4] * _dims(c.g)[6]),
            lambda c: _quads.col2im(_dcols(c), c.dx, c.g, c.alpha, c.beta, c.stream),
            "col2im_quads.py: 2-d channels-last of one group, C % 4 == 0: four channels a "
            "thread"),
    Variant("col2im", lambda c: True, _col2im, "one dx element a thread, every geometry"),
)


def backward_data(table, gemm, dy, w, dx, g, alpha, beta, stream):
    """dcols_g = rows_g @ W_g, then col2im gathers them into dx: COL2IM's first usable
    variant."""
    c = Col2im(table, gemm, dy, w, dx, g, alpha, beta, stream)
    variants.choose("conv", "col2im", COL2IM, c).run(c)


def forward(table, gemm, x, w, y, bias, residual, g, act, coef, alpha, beta, stream):
    """im2col, GEMM, epilogue; g: the 24 geometry ints; act: a mode index or -1."""
    N, C, K, G, M, Kg, Kr, PD, PH, PW = _dims(g)
    raw = gemm(columns(table, x, g, stream), w.reshape((G, Kg, Kr)), False, True, None, None,
               0.0, 1.0, 0.0, None, stream)
    launch(table, "gemm_epilogue", dtype_name(x), int(np.prod(y.shape)), stream, raw, y,
            bias if bias is not None else y, residual if residual is not None else y, N, K,
            G, PD, PH, PW, g.last, int(bias is not None), int(residual is not None), act,
            coef, alpha, beta)

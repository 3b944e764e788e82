"""layer_norm / rms_norm / group_norm (instance_norm: a group a channel) on the GPU. A
row is the elements normalised together (layer/rms: the trailing axes; group: (n,
group), NCHW or NHWC, addressed through `_row_walk`). All sums deterministic.

- layer/rms norm, rows up to 32768 (forward) / 16384 (dx): the row held in registers
  (norm/rows.py; float32 8 B an element forward, 12 B backward).
- group/instance norm, channels first, planes of a multiple of 4, aligned: batch
  norm's plane kernels over re-shaped views (norm/group_planes.py).
- otherwise a block a row: forward sums x (layer_norm) for the mean, then (x -
  mean)^2 (two-pass: exact for mean 1e4, std 1 in float32), then writes y; dx sums g
  = dy*scale and g*xhat, then writes dx. Rows of a few thousand elements stay in L1/L2
  between the passes.
- dscale/dbias: layer/rms norm rows of 1k-4k inside the dx kernel (a block loops over
  rows keeping per-column partials in shared memory; reduce_tensor sums the blocks'
  partial rows in order: dy and x read once); other layer/rms rows, chunk partials
  over blocks of rows (8 B more); group norm, chunk partials over samples (channels
  first a block a channel, channels last lanes on 32 channels), summed in order (one
  thread a channel took 70 ms for 256 MiB on the H200).
"""
import math

import numpy as np

from ..runtime.arrays import dtype_name, empty, vector_aligned
from ..runtime.device import sm_count
from ..softmax import ROWS_BLOCK, rows_config
from ..tensor import reduce_tensor
from . import group_planes as _gn
from . import rows as _rows
# The knob that forces layer/rms rows onto the general block-a-row kernels (the
# register-row kernels of rows.py off): tests and A/B runs; clear plans after setting it.
GENERAL_ONLY = False

from .kernels import (BLOCK, FUSED_LANES_PER_SM, FUSED_V, GN_TARGET_BLOCKS,  # noqa: F401
                      KERNELS as _KERNELS, MAX_GRID, PLMAX)



def _layout_of(x, ndim):
    """(N, C, G, HW, last) that make layer/rms norm over the last ndim axes a grouped
    normalisation: rows of L = prod(tail) elements, one 'channel' per element."""
    shape = tuple(int(s) for s in x.shape)
    lead, tail = shape[:len(shape) - ndim], shape[len(shape) - ndim:]
    return (math.prod(lead), math.prod(tail), 1, 1, 0), lead, tail


def grouped_layout(x, groups, last):
    """(N, C, G, HW, last) of an (N, C, *S) or (N, *S, C) tensor in `groups` groups."""
    shape = tuple(int(s) for s in x.shape)
    C = shape[-1] if last else shape[1]
    return (shape[0], C, groups, math.prod(shape) // max(1, shape[0] * C), int(last))


def forward(x, scale, bias, geo, stats_shape, eps, out, stream, centred):
    """y and statistics (rows = N*G); geo = (N, C, G, HW, last)."""
    dtype = dtype_name(x)
    ct = "float64" if dtype == "float64" else "float32"
    N, C, G, HW, last = geo
    rows, L = N * G, C // G * HW
    y = out if out is not None else empty(x, x.shape, dtype)
    st1, st2 = empty(x, stats_shape, ct), empty(x, stats_shape, ct)
    if rows and L:
        if rows > MAX_GRID:
            from ...errors import NotSupportedError
            raise NotSupportedError(f"{rows} rows exceed the grid limit {MAX_GRID}")
        sc, bi = (scale if scale is not None else x), (bias if bias is not None else x)
        flags = (int(centred), int(scale is not None), int(bias is not None))
        cfg = rows_config(L, False, False, ct == "float64") if G == 1 and HW == 1 and \
            not GENERAL_ONLY else None
        if cfg is not None:  # layer/rms norm: the row in registers
            V, Gl = cfg
            aligned = int(L % 4 == 0 and vector_aligned(x, y, sc, bi))
            block = Gl if Gl > 32 else ROWS_BLOCK
            k, sig = _KERNELS[f"rows_v{V}", dtype]
            k.launch(sig, -(-rows // (block // Gl)), block, stream, x, y, sc, bi, st1, st2,
                     rows, L, Gl, eps, *flags, aligned)
        elif centred and _gn.usable(geo, vector_aligned(x, y)):
            _gn.forward(x, y, scale, bias, st1, st2, geo, eps, stream)
        else:
            k, sig = _KERNELS["fwd", dtype]
            k.launch(sig, rows, BLOCK, stream, x, y, sc, bi, st1, st2, C, G, HW, last, eps,
                     *flags)
    return (y, st1, st2) if centred else (y, st2)


def backward(dy, x, st1, st2, scale, geo, param_shape, out, stream, centred):
    dtype = dtype_name(x)
    N, C, G, HW, last = geo
    rows, L = N * G, C // G * HW
    dx, dscale, dbias = out if out is not None else (
        empty(x, x.shape, dtype), empty(x, param_shape, dtype), empty(x, param_shape, dtype))
    sc = scale if scale is not None else x
    cfg = rows_config(L, True, False, dtype == "float64") if G == 1 and HW == 1 and \
        not GENERAL_ONLY else None
    if rows and L and cfg is None and centred and _gn.usable(geo, vector_aligned(dy, x, dx)):
        _gn.backward(dy, x, st1, st2, scale, dx, dscale, dbias, geo, stream)
        return dx, dscale, dbias
    if rows and L and cfg is not None:  # layer/rms norm: dy and x in registers
        V, Gl = cfg
        aligned = int(L % 4 == 0 and vector_aligned(dy, x, sc, dx))
        if _fused_params(dy, x, st1, st2, sc, dx, dscale, dbias, rows, L, Gl, centred,
                         scale is not None, aligned, stream):
            return dx, dscale, dbias
        block = Gl if Gl > 32 else ROWS_BLOCK
        k, sig = _KERNELS[f"rows_bwd_v{V}", dtype]
        k.launch(sig, -(-rows // (block // Gl)), block, stream, dy, x, st1, st2, sc, dx, rows,
                 L, Gl, int(centred), int(scale is not None), aligned)
    elif rows and L:
        k, sig = _KERNELS["bwd", dtype]
        k.launch(sig, rows, BLOCK, stream, dy, x, st1, st2, sc, dx, C, G, HW, last,
                 int(centred), int(scale is not None))
    if G == 1 and HW == 1 and rows and L:  # layer/rms norm: chunk partials over rows
        ct = dtype_name(st2)
        nch = -(-rows // (_rows.CY * _rows.R))
        p1, p2 = empty(x, (nch * L,), ct), empty(x, (nch * L,), ct)
        k, sig = _KERNELS["params_partials", dtype]
        k.launch(sig, (-(-L // _rows.CX), min(nch, 65535), 1), _rows.CX * _rows.CY, stream,
                 dy, x, st1, st2, p1, p2, rows, L, int(centred))
        k, sig = _KERNELS["params_final", dtype]
        k.launch(sig, -(-L // BLOCK), BLOCK, stream, p1, p2, dscale, dbias, nch, L)
    elif C:  # group norm: chunk partials over samples, then their sum in order
        ct = dtype_name(st2)
        gx = -(-C // 32) if last else C
        nper = -(-N // max(1, min(N, -(-GN_TARGET_BLOCKS // gx))))
        nch = -(-N // nper)
        p1, p2 = empty(x, (nch * C,), ct), empty(x, (nch * C,), ct)
        k, sig = _KERNELS["gn_params_partials", dtype]
        k.launch(sig, (gx, nch, 1), BLOCK, stream, dy, x, st1, st2, p1, p2, N, C, G, HW, last,
                 int(centred), nper)
        k, sig = _KERNELS["params_final", dtype]
        k.launch(sig, -(-C // BLOCK), BLOCK, stream, p1, p2, dscale, dbias, nch, C)
    return dx, dscale, dbias


def _fused_params(dy, x, st1, st2, sc, dx, dscale, dbias, rows, L, Gl, centred,
                  has_scale, aligned, stream):
    """dx, dscale and dbias in one pass over dy and x (a block a row looping over rows,
    per-block partial rows summed by reduce_tensor in block order); False when the
    row's shape or dtype does not take it."""
    dtype = dtype_name(x)
    ct = "float64" if dtype == "float64" else "float32"
    G = 1 << max(0, -(-L // (4 * FUSED_V)) - 1).bit_length()  # pow2 >= L / 16
    key = f"rows_bwdp_g{G}", dtype
    if Gl <= 32 or L > PLMAX[ct] or key not in _KERNELS:
        return False
    nb = min(rows, FUSED_LANES_PER_SM // G * sm_count())
    # partials in the compute type, summed into the storage dtype (rounded once)
    p1, p2 = empty(x, (nb, L), ct), empty(x, (nb, L), ct)
    k, sig = _KERNELS[key]
    k.launch(sig, nb, G, stream, dy, x, st1, st2, sc, dx, rows, L, G, int(centred),
             int(has_scale), aligned, p1, p2)
    for p, d in ((p1, dscale), (p2, dbias)):
        reduce_tensor(p, "add", (0,), False, False, alpha=1.0, beta=0.0, out=d.reshape(L),
                      stream=stream)
    return True


def layer_norm(x, scale, bias, ndim, eps, *, out, stream):
    geo, lead, _ = _layout_of(x, ndim)
    return forward(x, scale, bias, geo, lead, eps, out, stream, True)


def rms_norm(x, scale, bias, ndim, eps, *, out, stream):
    geo, lead, _ = _layout_of(x, ndim)
    return forward(x, scale, bias, geo, lead, eps, out, stream, False)


def layer_norm_backward(dy, x, mean, invstd, scale, ndim, *, out, stream):
    geo, _, tail = _layout_of(x, ndim)
    return backward(dy, x, mean, invstd, scale, geo, tail, out, stream, True)


def rms_norm_backward(dy, x, invrms, scale, ndim, *, out, stream):
    geo, _, tail = _layout_of(x, ndim)
    return backward(dy, x, invrms, invrms, scale, geo, tail, out, stream, False)


def group_norm(x, groups, scale, bias, eps, last, *, out, stream):
    geo = grouped_layout(x, groups, last)
    return forward(x, scale, bias, geo, (geo[0], groups), eps, out, stream, True)


def group_norm_backward(dy, x, mean, invstd, scale, groups, last, *, out, stream):
    geo = grouped_layout(x, groups, last)
    return backward(dy, x, mean, invstd, scale, geo, (geo[1],), out, stream, True)

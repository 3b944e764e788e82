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
import dataclasses
import math

from ..runtime import variants
from ..runtime.memory.arrays import dtype_name, empty, vector_aligned
from ..runtime.device import sm_count
from ..runtime.variants import Variant
from ..softmax import ROWS_BLOCK, rows_config
from ..tensor import reduce_tensor
from . import group_planes as _gn
from . import rows as _rows

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


@dataclasses.dataclass
class Call:
    """One call as the variants take it: geo = (N, C, G, HW, last), rows = N*G of L
    elements; st1, st2 the statistics (mean and inverse deviation; rms norm: both the
    inverse rms); backward: dy and the gradients too."""
    x: object
    scale: object
    bias: object
    st1: object
    st2: object
    geo: tuple
    eps: float
    stream: object
    centred: bool
    y: object = None
    dy: object = None
    dx: object = None
    dscale: object = None
    dbias: object = None

    @property
    def dtype(self):
        return dtype_name(self.x)

    @property
    def rows(self):
        return self.geo[0] * self.geo[2]

    @property
    def L(self):
        N, C, G, HW, last = self.geo
        return C // G * HW

    @property
    def sc(self):
        return self.scale if self.scale is not None else self.x

    def config(self, backward):
        """rows.py's (V, lanes) for a layer/rms norm row, or None (too long, or grouped)."""
        N, C, G, HW, last = self.geo
        return rows_config(self.L, backward, False, self.dtype == "float64") \
            if G == 1 and HW == 1 else None


# ---- the forward's variants, in order of preference
def _rows_forward(c):
    V, Gl = c.config(False)
    bi = c.bias if c.bias is not None else c.x
    aligned = int(c.L % 4 == 0 and vector_aligned(c.x, c.y, c.sc, bi))
    block = Gl if Gl > 32 else ROWS_BLOCK
    k, sig = _KERNELS[f"rows_v{V}", c.dtype]
    k.launch(sig, -(-c.rows // (block // Gl)), block, c.stream, c.x, c.y, c.sc, bi, c.st1,
             c.st2, c.rows, c.L, Gl, c.eps, int(c.centred), int(c.scale is not None),
             int(c.bias is not None), aligned)


def _block_forward(c):
    N, C, G, HW, last = c.geo
    k, sig = _KERNELS["fwd", c.dtype]
    k.launch(sig, c.rows, BLOCK, c.stream, c.x, c.y, c.sc,
             c.bias if c.bias is not None else c.x, c.st1, c.st2, C, G, HW, last, c.eps,
             int(c.centred), int(c.scale is not None), int(c.bias is not None))


FORWARD = (
    Variant("rows", lambda c: c.config(False) is not None, _rows_forward,
            "rows.py: a layer/rms norm row held in registers (up to 32768 elements)"),
    Variant("group_planes", lambda c: c.centred and _gn.usable(c.geo, vector_aligned(c.x, c.y)),
            lambda c: _gn.forward(c.x, c.y, c.scale, c.bias, c.st1, c.st2, c.geo, c.eps,
                                  c.stream),
            "group_planes.py: channels-first group norm, planes of a multiple of 4, "
            "batch norm's plane kernels"),
    Variant("block_a_row", lambda c: True, _block_forward,
            "a block a row, two passes over x for the statistics, then y"),
)


def forward(x, scale, bias, geo, stats_shape, eps, out, stream, centred):
    """y and statistics (rows = N*G); geo = (N, C, G, HW, last)."""
    dtype = dtype_name(x)
    ct = "float64" if dtype == "float64" else "float32"
    y = out if out is not None else empty(x, x.shape, dtype)
    c = Call(x, scale, bias, empty(x, stats_shape, ct), empty(x, stats_shape, ct), geo, eps,
             stream, centred, y=y)
    if c.rows and c.L:
        if c.rows > MAX_GRID:
            from ...errors import NotSupportedError
            raise NotSupportedError(f"{c.rows} rows exceed the grid limit {MAX_GRID}")
        variants.choose("norm", "norm", FORWARD, c).run(c)
    return (y, c.st1, c.st2) if centred else (y, c.st2)


# ---- the backward's variants: dx, dscale and dbias
def _fused_key(c):
    """rows.py's fused kernel for the row length (a pow2 >= L / 16 lanes), or None."""
    V, Gl = c.config(True)
    G = 1 << max(0, -(-c.L // (4 * FUSED_V)) - 1).bit_length()
    key = f"rows_bwdp_g{G}", c.dtype
    ct = "float64" if c.dtype == "float64" else "float32"
    return key if Gl > 32 and c.L <= PLMAX[ct] and key in _KERNELS else None


def _rows_aligned(c):
    return int(c.L % 4 == 0 and vector_aligned(c.dy, c.x, c.sc, c.dx))


def _rows_fused(c):
    """dx, dscale and dbias in one pass over dy and x (a block a row looping over rows,
    per-block partial rows summed by reduce_tensor in block order)."""
    ct = "float64" if c.dtype == "float64" else "float32"
    key = _fused_key(c)
    G = int(key[0].rpartition("g")[2])
    nb = min(c.rows, FUSED_LANES_PER_SM // G * sm_count())
    # partials in the compute type, summed into the storage dtype (rounded once)
    p1, p2 = empty(c.x, (nb, c.L), ct), empty(c.x, (nb, c.L), ct)
    k, sig = _KERNELS[key]
    k.launch(sig, nb, G, c.stream, c.dy, c.x, c.st1, c.st2, c.sc, c.dx, c.rows, c.L, G,
             int(c.centred), int(c.scale is not None), _rows_aligned(c), p1, p2)
    for p, d in ((p1, c.dscale), (p2, c.dbias)):
        reduce_tensor(p, "add", (0,), False, False, alpha=1.0, beta=0.0, out=d.reshape(c.L),
                      stream=c.stream)


def _rows_backward(c):
    V, Gl = c.config(True)
    block = Gl if Gl > 32 else ROWS_BLOCK
    k, sig = _KERNELS[f"rows_bwd_v{V}", c.dtype]
    k.launch(sig, -(-c.rows // (block // Gl)), block, c.stream, c.dy, c.x, c.st1, c.st2, c.sc,
             c.dx, c.rows, c.L, Gl, int(c.centred), int(c.scale is not None),
             _rows_aligned(c))
    _parameter_gradients(c)


def _block_backward(c):
    N, C, G, HW, last = c.geo
    k, sig = _KERNELS["bwd", c.dtype]
    k.launch(sig, c.rows, BLOCK, c.stream, c.dy, c.x, c.st1, c.st2, c.sc, c.dx, C, G, HW,
             last, int(c.centred), int(c.scale is not None))
    _parameter_gradients(c)


def _parameter_gradients(c, by_rows=True):
    """dscale and dbias apart from dx: chunk partials, summed in order (by_rows: a
    layer/rms norm's over rows; else over samples, as group norm's)."""
    N, C, G, HW, last = c.geo
    ct = dtype_name(c.st2)
    if by_rows and G == 1 and HW == 1:  # layer/rms norm: chunk partials over rows
        nch = -(-c.rows // (_rows.CY * _rows.R))
        p1, p2 = empty(c.x, (nch * c.L,), ct), empty(c.x, (nch * c.L,), ct)
        k, sig = _KERNELS["params_partials", c.dtype]
        k.launch(sig, (-(-c.L // _rows.CX), min(nch, 65535), 1), _rows.CX * _rows.CY,
                 c.stream, c.dy, c.x, c.st1, c.st2, p1, p2, c.rows, c.L, int(c.centred))
        k, sig = _KERNELS["params_final", c.dtype]
        k.launch(sig, -(-c.L // BLOCK), BLOCK, c.stream, p1, p2, c.dscale, c.dbias, nch, c.L)
        return
    # group norm: chunk partials over samples, then their sum in order
    gx = -(-C // 32) if last else C
    nper = -(-N // max(1, min(N, -(-GN_TARGET_BLOCKS // gx))))
    nch = -(-N // nper)
    p1, p2 = empty(c.x, (nch * C,), ct), empty(c.x, (nch * C,), ct)
    k, sig = _KERNELS["gn_params_partials", c.dtype]
    k.launch(sig, (gx, nch, 1), BLOCK, c.stream, c.dy, c.x, c.st1, c.st2, p1, p2, N, C, G, HW,
             last, int(c.centred), nper)
    k, sig = _KERNELS["params_final", c.dtype]
    k.launch(sig, -(-C // BLOCK), BLOCK, c.stream, p1, p2, c.dscale, c.dbias, nch, C)


BACKWARD = (
    Variant("rows_fused", lambda c: c.config(True) is not None and _fused_key(c) is not None,
            _rows_fused,
            "rows.py: layer/rms rows of 1k-4k, dx and per-block parameter partials in one "
            "pass (dy and x read once)"),
    Variant("rows", lambda c: c.config(True) is not None, _rows_backward,
            "rows.py: the row in registers (up to 16384 elements), then the parameters' "
            "chunk partials"),
    Variant("group_planes", lambda c: c.centred and c.config(True) is None and
            _gn.usable(c.geo, vector_aligned(c.dy, c.x, c.dx)),
            lambda c: _gn.backward(c.dy, c.x, c.st1, c.st2, c.scale, c.dx, c.dscale, c.dbias,
                                   c.geo, c.stream),
            "group_planes.py: channels-first group norm, batch norm's plane kernels"),
    Variant("block_a_row", lambda c: True, _block_backward,
            "a block a row: sums of dy*scale and of its product with xhat, then dx; the "
            "parameters' chunk partials"),
)


def backward(dy, x, st1, st2, scale, geo, param_shape, out, stream, centred):
    dtype = dtype_name(x)
    dx, dscale, dbias = out if out is not None else (
        empty(x, x.shape, dtype), empty(x, param_shape, dtype), empty(x, param_shape, dtype))
    c = Call(x, scale, None, st1, st2, geo, 0.0, stream, centred, dy=dy, dx=dx,
             dscale=dscale, dbias=dbias)
    if c.rows and c.L:
        variants.choose("norm", "norm_backward", BACKWARD, c).run(c)
    elif geo[1]:  # (no rows, or empty ones: the parameters' zeros, over the samples)
        _parameter_gradients(c, by_rows=False)
    return dx, dscale, dbias


def forced(name):
    """Inside (this thread): layer, rms and group norm run the variant `name` (of
    FORWARD or BACKWARD), or raise NotSupportedError where its kernels cannot take a call
    (runtime/variants.py)."""
    return variants.forced("norm", name, variants.names(FORWARD, BACKWARD))


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

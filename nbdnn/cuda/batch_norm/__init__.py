"""Batch normalisation on the GPU; the formulas are in nbdnn/cpu/batch_norm.py.

x is addressed as (N, C, L): element (n, c, l) at (n*C + c)*L + l in the planes layout
(NCHW), (n*L + l)*C + c in the columns layout (NHWC; per_activation is columns with
C = an image's size, L = 1). Kernels (traffic per element, float32):
- statistics (batch_norm/sums.py): chunk partials then an in-order merge; reads x once (4 B).
- apply: a thread 4 consecutive elements, 16-byte loads and stores when the layout
  lets 4 elements share a channel (planes, L % 4 == 0) or take 4 consecutive channels
  (columns, C % 4 == 0) and the pointers are aligned; act(scale*(x-mean)*invstd + bias
  + z), blended. Reads x (and z, and y when beta != 0), writes y: 8 B.
  Training = statistics + apply (12 B against 8 B that must move: at most 67% of copy
  bandwidth); inference = apply alone.
- backward sums (batch_norm/sums.py): sums of dyh and dyh*xhat (dyh = dy*act'(pre), pre
  recomputed), chunk partials then in order: reads dy and x (8 B); dbias, dscale.
- backward dx: as apply, reads dy and x, writes dx (and dz): 12 B. Backward moves 20 B
  against 12 B that must: at most 60% of copy bandwidth.
Every sum runs in a fixed order (block trees, chunks merged in order, no atomics):
deterministic. Channels-first tensors with planes of a multiple of 4 elements take
_bn_planes' kernels for all four (16-byte vectors, multiply-high index splits; H200:
inference 98% of copy, training and backward 61-62% against two-pass ceilings of
67% and 60%).
"""
import math
from typing import NamedTuple

import numpy as np
from numba import cuda, float32, float64

from ..runtime import variants
from ..runtime.simulator import SIMULATOR
from ..runtime.variants import Variant
from .. import activation as _act
from . import columns as _bn_columns, planes as _bn_planes, sums as _bn_sums
from ..runtime.device import sm_count
from ..runtime.memory.arrays import dtype_name, empty, vector_aligned
from ..runtime.device_code.intrinsics import array_type, load4, narrow, narrow4, store4, widen
from ..runtime.launch.kernel import Kernel
from ..runtime.device_code.block_reduce import device_functions
from ..._vocab import BF16_DTYPES as DTYPES

BLOCK = 32 if SIMULATOR else 256


def _chains(nt):
    """act_fn(x, mode, coef) and its derivative act_grad over nbdnn's activation modes."""
    return _act.fused(nt), _act.fused(nt, derivative=True)


def _kernels(CT, nt):
    act_fn, act_grad = _chains(nt)
    ZERO, ONE = CT(0), CT(1)

    @cuda.jit(device=True)
    def apply_coefs(scale, bias, mu, inv, co, c, has_scale, has_bias):
        """co[3c:3c+3] = (mean, scale*invstd, bias): the apply kernel's channel terms."""
        co[3 * c] = mu
        co[3 * c + 1] = inv * (widen(scale[c]) if has_scale else ONE)
        co[3 * c + 2] = widen(bias[c]) if has_bias else ZERO

    def bn_coefs(scale, bias, mean, var, co, C, eps, has_scale, has_bias):
        # inference: invstd from the given variance, once a channel
        c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if c < C:
            apply_coefs(scale, bias, mean[c], ONE / math.sqrt(widen(var[c]) + eps), co, c,
                        has_scale, has_bias)

    @cuda.jit(device=True)
    def channel(e, C, L, columns):
        return e % C if columns else (e // L) % C

    @cuda.jit(device=True)
    def out_value(xv, zv, yv, m, k, b, has_z, act, coef, alpha, beta):
        """alpha * act((x - m)*k + b + z) + beta * y (m, k, b: apply_coefs)."""
        v = (widen(xv) - m) * k + b
        if has_z:
            v += widen(zv)
        if act >= 0:
            v = act_fn(v, act, coef)
        r = alpha * v
        if beta != ZERO:
            r += beta * widen(yv)
        return r

    @cuda.jit(device=True)
    def dx_value(dyv, xv, zv, m, inv, sc, b, sg, sgx, M, has_z, act, coef):
        """(dx, dz) of one element; m..sgx: _bn_sums.bwd_final's six channel terms."""
        xhat = (widen(xv) - m) * inv
        g = widen(dyv)
        if act >= 0:
            p = xhat * sc + b
            if has_z:
                p += widen(zv)
            g *= act_grad(p, act, coef)
        return sc * inv / M * (M * g - sg - xhat * sgx), g

    @cuda.jit(device=True)
    def terms(co, c, n, j, columns):
        """Term j of the n-term channel record of c (4 consecutive channels' records
        for columns: c + e, e = 0..3, returned as 4 values)."""
        a = co[n * c + j]
        if not columns:
            return a, a, a, a
        return a, co[n * (c + 1) + j], co[n * (c + 2) + j], co[n * (c + 3) + j]

    def bn_apply(x, y, z, co, N, C, L, columns, has_z, act, coef, alpha, beta, vec):
        # a thread 4 consecutive elements: one 16-byte access per array when vec (the 4
        # share a channel (planes) or take 4 consecutive ones (columns)). Every load is
        # unconditional (z is x when there is none) so that all are in flight at once.
        total = N * C * L
        g = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        while 4 * g < total:
            e = 4 * g
            if vec != 0:
                x0, x1, x2, x3 = load4(x, g)
                z0, z1, z2, z3 = load4(z, g)
                y0 = y1 = y2 = y3 = ZERO
                if beta != ZERO:
                    a0, a1, a2, a3 = load4(y, g)
                    y0, y1, y2, y3 = widen(a0), widen(a1), widen(a2), widen(a3)
                # every channel term loaded before any arithmetic: all in flight at once
                c = channel(e, C, L, columns)
                m0, m1, m2, m3 = terms(co, c, 3, 0, columns)
                k0, k1, k2, k3 = terms(co, c, 3, 1, columns)
                b0, b1, b2, b3 = terms(co, c, 3, 2, columns)
                r0 = out_value(x0, z0, y0, m0, k0, b0, has_z, act, coef, alpha, beta)
                r1 = out_value(x1, z1, y1, m1, k1, b1, has_z, act, coef, alpha, beta)
                r2 = out_value(x2, z2, y2, m2, k2, b2, has_z, act, coef, alpha, beta)
                r3 = out_value(x3, z3, y3, m3, k3, b3, has_z, act, coef, alpha, beta)
                store4(y, g, narrow4((r0, r1, r2, r3), y))
            else:
                for i in range(e, min(e + 4, total)):
                    c = channel(i, C, L, columns)
                    y[i] = narrow(out_value(x[i], z[i], widen(y[i]) if beta != ZERO else ZERO,
                                            co[3 * c], co[3 * c + 1], co[3 * c + 2], has_z,
                                            act, coef, alpha, beta), y)
            g += cuda.gridDim.x * cuda.blockDim.x

    def bn_bwd_dx(dy, x, z, cb, dx, dz, N, C, L, columns, has_z, act, coef, vec):
        total = N * C * L
        M = CT(N * L)
        g = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        while 4 * g < total:
            e = 4 * g
            if vec != 0:
                d0, d1, d2, d3 = load4(dy, g)
                x0, x1, x2, x3 = load4(x, g)
                z0, z1, z2, z3 = load4(z, g)
                c = channel(e, C, L, columns)
                m0, m1, m2, m3 = terms(cb, c, 6, 0, columns)
                i0, i1, i2, i3 = terms(cb, c, 6, 1, columns)
                s0, s1, s2, s3 = terms(cb, c, 6, 2, columns)
                b0, b1, b2, b3 = terms(cb, c, 6, 3, columns)
                p0, p1, p2, p3 = terms(cb, c, 6, 4, columns)
                q0, q1, q2, q3 = terms(cb, c, 6, 5, columns)
                r0, g0 = dx_value(d0, x0, z0, m0, i0, s0, b0, p0, q0, M, has_z, act, coef)
                r1, g1 = dx_value(d1, x1, z1, m1, i1, s1, b1, p1, q1, M, has_z, act, coef)
                r2, g2 = dx_value(d2, x2, z2, m2, i2, s2, b2, p2, q2, M, has_z, act, coef)
                r3, g3 = dx_value(d3, x3, z3, m3, i3, s3, b3, p3, q3, M, has_z, act, coef)
                store4(dx, g, narrow4((r0, r1, r2, r3), dx))
                if has_z:
                    store4(dz, g, narrow4((g0, g1, g2, g3), dz))
            else:
                for i in range(e, min(e + 4, total)):
                    c = 6 * channel(i, C, L, columns)
                    r, gi = dx_value(dy[i], x[i], z[i], cb[c], cb[c + 1], cb[c + 2], cb[c + 3],
                                     cb[c + 4], cb[c + 5], M, has_z, act, coef)
                    dx[i] = narrow(r, dx)
                    if has_z:
                        dz[i] = narrow(gi, dz)
            g += cuda.gridDim.x * cuda.blockDim.x

    ks = _bn_sums.kernels(CT, act_grad, apply_coefs, device_functions(nt)["grp_sum"])
    ks.update(apply=bn_apply, bwd_dx=bn_bwd_dx, coefs=bn_coefs)
    if CT is float32:
        ks.update(_bn_columns.kernels(CT, out_value, act_grad, ks["chan"]))
    ks.update(_bn_planes.kernels(CT, out_value, dx_value, ks.pop("chan")))
    return ks


# the kernels that read scale and bias (and write dscale, dbias), built for x's dtype
# (key (name, dtype)) and, beside 16-bit x, for float32 parameters (key (name, dtype,
# "float32"): cuDNN's float scale-bias descriptor, PyTorch's weights under autocast)
PARAMS_READ = ("stats_final", "coefs", "bwd_final", "bwd_planes", "bwd_columns",
               "bwd_act_planes", "bwd_act_columns", "bwd_columns8", "bwd_act_columns8")


def _signatures(t, ct, p):
    """{name: signature} of x's dtype t, compute dtype ct, parameters' dtype p."""
    a, s, pa = f"{array_type(t)}[::1]", f"{ct}[::1]", f"{array_type(p)}[::1]"
    geo = "int64, int64, int64, int64"  # N, C, L, columns
    flags = "int64, int64, int64, int64"  # has_scale, has_bias, has_z, act
    six, seven = ", ".join(["int64"] * 6), ", ".join(["int64"] * 7)
    part = (f"void({a}, {a}, {a}, {pa}, {pa}, {s}, {s}, {s}, {s}, int64, int64, int64, "
            f"{flags}, {ct}, int64)")  # (x, dy, z, scale, bias, ..., coef, chunks a block)
    sigs = {"stats_planes": part, "stats_columns": part, "bwd_planes": part,
            "bwd_columns": part, "bwd_act_planes": part, "bwd_act_columns": part,
            "stats_final": f"void({a}, {pa}, {pa}, {s}, {s}, {s}, {s}, {s}, {s}, {s}, "
                           f"{geo}, {ct}, {ct}, int64, int64, int64, int64)",
            "bwd_final": f"void({pa}, {pa}, {s}, {s}, {s}, {s}, {pa}, {pa}, {s}, {geo}, "
                         "int64, int64, int64)",
            "stats_planes_vec": f"void({a}, {s}, {s}, {six})",
            "bwd_planes_vec": f"void({a}, {a}, {s}, {s}, {s}, {s}, {six})",
            "coefs": f"void({pa}, {pa}, {s}, {s}, {s}, int64, {ct}, int64, int64)",
            "apply": f"void({a}, {a}, {a}, {s}, {geo}, int64, int64, {ct}, {ct}, "
                     f"{ct}, int64)",
            "bwd_dx": f"void({a}, {a}, {a}, {s}, {a}, {a}, {geo}, int64, int64, {ct}, "
                      "int64)",
            "apply_planes_vec": f"void({a}, {a}, {a}, {s}, {seven}, int64, int64, {ct}, "
                                f"{ct}, {ct})",
            "dx_planes_vec": f"void({a}, {a}, {a}, {s}, {a}, {a}, {seven}, {ct}, int64, "
                             f"int64, {ct})"}
    if ct == "float32":
        sigs["apply_columns"] = (f"void({a}, {a}, {a}, {s}, int64, int64, int64, int64, "
                                 f"{ct}, {ct}, {ct})")
        for kind in _bn_columns.SUM_ROWS:  # (the partials' arguments but `per`)
            sigs[f"{kind}_columns8"] = part[:part.rindex(",")] + ")"
    return sigs


def _build():
    table = {}
    for ct, CT, nt in (("float32", float32, np.float32), ("float64", float64, np.float64)):
        ks = _kernels(CT, nt)
        for t in (d for d in DTYPES if (d == "float64") == (ct == "float64")):
            for name, sig in _signatures(t, ct, t).items():
                table[name, t] = (Kernel(ks[name], [sig]), sig)
            if t in ("float16", "bfloat16"):
                sigs = _signatures(t, ct, "float32")
                for name in PARAMS_READ:
                    table[name, t, "float32"] = (Kernel(ks[name], [sigs[name]]), sigs[name])
    return table


def _params(x, scale, bias):
    """(the key's tail, scale or a stand-in, bias or a stand-in) for the PARAMS_READ
    kernels: x's dtype, or float32 parameters beside 16-bit x (a stand-in is never
    read: its has_ flag is 0)."""
    given = scale if scale is not None else bias
    if given is None or dtype_name(given) == dtype_name(x):
        return (), _or(scale, x), _or(bias, x)
    return (dtype_name(given),), _or(scale, given), _or(bias, given)


KERNELS = _build()


class Geometry(NamedTuple):
    """x as (N, C, L) (the kernels take the four ints in this order)."""
    N: int
    C: int
    L: int
    columns: int  # 1: a channel's elements are C apart (NHWC, or per_activation)


def _ncl(x, mode, last):
    """x's Geometry: per_activation is columns with C = an image's size, L = 1."""
    shape = tuple(int(s) for s in x.shape)
    if mode == "per_activation":
        return Geometry(shape[0], math.prod(shape[1:]), 1, 1)
    C = shape[-1] if last else shape[1]
    L = math.prod(shape) // max(1, shape[0] * C)
    return Geometry(shape[0], C, L, int(bool(last) or L == 1))


def _vec(geo, arrays):
    """1 when every array takes 16-byte accesses of 4 elements sharing a channel
    (planes, L % 4 == 0) or on 4 consecutive channels (columns, C % 4 == 0)."""
    N, C, L, columns = geo
    if (C if columns else L) % 4:
        return 0
    return int(vector_aligned(*arrays))


def _grid(total):
    return min(max(1, -(-total // (4 * BLOCK))), 2 ** 31 - 1)


def _planes(geo, arrays):
    """The channels-first fast path applies (_bn_planes.usable)."""
    return _bn_planes.usable(geo, vector_aligned(*(a for a in arrays if a is not None)))


class Apply(NamedTuple):
    """y = alpha * act((x - mean)*k + bias + z) + beta * y; co: the channel terms."""
    x: object
    y: object
    z: object
    co: object
    geo: Geometry
    mode: int
    coef: float
    alpha: float
    beta: float
    stream: object


def _apply_planes(c):
    N, C, L, columns = c.geo
    k, sig = KERNELS["apply_planes_vec", dtype_name(c.x)]
    args = _bn_planes.apply_args(N, C, L)
    k.launch(sig, _bn_planes.grid(args[0]), _bn_planes.ABLOCK, c.stream, c.x, c.y,
             _or(c.z, c.x), c.co, *args, int(c.z is not None), c.mode, c.coef, c.alpha, c.beta)


def _apply_columns(c):
    N, C, L, columns = c.geo
    k, sig = KERNELS["apply_columns", dtype_name(c.x)]
    grid, block = _bn_columns.launch_shape(N * L, C)
    k.launch(sig, grid, block, c.stream, c.x, c.y, _or(c.z, c.x), c.co, N * L, C // 8,
             int(c.z is not None), c.mode, c.coef, c.alpha, c.beta)


def _apply_general(c):
    N, C, L, columns = c.geo
    k, sig = KERNELS["apply", dtype_name(c.x)]
    vec = _vec(c.geo, [a for a in (c.x, c.y, c.z) if a is not None])
    k.launch(sig, _grid(N * C * L), BLOCK, c.stream, c.x, c.y, _or(c.z, c.x), c.co, *c.geo,
             int(c.z is not None), c.mode, c.coef, c.alpha, c.beta, vec)


APPLY = (  # in order of preference
    Variant("planes", lambda c: _planes(c.geo, (c.x, c.y, c.z)), _apply_planes,
            "planes.py: channels first, planes of a multiple of 4, 16-byte vectors"),
    Variant("columns", lambda c: _bn_columns.usable(c.geo, dtype_name(c.x), (c.x, c.y, c.z)),
            _apply_columns, "columns.py: channels last, 8 channels a thread"),
    Variant("general", lambda c: True, _apply_general,
            "4 elements a thread, 16-byte accesses where the layout lets them"),
)


def _apply(x, y, z, co, geo, act, coef, alpha, beta, stream):
    c = Apply(x, y, z, co, geo, -1 if act is None else _act.MODES.index(act), coef, alpha,
              beta, stream)
    variants.choose("batch_norm", "batch_norm", APPLY, c).run(c)
    return y


class Partials(NamedTuple):
    """Per-chunk partials (p1, p2), each (chunks, C) in the compute dtype p_dtype, of
    `kind`'s sums; fast: the planes kernel's inputs, where its layout holds."""
    kind: str
    x: object
    ins: tuple
    p_dtype: str
    geo: tuple
    flags: tuple
    stream: object
    fast: tuple
    params: tuple = ()  # the kernels' key tail (`_params`)


def _partials_planes(c):
    N, C, L, columns = c.geo
    grid, block, E, args = _bn_planes.sum_args(N, C, L)
    p1, p2 = empty(c.x, (grid[1] * C,), c.p_dtype), empty(c.x, (grid[1] * C,), c.p_dtype)
    k, sig = KERNELS[f"{c.kind}_planes_vec", dtype_name(c.x)]
    k.launch(sig, grid, block, c.stream, *c.fast, p1, p2, *args)
    return p1, p2, E


def _partials_columns(c):
    N, C, L, columns = c.geo
    grid, block, E, it = _bn_columns.sum_shape(N * L, C, c.kind, sm_count())
    p1, p2 = empty(c.x, (grid[1] * C,), c.p_dtype), empty(c.x, (grid[1] * C,), c.p_dtype)
    k, sig = KERNELS[(f"{c.kind}_columns8", dtype_name(c.x)) + c.params]
    k.launch(sig, grid, block, c.stream, *c.ins, p1, p2, N * L, C // 8, it, *c.flags)
    return p1, p2, E


def _partials_general(c):
    N, C, L, columns = c.geo
    nch = _bn_sums.chunks(N, L, columns)
    gx = _bn_sums.launch_shape(C, nch, columns)[0][0]
    per = _bn_sums.chunks_a_block(nch, gx, sm_count(), c.kind)
    groups = -(-nch // per)  # partials a channel, each of `per` chunks
    p1, p2 = empty(c.x, (groups * C,), c.p_dtype), empty(c.x, (groups * C,), c.p_dtype)
    k, sig = KERNELS[(f"{c.kind}_{'columns' if columns else 'planes'}", dtype_name(c.x)) +
                     c.params]
    grid, block = _bn_sums.launch_shape(C, groups, columns)
    k.launch(sig, grid, block, c.stream, *c.ins, p1, p2, N, C, L, *c.flags, per)
    return p1, p2, per * _bn_sums.R * (_bn_sums.CY if columns else _bn_sums.BLOCK)


PARTIALS = (  # in order of preference; run(c) returns (p1, p2, E: the elements a chunk)
    Variant("planes", lambda c: c.fast is not None, _partials_planes,
            "planes.py: channels first, planes of a multiple of 4 (no activation)"),
    Variant("columns", lambda c: _bn_columns.usable(c.geo, dtype_name(c.x), c.ins[:3]),
            _partials_columns, "columns.py: channels last, 8 channels a lane"),
    Variant("general", lambda c: True, _partials_general,
            "sums.py: chunk partials a block, planes or columns"),
)


def _partials(kind, x, ins, p_dtype, geo, flags, stream, fast=None, params=()):
    """(p1, p2, E): PARTIALS' first usable variant."""
    c = Partials(kind, x, ins, p_dtype, geo, flags, stream, fast, params)
    return variants.choose("batch_norm", "batch_norm", PARTIALS, c).run(c)


class Dx(NamedTuple):
    """The backward's dx (and dz) from the channel terms cb."""
    dy: object
    x: object
    z: object
    cb: object
    dx: object
    dz: object
    geo: tuple
    residual: object
    mode: int
    coef: float
    stream: object

    def arrays(self):
        return (self.dy, self.x, self.dx, self.residual,
                self.dz if self.residual is not None else None)


def _dx_planes(c):
    N, C, L, columns = c.geo
    k, sig = KERNELS["dx_planes_vec", dtype_name(c.x)]
    args = _bn_planes.apply_args(N, C, L)
    k.launch(sig, _bn_planes.grid(args[0]), _bn_planes.ABLOCK, c.stream, c.dy, c.x, c.z, c.cb,
             c.dx, c.dz, *args, N * L, int(c.residual is not None), c.mode, c.coef)


def _dx_general(c):
    N, C, L, columns = c.geo
    k, sig = KERNELS["bwd_dx", dtype_name(c.x)]
    vec = _vec(c.geo, [a for a in c.arrays() if a is not None])
    k.launch(sig, _grid(N * C * L), BLOCK, c.stream, c.dy, c.x, c.z, c.cb, c.dx, c.dz, *c.geo,
             int(c.residual is not None), c.mode, c.coef, vec)


DX = (  # in order of preference (columns.py's dx lost: docs/decisions.md "bn_columns_ab")
    Variant("planes", lambda c: _planes(c.geo, c.arrays()), _dx_planes,
            "planes.py: channels first, planes of a multiple of 4"),
    Variant("general", lambda c: True, _dx_general,
            "4 elements a thread, 16-byte accesses where the layout lets them"),
)


def forced(name):
    """Inside (this thread): batch norm runs the variant `name` in each step that has one
    (APPLY, PARTIALS, DX), or raises NotSupportedError where its kernels cannot take a
    call (runtime/variants.py)."""
    return variants.forced("batch_norm", name, variants.names(APPLY, PARTIALS, DX))


def _or(a, x):
    return a if a is not None else x


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
    fast = _planes(geo, (x,))
    p1, p2, E = _partials("stats", x, (x, x, x, x, x, mean, mean), ct, geo,
                          (0, 0, 0, -1, 0.0), stream, (x,) if fast else None)
    co = empty(x, (3 * C,), ct)
    tail, sc, bi = _params(x, scale, bias)
    k, sig = KERNELS[("stats_final", dtype) + tail]
    k.launch(sig, *_bn_sums.final_shape(C), stream, x, sc, bi, p1, p2,
             mean, invstd, _or(running_mean, scratch), _or(running_var, scratch), co, *geo, eps,
             momentum, int(has_run), int(scale is not None), int(bias is not None), E)
    _apply(x, y, residual, co, geo, act, coef, 1.0, 0.0, stream)
    return y, mean, invstd


def batch_norm_infer(x, scale, bias, mean, var, residual, eps, mode, last, act, coef, *,
                     alpha, beta, out, stream):
    dtype = dtype_name(x)
    geo = _ncl(x, mode, last)
    C = geo.C
    y = out if out is not None else empty(x, x.shape, dtype)
    if not geo.N * geo.C * geo.L:
        return y
    co = empty(x, (3 * C,), dtype_name(mean))
    tail, sc, bi = _params(x, scale, bias)
    k, sig = KERNELS[("coefs", dtype) + tail]
    k.launch(sig, -(-C // BLOCK), BLOCK, stream, sc, bi, mean, var, co, C,
             eps, int(scale is not None), int(bias is not None))
    return _apply(x, y, residual, co, geo, act, coef, alpha, beta, stream)


def batch_norm_backward(dy, x, scale, bias, mean, invstd, residual, mode, last, act, coef, *,
                        out, stream):
    dtype = dtype_name(x)
    geo = _ncl(x, mode, last)
    N, C, L, columns = geo
    pshape = tuple(int(s) for s in x.shape[1:]) if mode == "per_activation" else (C,)
    shapes = (tuple(x.shape), pshape, pshape) + ((tuple(x.shape),) if residual is not None
                                                  else ())
    tail, sc, bi = _params(x, scale, bias)
    dtypes = (dtype, dtype_name(sc), dtype_name(sc), dtype)
    res = out if out is not None else tuple(empty(x, s, d) for s, d in zip(shapes, dtypes))
    dx, dscale, dbias = res[:3]
    dz = res[3] if residual is not None else dx
    if not N * C * L:
        return tuple(res)
    m = -1 if act is None else _act.MODES.index(act)
    has = (int(scale is not None), int(bias is not None))
    z = _or(residual, x)
    ct = dtype_name(mean)
    fast = _planes(geo, (dy, x))
    p1, p2, E = _partials("bwd_act" if act is not None else "bwd", x,
                          (x, dy, z, sc, bi, mean, invstd), ct, geo,
                          has + (int(residual is not None), m, coef), stream,
                          (dy, x, mean, invstd) if fast and act is None else None, tail)
    cb = empty(x, (6 * C,), ct)
    k, sig = KERNELS[("bwd_final", dtype) + tail]
    k.launch(sig, *_bn_sums.final_shape(C), stream, sc, bi, mean, invstd, p1, p2, dscale,
             dbias, cb, *geo, *has, E)
    c = Dx(dy, x, z, cb, dx, dz, geo, residual, m, coef, stream)
    variants.choose("batch_norm", "batch_norm_backward", DX, c).run(c)
    return tuple(res)

"""Group and instance norm's fast path for channels-first tensors (NCHW, ...) whose
planes hold a multiple of 4 elements, 16-byte aligned, under 2**31 elements: batch
norm's plane kernels (_bn_planes) over re-shaped views of x, plus four small kernels.

x: (N, C, HW) in G groups of Cg = C/G channels. Row r = (n, g) is Cg*HW contiguous
elements (what is normalised together); plane p = n*C + c is HW of them.
- forward: batch norm's statistics over (1, N*G, Cg*HW) (a row as a "channel":
  chunk partials, Chan merges, deterministic) and its final (a row's mean, invstd);
  plane_coefs writes each plane's (mean, scale*invstd, bias); batch norm's apply over
  (1, N*C, HW). Reads x twice, writes y: 12 B an element against the 8 that must move
  (at most 67% of copy). The general kernel (norm.py, a block a row, three passes)
  re-read 128 KiB rows from DRAM: 27% of copy, 0.72x PyTorch on the H200.
- backward: plane_stats spreads (mean, invstd) to planes; batch norm's sums over
  (1, N*C, HW) give each plane's chunk partials of sum dy and sum dy*xhat; row_terms
  (a warp a row) sums scale * those over the row's planes into each plane's dx record;
  param_sums (a thread a channel) sums samples and chunks into dscale, dbias; dx is
  batch norm's elementwise kernel with group norm's dx_value. Reads dy, x twice,
  writes dx: 20 B against 12 (at most 60%).
Every sum runs in a fixed order: deterministic.
"""
import numpy as np
from numba import cuda, float32, float64

from ..runtime.simulator import SIMULATOR
from ..batch_norm import planes as _bn_planes, sums as _bn_sums
from ..runtime.memory.arrays import dtype_name, empty
from ..runtime.device_code.intrinsics import array_type, narrow, widen
from ..runtime.launch.kernel import Kernel
from ..._vocab import BF16_DTYPES as DTYPES
from ..runtime.device_code.block_reduce import SHM, device_functions

BLOCK = 32 if SIMULATOR else 256


def usable(geo, aligned):
    """Channels first, planes of a multiple of 4 elements, aligned, 32-bit indices."""
    N, C, G, HW, last = geo
    return not last and HW % 4 == 0 and aligned and _bn_planes.usable((1, N * C, HW, 0), True)


def _kernels(CT, nt):
    ZERO, ONE = CT(0), CT(1)
    grp_sum = device_functions(nt)["grp_sum"]

    @cuda.jit(device=True)
    def plane_row(p, C, G):
        """(row, channel) of plane p = n*C + c."""
        c = p % C
        return p // C * G + c // (C // G), c

    def gn_plane_coefs(st1, st2, scale, bias, co, N, C, G, has_scale, has_bias):
        # co[3p:3p+3] = (mean, scale*invstd, bias) of plane p: batch norm's apply terms
        p = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if p < N * C:
            r, c = plane_row(p, C, G)
            co[3 * p] = st1[r]
            co[3 * p + 1] = st2[r] * (widen(scale[c]) if has_scale else ONE)
            co[3 * p + 2] = widen(bias[c]) if has_bias else ZERO

    def gn_plane_stats(st1, st2, me, iv, N, C, G):
        p = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if p < N * C:
            r = plane_row(p, C, G)[0]
            me[p], iv[p] = st1[r], st2[r]

    def gn_row_terms(p1, p2, st1, st2, scale, cb, N, C, G, nch, has_scale):
        # a warp a row (n, g): sg = sum scale*dy, sgx = sum scale*dy*xhat over the row,
        # lanes on its planes, chunks in order, then grp_sum's butterfly (every lane
        # the same sum); each plane's record (mean, invstd, scale, 0, sg, sgx)
        r, lane = cuda.blockIdx.x, cuda.threadIdx.x
        n, g = r // G, r % G
        Cg, NC = C // G, N * C
        sg, sgx = ZERO, ZERO
        for c in range(g * Cg + lane, (g + 1) * Cg, 32):
            s1, s2 = ZERO, ZERO
            for j in range(nch):
                s1 += p1[j * NC + n * C + c]
                s2 += p2[j * NC + n * C + c]
            w = widen(scale[c]) if has_scale else ONE
            sg += w * s1
            sgx += w * s2
        shm = cuda.shared.array(SHM, CT)
        sg, sgx = grp_sum(sg, 32, shm), grp_sum(sgx, 32, shm)
        for c in range(g * Cg + lane, (g + 1) * Cg, 32):
            q = 6 * (n * C + c)
            cb[q], cb[q + 1] = st1[r], st2[r]
            cb[q + 2] = widen(scale[c]) if has_scale else ONE
            cb[q + 3] = ZERO
            cb[q + 4], cb[q + 5] = sg, sgx

    def gn_param_sums(p1, p2, dscale, dbias, N, C, nch):
        # a thread a channel: dbias = sum dy, dscale = sum dy*xhat over samples, chunks
        c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if c < C:
            a, b = ZERO, ZERO
            for n in range(N):
                for j in range(nch):
                    a += p1[(j * N + n) * C + c]
                    b += p2[(j * N + n) * C + c]
            dbias[c] = narrow(a, dbias)
            dscale[c] = narrow(b, dscale)

    @cuda.jit(device=True)
    def gn_dx_value(dyv, xv, zv, m, inv, sc, b, sg, sgx, M, has_z, act, coef):
        """dx = invstd/M * (M*scale*dy - sg - xhat*sgx) over a row of M elements (batch
        norm's dx_value takes scale outside: it cannot carry sums already scaled)."""
        xhat = (widen(xv) - m) * inv
        g = widen(dyv)
        return inv / M * (M * sc * g - sg - xhat * sgx), g

    dx = _bn_planes.elementwise(CT, None, gn_dx_value)[1]
    dx.__name__ = dx.__qualname__ = "gn_dx_planes_vec"  # told apart in profiles
    return {"gn_plane_coefs": gn_plane_coefs, "gn_plane_stats": gn_plane_stats,
            "gn_row_terms": gn_row_terms, "gn_param_sums": gn_param_sums,
            "gn_dx_planes_vec": dx}


def _build():
    table = {}
    for ct, CT, nt in (("float32", float32, np.float32), ("float64", float64, np.float64)):
        ks = _kernels(CT, nt)
        for t in (d for d in DTYPES if (d == "float64") == (ct == "float64")):
            a, s = f"{array_type(t)}[::1]", f"{ct}[::1]"
            seven = ", ".join(["int64"] * 7)
            sigs = {"gn_plane_coefs": f"void({s}, {s}, {a}, {a}, {s}, int64, int64, int64, "
                                      "int64, int64)",
                    "gn_plane_stats": f"void({s}, {s}, {s}, {s}, int64, int64, int64)",
                    "gn_row_terms": f"void({s}, {s}, {s}, {s}, {a}, {s}, int64, int64, int64, "
                                    "int64, int64)",
                    "gn_param_sums": f"void({s}, {s}, {a}, {a}, int64, int64, int64)",
                    "gn_dx_planes_vec": f"void({a}, {a}, {a}, {s}, {a}, {a}, {seven}, {ct}, "
                                        f"int64, int64, {ct})"}
            for name, sig in sigs.items():
                table[name, t] = (Kernel(ks[name], [sig]), sig)
    return table


_KERNELS = _build()


def _launch(name, dtype, grid, block, stream, *args):
    from ..batch_norm import KERNELS as bn
    k, sig = (_KERNELS if name.startswith("gn_") else bn)[name, dtype]
    k.launch(sig, grid, block, stream, *args)


def forward(x, y, scale, bias, st1, st2, geo, eps, stream):
    """y, and the rows' mean and invstd into st1, st2; scale/bias None or (C,)."""
    N, C, G, HW, _ = geo
    t, ct = dtype_name(x), dtype_name(st1)
    rows = (1, N * G, C // G * HW, 0)
    grid, block, E, args = _bn_planes.sum_args(*rows[:3])
    p1, p2 = (empty(x, (grid[1] * N * G,), ct) for _ in range(2))
    _launch("stats_planes_vec", t, grid, block, stream, x, p1, p2, *args)
    co = empty(x, (3 * N * C,), ct)  # the final's row terms, then the planes' terms
    _launch("stats_final", t, *_bn_sums.final_shape(N * G), stream, x, x, x, p1, p2, st1, st2,
            st1, st2, co, *rows, eps, 0.0, 0, 0, 0, E)
    sc, bi = (scale if scale is not None else x), (bias if bias is not None else x)
    _launch("gn_plane_coefs", t, -(-N * C // BLOCK), BLOCK, stream, st1, st2, sc, bi, co, N, C,
            G, int(scale is not None), int(bias is not None))
    args = _bn_planes.apply_args(1, N * C, HW)
    _launch("apply_planes_vec", t, _bn_planes.grid(args[0]), _bn_planes.ABLOCK, stream, x, y,
            x, co, *args, 0, -1, 0.0, 1.0, 0.0)


def backward(dy, x, st1, st2, scale, dx, dscale, dbias, geo, stream):
    """dx, dscale, dbias (preallocated) from the rows' mean and invstd st1, st2."""
    N, C, G, HW, _ = geo
    t, ct, NC = dtype_name(x), dtype_name(st2), N * C
    me, iv = (empty(x, (NC,), ct) for _ in range(2))
    _launch("gn_plane_stats", t, -(-NC // BLOCK), BLOCK, stream, st1, st2, me, iv, N, C, G)
    grid, block, E, args = _bn_planes.sum_args(1, NC, HW)
    p1, p2 = (empty(x, (grid[1] * NC,), ct) for _ in range(2))
    _launch("bwd_planes_vec", t, grid, block, stream, dy, x, me, iv, p1, p2, *args)
    cb = empty(x, (6 * NC,), ct)
    sc = scale if scale is not None else x
    _launch("gn_row_terms", t, N * G, 32, stream, p1, p2, st1, st2, sc, cb, N, C, G, grid[1],
            int(scale is not None))
    _launch("gn_param_sums", t, -(-C // BLOCK), BLOCK, stream, p1, p2, dscale, dbias, N, C,
            grid[1])
    args = _bn_planes.apply_args(1, NC, HW)
    _launch("gn_dx_planes_vec", t, _bn_planes.grid(args[0]), _bn_planes.ABLOCK, stream, dy, x,
            x, cb, dx, dx, *args, float(C // G * HW), 0, -1, 0.0)

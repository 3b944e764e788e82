"""The general layer/rms/group norm kernels (a block a row, or a row walked through its
groups for group norm, both layouts) and the fused dscale/dbias backward; the table
KERNELS[name, dtype] -> (Kernel, signature). nbdnn/cuda/norm/__init__.py says when
each runs; rows.py and group_planes.py hold the specialised ones."""
import math

import numpy as np
from numba import cuda, float32, float64, uint64

from ..runtime.simulator import SIMULATOR
from ..runtime.device_code.intrinsics import array_type, load4, narrow, store4, widen
from ..._vocab import BF16_DTYPES as DTYPES
from ..runtime.launch.kernel import Kernel
from ..runtime.device_code.block_reduce import SHM, device_functions
from ..softmax import row_vs
from . import rows as _rows

BLOCK = 32 if SIMULATOR else 256
MAX_GRID = 2 ** 31 - 1
PLMAX = {"float32": 4096, "float64": 2048}  # fused backward: columns (32 KiB a block),
                                              # by compute type
FUSED_V = 4                                   # 4-element vectors a lane, G lanes a row
FUSED_LANES_PER_SM = 512                      # resident at 128 registers (2 blocks of 256)
GN_TARGET_BLOCKS = 4 if SIMULATOR else 1024   # group norm dscale/dbias partials


def _fused_groups(ct):
    """The lane counts G of the fused backward: rows past a warp's reach (1024 float32,
    512 float64 elements) up to PLMAX, 4*FUSED_V elements a lane."""
    lo = 1024 if ct == "float32" else 512
    return [G for G in (64, 128, 256) if lo < 16 * G and 16 * G // 2 < PLMAX[ct]]


@cuda.jit(device=True)
def _row_walk(t, T, row, C, G, HW, last):
    """A thread's walk over elements t, t + T, ... of row (n, g) of an (N, C, HW) tensor
    normalised over groups of C/G channels (NHWC when last; layer/rms norm are G = 1,
    HW = 1, C = L). Element i sits at base + a*sa + b in channel c0 + (b if last else
    a), with (a, b) = divmod(i, D): D = HW, a the channel in the group and b the
    position in its plane (channels first), or D = C/G, a the position and b the
    channel (last). Returns (a, b, dq, dr, D, base, sa, c0); _walk_step advances (a, b)
    by T = dq*D + dr: the divisions happen once a thread, not once an element (64-bit
    divisions an element held group norm at 13% of copy)."""
    Cg = C // G
    n, g = row // G, row % G
    D = Cg if last else HW
    if last:
        base, sa = n * HW * C + g * Cg, C
    else:
        base, sa = row * Cg * HW, HW
    return t // D, t % D, T // D, T % D, D, base, sa, g * Cg


@cuda.jit(device=True)
def _walk_at(a, b, base, sa, c0, last):
    """(memory offset, channel) of the walk's current element."""
    return base + a * sa + b, c0 + (b if last else a)


@cuda.jit(device=True)
def _walk_step(a, b, dq, dr, D):
    a += dq
    b += dr
    if b >= D:
        b -= D
        a += 1
    return a, b


def _kernels(CT, f):
    grp_sum = f["grp_sum"]
    ZERO, ONE = CT(0), CT(1)

    def norm_fwd(x, y, scale, bias, st1, st2, C, G, HW, last, eps, centred, has_scale,
                 has_bias):
        row, t, T = cuda.blockIdx.x, cuda.threadIdx.x, cuda.blockDim.x
        L = C // G * HW
        shm = cuda.shared.array(SHM, CT)
        a0, b0, dq, dr, D, base, sa, c0 = _row_walk(t, T, row, C, G, HW, last)
        mean = ZERO
        if centred:
            s = ZERO
            a, b = a0, b0
            for i in range(t, L, T):
                s += widen(x[_walk_at(a, b, base, sa, c0, last)[0]])
                a, b = _walk_step(a, b, dq, dr, D)
            mean = grp_sum(s, T, shm) / CT(L)
        q = ZERO
        a, b = a0, b0
        for i in range(t, L, T):
            d = widen(x[_walk_at(a, b, base, sa, c0, last)[0]]) - mean
            q += d * d
            a, b = _walk_step(a, b, dq, dr, D)
        inv = ONE / math.sqrt(grp_sum(q, T, shm) / CT(L) + eps)
        if t == 0:
            st1[row] = mean if centred else inv
            st2[row] = inv
        a, b = a0, b0
        for i in range(t, L, T):
            o, c = _walk_at(a, b, base, sa, c0, last)
            v = (widen(x[o]) - mean) * inv
            if has_scale:
                v *= widen(scale[c])
            if has_bias:
                v += widen(bias[c])
            y[o] = narrow(v, y)
            a, b = _walk_step(a, b, dq, dr, D)

    def norm_bwd(dy, x, st1, st2, scale, dx, C, G, HW, last, centred, has_scale):
        row, t, T = cuda.blockIdx.x, cuda.threadIdx.x, cuda.blockDim.x
        L = C // G * HW
        shm = cuda.shared.array(SHM, CT)
        mean = st1[row] if centred else ZERO
        inv = st2[row]
        a0, b0, dq, dr, D, base, sa, c0 = _row_walk(t, T, row, C, G, HW, last)
        sg, sgx = ZERO, ZERO
        a, b = a0, b0
        for i in range(t, L, T):
            o, c = _walk_at(a, b, base, sa, c0, last)
            g = widen(dy[o]) * (widen(scale[c]) if has_scale else ONE)
            sg += g
            sgx += g * (widen(x[o]) - mean) * inv
            a, b = _walk_step(a, b, dq, dr, D)
        sg = grp_sum(sg, T, shm) / CT(L)
        sgx = grp_sum(sgx, T, shm) / CT(L)
        a, b = a0, b0
        for i in range(t, L, T):
            o, c = _walk_at(a, b, base, sa, c0, last)
            g = widen(dy[o]) * (widen(scale[c]) if has_scale else ONE)
            v = g - (widen(x[o]) - mean) * inv * sgx
            if centred:
                v -= sg
            dx[o] = narrow(v * inv, dx)
            a, b = _walk_step(a, b, dq, dr, D)

    def gn_params_partials(dy, x, st1, st2, p1, p2, N, C, G, HW, last, centred, nper):
        # block (channel(s), j) sums dy*xhat and dy over samples j*nper ... (j+1)*nper - 1:
        # channels first, a block a channel, threads along each plane (coalesced), 4
        # elements a thread in flight; channels last, lanes on 32 consecutive channels
        # and PY row groups, a row's (n, s) stepped, not divided. Fixed order throughout.
        t, T = cuda.threadIdx.x, cuda.blockDim.x
        shm = cuda.shared.array(SHM, CT)
        j = cuda.blockIdx.y
        n0 = j * nper
        n1 = min(N, n0 + nper)
        Cg = C // G
        a, b = ZERO, ZERO
        if not last:
            c = cuda.blockIdx.x
            for n in range(n0, n1):
                r = n * G + c // Cg
                mean = st1[r] if centred else ZERO
                base = (n * C + c) * HW
                an = ZERO
                for s0 in range(t, HW, 4 * T):
                    s1, s2, s3 = s0 + T, s0 + 2 * T, s0 + 3 * T
                    o1 = base + (s1 if s1 < HW else s0)
                    o2 = base + (s2 if s2 < HW else s0)
                    o3 = base + (s3 if s3 < HW else s0)
                    d0, d1, d2, d3 = widen(dy[base + s0]), widen(dy[o1]), widen(dy[o2]), widen(dy[o3])
                    x0, x1, x2, x3 = widen(x[base + s0]), widen(x[o1]), widen(x[o2]), widen(x[o3])
                    d1 = d1 if s1 < HW else ZERO
                    d2 = d2 if s2 < HW else ZERO
                    d3 = d3 if s3 < HW else ZERO
                    an += d0 * (x0 - mean) + d1 * (x1 - mean) + d2 * (x2 - mean) + \
                        d3 * (x3 - mean)
                    b += d0 + d1 + d2 + d3
                a += an * st2[r]
            a = grp_sum(a, T, shm)
            b = grp_sum(b, T, shm)
            if t == 0:
                p1[j * C + c] = a
                p2[j * C + c] = b
            return
        PY = T // 32
        tx, ty = t % 32, t // 32
        c = cuda.blockIdx.x * 32 + tx
        cc = c if c < C else C - 1  # masked lanes read a valid channel
        g = cc // Cg
        n, s = n0 + ty // HW, ty % HW
        while n < n1:
            r = n * G + g
            o = (n * HW + s) * C + cc
            d = widen(dy[o])
            a += d * (widen(x[o]) - (st1[r] if centred else ZERO)) * st2[r]
            b += d
            s += PY
            while s >= HW:
                s -= HW
                n += 1
        cols = cuda.shared.array(BLOCK, CT)  # a slot a thread (shm has one a warp)
        for k in range(2):  # a, then b, over the PY row groups of a channel, in order
            cols[t] = a if k == 0 else b
            cuda.syncthreads()
            if ty == 0 and c < C:
                v = cols[tx]
                for i in range(1, PY):
                    v += cols[tx + 32 * i]
                if k == 0:
                    p1[j * C + c] = v
                else:
                    p2[j * C + c] = v
            cuda.syncthreads()

    return {"fwd": norm_fwd, "bwd": norm_bwd, "gn_params_partials": gn_params_partials}


def _build():
    table = {}
    for ct, CT, nt in (("float32", float32, np.float32), ("float64", float64, np.float64)):
        f = device_functions(nt)
        ks = _kernels(CT, f)
        ns = dict(f, cuda=cuda, math=math, load4=load4, store4=store4, CT=CT, SHM=SHM,
                  widen=widen, narrow=narrow,
                  PLMAX=PLMAX[ct], PLMAX4=PLMAX[ct] // 4, PSHM=2 * PLMAX[ct],
                  U=int if SIMULATOR else uint64)
        ks["params_partials"], ks["params_final"] = _rows.param_kernels(CT)
        for t in (d for d in DTYPES if (d == "float64") == (ct == "float64")):
            a, s = f"{array_type(t)}[::1]", f"{ct}[::1]"
            i4 = "int64, int64, int64, int64"  # C, G, HW, last
            sigs = {"fwd": f"void({a}, {a}, {a}, {a}, {s}, {s}, {i4}, {ct}, int64, int64, int64)",
                    "bwd": f"void({a}, {a}, {s}, {s}, {a}, {a}, {i4}, int64, int64)",
                    "gn_params_partials": f"void({a}, {a}, {s}, {s}, {s}, {s}, int64, {i4}, "
                                          "int64, int64)",
                    "params_partials": f"void({a}, {a}, {s}, {s}, {s}, {s}, int64, int64, "
                                       "int64)",
                    "params_final": f"void({s}, {s}, {a}, {a}, int64, int64)"}
            for name, sig in sigs.items():
                table[name, t] = (Kernel(ks[name], [sig]), sig)
            sig = (f"void({a}, {a}, {a}, {a}, {s}, {s}, int64, int64, int64, {ct}, int64, "
                   "int64, int64, int64)")
            for V in row_vs(ct == "float64", False):
                # V = 16 runs blocks of up to 512 lanes: 128 registers (ptxas: 110, no
                # spills); V <= 8 needs 76 at most, blocks of up to 256 lanes
                opts = {} if SIMULATOR or V < 16 else {"max_registers": 128}
                table[f"rows_v{V}", t] = (Kernel(_rows.row_kernel(V, False, ns), [sig],
                                                 **opts), sig)
            sig = (f"void({a}, {a}, {s}, {s}, {a}, {a}, int64, int64, int64, int64, int64, "
                   "int64)")
            for V in row_vs(ct == "float64", True):
                # dy and x held: blocks of up to 512 lanes, 128 registers
                opts = {} if SIMULATOR or V < 4 else {"max_registers": 128}
                table[f"rows_bwd_v{V}", t] = (Kernel(_rows.row_kernel(V, True, ns), [sig],
                                                     **opts), sig)
            # the fused backward, partials in the compute type for every storage dtype
            # (16-bit rows had only the unfused kernels: 16% of copy)
            psig = sig[:-1] + f", {s}, {s})"
            # float32: 129 registers uncapped (2 blocks of 256 would not fit an SM),
            # 128 capped without spills; float64 180 uncapped
            opts = {"max_registers": 128} if ct == "float32" and not SIMULATOR else {}
            for G in _fused_groups(ct):
                kern = _rows.row_kernel(FUSED_V, True, ns, G)
                table[f"rows_bwdp_g{G}", t] = (Kernel(kern, [psig], **opts), psig)
    return table


KERNELS = _build()

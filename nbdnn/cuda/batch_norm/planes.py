"""Batch norm's fast path for channels-first tensors (NCHW, ...) whose planes hold a
multiple of 4 elements, 16-byte aligned, under 2**31 elements: every access a 16-byte
vector, every index split by a multiply-high (_stencil.magic), no 64-bit division.

x is (N, C, L) planes; L4 = L / 4 vectors a plane; channel c's NV = N * L4 vectors
are its N planes, vector m of the channel at m + c*L4 + (m // L4) * (C-1)*L4.
- statistics / backward sums: grid (C, G); block (c, j) reduces the channel's
  vectors [j*V, (j+1)*V) (a chunk of E = 4V elements) in a block-stride loop, VPT
  vectors a thread an iteration with the next VPT already loading (bytes in flight
  through the loop, where the general kernel (_bn_sums) gives a block one load burst
  then two barriers). Statistics keep a running (count, mean, M2) a thread, merged
  with each iteration's exact (mean, M2) of its 4*VPT values (Chan), then across the block
  by a fixed tree in shared memory: deterministic, and as robust as the general
  kernel's. Reads x once (4 B an element); backward reads dy and x once (8 B).
  The partials go to _bn_sums' finals with chunk size E.
- apply / dx: 2 vectors a thread (relu's best shape), the channel by
  two multiply-highs where the general kernel divides in 64 bits. 8 B an element
  (apply), 12 B (dx).
Walking apply and dx backwards, to re-read from L2 the last chunks the sums pass
left there, with last-use loads and streaming stores, measured no faster.
"""
from numba import cuda, int32

from ..runtime.simulator import SIMULATOR
from ..runtime.device_code.intrinsics import load4, narrow4, store4, widen
from ..runtime.device_code.stencil import DIV, U, U32, div, magic_args
from ..runtime.launch.codegen import compile_source

BLOCK = 32 if SIMULATOR else 256   # statistics and sums
ABLOCK = 32 if SIMULATOR else 128  # apply and dx
VPT = 2 if SIMULATOR else 4        # vectors a thread an iteration (statistics, sums)
TARGET_BLOCKS = 8 if SIMULATOR else 2048
LIMIT = 2 ** 31


def usable(geo, aligned):
    """Planes of a multiple of 4 elements, aligned arrays, 32-bit vector indices."""
    N, C, L, columns = geo
    return not columns and L % 4 == 0 and aligned and N * C * L < LIMIT


def chunking(N, C, L):
    """(G chunks a channel, V vectors a chunk): about TARGET_BLOCKS blocks, at least
    VPT*BLOCK vectors a chunk."""
    NV = N * (L // 4)
    G = max(1, min(-(-NV // (VPT * BLOCK)), -(-TARGET_BLOCKS // C)))
    V = -(-NV // G)
    return -(-NV // V), V


def sum_args(N, C, L):
    """(grid, block, E elements a chunk, the kernel's arguments C, L4, NV, V, m_L4, s_L4)
    of the statistics and sums kernels."""
    G, V = chunking(N, C, L)
    return (C, G, 1), BLOCK, 4 * V, (C, L // 4, N * (L // 4), V) + magic_args(L // 4)


def apply_args(N, C, L):
    """Arguments n4, C, L4, m_L4, s_L4, m_C, s_C of apply and dx."""
    return (N * C * L // 4, C, L // 4) + magic_args(L // 4, C)


def _vector(k, m, prefix, arrays):
    """Lines: the channel vector m + k*BLOCK (clamped to lo past hi: a valid address,
    flag f{k} false) as a tensor vector index, then its 16-byte loads from each array
    (into {prefix}{array}{k}_0..3)."""
    q, f = f"{prefix}q{k}", f"{prefix}f{k}"
    return [f"{q} = {m} + {k * BLOCK}", f"{f} = {q} < hi", f"{q} = {q} if {f} else lo",
            f"{q} = {q} + cl + {DIV.format(a=q, b='L4')} * cc"] + \
        [", ".join(f"{prefix}{a}{k}_{i}" for i in range(4)) + f" = load4({a}, {q})"
         for a in arrays]


def sums_source(stats):
    """Statistics (stats) or the backward sums over chunk (c = blockIdx.x, j =
    blockIdx.y): p1[j*C + c], p2[j*C + c] = (mean - x0, M2) or (sum dy, sum dy*xhat)."""
    name = "stats_planes_vec" if stats else "bwd_planes_vec"
    arrays = ("x", "p1", "p2") if stats else ("dy", "x", "mean", "invstd", "p1", "p2")
    loaded = ("x",) if stats else ("dy", "x")
    head = [f"def {name}({', '.join(arrays)}, C, L4, NV, V, m_L4, s_L4):",
            "t = cuda.threadIdx.x", "c = cuda.blockIdx.x", "lo = cuda.blockIdx.y * V",
            "hi = min(NV, lo + V)", "cl = c * L4", "cc = (C - 1) * L4", "m = lo + t"]
    head += (["shift = widen(x[4 * cl])", "shift = shift if shift - shift == ZERO else ZERO",
              "cnt, mu, m2 = 0, ZERO, ZERO"] if stats else
             ["mc, ic = widen(mean[c]), widen(invstd[c])", "s, q = ZERO, ZERO"])
    for k in range(VPT):
        head += _vector(k, "m", "", loaded)
    loop = ["m += VPT * BLOCK"]
    for k in range(VPT):  # the next iteration's loads, in flight during this one's arithmetic
        loop += _vector(k, "m", "n", loaded)
    if stats:
        loop += [f"v{k}_{i} = widen(x{k}_{i}) - shift" for k in range(VPT) for i in range(4)]
        loop += ["nb = " + " + ".join(f"(4 if f{k} else 0)" for k in range(VPT)),
                 "sb = " + " + ".join(f"(v{k}_0 + v{k}_1 + v{k}_2 + v{k}_3 if f{k} else ZERO)"
                                      for k in range(VPT)),
                 "mb = sb / CT(nb)",
                 "qb = " + " + ".join(
                     "(" + " + ".join(f"(v{k}_{i} - mb) * (v{k}_{i} - mb)" for i in range(4))
                     + f" if f{k} else ZERO)" for k in range(VPT)),
                 "cnt, mu, m2 = chan(cnt, mu, m2, nb, mb, qb)"]
    else:
        for k in range(VPT):
            loop += [f"if f{k}:"] + [ln for i in range(4) for ln in (
                f"    s += widen(dy{k}_{i})", f"    q += widen(dy{k}_{i}) * (widen(x{k}_{i}) - mc)")]
    for k in range(VPT):  # rotate
        loop += [f"f{k} = nf{k}"] + [f"{a}{k}_{i} = n{a}{k}_{i}" for a in loaded for i in range(4)]
    tail = ["mu, m2 = block_chan(cnt, mu, m2)" if stats else "s, q = block_sum2(s, q * ic)",
            "if t == 0:", "    p1[cuda.blockIdx.y * C + c] = " + ("mu" if stats else "s"),
            "    p2[cuda.blockIdx.y * C + c] = " + ("m2" if stats else "q")]
    body = head[1:] + ["while m < hi:"] + ["    " + ln for ln in loop] + tail
    return head[0] + "\n" + "\n".join("    " + ln for ln in body) + "\n"


def elementwise(CT, out_value, dx_value):
    """(apply, dx) python kernels over 2 vectors a thread: batch_norm's out_value and
    dx_value (group norm's dx_value: _gn_planes; an apply without out_value is never
    compiled)."""
    ZERO = CT(0)

    @cuda.jit(device=True)
    def widen4(v):
        return widen(v[0]), widen(v[1]), widen(v[2]), widen(v[3])

    @cuda.jit(device=True)
    def vector(i, n4, L4, m_L4, s_L4, C, m_C, s_C):
        """(tensor vector index, channel) of vector i (clamped: loads stay valid; the
        caller stores only when i < n4)."""
        g = i if i < n4 else n4 - 1
        p = div(g, m_L4, s_L4)
        return g, p - div(p, m_C, s_C) * C

    @cuda.jit(device=True)
    def vectors(n4, L4, m_L4, s_L4, C, m_C, s_C):
        """This thread's two vectors i0, i1 and their (index, channel)s."""
        i0 = cuda.blockIdx.x * 2 * ABLOCK + cuda.threadIdx.x
        g0, c0 = vector(i0, n4, L4, m_L4, s_L4, C, m_C, s_C)
        g1, c1 = vector(i0 + ABLOCK, n4, L4, m_L4, s_L4, C, m_C, s_C)
        return i0, g0, c0, i0 + ABLOCK, g1, c1

    @cuda.jit(device=True)
    def out4(v, w, u, co, c, has_z, act, coef, alpha, beta):
        m, k, b = co[3 * c], co[3 * c + 1], co[3 * c + 2]
        return (out_value(v[0], w[0], u[0], m, k, b, has_z, act, coef, alpha, beta),
                out_value(v[1], w[1], u[1], m, k, b, has_z, act, coef, alpha, beta),
                out_value(v[2], w[2], u[2], m, k, b, has_z, act, coef, alpha, beta),
                out_value(v[3], w[3], u[3], m, k, b, has_z, act, coef, alpha, beta))

    def apply_planes_vec(x, y, z, co, n4, C, L4, m_L4, s_L4, m_C, s_C, has_z, act, coef,
                         alpha, beta):
        i0, g0, c0, i1, g1, c1 = vectors(n4, L4, m_L4, s_L4, C, m_C, s_C)
        x0, x1 = load4(x, g0), load4(x, g1)
        z0, z1 = load4(z, g0), load4(z, g1)
        y0 = y1 = (ZERO, ZERO, ZERO, ZERO)
        if beta != ZERO:
            y0, y1 = widen4(load4(y, g0)), widen4(load4(y, g1))
        r0 = out4(x0, z0, y0, co, c0, has_z, act, coef, alpha, beta)
        r1 = out4(x1, z1, y1, co, c1, has_z, act, coef, alpha, beta)
        if i0 < n4:
            store4(y, g0, narrow4(r0, y))
        if i1 < n4:
            store4(y, g1, narrow4(r1, y))

    @cuda.jit(device=True)
    def dx4(d, v, w, cb, c, M, has_z, act, coef):
        m, inv, sc, b, sg, sgx = (cb[6 * c], cb[6 * c + 1], cb[6 * c + 2], cb[6 * c + 3],
                                  cb[6 * c + 4], cb[6 * c + 5])
        r0, e0 = dx_value(d[0], v[0], w[0], m, inv, sc, b, sg, sgx, M, has_z, act, coef)
        r1, e1 = dx_value(d[1], v[1], w[1], m, inv, sc, b, sg, sgx, M, has_z, act, coef)
        r2, e2 = dx_value(d[2], v[2], w[2], m, inv, sc, b, sg, sgx, M, has_z, act, coef)
        r3, e3 = dx_value(d[3], v[3], w[3], m, inv, sc, b, sg, sgx, M, has_z, act, coef)
        return (r0, r1, r2, r3), (e0, e1, e2, e3)

    def dx_planes_vec(dy, x, z, cb, dx, dz, n4, C, L4, m_L4, s_L4, m_C, s_C, M, has_z, act,
                      coef):
        i0, g0, c0, i1, g1, c1 = vectors(n4, L4, m_L4, s_L4, C, m_C, s_C)
        d0, d1 = load4(dy, g0), load4(dy, g1)
        x0, x1 = load4(x, g0), load4(x, g1)
        z0, z1 = load4(z, g0), load4(z, g1)
        r0, e0 = dx4(d0, x0, z0, cb, c0, M, has_z, act, coef)
        r1, e1 = dx4(d1, x1, z1, cb, c1, M, has_z, act, coef)
        if i0 < n4:
            store4(dx, g0, narrow4(r0, dx))
            if has_z:
                store4(dz, g0, narrow4(e0, dz))
        if i1 < n4:
            store4(dx, g1, narrow4(r1, dx))
            if has_z:
                store4(dz, g1, narrow4(e1, dz))
    return apply_planes_vec, dx_planes_vec


def grid(n4):
    """Blocks of apply and dx."""
    return max(1, -(-n4 // (2 * ABLOCK)))


def kernels(CT, out_value, dx_value, chan):
    """Python kernels: stats_planes_vec, bwd_planes_vec, apply_planes_vec, dx_planes_vec
    (chan: _bn_sums' merge of (count, mean, M2) triples)."""
    ZERO = CT(0)

    @cuda.jit(device=True)
    def block_chan(n, mu, m2):
        """The block's merge in a fixed tree (thread 0 holds it): deterministic."""
        sn = cuda.shared.array(BLOCK, int32)
        s1 = cuda.shared.array(BLOCK, CT)
        s2 = cuda.shared.array(BLOCK, CT)
        t = cuda.threadIdx.x
        h = BLOCK // 2
        while h > 0:
            if t >= h and t < 2 * h:
                sn[t], s1[t], s2[t] = n, mu, m2
            cuda.syncthreads()
            if t < h:
                n, mu, m2 = chan(n, mu, m2, sn[t + h], s1[t + h], s2[t + h])
            cuda.syncthreads()
            h //= 2
        return mu, m2

    @cuda.jit(device=True)
    def block_sum2(a, b):
        s1 = cuda.shared.array(BLOCK, CT)
        s2 = cuda.shared.array(BLOCK, CT)
        t = cuda.threadIdx.x
        h = BLOCK // 2
        while h > 0:
            if t >= h and t < 2 * h:
                s1[t], s2[t] = a, b
            cuda.syncthreads()
            if t < h:
                a += s1[t + h]
                b += s2[t + h]
            cuda.syncthreads()
            h //= 2
        return a, b

    ns = {"cuda": cuda, "CT": CT, "ZERO": ZERO, "load4": load4, "chan": chan, "widen": widen,
          "block_chan": block_chan, "block_sum2": block_sum2, "VPT": VPT, "BLOCK": BLOCK,
          "U32": U32, "U": U}
    out = {}
    for stats in (True, False):
        src = sums_source(stats)
        compile_source("stats_planes_vec" if stats else "bwd_planes_vec", src, ns, about={
            "what": f"batch norm {'statistics' if stats else 'backward sums'} over channel "
                    "planes, 16-byte vectors",
            "traffic": "x (and dy) read once; a partial a (channel, chunk)"})
    out["stats_planes_vec"] = ns["stats_planes_vec"]
    out["bwd_planes_vec"] = ns["bwd_planes_vec"]
    out["apply_planes_vec"], out["dx_planes_vec"] = elementwise(CT, out_value, dx_value)
    return out

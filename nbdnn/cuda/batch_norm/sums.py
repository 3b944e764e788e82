"""Batch norm's per-channel reductions: statistics (forward) and the two backward sums,
each as chunk partials then an in-order finalize (deterministic, no atomics).

x is (N, C, L) in one of two layouts (batch_norm.py): planes (NCHW: a channel's
elements are N runs of L) or columns (NHWC, and per_activation: rows of C, a channel a
column). A channel's M = N*L elements are cut into chunks of E; one block a
(channel(s), chunk) writes a partial; the finals give a channel FW lanes, each merging
chunks lane, lane + FW, ... in order, then lane 0 merges the lanes in order (fixed
order: deterministic; one thread a channel walking 64 chunks took 50 us on the H200).
- planes: BLOCK threads a (channel, chunk), R elements a thread, E = R*BLOCK; element m
  of the chunk at thread t + k*BLOCK (coalesced); its (n, l) is stepped, not divided;
  block sums through warp shuffles (_reduce.grp_sum).
- columns: CX channels x CY row groups a block (CX consecutive channels: coalesced),
  R rows a thread, E = R*CY rows; sums over the CY threads of a column in order.

Every element load is unconditional (masked slots read a valid address) and all R are
issued before any arithmetic: a branch around each load with its use right after made
every thread wait out one DRAM latency per element (PTX: `@p bra` around each `ld`).
Statistics: the chunk's values stay in registers (x read once from DRAM), shifted by
the channel's first element x0 (0 when x0 is not finite: a mean with an infinite
element is that infinity, not inf - inf); the chunk's mean and M2 = sum (v - mean)^2 are exact
two-pass values, merged with Chan's formula. Float32 keeps mean 1e4, std 1 over N*L
past 2**24. Backward: the sums of g = dy*act'(pre) and g*xhat, summed per chunk.
Traffic: statistics read x once (4 B/element float32), backward sums read dy and x
(and z with an activation) once.
"""
import math

from numba import cuda, int64

from ..runtime.simulator import SIMULATOR
from ..runtime.device_code.intrinsics import narrow, widen

BLOCK = 32 if SIMULATOR else 256
CX, CY = (8, 4) if SIMULATOR else (32, 8)
R = 4 if SIMULATOR else 16
MAX_GRID_Y = 65535
FW, FC = (4, 4) if SIMULATOR else (32, 8)   # finals: lanes a channel, channels a block
FWC = FW * FC


def chunks(N, L, columns):
    """Chunks a channel (of R * CY rows, or R * BLOCK elements)."""
    return max(1, -(-N * L // (R * (CY if columns else BLOCK))))


# A block sums `per` consecutive chunks into one partial (Chan's merge for the
# statistics, in chunk order: deterministic), so that a large channel has a few hundred
# partials, not thousands: ResNet-50's bf16 training step (its profile) spent
# 1.06 ms in the finals, lane 0 of a channel merging up to 98 chunk partials in a
# dependent chain (the stem's 401408 rows: 3136 chunks of 128), and launched 6272
# blocks of one 8 KB chunk each for the stem's statistics. With this on, the partials
# fill BLOCKS_AN_SM blocks an SM. A profile (H200, every kind merged): the
# statistics' finals 0.71 -> 0.56 ms and the backward's 0.35 -> under 0.28, the
# backward's partials unchanged (1.14 ms), but the statistics' partials 1.14 -> 1.51
# (each merged chunk pays its block reductions and Chan's merge in a dependent chain,
# on fewer blocks): so only the kinds in CHUNKS_A_BLOCK merge.
CHUNKS_A_BLOCK = ("bwd", "bwd_act")
BLOCKS_AN_SM = 8


def chunks_a_block(nch, gx, sm_count, kind):
    """Chunks a partial of `kind` sums: 1 unless kind is in CHUNKS_A_BLOCK, else as many
    as leave about BLOCKS_AN_SM blocks an SM over the gx column blocks."""
    if kind not in CHUNKS_A_BLOCK:
        return 1
    groups = max(1, min(nch, -(-BLOCKS_AN_SM * sm_count // gx)))
    return -(-nch // groups)


def final_shape(C):
    """(grid, block) of the finals."""
    return -(-C // FC), FW * FC


def launch_shape(C, nch, columns):
    """(grid, block) of the partials kernels."""
    gx = -(-C // CX) if columns else C
    return (gx, min(nch, MAX_GRID_Y), 1), (CX * CY if columns else BLOCK)


def kernels(CT, act_grad, apply_coefs, grp_sum):
    """{'stats_planes', 'stats_columns', 'bwd_planes', 'bwd_columns', 'stats_final',
    'bwd_final'} python kernels in compute type CT; act_grad and apply_coefs (the
    apply kernel's per-channel (mean, scale*invstd, bias)) from batch_norm; grp_sum
    (_reduce: warp shuffles, then one shared-memory step) sums over a planes block."""
    ZERO, ONE = CT(0), CT(1)

    @cuda.jit(device=True)
    def column_sum(v, shm):
        # over the CY threads of column tx (t = ty*CX + tx), in order
        t = cuda.threadIdx.x
        shm[t] = v
        cuda.syncthreads()
        tx = t % CX
        v = shm[tx]
        for i in range(1, CY):
            v += shm[tx + i * CX]
        cuda.syncthreads()
        return v

    def make(stats, columns, fused=False):
        # fused (backward with an activation): the act' chain is too large for the
        # compiler to unroll the compute loop, and a rolled loop would index the staging
        # arrays dynamically (local memory): each element is loaded and used in turn
        T = CX * CY if columns else BLOCK
        staged = not fused

        def partials(x, dy, z, scale, bias, mean, invstd, p1, p2, N, C, L, has_scale,
                     has_bias, has_z, act, coef, per):
            shm = cuda.shared.array(T, CT)  # >= SHM: grp_sum's slots too
            xs = cuda.local.array(R, CT)
            ds = cuda.local.array(R, CT)
            t = cuda.threadIdx.x
            M = N * L
            E = R * (CY if columns else BLOCK)
            if columns:
                c = cuda.blockIdx.x * CX + t % CX
                ok = c < C
                c = c if ok else 0
            else:
                c, ok = cuda.blockIdx.x, True
            first = c if columns else c * L   # a valid address for masked slots
            x0 = widen(x[first])
            x0 = x0 if x0 - x0 == ZERO else ZERO  # (an infinite shift: inf - inf = nan)
            mc, ic, sc, bc = ZERO, ZERO, ONE, ZERO
            if not stats:
                mc, ic = mean[c], invstd[c]
                if has_scale:
                    sc = widen(scale[c])
                if has_bias:
                    bc = widen(bias[c])
            grp = cuda.blockIdx.y  # chunks grp*per ... grp*per + per - 1, one partial
            while grp * per * E < M:
                na, pa, qa = 0, ZERO, ZERO  # (the group's merge: Chan's, or sums)
                for j in range(grp * per, min(grp * per + per, -(-M // E))):
                    # this thread's elements: m, m + dm, ... of the channel; (n, l) stepped
                    if columns:
                        m, dm = j * E + t // CX, CY
                    else:
                        m, dm = j * E + t, BLOCK
                    if not ok:
                        m = M
                    n, l = m // L, m % L
                    dn, dl = dm // L, dm % L
                    # loads first, unconditional (masked slots read `first`): all R in flight
                    s, q = ZERO, ZERO
                    for k in range(R):
                        i = (n * L + l) * C + c if columns else (n * C + c) * L + l
                        i = i if m + k * dm < M else first
                        if staged:
                            xs[k] = widen(x[i])
                            if not stats:
                                ds[k] = widen(dy[i])
                        elif m + k * dm < M:
                            xhat = (widen(x[i]) - mc) * ic
                            zk = widen(z[i]) if has_z else ZERO
                            g = widen(dy[i]) * act_grad(xhat * sc + bc + zk, act, coef)
                            s += g
                            q += g * xhat
                        n += dn
                        l += dl
                        if l >= L:
                            l -= L
                            n += 1
                    for k in range(R if staged else 0):
                        if m + k * dm < M:
                            if stats:
                                xs[k] -= x0
                                s += xs[k]
                            else:
                                xhat = (xs[k] - mc) * ic
                                s += ds[k]
                                q += ds[k] * xhat
                    s = column_sum(s, shm) if columns else grp_sum(s, BLOCK, shm)
                    if stats:
                        mu = s / CT(min(E, M - j * E))
                        for k in range(R):
                            if m + k * dm < M:
                                d = xs[k] - mu
                                q += d * d
                        s = mu
                    q = column_sum(q, shm) if columns else grp_sum(q, BLOCK, shm)
                    if stats:  # (lanes past the column sums merge garbage, unwritten)
                        na, pa, qa = chan(na, pa, qa, min(E, M - j * E), s, q)
                    else:
                        pa += s
                        qa += q
                if ok and (t < CX if columns else t == 0):
                    p1[grp * C + c] = pa
                    p2[grp * C + c] = qa
                grp += cuda.gridDim.y
        return partials

    @cuda.jit(device=True)
    def chan(na, mu, m2, nb, mb, m2b):
        """Chan's merge of two (count, mean, M2) triples. An empty side returns the other
        without the two divisions: lane 0 of the finals merges FW lanes in a dependent
        chain, most of them empty when a channel has few chunks (14 us with 31 of
        them, an H200 profile)."""
        if nb == 0:
            return na, mu, m2
        if na == 0:
            return nb, mb, m2b
        n = na + nb
        d = mb - mu
        if d - d != ZERO:  # a side's mean is infinite or NaN: the merged mean is their sum
            return n, mu + mb, m2 + m2b + d * ZERO  # (inf + 5 = inf; inf - inf = NaN), M2 NaN
        return n, mu + d * (CT(nb) / CT(n)), m2 + m2b + d * d * (CT(na) * CT(nb) / CT(n))

    @cuda.jit(device=True)
    def lanes(p1, p2, c, C, M, E, stats):
        """This lane's merge (or sums) of chunks lane, lane + FW, ... in order; then the
        FW lanes' results merged in lane order in shared memory (lane 0 holds them)."""
        sn = cuda.shared.array(FWC, int64)
        s1 = cuda.shared.array(FWC, CT)
        s2 = cuda.shared.array(FWC, CT)
        t = cuda.threadIdx.x
        lane = t % FW
        na, a, b = 0, ZERO, ZERO
        j = lane
        while c < C and j * E < M:
            if stats:
                na, a, b = chan(na, a, b, min(E, M - j * E), p1[j * C + c], p2[j * C + c])
            else:
                a += p1[j * C + c]
                b += p2[j * C + c]
            j += FW
        sn[t], s1[t], s2[t] = na, a, b
        cuda.syncthreads()
        if lane == 0:
            for i in range(t + 1, t + FW):
                if stats:
                    na, a, b = chan(na, a, b, sn[i], s1[i], s2[i])
                else:
                    a += s1[i]
                    b += s2[i]
        return a, b

    def stats_final(x, scale, bias, p1, p2, mean, invstd, rmean, rvar, co, N, C, L, columns,
                    eps, momentum, has_running, has_scale, has_bias, E):
        # FW lanes a channel merge its chunk partials (of E elements; Chan), in a fixed
        # order
        c = cuda.blockIdx.x * FC + cuda.threadIdx.x // FW
        M = N * L
        mu, m2 = lanes(p1, p2, c, C, M, E, True)
        if c < C and cuda.threadIdx.x % FW == 0:
            var = m2 / CT(M)
            x0 = widen(x[c if columns else c * L])
            mu += x0 if x0 - x0 == ZERO else ZERO  # (the partials' shift, finite)
            inv = ONE / math.sqrt(var + eps)
            mean[c] = mu
            invstd[c] = inv
            apply_coefs(scale, bias, mu, inv, co, c, has_scale, has_bias)
            if has_running:
                unbiased = var * CT(M) / CT(M - 1) if M > 1 else var
                rmean[c] = (ONE - momentum) * rmean[c] + momentum * mu
                rvar[c] = (ONE - momentum) * rvar[c] + momentum * unbiased

    def bwd_final(scale, bias, mean, invstd, p1, p2, dscale, dbias, cb, N, C, L, columns,
                  has_scale, has_bias, E):
        c = cuda.blockIdx.x * FC + cuda.threadIdx.x // FW
        a, b = lanes(p1, p2, c, C, N * L, E, False)
        if c < C and cuda.threadIdx.x % FW == 0:
            dbias[c] = narrow(a, dbias)
            dscale[c] = narrow(b, dscale)
            # dx's per-channel terms; the sums unrounded (float16 dscale/dbias would
            # lose bits that invstd then amplifies)
            cb[6 * c] = mean[c]
            cb[6 * c + 1] = invstd[c]
            cb[6 * c + 2] = widen(scale[c]) if has_scale else ONE
            cb[6 * c + 3] = widen(bias[c]) if has_bias else ZERO
            cb[6 * c + 4] = a
            cb[6 * c + 5] = b

    return {"stats_planes": make(True, False), "stats_columns": make(True, True),
            "bwd_planes": make(False, False), "bwd_columns": make(False, True),
            "bwd_act_planes": make(False, False, True), "bwd_act_columns": make(False, True, True),
            "stats_final": stats_final, "bwd_final": bwd_final, "chan": chan}

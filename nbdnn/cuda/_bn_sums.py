"""Batch norm's per-channel reductions: statistics (forward) and the two backward sums,
each as chunk partials then an in-order finalize (deterministic, no atomics).

x is (N, C, L) in one of two layouts (batch_norm.py): planes (NCHW: a channel's
elements are N runs of L) or columns (NHWC, and per_activation: rows of C, a channel a
column). A channel's M = N*L elements are cut into chunks of E; one block a
(channel(s), chunk) writes a partial, and a thread a channel merges its partials in
chunk order.
- planes: BLOCK threads a (channel, chunk), R elements a thread, E = R*BLOCK; element m
  of the chunk at thread t + k*BLOCK (coalesced); its (n, l) is stepped, not divided.
- columns: CX channels x CY row groups a block (CX consecutive channels: coalesced),
  R rows a thread, E = R*CY rows; sums over the CY threads of a column in order.

Statistics: the chunk's values stay in registers (x read once from DRAM), shifted by
the channel's first element x0; the chunk's mean and M2 = sum (v - mean)^2 are exact
two-pass values, merged with Chan's formula. Float32 keeps mean 1e4, std 1 over N*L
past 2**24. Backward: the sums of g = dy*act'(pre) and g*xhat, summed per chunk.
Traffic: statistics read x once (4 B/element float32), backward sums read dy and x
(and z with an activation) once.
"""
import math

from numba import cuda

from . import SIMULATOR

BLOCK = 32 if SIMULATOR else 256
CX, CY = (8, 4) if SIMULATOR else (32, 8)
R = 4 if SIMULATOR else 16
MAX_GRID_Y = 65535


def chunking(N, L, columns):
    """(elements a chunk, chunks a channel)."""
    E = R * (CY if columns else BLOCK)
    return E, max(1, -(-N * L // E))


def launch_shape(C, nch, columns):
    """(grid, block) of the partials kernels."""
    gx = -(-C // CX) if columns else C
    return (gx, min(nch, MAX_GRID_Y), 1), (CX * CY if columns else BLOCK)


def kernels(CT, pre, act_grad):
    """{'stats_planes', 'stats_columns', 'bwd_planes', 'bwd_columns', 'stats_final',
    'bwd_final'} python kernels in compute type CT; pre/act_grad from batch_norm."""
    from ._reduce import SHM
    ZERO, ONE = CT(0), CT(1)

    @cuda.jit(device=True)
    def block_sum(v, shm):
        # over the whole block, in a fixed order (thread 0's tree)
        t, T = cuda.threadIdx.x, cuda.blockDim.x
        shm[t] = v
        cuda.syncthreads()
        w = T // 2
        while w > 0:
            if t < w:
                shm[t] += shm[t + w]
            cuda.syncthreads()
            w //= 2
        v = shm[0]
        cuda.syncthreads()
        return v

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

    def make(stats, columns):
        T = CX * CY if columns else BLOCK

        def partials(x, dy, z, scale, bias, mean, invstd, p1, p2, N, C, L, has_scale,
                     has_bias, has_z, act, coef):
            shm = cuda.shared.array(T, CT)
            vals = cuda.local.array(R, CT)
            t = cuda.threadIdx.x
            M = N * L
            E = R * (CY if columns else BLOCK)
            if columns:
                c = cuda.blockIdx.x * CX + t % CX
                ok = c < C
                c = c if ok else 0
            else:
                c, ok = cuda.blockIdx.x, True
            x0 = CT(x[c if columns else c * L])
            j = cuda.blockIdx.y
            while j * E < M:
                # first element of this thread, then steps of dm (rows or (n, l) pairs)
                if columns:
                    m, dm = j * E + t // CX, CY
                else:
                    m, dm = j * E + t, BLOCK
                n, l = m // L, m % L
                dn, dl = dm // L, dm % L
                s, q = ZERO, ZERO
                for k in range(R):
                    v, gx = ZERO, ZERO
                    if ok and m < M:
                        i = (n * L + l) * C + c if columns else (n * C + c) * L + l
                        if stats:
                            v = CT(x[i]) - x0
                        else:
                            inv = invstd[c]
                            p, xhat = pre(x, z, scale, bias, mean, inv, i, c, has_scale,
                                          has_bias, has_z)
                            v = CT(dy[i]) * (act_grad(p, act, coef) if act >= 0 else ONE)
                            gx = v * xhat
                    vals[k] = v
                    s += v
                    q += gx
                    m += dm
                    n += dn
                    l += dl
                    if l >= L:
                        l -= L
                        n += 1
                if columns:
                    s = column_sum(s, shm)
                else:
                    s = block_sum(s, shm)
                if stats:
                    cnt = min(E, M - j * E)
                    mu = s / CT(cnt)
                    m = j * E + (t // CX if columns else t)
                    for k in range(R):
                        if m < M:
                            d = vals[k] - mu
                            q += d * d
                        m += dm
                    s = mu
                q = column_sum(q, shm) if columns else block_sum(q, shm)
                if ok and (t < CX if columns else t == 0):
                    p1[j * C + c] = s
                    p2[j * C + c] = q
                j += cuda.gridDim.y
        return partials

    def stats_final(x, p1, p2, mean, invstd, rmean, rvar, N, C, L, columns, eps, momentum,
                    has_running):
        # Chan's merge of (count, mean, M2) in chunk order; a thread a channel
        c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if c < C:
            M = N * L
            E = R * (CY if columns else BLOCK)
            na, mu, m2 = 0, ZERO, ZERO
            j = 0
            while j * E < M:
                nb = min(E, M - j * E)
                d = p1[j * C + c] - mu
                n = na + nb
                mu += d * (CT(nb) / CT(n))
                m2 += p2[j * C + c] + d * d * (CT(na) * CT(nb) / CT(n))
                na = n
                j += 1
            var = m2 / CT(M)
            mu += CT(x[c if columns else c * L])
            mean[c] = mu
            invstd[c] = ONE / math.sqrt(var + eps)
            if has_running:
                unbiased = var * CT(M) / CT(M - 1) if M > 1 else var
                rmean[c] = (ONE - momentum) * rmean[c] + momentum * mu
                rvar[c] = (ONE - momentum) * rvar[c] + momentum * unbiased

    def bwd_final(p1, p2, dscale, dbias, sums, N, C, L, columns):
        c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if c < C:
            M = N * L
            E = R * (CY if columns else BLOCK)
            a, b = ZERO, ZERO
            j = 0
            while j * E < M:
                a += p1[j * C + c]
                b += p2[j * C + c]
                j += 1
            dbias[c] = a   # sums keeps them unrounded for dx (float16 outputs would
            dscale[c] = b  # lose bits that invstd then amplifies)
            sums[2 * c] = a
            sums[2 * c + 1] = b

    del SHM
    return {"stats_planes": make(True, False), "stats_columns": make(True, True),
            "bwd_planes": make(False, False), "bwd_columns": make(False, True),
            "stats_final": stats_final, "bwd_final": bwd_final}

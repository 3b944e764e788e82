"""Decoding at the speed of a copy (issue 25: Sq <= 16 queries against a long key
cache): decode.py's split of the keys into chunks, a block a (batch, kv head, chunk),
the chunks merged by decode.py's combine kernel, but with 16-byte loads and a thread a
key, for the common case: 16-bit q, k, v, head dims D = Dv of 64 or 128, R = G Sq <= 8
query rows a kv head, no mask, no dropout (decode.py runs the rest).

A block (T = 128 threads, NW = 4 warps) walks its chunk in tiles of T keys:
  A  thread t, key j = tile + t: its K row by D/8 16-byte loads (32 rows a warp; the
     second 16 bytes of each 32-byte sector come from L1), s_r = scale q_r . k_j for the
     R rows (q in shared memory, read as broadcasts); removed pairs -inf
  B  the tile's max of each row (warp shuffles, then NW slots: one barrier), the running
     max m_r; p = exp(s_r - m_r) into shared memory; each thread's l_r and o_r take the
     rescale exp(m_old - m_new)
  C  thread (ks, dg) = (t // (D/8), t % (D/8)): dims 8 dg .. 8 dg + 7 of V rows ks,
     ks + KS, ... of the tile (KS = T / (D/8) rows a pass; D/8 threads a row: coalesced
     16-byte loads), o_r += p_r,u v_u, skipping p = 0 (a NaN in a removed key's V stays
     out, as on the exact path)
After the chunk: l_r summed over the block, o_r over the KS key subsets (shared memory),
written to decode.py's workspace: (m, l) and the unnormalised o of (row, chunk).

Traffic: K and V once, 2 Sk D 2 bytes a kv head, against 4 R Sk D flops: at R = 1 one
flop a byte, so the kernel is bound by DRAM, whose copy rate is the goal. Registers:
o_r (8 R floats), the R scores and running (m, l); the chunk length is chosen so that
about 16 blocks an SM are in flight (`chunking`).

ON is False: written in run AR after the device time ran out (decode.py measured
8-11% of a copy's bandwidth there); the simulator checks it against the reference
(tests/test_attention_paths.py), the H200 has not run it.
"""
import math

import numpy as np
from numba import cuda, float32

from ..runtime.arrays import dtype_name, ptr
from ..runtime.block_reduce import SHM, device_functions
from ..runtime.device import sm_count
from ..runtime.intrinsics import array_type, load8, widen
from ..runtime.launch import Kernel
from ..runtime.simulator import SIMULATOR
from .simt import _device_functions

ON = False
T = 32 if SIMULATOR else 128    # a block's threads = a tile's keys
DIMS = (64, 128)
ROWS = (1, 2, 4, 8)             # R buckets: a kernel a bucket (registers by R)
BLOCKS_PER_SM = 16              # chunking's target


def usable(q, k, v, attn_mask, dropout_p, G, Sq, D, Dv, geo):
    """ON, 16-bit data, D = Dv in DIMS, G Sq <= 8 rows, no mask, no dropout, and K's and
    V's rows at 16-byte boundaries (bases and strides: geo's k and v strides)."""
    return ON and dtype_name(q) in ("float16", "bfloat16") and D == Dv and D in DIMS and \
        G * Sq <= ROWS[-1] and attn_mask is None and dropout_p == 0 and \
        all(ptr(t) % 16 == 0 for t in (k, v)) and all(s % 8 == 0 for s in geo[10:16])


def chunking(B, Hk, Sk, sms):
    """(chunks a kv head, keys a chunk: a multiple of T) so that B Hk chunks blocks make
    about BLOCKS_PER_SM an SM (a long cache over few heads splits; many heads don't)."""
    tiles = -(-Sk // T)
    want = max(1, -(-BLOCKS_PER_SM * sms // (B * Hk)))
    per = -(-tiles // min(tiles, want))
    return -(-tiles // per), per * T


def _kernel(R, D):
    DG = D // 8          # threads a K or V row in phase C (8 dims each)
    KS = T // DG         # V rows a pass of phase C
    NW = max(1, T // 32)
    QS, PS, WM, OB, O8 = R * D, R * T, R * NW, KS * D, R * 8  # (array sizes: literals)
    NEG = float32(-np.inf)
    live_keys = _device_functions(float32)[2]
    reductions = device_functions(np.float32)
    grp_max, grp_sum = reductions["grp_max"], reductions["grp_sum"]

    def attention_decode_split(q, k, v, ws_o, ws_ml, lens_q, lens_k, Hq, G, Sq, Sk,
                               qb, qh, qi, kb, kh, kj, vb, vh, vj, has_lq, has_lk, causal,
                               scale, nchunks, chunk):
        qs = cuda.shared.array(QS, float32)        # the rows' q, times scale
        ps = cuda.shared.array(PS, float32)        # the tile's p
        wm = cuda.shared.array(WM, float32)        # the warps' maxima, then sums
        ob = cuda.shared.array(OB, float32)        # one row's o over the key subsets
        red = cuda.shared.array(SHM, float32)      # grp_max's slots (the simulator's)
        t = cuda.threadIdx.x
        w, lane = t // 32, t % 32
        dg, ks = t % DG, t // DG
        c = cuda.blockIdx.x % nchunks
        bh = cuda.blockIdx.x // nchunks            # b Hk + hk
        Hk = Hq // G
        b, hk = bh // Hk, bh % Hk
        rows = G * Sq
        for x in range(t, R * D, T):
            r = x // D
            val = float32(0)
            if r < rows:
                h, i = hk * G + r // Sq, r % Sq
                val = widen(q[b * qb + h * qh + i * qi + x % D]) * scale
            qs[x] = val
        lim = cuda.local.array(R, np.int64)        # row r's keys 0 .. lim - 1 take part
        m = cuda.local.array(R, float32)
        l = cuda.local.array(R, float32)
        s = cuda.local.array(R, float32)
        o = cuda.local.array(O8, float32)
        for r in range(R):
            h, i = hk * G + r // Sq, r % Sq
            n = 0
            if r < rows and (has_lq == 0 or i < lens_q[b]):
                n = live_keys(lens_k, has_lk, b, i, Sk, causal)
            lim[r], m[r], l[r] = n, NEG, float32(0)
            for e in range(8):
                o[8 * r + e] = float32(0)
        cuda.syncthreads()
        k0 = c * chunk
        kend = min(Sk, k0 + chunk)
        for t0 in range(k0, kend, T):
            j = t0 + t
            for r in range(R):
                s[r] = float32(0)
            if j < kend:                           # A: s_r = scale q_r . k_j
                kr = (b * kb + hk * kh + j * kj) // 8
                for g in range(DG):
                    kv = load8(k, kr + g)
                    for e in range(8):
                        x = widen(kv[e])
                        for r in range(R):
                            s[r] += qs[r * D + 8 * g + e] * x
            for r in range(R):                     # B: the tile's max of each row
                if not (j < kend and j < lim[r]):
                    s[r] = NEG
                top = grp_max(s[r], 32, red)
                if lane == 0:
                    wm[r * NW + w] = top
            cuda.syncthreads()
            for r in range(R):
                top = m[r]
                for x in range(NW):
                    y = wm[r * NW + x]
                    top = y if y > top else top
                alpha = math.exp(m[r] - top) if top != NEG else float32(1)
                p = float32(0) if s[r] == NEG else math.exp(s[r] - top)
                ps[r * T + t] = p
                m[r], l[r] = top, l[r] * alpha + p
                for e in range(8):
                    o[8 * r + e] *= alpha
            cuda.syncthreads()
            for uu in range(DG):                   # C: o_r += p_r,u v_u
                u = ks + uu * KS
                if t0 + u < kend:
                    vv = load8(v, (b * vb + hk * vh + (t0 + u) * vj) // 8 + dg)
                    vf = (widen(vv[0]), widen(vv[1]), widen(vv[2]), widen(vv[3]),
                          widen(vv[4]), widen(vv[5]), widen(vv[6]), widen(vv[7]))
                    for r in range(R):
                        p = ps[r * T + u]
                        if p != 0:
                            for e in range(8):
                                o[8 * r + e] += p * vf[e]
            # (the next tile writes ps only after its barrier: every thread is past C)
        for r in range(R):                         # the chunk's l_r over the block
            total = grp_sum(l[r], 32, red)
            if lane == 0:
                wm[r * NW + w] = total
        cuda.syncthreads()
        for r in range(R):
            if r < rows:
                for e in range(8):
                    ob[ks * D + 8 * dg + e] = o[8 * r + e]
                cuda.syncthreads()
                h, i = hk * G + r // Sq, r % Sq
                at = ((b * Hq + h) * Sq + i) * nchunks + c
                for d in range(t, D, T):
                    acc = float32(0)
                    for x in range(KS):
                        acc += ob[x * D + d]
                    ws_o[at * D + d] = acc
                if t == 0:
                    total = float32(0)
                    for x in range(NW):
                        total += wm[r * NW + x]
                    ws_ml[2 * at] = m[r]
                    ws_ml[2 * at + 1] = total
                cuda.syncthreads()

    return attention_decode_split


_KERNELS = {}


def kernel(dtype, D, R):
    """The Kernel for dtype, head dim D and R rows a kv head (rounded up to ROWS)."""
    R = next(x for x in ROWS if R <= x)
    key = dtype, D, R
    if key not in _KERNELS:
        a = f"{array_type(dtype)}[::1]"
        sig = f"void({a}, {a}, {a}, float32[::1], float32[::1], int64[::1], int64[::1], " + \
            ", ".join(["int64"] * 16) + ", float32, int64, int64)"
        fn = _kernel(R, D)
        fn.__name__ = fn.__qualname__ = f"attention_decode_split_d{D}_r{R}"
        _KERNELS[key] = (Kernel(fn, [sig]), sig)
    return _KERNELS[key]


def forward(q, k, v, ws, lq, lk, geo, stream):
    """Launch the part kernel over (batch, kv head, chunk) into the workspace ws =
    (ws_o, ws_ml) sized by `chunking`; decode.py's combine kernel then merges."""
    B, Hq, G, Sq, Sk, D = geo[:6]
    nchunks, chunk = chunking(B, Hq // G, Sk, sm_count())
    kern, sig = kernel(dtype_name(q), D, G * Sq)
    kern.launch(sig, B * (Hq // G) * nchunks, T, stream, q, k, v, *ws, lq, lk, Hq, G, Sq,
                Sk, *geo[7:16], geo[24], geo[25], geo[26], float(geo[27]), nchunks, chunk)


def ptx_examples():
    """Both head dims, one row and the most rows (tests/test_ptx.py compiles them)."""
    for dtype, D, R in (("bfloat16", 128, 1), ("bfloat16", 128, 8), ("float16", 64, 4)):
        kernel(dtype, D, R)

"""Decoding at the speed of a copy (Sq <= 16 queries against a long key
cache): decode.py's split of the keys into chunks, a block a (batch, kv head, chunk),
the chunks merged by decode.py's combine kernel, but with 16-byte loads and a thread a
key, for the common case: 16-bit q, k, v, head dims D = Dv of 64 or 128, R = G Sq <= 8
(D 64) or 4 (D 128) query rows a kv head (decode.py runs the rest); masks, dropout,
causal and both lengths as on the exact path (simt.py's bias, keep and key_range).

A block (T = 128 threads, NW = 4 warps) walks its chunk in tiles of T keys:
  A  thread t, key j = tile + t: its K row by D/8 16-byte loads (32 rows a warp; the
     second 16 bytes of each 32-byte sector come from L1), s_r = scale q_r . k_j for the
     R rows (q in shared memory, read as broadcasts); the mask's bias added, removed
     pairs -inf
  B  the tile's max of each row (warp shuffles, then NW slots: one barrier), the running
     max m_r; p = exp(s_r - m_r) into l_r, p times the dropout's keep factor into shared
     memory (-1: a removed pair); each thread's l_r and o_r take the rescale
     exp(m_old - m_new)
  C  thread (ks, dg) = (t // (D/8), t % (D/8)): dims 8 dg .. 8 dg + 7 of V rows ks,
     ks + KS, ... of the tile (KS = T / (D/8) rows a pass; D/8 threads a row: coalesced
     16-byte loads), o_r += p_r,u v_u, skipping removed pairs (a NaN in a removed key's
     V stays out, as on the exact path; a dropped pair's 0 meets it, as in the reference)
After the chunk: l_r summed over the block, o_r over the KS key subsets (shared memory),
written to decode.py's workspace: (m, l) and the unnormalised o of (row, chunk).

Paged (paged.py): the same kernel with each key's K row found through the block table
by its thread in A, which hands the V row to C through shared memory (vrows: C's
threads read other keys' rows; the table is read once a key a tile).

Traffic: K and V once, 2 Sk D 2 bytes a kv head, against 4 R Sk D flops: at R = 1 one
flop a byte, so the kernel is bound by DRAM, whose copy rate is the goal. Registers:
o_r (8 R floats), the R scores and running (m, l); the chunk length is chosen so that
about 16 blocks an SM are in flight (`chunking`).

Measured (H200, bf16, D 128, Sq 1): 28-76% of a copy's bandwidth (1.0-3.2 TB/s; B 1 at
8k keys the least, B 64 the most), 3.7-11.5x decode.py's part kernel, 0.42-0.72x
PyTorch's default (cuDNN / flash-decoding), 1.2-1.3x its flash backend at B 64;
grouped-query (32 query heads on 8 kv heads, R 4) 38-43% of copy.
"""
import math

import numpy as np
from numba import cuda, float32, int64

from ..runtime.memory.arrays import dtype_name, ptr
from ..runtime.device_code.block_reduce import SHM, device_functions
from ..runtime.launch.codegen import compile_source
from ..runtime.device import sm_count
from ..runtime.device_code.intrinsics import array_type, load8, widen
from ..runtime.launch.kernel import Kernel
from ..runtime.simulator import SIMULATOR
from .simt import attention_device_functions, geometry_types

T = 32 if SIMULATOR else 128    # a block's threads = a tile's keys
DIMS = (64, 128)
ROWS = (1, 2, 4, 8)             # R buckets: a kernel a bucket (registers by R) ...
MAX_ROWS = {64: 8, 128: 4}      # ... up to these by D (R 8 at D 128: 524 B spilled)
BLOCKS_PER_SM = 16              # chunking's target ...
MIN_CHUNK_TILES = 1             # ... and each chunk's least T-key tiles (its setup and
# tail reduction amortised over more keys: B 1 at 8k keys, one tile a chunk, 28%
# of copy; perf/suites/attention.py --decode --set ... sweeps both)


def usable(q, G, Sq, D, Dv, k, v, geo):
    """16-bit data, D = Dv in DIMS, G Sq <= MAX_ROWS[D] rows, K's and V's rows at
    16-byte boundaries (bases and strides: geo's k and v strides), no sliding window (a
    row's keys start at 0 here), no logit cap, no ALiBi."""
    return dtype_name(q) in ("float16", "bfloat16") and D == Dv and D in DIMS and \
        G * Sq <= MAX_ROWS.get(D, 0) and all(ptr(t) % 16 == 0 for t in (k, v)) and \
        all(s % 8 == 0 for s in (geo.kb, geo.kh, geo.kj, geo.vb, geo.vh, geo.vj)) and \
        not geo.windowed and not geo.softcap and not geo.alibi


def chunking(B, Hk, Sk, sms):
    """(chunks a kv head, keys a chunk: a multiple of T) so that B Hk chunks blocks make
    about BLOCKS_PER_SM an SM (a long cache over few heads splits; many heads don't)."""
    tiles = -(-Sk // T)
    want = max(1, -(-BLOCKS_PER_SM * sms // (B * Hk)))
    per = min(tiles, max(MIN_CHUNK_TILES, -(-tiles // min(tiles, want))))
    return -(-tiles // per), per * T


def source(R, D, paged=False):
    """(name, source) of the part kernel for R rows and head dim D (paged: each key's K
    and V rows through paged.py's block table, a key in a page outside the cache removed
    and its loads sent to page 0's rows), unrolled: the rows'
    scores s_r, maxima mx_r (m0 .. m3 are the mask's strides), sums l_r and o_r (8 dims
    a thread) are scalars (a row's mask and dropout indices are recomputed where used:
    held, they cost R 8 at D 64 236 B of spills), and each thread issues all D/8 of its
    K loads (phase A) and its D/8 V loads (phase C) before their math. Loads past the
    chunk's end re-read its last key (never out of bounds), a removed pair there: no
    branch around a load."""
    DG, NW = D // 8, max(1, T // 32)
    KS = T // DG
    rows = range(R)
    name = f"attention_splitkv{'_paged' if paged else ''}_d{D}_r{R}"  # (its own family for
    # tests/test_ptx.py)
    L = [f"def {name}(q, k, v, ws_o, ws_ml, ma, mb, lens_q, lens_k, B, Hq, G, Sq, Sk, D_, Dv_, "
         "qb, qh, qi, kb, kh, kj, vb, vh, vj, ob_, oh_, oi_, mkind, m0, m1, m2, m3, has_lq, "
         "has_lk, causal, scale, mode, thr, kscale, off_lo, off_hi, key_lo, key_hi, win_lo, "
         "win_hi, softcap, alibi, slope_b, slopes, nchunks, "
         f"chunk{', table, P, W, npages' if paged else ''}):",
         f"    qs = cuda.shared.array({R * D}, F32)  # the rows' q, times scale",
         f"    ps = cuda.shared.array({R * T}, F32)  # the tile's p",
         f"    wm = cuda.shared.array({R * NW}, F32)  # the warps' maxima, then sums",
         f"    ob = cuda.shared.array({KS * D}, F32)  # one row's o over the key subsets",
         "    red = cuda.shared.array(SHM, F32)  # grp_max's slots (the simulator's)"]
    if paged:  # (each key's V row, found by its thread in A: C reads it here, not the table)
        L += [f"    vrows = cuda.shared.array({T}, I64)"]
    L += ["    t = cuda.threadIdx.x", "    w, lane = t // 32, t % 32",
         f"    dg, ks = t % {DG}, t // {DG}",
         "    c = cuda.blockIdx.x % nchunks", "    bh = cuda.blockIdx.x // nchunks  # b Hk + hk",
         "    Hk = Hq // G", "    b, hk = bh // Hk, bh % Hk", "    rows = G * Sq",
         # the tiles past the batch entry's length are never loaded (a cache longer
         # than its sequence: seq_lens_k, a paged table's capacity): the tile loop stops
         # there (kstop; kend stays the chunk's end for the loads' clamp: R 8 at D 64,
         # at 255 registers, spilled with kend or a bound of the rows' limits instead)
         "    k0 = c * chunk", "    kend = min(Sk, k0 + chunk)",
         "    kstop = min(kend, min(max(lens_k[b], 0), Sk) if has_lk != 0 else Sk)",
         f"    for x in range(t, {R * D}, {T}):", f"        r = x // {D}", "        val = F32(0)",
         "        if r < rows:", "            h, i = hk * G + r // Sq, r % Sq",
         f"            val = widen(q[b * qb + h * qh + i * qi + x % {D}]) * scale",
         "        qs[x] = val"]
    for r in rows:
        L += [f"    h, i = hk * G + {r} // Sq, {r} % Sq", f"    lim{r} = 0",
              f"    if {r} < rows and (has_lq == 0 or i < lens_q[b]):",
              f"        lim{r} = key_range(lens_q, lens_k, has_lq, has_lk, b, i, Sq, Sk, causal, "
              "win_lo, win_hi)[1]  # (from key 0: usable() takes no window)",
              f"    mx{r} = NEG", f"    l{r} = F32(0)"] + \
            [f"    o{r}_{e} = F32(0)" for e in range(8)]
    L += ["    cuda.syncthreads()",
          "    vrow = (b * vb + hk * vh) // 8 + dg", "    vstep = vj // 8",
          f"    for t0 in range(k0, kstop, {T}):",  # A: s_r = scale q_r . k_j
          "        j = t0 + t"]
    if paged:
        L += ["        jj = min(j, kend - 1)", "        pg = table[b * W + jj // P]",
              "        inside = pg >= 0 and pg < npages",
              "        kr = ((pg if inside else 0) * kb + hk * kh + (jj % P) * kj) // 8",
              "        vr = ((pg if inside else 0) * vb + hk * vh + (jj % P) * vj) // 8"]
    else:
        L += ["        kr = (b * kb + hk * kh + min(j, kend - 1) * kj) // 8"]
    live = "j < kend and j < lim{r}" + (" and inside" if paged else "")
    L += [f"        s{r} = F32(0)" for r in rows]
    for g in range(DG):
        if g == 0:
            L += [f"        k{x} = load8(k, kr + {x})" for x in range(DG)]
        for e in range(8):
            L += [f"        kx = widen(k{g}[{e}])"] + \
                [f"        s{r} += qs[{r * D + 8 * g + e}] * kx" for r in rows]
    for r in rows:  # B: the tile's max of each row (the mask's bias or removal first)
        L += [f"        if not ({live.format(r=r)}):", f"            s{r} = NEG",
              "        elif mkind != 0:",
              f"            ok, add = bias(ma, mb, mkind, b * m0 + (hk * G + {r} // Sq) * m1 + "
              f"({r} % Sq) * m2 + j * m3)",
              f"            s{r} = s{r} + add if ok else NEG",
              f"        top = grp_max(s{r}, 32, red)", "        if lane == 0:",
              f"            wm[{r * NW} + w] = top"]
    L += ["        cuda.syncthreads()"]
    if paged:  # (after the barrier, as ps: every thread is past the last tile's C)
        L += ["        vrows[t] = vr"]
    for r in rows:
        L += [f"        top = mx{r}"]
        for x in range(NW):
            L += [f"        y = wm[{r * NW + x}]", "        top = y if y > top else top"]
        L += [f"        alpha = math.exp(mx{r} - top) if top != NEG else F32(1)",
              f"        p = F32(0) if s{r} == NEG else math.exp(s{r} - top)",
              f"        ps[{r * T} + t] = F32(-1) if s{r} == NEG else p if thr == DROP_NONE else "
              f"p * keep(U64((b * Hq + hk * G + {r} // Sq) * Sq + {r} % Sq) * U64(Sk) + U64(j), "
              "thr, kscale, off_lo, off_hi, key_lo, key_hi)",
              f"        mx{r} = top", f"        l{r} = l{r} * alpha + p"] + \
            [f"        o{r}_{e} *= alpha" for e in range(8)]
    L += ["        cuda.syncthreads()"]  # C: o_r += p_r,u v_u
    for uu in range(DG):
        if uu == 0 and paged:  # (a removed key's p is -1: its row's values are not used)
            L += [f"        v{x} = load8(v, vrows[ks + {x * KS}] + dg)" for x in range(DG)]
        elif uu == 0:
            L += [f"        v{x} = load8(v, vrow + min(t0 + ks + {x * KS}, kend - 1) * vstep)"
                  for x in range(DG)]
        L += [f"        f{e} = widen(v{uu}[{e}])" for e in range(8)]
        for r in rows:
            L += [f"        p = ps[{r * T} + ks + {uu * KS}]", "        if not p < 0:"] + \
                [f"            o{r}_{e} += p * f{e}" for e in range(8)]
    # (the next tile writes ps only after its first barrier: every thread is past C)
    for r in rows:  # the chunk's l_r over the block
        L += [f"    total = grp_sum(l{r}, 32, red)", "    if lane == 0:",
              f"        wm[{r * NW} + w] = total"]
    L += ["    cuda.syncthreads()"]
    for r in rows:
        L += [f"    if {r} < rows:"] + \
            [f"        ob[ks * {D} + 8 * dg + {e}] = o{r}_{e}" for e in range(8)] + [
            "        cuda.syncthreads()", f"        h, i = hk * G + {r} // Sq, {r} % Sq",
            "        at = ((b * Hq + h) * Sq + i) * nchunks + c",
            f"        for d in range(t, {D}, {T}):", "            acc = F32(0)",
            f"            for x in range({KS}):", f"                acc += ob[x * {D} + d]",
            f"            ws_o[at * {D} + d] = acc", "        if t == 0:",
            "            total = F32(0)"] + \
            [f"            total += wm[{r * NW + x}]" for x in range(NW)] + [
            f"            ws_ml[2 * at] = mx{r}", "            ws_ml[2 * at + 1] = total",
            "        cuda.syncthreads()"]
    return name, "\n".join(L) + "\n"


_KERNELS = {}


def kernel(dtype, D, R, paged=False):
    """The Kernel for dtype, head dim D and R rows a kv head (rounded up to ROWS); paged:
    with the block table's arguments last (paged.py)."""
    R = next(x for x in ROWS if R <= x)
    key = dtype, D, R, paged
    if key not in _KERNELS:
        a = f"{array_type(dtype)}[::1]"
        sig = f"void({a}, {a}, {a}, float32[::1], float32[::1], {a}, uint8[::1], " \
            f"{geometry_types('float32')}, int64, int64" + \
            (", int64[::1], int64, int64, int64)" if paged else ")")  # (decode.py's part
        # kernel's, then the chunks and their length)
        name, src = source(R, D, paged)
        reductions = device_functions(np.float32)
        _, keep, key_range, _, bias, *_ = attention_device_functions(float32)
        fn = compile_source(name, src, dict(
            cuda=cuda, math=math, F32=float32, I64=int64, U64=np.uint64, NEG=float32(-np.inf), SHM=SHM,
            DROP_NONE=np.uint64(1 << 32), load8=load8, widen=widen, key_range=key_range,
            bias=bias, keep=keep,
            grp_max=reductions["grp_max"], grp_sum=reductions["grp_sum"]), about={
            "config": f"{dtype}, D {D}, {R} rows a kv head, {T} threads = keys a tile",
            "traffic": f"a tile: {2 * T * D * 2} B of K and V in, {4 * R * T * D} flops",
            "why": "decode_split.py"})
        _KERNELS[key] = (Kernel(fn, [sig]), sig)
    return _KERNELS[key]


def forward(q, k, v, ws, ma, mb, lq, lk, geo, stream, pages=None):
    """Launch the part kernel over (batch, kv head, chunk) into the workspace ws =
    (ws_o, ws_ml) sized by `chunking`; decode.py's combine kernel then merges. pages:
    (block table, P, W, number of pages) of a paged cache (paged.py)."""
    B, Hq, G, Sq, Sk, D = geo[:6]
    nchunks, chunk = chunking(B, Hq // G, Sk, sm_count())
    kern, sig = kernel(dtype_name(q), D, G * Sq, pages is not None)
    kern.launch(sig, B * (Hq // G) * nchunks, T, stream, q, k, v, *ws, ma, mb, lq, lk, *geo,
                nchunks, chunk, *(pages or ()))


def ptx_examples():
    """Both head dims and dtypes (tests/test_ptx.py compiles the first of each dtype: the
    smaller ones; perf/tools/ptxas_check.py all: R 4 at D 128 and 8 at D 64 take 235
    and 254 registers, no spills)."""
    for dtype, D, R in (("bfloat16", 128, 1), ("float16", 64, 2), ("bfloat16", 128, 4),
                        ("float16", 64, 8)):
        kernel(dtype, D, R)
    for dtype, D, R in (("float16", 128, 1), ("bfloat16", 64, 8)):
        kernel(dtype, D, R, paged=True)

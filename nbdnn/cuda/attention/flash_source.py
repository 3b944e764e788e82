"""The flash-attention forward kernel's generated source (flash.py documents the kernel,
its limits and its switches; flash.kernel compiles what `source` writes).

A block: 3 warpgroups. Warpgroup 0 produces: one thread loads the block's Q tile once,
then each key tile's K and V by TMA into a ring of STAGES stages (128-byte swizzle,
each operand in 64-column boxes: one 128-byte row a key), announcing K and V on their
own mbarriers so that S = QK^T starts while V lands. Warpgroups 1 and 2 consume, each
64 query rows of the block's BM = 128:

    S (64 x BN, registers)  = Q_w (64 x D, smem, K-major) @ K^T (smem, K-major)    wgmma
    online softmax of S's rows in registers (exp2, the scale folded into log2(e))
    P (64 x BN, registers, 16-bit) -> A operand as it lies (wgmma.wgmma_rs)
    O (64 x D, registers)  += P @ V (smem: keys x D, D contiguous, MN-major B)      wgmma

Shared memory (128-byte-swizzled boxes, BM or BN rows of 128 B, 1024-B aligned):

    | Q: D/64 boxes of BM rows | stage 0: K (D/64 boxes of BN rows), V (same) | stage 1 ...

A consumer thread's fragment (wgmma.py): rows r = 16 (i // 32) + (i % 32) // 4 and r + 8
of its 64, columns 8j + 2 (i % 4) + {0, 1}; s[4j], s[4j+1] on row r, s[4j+2], s[4j+3]
on row r + 8 (o likewise over D). The four lanes of a row reduce its max and sum with
two xor shuffles.

Traffic a key tile: 2 BN D 2 bytes in (K and V), 4 BM BN D flops (two products): at
BN = 128, D = 128, 64 KB for 8.4 MFLOP, 128 flop/byte, so the loads hide behind the
tensor cores once a head's K and V sit in L2 (the block order keeps a head's query
tiles together).

Four features are compiled in only where a call has them (`masked`: the mask's kind,
`dropped`, `capped`, `alibi`):
- a mask (strides ms0..ms3 over (B, Hq, Sq, Sk), 0 where broadcast): boolean (True
  attends), each score reads its byte and a False one is -inf, as past seq_lens_k; or
  additive (q's dtype), each score takes its value m / scale before the scale (in the
  log2 domain: s sl + m log2(e)); a tile's BM x BN values come from L2 (a (B, 1, S, S)
  causal mask: S^2 values a batch entry);
- dropout, nbdnn.dropout's stream over the (B, Hq, Sq, Sk) scores in C order (score e
  is word e % 4 of Philox4x32-10 call e // 4; cpu/dropout.py), so P V takes P' = P keep
  / (1 - p) while the row sums l take P (the reference's o = (softmax keep / (1 - p)) V).
  With Sk % 4 == 0 a call's 4 words are 4 adjacent keys of one row: lanes 2c and 2c + 1
  (columns 8j + 4c .. 8j + 4c + 3 together) each make one call a column group, for row r
  and row r + 8 respectively, and trade the two words the other needs by two shuffles:
  BN / 8 calls a thread a tile, none wasted;
- a logit cap (softcap): each raw score s becomes (softcap / scale) tanh(s scale /
  softcap) before the mask and the softmax (flash.capped: ex2 and rcp, two MUFU
  instructions a score besides the softmax's ex2; tanh.approx's one would err by
  2^-11 of the cap, 0.025 at Gemma 2's 50);
- ALiBi: each (capped) raw score takes -slope / scale |i + d - j| (d: ALiBi's diagonal),
  |i + d - j| = |ca - c| for the tile's per-row ca = i + d - n0 - cb and the score's
  column offset c: a subtraction, an absolute value, a conversion and an FMA a score.
"""

BM = 128           # query rows a block (two consumer warpgroups of 64)
REGS = (24, 240)   # setmaxnreg: the producer's, the consumers' (24 x 128 + 240 x 256 of
#                    an SM's 65536; the kernel compiles for 168 = 65536 / 384)


def shared_bytes(D, BN, stages):
    """Dynamic shared memory of a block: 1024 B of alignment slack, Q, the stages."""
    return 1024 + BM * D * 2 + stages * 2 * BN * D * 2


def _tree(op, xs):
    """A balanced reduction expression of names xs with binary function op."""
    while len(xs) > 1:
        xs = [f"{op}({xs[i]}, {xs[i + 1]})" if i + 1 < len(xs) else xs[i]
              for i in range(0, len(xs), 2)]
    return xs[0]


def _sum(xs):
    while len(xs) > 1:
        xs = [f"({xs[i]} + {xs[i + 1]})" if i + 1 < len(xs) else xs[i]
              for i in range(0, len(xs), 2)]
    return xs[0]


def _producer_lines(D, BN, stages, persistent):
    q_bytes, kv_bytes, boxes = BM * D * 2, BN * D * 2, D // 64
    L = ["            while mbarrier_try_wait_parity(U32(qempty), U32((jt & 1) ^ 1)) == 0:",
         "                pass  # (the consumers are done with the last tile's Q)"] \
        if persistent else []
    L += [f"            mbarrier_arrive_expect_tx(U32(qfull), {q_bytes})"]
    L += [f"            tma_load_3d(U32(qs + {c * BM * 128}), map_q, I32(xq + {64 * c}), "
          "I32(m0), I32(zq), U32(qfull))" for c in range(boxes)]
    L += ["            for t in range(ntiles):",
          f"                s = (it + t) % {stages}",
          f"                ph = ((it + t) // {stages}) & 1",
          "                while mbarrier_try_wait_parity(U32(empty0 + 8 * s), U32(ph ^ 1)) == 0:",
          "                    pass",
          f"                ka = ks0 + s * {2 * kv_bytes}",
          f"                n0 = (kt0 + t) * {BN}"]
    for bar, mp, off in (("kfull0", "map_k", 0), ("vfull0", "map_v", kv_bytes)):
        L += [f"                mbarrier_arrive_expect_tx(U32({bar} + 8 * s), {kv_bytes})"]
        L += [f"                tma_load_3d(U32(ka + {off + c * BN * 128}), {mp}, "
              f"I32(xk + {64 * c}), I32(n0), I32(zk), U32({bar} + 8 * s))" for c in range(boxes)]
    L += ["            it += ntiles", "            jt += 1"]
    head = ["    if wg == 0:", f"        setmaxnreg_dec({REGS[0]})", "        if tid == 0:",
            "            it = 0  # K/V tiles loaded so far (stage, phase), tiles so far",
            "            jt = 0"]
    return head + (_persistent(L, "            ", D, BN) if persistent else L)


def _persistent(L, ind, D, BN):
    """Lines L of one tile, inside a loop over this block's tiles (their geometry first)."""
    return [f"{ind}for tile in range(cuda.blockIdx.x, total, cuda.gridDim.x):"] + \
        _tile_lines(D, BN, ind + "    ") + ["    " + x for x in L]


def _tile_lines(D, BN, ind):
    """Tile `tile` -> its geometry: one block a (batch, head, query tile), a head's tiles
    consecutive (its K and V stay in L2 while they run); causal: a head's longest rows
    first, the diagonal at key i + dg for query i (dg: 0 top-left, Lk - Lq
    bottom-right), the band win_lo <= j - i - dg <= win_hi about it (geometry.py), so the
    key tiles kt0 .. kt1 - 1 that meet the block's band (ntiles of them); the maps'
    coordinates (BHSD: (B*H, S, D) maps, BSHD: (B, S, H*D) maps)."""
    return [ind + x for x in [
        f"tiles = (Sq + {BM - 1}) // {BM}", "bh = tile // tiles", "mt = tile % tiles",
        "if causal != 0:", "    mt = tiles - 1 - mt", "b = bh // Hq", "h = bh % Hq",
        "hk = h // G", f"m0 = mt * {BM}", "lqb = lq[b] if has_lq != 0 else Sq",
        "lkb = lk[b] if has_lk != 0 else Sk", "kend = lkb",
        "dg = (min(max(lkb, 0), Sk) - min(max(lqb, 0), Sq)) if causal == 2 else 0",
        f"if causal != 0 and m0 + {BM} + dg + win_hi < kend:",
        f"    kend = max(m0 + {BM} + dg + win_hi, 0)",
        "if m0 >= lqb:", "    kend = 0", f"kt1 = (kend + {BN - 1}) // {BN}",
        f"kt0 = min(max(m0 + dg + win_lo, 0) // {BN}, kt1) if causal != 0 else 0",
        "ntiles = kt1 - kt0",
        "zq = bh if bhsd != 0 else b", f"xq = 0 if bhsd != 0 else h * {D}",
        "zk = b * (Hq // G) + hk if bhsd != 0 else b", f"xk = 0 if bhsd != 0 else hk * {D}"]]



def live_lines(ind, rows=("r0", "r1")):
    """Rows r0, r1's live keys lo .. lim - 1: before seq_lens_k, inside the band; held as
    lo and the unsigned width wd, so that one unsigned compare, U64(key - lo) < wd, tells
    a key inside from one on either side."""
    L = [f"{ind}lo0 = 0", f"{ind}lo1 = 0", f"{ind}lim0 = lkb", f"{ind}lim1 = lkb",
         f"{ind}if causal != 0:"]
    for rr, r in enumerate(rows):
        L += [f"{ind}    lim{rr} = min(lkb, {r} + 1 + dg + win_hi)",
              f"{ind}    lo{rr} = max({r} + dg + win_lo, 0)"]
    return L + [f"{ind}wd{rr} = U64(max(lim{rr} - lo{rr}, 0))" for rr in (0, 1)]


def cap_lines(ind):
    """The logit cap's constants for flash.capped over raw scores s (sl = scale log2(e)):
    cs tanh(y) = cs - 2 cs / (1 + 2^(s c2)), y = s scale / softcap, cs = softcap / scale
    (the cap in raw units), c2 = 2 sl / softcap."""
    return [f"{ind}cc2 = F32(2) * sl / softcap", f"{ind}ccs = softcap * F32(LOG2E) / sl",
            f"{ind}ccs2 = F32(2) * ccs"]


def alibi_lines(ind, *rows):
    """ALiBi's slope as a raw-unit factor ans = -slope / scale (sl = scale log2(e)), the
    diagonal adg of its code, and each row's ai = i + adg (rows: the names of i)."""
    return [f"{ind}ans = -slopes[b * slope_b + h] * F32(LOG2E) / sl",
            f"{ind}adg = (min(max(lkb, 0), Sk) - min(max(lqb, 0), Sq)) if alibi == 2 else 0"] + \
        [f"{ind}ai{rr} = {r} + adg" for rr, r in enumerate(rows)]


def _pack_lines(BN, ind, dropped=False):
    """P's probabilities p -> the 16-bit pairs a of PV's A operand; dropped: each times
    its keep factor, kscale or 0 (module docstring: a lane's call per column group j
    covers row r0 on even lanes, r1 on odd ones; the shuffles swap the other row's pair)."""
    if not dropped:
        return [f"{ind}a{k} = cvt(p{2 * k}, p{2 * k + 1})" for k in range(BN // 4)]
    L = []
    for j in range(BN // 8):
        L += [f"{ind}f0, f1, f2, f3 = pair_keep((eb + U64(n0 + {8 * j})) >> TWO, ev, thr, "
              "kscale, off_lo, off_hi, key_lo, key_hi)",
              f"{ind}a{2 * j} = cvt(p{4 * j} * f0, p{4 * j + 1} * f1)",
              f"{ind}a{2 * j + 1} = cvt(p{4 * j + 2} * f2, p{4 * j + 3} * f3)"]
    return L


def _softmax_lines(BN, D, ind, pack=True, feat=(False, False, False, False)):
    """Scores s -> masked x, the rows' running max m_, sum l_, probabilities p (packed
    into a unless pack is False). feat: (masked: the mask's kind, 1 boolean, 2 additive:
    every score reads its mask value; dropped: the packed p take their keep factors;
    capped: each raw score capped first, capped(s, ...) of flash.py, in its own units;
    alibi: then ALiBi's term, ans |ca - c| in raw units)."""
    masked, dropped, capped, alibi = feat
    raw = "capped(sc[{k}], cc2, ccs, ccs2)" if capped else "sc[{k}]"
    if alibi:
        raw = "(" + raw + " + ans * F32(abs(ca{r} - {c})))"
    n = BN // 2
    row = [(k % 4) // 2 for k in range(n)]          # 0: row r, 1: row r + 8
    col = [8 * (k // 4) + k % 2 for k in range(n)]  # column offset past n0 + cb
    inside = "ck{r} + U64({c}) < wd{r}"  # (key cl + c in row r's live keys lo .. lim - 1)
    alibi_tile = [f"{ind}ca{rr} = ai{rr} - n0 - cb" for rr in (0, 1)] if alibi else []
    if masked:
        score = f"masked_score({raw}, {inside}, mb, mr{{r}} + (cl + {{c}}) * ms3)" \
            if masked == 1 else \
            f"added_score({raw}, {inside}, ma, mr{{r}} + (cl + {{c}}) * ms3, isc)"
        L = [f"{ind}cl = n0 + cb", f"{ind}ck0 = U64(cl - lo0)", f"{ind}ck1 = U64(cl - lo1)"]
        L += [f"{ind}x{k} = " + score.format(k=k, c=col[k], r=row[k]) for k in range(n)]
        L = L[:1] + alibi_tile + L[1:]
    else:
        L = [f"{ind}need = (n0 + {BN} > lkb) | ((causal != 0) & ((n0 + {BN - 1} > wrow + dg + "
             f"win_hi) | (n0 < wrow + 63 + dg + win_lo)))  # (bitwise: no branches in IR)",
             f"{ind}if need:", f"{ind}    ck0 = U64(n0 + cb - lo0)",
             f"{ind}    ck1 = U64(n0 + cb - lo1)"]
        L += [f"{ind}    x{k} = sel({inside.format(c=col[k], r=row[k])}, "
              f"{raw.format(k=k, c=col[k], r=row[k])}, NEG)" for k in range(n)]
        L += [f"{ind}else:"] + [f"{ind}    x{k} = {raw.format(k=k, c=col[k], r=row[k])}"
                                for k in range(n)]
        L = alibi_tile + L
    for rr in (0, 1):
        xs = [f"x{k}" for k in range(n) if row[k] == rr]
        L += [f"{ind}mx{rr} = {_tree('fmaxf', xs)}",
              f"{ind}mx{rr} = fmaxf(mx{rr}, cuda.shfl_xor_sync(FULL, mx{rr}, 1))",
              f"{ind}mx{rr} = fmaxf(mx{rr}, cuda.shfl_xor_sync(FULL, mx{rr}, 2))",
              f"{ind}mn{rr} = fmaxf(m_{rr}, mx{rr} * sl)",
              f"{ind}mu{rr} = sel(mn{rr} == NEG, F32(0), mn{rr})  # (a row masked so far)",
              f"{ind}al{rr} = ex2(m_{rr} - mu{rr})",
              f"{ind}m_{rr} = mn{rr}",
              f"{ind}nmu{rr} = -mu{rr}"]
    L += [f"{ind}p{k} = ex2(cuda.fma(x{k}, sl, nmu{row[k]}))" for k in range(n)]
    for rr in (0, 1):
        L += [f"{ind}l_{rr} = l_{rr} * al{rr} + " +
              _sum([f"p{k}" for k in range(n) if row[k] == rr])]
    return L + (_pack_lines(BN, ind, dropped) if pack else [])


def _pv_lines(D, BN, ind, stage, parity):
    """O += P V of the tile in `stage` (its V awaited): the a registers, V MN-major."""
    L = [f"{ind}va = ks0 + {stage} * {4 * BN * D} + {2 * BN * D}",
         f"{ind}while mbarrier_try_wait_parity(U32(vfull0 + 8 * {stage}), U32({parity})) == 0:",
         f"{ind}    pass"]
    return L + [f"{ind}o = mma_pv(a{4 * kk}, a{4 * kk + 1}, a{4 * kk + 2}, a{4 * kk + 3}, "
                f"descriptor(va + {2048 * kk}, {BN * 128}, 1024, SW128), o, 1)"
                for kk in range(BN // 16)] + [f"{ind}wgmma_commit()"]


def _consumer_lines(D, BN, stages, overlap, pingpong, persistent, feat):
    """A consumer warpgroup: its constants, then its tiles (_tile_lines), one each
    unless persistent. feat: (masked, dropped, capped, alibi)."""
    setup = ["    else:", f"        setmaxnreg_inc({REGS[1]})", "        w = wg - 1",
             "        i = tid % 128", "        lane = i % 32", "        cb = 2 * (lane % 4)",
             "        qa = qs + w * 8192  # (64 rows of 128 B into each Q box)",
             "        sl = F32(scale_log2)", "        it = 0", "        jt = 0"]
    L = _consumer_tile(D, BN, stages, overlap, pingpong, feat)
    if persistent:  # (this tile's Q is free once its products are done: before the stores)
        at = L.index("        l_0 += cuda.shfl_xor_sync(FULL, l_0, 1)")
        L[at:at] = ["        if i == 0:", "            mbarrier_arrive(U32(qempty))"]
    L += ["        it += ntiles", "        jt += 1"]
    return setup + (_persistent(L, "        ", D, BN) if persistent else L)


def _consumer_tile(D, BN, stages, overlap, pingpong=False, feat=(False, False, False, False)):
    """A consumer warpgroup's loop over the key tiles. overlap (variant F2, FA3's
    intra-warpgroup pipelining): tile t's S = QK^T and tile t-1's O += PV are issued
    together, and the softmax of S_t runs while PV_{t-1} is on the tensor cores; O is
    rescaled once PV_{t-1} is done, the last tile's PV after the loop. Without it (F1):
    S_t, wait, softmax, PV_t, wait."""
    masked, dropped, capped, alibi = feat
    kv_bytes = BN * D * 2
    ind = " " * 12
    L = ["        wrow = m0 + w * 64",
         "        r0 = wrow + 16 * (i // 32) + lane // 4",
         "        r1 = r0 + 8",
         "        m_0 = NEG", "        m_1 = NEG", "        l_0 = F32(0)", "        l_1 = F32(0)"]
    L += live_lines("        ") + ["        o = zero_o()", "        sc = zero_s()"]
    if masked:  # (rows past Sq read row Sq - 1: in bounds, never stored)
        L += [f"        mr{rr} = b * ms0 + h * ms1 + min(r{rr}, Sq - 1) * ms2" for rr in (0, 1)]
        L += ["        isc = F32(LOG2E) / sl  # 1 / scale: m / scale joins the raw scores"]
    if capped:
        L += cap_lines("        ")
    if alibi:
        L += alibi_lines("        ", "r0", "r1")
    if dropped:  # score (row, n0 + 8 j + 4 (c // 2)): this lane's call's first word
        L += ["        eb = U64((b * Hq + h) * Sq + (r0 if lane % 2 == 0 else r1)) * U64(Sk) "
              "+ U64(4 * ((lane % 4) // 2))",
              "        ev = lane % 2 == 0"]
    L += [
         "        while mbarrier_try_wait_parity(U32(qfull), U32(jt & 1)) == 0:",
         "            pass"]
    head = [f"s = (it + t) % {stages}", f"ph = ((it + t) // {stages}) & 1",
            f"ka = ks0 + s * {2 * kv_bytes}",
            f"n0 = (kt0 + t) * {BN}",
            "while mbarrier_try_wait_parity(U32(kfull0 + 8 * s), U32(ph)) == 0:",
            "    pass"]
    qk = ["wgmma_fence()"]  # (S = Q K^T of tile t, issued)
    for kk in range(D // 16):
        off_q = (kk // 4) * BM * 128 + (kk % 4) * 32
        off_k = (kk // 4) * BN * 128 + (kk % 4) * 32
        qk += [f"sc = mma_qk(descriptor(qa + {off_q}, 16, 1024, SW128), "
               f"descriptor(ka + {off_k}, 16, 1024, SW128), sc, {int(kk > 0)})"]
    qk += ["wgmma_commit()"]
    tile = head + qk
    release = ["if i == 0:", "    mbarrier_arrive(U32(empty0 + 8 * s))"]
    if not overlap:
        L += ["        for t in range(ntiles):"] + [ind + x for x in tile + ["wgmma_wait(0)"]] + \
            _softmax_lines(BN, D, ind, True, feat) + [ind + "o = rescale(o, al0, al1)",
                                                       ind + "wgmma_fence()"] + \
            _pv_lines(D, BN, ind, "s", "ph") + [ind + x for x in ["wgmma_wait(0)"] + release]
        return L + _epilogue_lines(D)
    # F3 (pingpong): each warpgroup issues its products between bar_sync on its named
    # barrier (1 + w) and bar_arrive on the other's, so the two take turns on the tensor
    # cores and one's softmax runs under the other's products (FA3's ping-pong schedule);
    # warpgroup 1 opens with an arrive, warpgroup 0 closes with a sync: the counts match
    turn = ["bar_sync(U32(1 + w), U32(256))"] if pingpong else []
    done = ["bar_arrive(U32(2 - w), U32(256))"] if pingpong else []
    if pingpong:
        L += ["        if w == 1:", "            bar_arrive(U32(1), U32(256))"]
    # F2: tile 0 peeled (no wgmma in a branch), and P packed only once PV_{t-1} is done:
    # registers a wgmma reads, written by other instructions while a wgmma group is in
    # flight, make ptxas serialise every wgmma (its advisory C7513)
    L += ["        if ntiles > 0:", ind + "t = 0"] + [
        ind + x for x in head + turn + qk + done + ["wgmma_wait(0)"]] + \
        _softmax_lines(BN, D, ind, True, feat) + [
         "            for t in range(1, ntiles):",
         f"                sp = (it + t - 1) % {stages}  # the previous tile's stage, parity",
         f"                php = ((it + t - 1) // {stages}) & 1"] + \
        [" " * 16 + x for x in head + turn + qk] + \
        _pv_lines(D, BN, " " * 16, "sp", "php") + [" " * 16 + x for x in done] + [
         "                wgmma_wait(1)"] + _softmax_lines(BN, D, " " * 16, False, feat) + [
         "                wgmma_wait(0)  # (P's registers are PV's inputs until here)",
         "                if i == 0:",
         "                    mbarrier_arrive(U32(empty0 + 8 * sp))",
         "                o = rescale(o, al0, al1)"] + _pack_lines(BN, " " * 16, dropped) + [
         f"            s = (it + ntiles - 1) % {stages}",
         f"            ph = ((it + ntiles - 1) // {stages}) & 1",
         "            wgmma_fence()"] + _pv_lines(D, BN, ind, "s", "ph") + [
         ind + "wgmma_wait(0)"] + [ind + x for x in release]
    if pingpong:
        L += ["        if w == 0:", "            bar_sync(U32(1), U32(256))"]
    return L + _epilogue_lines(D)


def _epilogue_lines(D):
    """Rows' sums over their four lanes, o / l and lse = ln(sum exp(scaled scores)); a row
    at or past its batch entry's seq_lens_q gets o = 0, lse = -inf (nothing attends);
    rows past Sq (the tile's tail) are not stored."""
    L = []
    for rr in (0, 1):
        L += [f"        l_{rr} += cuda.shfl_xor_sync(FULL, l_{rr}, 1)",
              f"        l_{rr} += cuda.shfl_xor_sync(FULL, l_{rr}, 2)",
              f"        dead{rr} = r{rr} >= lqb",
              f"        inv{rr} = sel(l_{rr} != 0, F32(1) / l_{rr}, F32(0))",
              f"        e{rr} = sel(l_{rr} != 0, sel(dead{rr}, NEG, (m_{rr} + "
              f"math.log2(l_{rr})) * LN2), NEG)",
              f"        if r{rr} < Sq:",
              f"            wo = (b * ob + h * oh + r{rr} * orow + cb) // 2"]
        for j in range(D // 8):
            k = 4 * j + 2 * rr
            L += [f"            out[wo + {4 * j}] = cvt(sel(dead{rr}, F32(0), o[{k}] * inv{rr}), "
                  f"sel(dead{rr}, F32(0), o[{k + 1}] * inv{rr}))"]
        L += ["            if lane % 4 == 0:",
              f"                lse[(b * Hq + h) * Sq + r{rr}] = e{rr}"]
    return L


def _helper_lines(D, BN):
    """Device functions for the long tuple literals (numba's bytecode peephole for them
    fails inside a kernel's branches): the accumulators' zeros, O's rows rescaled."""
    return ["@cuda.jit(device=True, forceinline=True)", "def zero_o():",
            f"    return ({'F32(0), ' * (D // 2)})", "",
            "@cuda.jit(device=True, forceinline=True)", "def zero_s():",
            f"    return ({'F32(0), ' * (BN // 2)})", "",
            "@cuda.jit(device=True, forceinline=True)", "def rescale(o, al0, al1):",
            "    return (" + ", ".join(f"o[{k}] * al{(k % 4) // 2}" for k in range(D // 2)) +
            ",)", "", ""]


def source(kind, D, BN, stages, overlap=True, pingpong=False, persistent=False,
           masked=False, dropped=False, capped=False, alibi=False):
    """(name, source) of the forward kernel for kind "f16"/"bf16", head dim D (64 or 128),
    BN keys a tile, `stages` K/V stages; overlap: variant F2 (_consumer_tile), else F1;
    pingpong (with overlap): F3, the warpgroups' products in turns; persistent: a block
    loops over tiles (total of them, the grid one block an SM), its producer loading the
    next tile's Q once the consumers' products are done with the last (barrier qempty)
    and its K and V meanwhile; masked: the mask's kind (0 none, 1 boolean, 2 additive),
    dropped: dropout, capped: the logit cap, alibi: ALiBi (module docstring)."""
    q_bytes, kv_bytes = BM * D * 2, BN * D * 2
    name = f"attention_flash_fwd_{kind}_d{D}_n{BN}s{stages}" + \
        ("_pp" if overlap and pingpong else "" if overlap else "_f1") + \
        ("_p" if persistent else "") + ("", "_m", "_a")[masked] + ("_d" if dropped else "") + \
        ("_c" if capped else "") + ("_l" if alibi else "")
    L = _helper_lines(D, BN) + [
         f"def {name}(map_q, map_k, map_v, out, lse, lq, lk, Hq, G, Sq, Sk, has_lq, has_lk, "
         "causal, win_lo, win_hi, bhsd, scale_log2, ob, oh, orow, total, mb, ma, ms0, ms1, ms2, "
         "ms3, thr, kscale, off_lo, off_hi, key_lo, key_hi, softcap, alibi, slope_b, slopes):",
         "    smem = cuda.shared.array(0, types.uint8)",
         f"    bars = cuda.shared.array({2 + 3 * stages}, types.uint64, alignment=8)",
         "    tid = cuda.threadIdx.x",
         "    wg = tid // 128",
         "    base = (I(smem_address(smem, 0)) + 1023) & ~1023  # the swizzle atom's alignment",
         "    qs = base",
         f"    ks0 = base + {q_bytes}  # stage s: K at ks0 + {2 * kv_bytes} s, V {kv_bytes} B on",
         "    qfull = I(smem_address(bars, 0))  # then kfull[s], vfull[s], empty[s], 8 B each",
         "    kfull0 = qfull + 8",
         f"    vfull0 = kfull0 + {8 * stages}",
         f"    empty0 = vfull0 + {8 * stages}",
         f"    qempty = empty0 + {8 * stages}  # (persistent: Q free for the next tile)"] + \
        ([] if persistent else ["    tile = cuda.blockIdx.x"] + _tile_lines(D, BN, "    ")) + [
         "    if tid == 0:",
         "        fence_proxy_tensormap_acquire(map_q)",
         "        fence_proxy_tensormap_acquire(map_k)",
         "        fence_proxy_tensormap_acquire(map_v)",
         "        mbarrier_init(U32(qfull), 1)",
         f"        for s in range({stages}):",
         "            mbarrier_init(U32(kfull0 + 8 * s), 1)",
         "            mbarrier_init(U32(vfull0 + 8 * s), 1)",
         "            mbarrier_init(U32(empty0 + 8 * s), 2)",
         "        mbarrier_init(U32(qempty), 2)",
         "        fence_proxy_async()  # the initialised barriers, visible to TMA",
         "    cuda.syncthreads()"]
    L += _producer_lines(D, BN, stages, persistent) + \
        _consumer_lines(D, BN, stages, overlap, pingpong and overlap, persistent,
                        (masked, dropped, capped, alibi))
    return name, "\n".join(L) + "\n"

"""The flash-attention backward's two generated kernels (flash_bwd.py launches them and
says where they run). FlashAttention-2's algorithm with dQ by a second pass, so that
nothing is summed by atomics and reruns are bit-identical:

    dkv: a block a (batch, kv head, 128 keys); two consumer warpgroups of 64 keys loop
         over (query head of the group, query tile of st = step_of("dkv", D): 64, 32 at
         D 128) and keep dK, dV in registers:
           S^T  = K_w Q_i^T        P^T  = exp2(S^T sl - L_i)         (wgmma, smem x smem)
           dP^T = V_w dO_i^T       dS^T = P^T (dP^T - delta_i)
           dV  += P^T dO_i         dK  += dS^T Q_i                   (wgmma, P^T / dS^T
                                                                      from registers)
    dq:  a block a (batch, head, 128 queries); two consumer warpgroups of 64 queries loop
         over 64-key tiles:
           S = Q_w K_j^T,  dP = dO_w V_j^T,  dS = P (dP - delta),  dQ += dS K_j

L = lse log2(e) (+inf where lse is -inf or NaN: such a row has no live pair), sl = scale
log2(e); dK and dQ take the scale at the end. A product's accumulator layout is the next
one's A operand (wgmma.wgmma_rs), so P and dS never leave registers.

Shared memory (128-byte-swizzled 64-column boxes, 1024-B aligned), dkv:

    | K: 128 keys | V: 128 keys | stage s: Q_i, dO_i (st rows each) ...

(L_i and delta_i come by plain loads from global memory, issued before the stage's wait:
TMA's boxes must start 16-byte aligned, and row (b Hq + h) Sq of lse is not when Sq % 4.)

dq: | Q: 128 rows | dO: 128 rows | stage s: K_j, V_j (64 rows each) ...

The producer warpgroup's one thread loads the resident tiles once and streams the rest;
consumers release a stage after their last product that reads it. Masked pairs (key
past seq_lens_k, query past seq_lens_q, causal) get P = dS = 0 by selection.

A mask, dropout, a logit cap and ALiBi (flash_source.py) are compiled in where a call
has them (`masked`: its kind, `dropped`, `capped`, `alibi`): a False boolean byte is one
more masked pair, an additive value m joins its score as m / scale before P is
recomputed; a capped score is recomputed capped and dS takes the cap's slope
1 - tanh^2; ALiBi's term joins the (capped) score as in the forward; with dropout
(Sk % 4 == 0) dV takes P' = P keep / (1 - p) and dS = P (dP keep / (1 - p) - delta), the
keep factors drawn as the forward drew them. In dq a lane pair shares a Philox call's
4 adjacent keys as in the forward; in dkv, whose lanes hold 2 queries of a key, the 4
lanes of keys 4a .. 4a + 3 (lanes c + 4 kl, kl = 0..3) each make one call a column
group j, for the 4 (query, key row) pairs (e, rr) = (kl % 2, kl // 2), and pass each
lane its word by 3 shuffles (in round t lane kl reads from lane (kl + t) % 4 the word kl
of that lane's call): st / 8 calls a thread a step, none wasted.

Traffic (dkv, D 128, a step of st = 32 queries): 2 x 32 x 128 x 2 B + 256 B in, 4
products of 2 x 64 x 32 x 128 flops per warpgroup: 4.2 MFLOP a block for 16.6 KB.
"""
from .flash_source import REGS, alibi_lines, cap_lines, live_lines

BLOCK = 128   # the resident tile's rows (keys in dkv, queries in dq): 2 warpgroups of 64
STEP = 64     # the streamed tile's rows (queries in dkv, keys in dq) ...
STEP_DKV = {64: 64, 128: 32}  # ... but dkv's at D 128: 64 would spill (140 B: dK, dV
#                               and a 64 x 64 S^T, dP^T in 240 registers), and with
#                               dropout at D 64 (its draws: 64 B at 64, none at 32)


def step_of(which, D, dropped=False):
    """The streamed tile's rows of kernel "dkv" or "dq" at head dim D (dropped: with
    dropout)."""
    if which == "dq":
        return STEP
    return 32 if dropped else STEP_DKV[D]


def shared_bytes(D, stages, st=STEP):
    """Dynamic shared memory of either kernel: slack, the resident tiles, the stages."""
    return 1024 + 2 * BLOCK * D * 2 + stages * stage_bytes(D, st)


def stage_bytes(D, st=STEP):
    """A stage: two st-row tiles (16 KB at both of dkv's steps and dq's: 1024-B aligned)."""
    return 2 * st * D * 2


def _helpers(D, st):
    return ["@cuda.jit(device=True, forceinline=True)", "def zero_acc():",
            f"    return ({'F32(0), ' * (D // 2)})", "",
            "@cuda.jit(device=True, forceinline=True)", "def zero_s():",
            f"    return ({'F32(0), ' * (st // 2)})", "", ""]


def _kmajor_lines(D, pairs, ind):
    """K-major products over D issued together: for (acc, A base, A box rows, B base, B box
    rows), this warpgroup's 64 A rows `woff` bytes into each A box."""
    L = []
    for acc, a, ar, b, br in pairs:
        for kk in range(D // 16):
            c, r = divmod(kk, 4)
            L += [f"{ind}{acc} = mma_s(descriptor({a} + {c * ar * 128 + 32 * r} + woff, 16, 1024, "
                  f"SW128), descriptor({b} + {c * br * 128 + 32 * r}, 16, 1024, SW128), {acc}, "
                  f"{int(kk > 0)})"]
    return L


def _rs_lines(pairs, ind, st):
    """Products with A in registers over the 64 streamed rows: for (acc, register prefix,
    B base), B MN-major (64-row boxes 8192 B apart along D, 16 rows 2048 B)."""
    L = []
    for acc, regs, b in pairs:
        for kk in range(st // 16):
            a = ", ".join(f"{regs}{4 * kk + x}" for x in range(4))
            L += [f"{ind}{acc} = mma_rs({a}, descriptor({b} + {2048 * kk}, {st * 128}, 1024, "
                  f"SW128), {acc}, 1)"]
    return L


def _grad_lines(ind, masked, L_of, dl_of, pack_p, st, feat=(0, False, False, False),
                keep=None, added=None, alibi_of=None):
    """sv, dp (m64n64 accumulators: S and dP) -> p = exp2(s sl - L), dS = p (dp - delta), zeros where
    masked(k) holds (masked tiles only; every tile with a boolean mask), packed into ap
    (P, if pack_p) and ad (dS); dropped: times the keep factors f{k} that keep(j, ind)'s
    lines make for pairs 4j .. 4j + 3 (_keep_lines); an additive mask: score k is
    sv[k] + added(k) (its value / scale); capped: score k is sv[k] capped (flash.capped,
    its 1 / (1 + 2^(s c2)) kept as rc{k}) and dS takes the cap's slope 1 - tanh^2 =
    4 rc (1 - rc); alibi: score k then takes alibi_of(k), ALiBi's term in raw units. A
    column group j at a time: its factors, scores and packed pairs, so few values are
    live at once."""
    mask_kind, dropped, capped, alibi = feat
    boolean = mask_kind != 0  # (every tile reads its mask: no unmasked branch)
    base = (lambda k: f"(ccs - ccs2 * rc{k})") if capped else (lambda k: f"sv[{k}]")
    raw = (lambda k: f"({base(k)} + {alibi_of(k)})") if alibi else base
    s_of = (lambda k: f"({raw(k)} + {added(k)})") if mask_kind == 2 else raw
    f = (lambda k: f" * f{k}") if dropped else (lambda k: "")
    slope = (lambda k: f" * (F32(4) * rc{k} * (F32(1) - rc{k}))") if capped else \
        (lambda k: "")

    def body(sub, check):
        L = []
        for j in range(st // 8):
            L += keep(j, sub) if dropped else []
            for k in range(4 * j, 4 * j + 4):
                if capped:
                    L += [f"{sub}rc{k} = rcp(F32(1) + ex2(sv[{k}] * cc2))"]
                if check:
                    L += [f"{sub}z{k} = {masked(k)}",
                          f"{sub}p{k} = sel(z{k}, F32(0), ex2(cuda.fma({s_of(k)}, sl, "
                          f"-{L_of(k)})))",
                          f"{sub}d{k} = sel(z{k}, F32(0), p{k} * (dp[{k}]{f(k)} - {dl_of(k)})"
                          f"{slope(k)})"]
                else:
                    L += [f"{sub}p{k} = ex2(cuda.fma({raw(k)}, sl, -{L_of(k)}))",
                          f"{sub}d{k} = p{k} * (dp[{k}]{f(k)} - {dl_of(k)}){slope(k)}"]
            for k in (2 * j, 2 * j + 1):
                if pack_p:
                    L += [f"{sub}ap{k} = cvt(p{2 * k}{f(2 * k)}, p{2 * k + 1}{f(2 * k + 1)})"]
                L += [f"{sub}ad{k} = cvt(d{2 * k}, d{2 * k + 1})"]
        return L
    if boolean:
        return body(ind, True)
    return [f"{ind}if need:"] + body(ind + "    ", True) + [f"{ind}else:"] + \
        body(ind + "    ", False)


def _keep_lines(which, j, ind):
    """The keep factors f{4j} .. f{4j + 3} (kscale or 0) of a thread's pairs in column
    group j of the step (module docstring): "dq" as the forward (row r0 on even lanes,
    r1 on odd ones, two words swapped); "dkv" by the 4 lanes of a key group, 3 shuffles
    a call."""
    fs = ", ".join(f"f{4 * j + x}" for x in range(4))
    if which == "dq":
        return [f"{ind}{fs} = pair_keep((eb + U64(n0 + {8 * j})) >> TWO, ev, thr, kscale, "
                "off_lo, off_hi, key_lo, key_hi)"]
    # this lane's call: query cl + 8 j + kl % 2, keys from kg (its key row's group)
    return [f"{ind}{fs} = quad_keep((U64(rb + cl + {8 * j} + kl % 2) * U64(Sk) + U64(kg)) >> "
            "TWO, kl, src1, src2, src3, thr, kscale, off_lo, off_hi, key_lo, key_hi)"]


def _store_lines(acc, D, rows, word, scale, dead):
    """A consumer thread's two rows (r0, r0 + 8) of a 64 x D accumulator, x scale, zero
    where `dead`, as 16-bit pairs; rows at or past `rows` are not stored."""
    L = []
    for rr in (0, 1):
        L += [f"        rw = r0 + {8 * rr}", f"        if rw < {rows}:",
              f"            dz = {dead}", f"            wo = ({word}) // 2"]
        for j in range(D // 8):
            k = 4 * j + 2 * rr
            L += [f"            {acc}_out[wo + {4 * j}] = cvt(sel(dz, F32(0), {acc}[{k}] * "
                  f"{scale}), sel(dz, F32(0), {acc}[{k + 1}] * {scale}))"]
    return L


def _start(name, args, maps, D, stages, st):
    """Shared memory, barriers (rfull: the resident tiles; full[s], empty[s]), setup."""
    return [f"def {name}({args}):",
            "    smem = cuda.shared.array(0, types.uint8)",
            f"    bars = cuda.shared.array({1 + 2 * stages}, types.uint64, alignment=8)",
            "    tid = cuda.threadIdx.x",
            "    wg = tid // 128",
            "    base = (I(smem_address(smem, 0)) + 1023) & ~1023  # the swizzle atom's alignment",
            f"    res2 = base + {BLOCK * D * 2}  # the second resident tile",
            f"    st0 = base + {2 * BLOCK * D * 2}  # stage s at st0 + {stage_bytes(D, st)} s",
            "    rfull = I(smem_address(bars, 0))",
            "    full0 = rfull + 8",
            f"    empty0 = full0 + {8 * stages}"], [
            "    if tid == 0:"] + [f"        fence_proxy_tensormap_acquire({m})" for m in maps] + [
            "        mbarrier_init(U32(rfull), 1)",
            f"        for s in range({stages}):",
            "            mbarrier_init(U32(full0 + 8 * s), 1)",
            "            mbarrier_init(U32(empty0 + 8 * s), 2)",
            "        fence_proxy_async()",
            "    cuda.syncthreads()"]


def _boxes(dst, mp, x, y, z, rows, D, bar):
    return [f"tma_load_3d(U32({dst} + {c * rows * 128}), {mp}, I32({x} + {64 * c}), I32({y}), "
            f"I32({z}), U32({bar}))" for c in range(D // 64)]


def _producer(D, stages, resident, step, step_bytes, st):
    L = ["    if wg == 0:", f"        setmaxnreg_dec({REGS[0]})", "        if tid == 0:",
         f"            mbarrier_arrive_expect_tx(U32(rfull), {2 * BLOCK * D * 2})"]
    L += ["            " + x for x in resident]
    L += ["            for u in range(nsteps):",
          f"                s = u % {stages}",
          f"                ph = (u // {stages}) & 1",
          "                while mbarrier_try_wait_parity(U32(empty0 + 8 * s), U32(ph ^ 1)) == 0:",
          "                    pass",
          f"                sa = st0 + s * {stage_bytes(D, st)}",
          f"                mbarrier_arrive_expect_tx(U32(full0 + 8 * s), {step_bytes})"]
    return L + ["                " + x for x in step]


def _consumer_head(D, stages, capped):
    return ["    else:", f"        setmaxnreg_inc({REGS[1]})", "        w = wg - 1",
            "        i = tid % 128", "        lane = i % 32", "        woff = w * 8192",
            "        cb = 2 * (lane % 4)", "        sl = F32(scale_log2)",
            "        isc = F32(1) / F32(scale)  # (an additive mask's value joins S over scale)"
            ] + (cap_lines("        ") if capped else []) + [
            "        while mbarrier_try_wait_parity(U32(rfull), U32(0)) == 0:", "            pass"]


def _step_wait(D, stages, st):
    return [f"            s = u % {stages}", f"            ph = (u // {stages}) & 1",
            f"            sa = st0 + s * {stage_bytes(D, st)}",
            "            while mbarrier_try_wait_parity(U32(full0 + 8 * s), U32(ph)) == 0:",
            "                pass", "            wgmma_fence()"]


def _release():
    return ["            wgmma_commit()", "            wgmma_wait(0)", "            if i == 0:",
            "                mbarrier_arrive(U32(empty0 + 8 * s))"]


_FEATURES = "mb, ma, ms0, ms1, ms2, ms3, thr, kscale, off_lo, off_hi, key_lo, key_hi, softcap, " \
    "alibi, slope_b, slopes"


def _suffix(feat):
    return ("", "_m", "_a")[feat[0]] + ("_d" if feat[1] else "") + ("_c" if feat[2] else "") + \
        ("_l" if feat[3] else "")


def dkv_source(kind, D, stages, feat=(False, False, False, False)):
    """(name, source) of the dK/dV kernel (module docstring) for kind "f16"/"bf16", head
    dim D (64 or 128), `stages` Q/dO stages; feat: (the mask's kind: 0 none, 1 boolean,
    2 additive; dropout; the logit cap; ALiBi)."""
    st = step_of("dkv", D, feat[1])
    name = f"attention_flash_dkv_{kind}_d{D}_m{st}s{stages}" + _suffix(feat)
    args = ("map_a, map_b, map_c, map_d, lse, dl, dk_out, dv_out, lq, lk, Hq, G, Sq, Sk, "
            "has_lq, has_lk, causal, win_lo, win_hi, bhsd, scale_log2, scale, kb, kh, krow, " +
            _FEATURES)
    start, setup = _start(name, args, ("map_a", "map_b", "map_c", "map_d"), D, stages, st)
    geo = ["    Hk = Hq // G",
           f"    ktiles = (Sk + {BLOCK - 1}) // {BLOCK}",
           "    bh = cuda.blockIdx.x // ktiles  # b Hk + hk",
           f"    n0 = (cuda.blockIdx.x % ktiles) * {BLOCK}",
           "    b = bh // Hk", "    hk = bh % Hk",
           "    lqb = lq[b] if has_lq != 0 else Sq",
           "    lkb = lk[b] if has_lk != 0 else Sk",
           "    dg = (min(max(lkb, 0), Sk) - min(max(lqb, 0), Sq)) if causal == 2 else 0",
           f"    mt1 = (lqb + {st - 1}) // {st}",
           "    mt0 = 0",
           "    if causal != 0:  # (the query tiles whose bands meet these keys: query i sees"
           " key j where j - dg - win_hi <= i <= j - dg - win_lo)",
           f"        mt0 = max(n0 - dg - win_hi, 0) // {st}",
           f"        mt1 = min(mt1, max(n0 + {BLOCK - 1} - dg - win_lo, -1) // {st} + 1)",
           "    nq = max(mt1 - mt0, 0)",
           "    nsteps = G * nq if n0 < lkb else 0",
           "    zk = bh if bhsd != 0 else b",
           f"    xk = 0 if bhsd != 0 else hk * {D}"]
    tile = ["g = u // nq", "mt = mt0 + u % nq", "h = hk * G + g",
            "zq = b * Hq + h if bhsd != 0 else b", f"xq = 0 if bhsd != 0 else h * {D}",
            f"i0 = mt * {st}"]
    resident = _boxes("base", "map_a", "xk", "n0", "zk", BLOCK, D, "rfull") + \
        _boxes("res2", "map_b", "xk", "n0", "zk", BLOCK, D, "rfull")
    step = tile + _boxes("sa", "map_c", "xq", "i0", "zq", st, D, "full0 + 8 * s") + \
        _boxes(f"sa + {st * D * 2}", "map_d", "xq", "i0", "zq", st, D, "full0 + 8 * s")
    L = _helpers(D, st) + start + geo + setup + \
        _producer(D, stages, resident, step, 2 * st * D * 2, st) + \
        _consumer_head(D, stages, feat[2]) + [
        "        r0 = n0 + w * 64 + 16 * (i // 32) + lane // 4  # this thread's keys r0, r0 + 8",
        "        r1 = r0 + 8",
        "        wband = U64(win_hi - win_lo)  # (win_lo <= 0 <= win_hi)",
        "        dk = zero_acc()", "        dv = zero_acc()",
        "        sv = zero_s()", "        dp = zero_s()"]
    if feat[3]:  # (ALiBi's diagonal: the block's; its slope: each step's head's, below)
        L += ["        adg = (min(max(lkb, 0), Sk) - min(max(lqb, 0), Sq)) if alibi == 2 else 0"]
    if feat[1]:  # (r0 % 4 = kl: the key group of row r0 + 8 (kl // 2) starts at kg)
        L += ["        kl = (lane // 4) % 4",
              "        kg = r0 + 8 * (kl // 2) - kl"]
        L += [f"        src{t} = lane % 4 + 4 * ((kl + {t}) % 4) + 16 * (lane // 16)"
              for t in (1, 2, 3)]
    L += ["        for u in range(nsteps):"] + ["            " + x for x in tile] + [
        "            cl = i0 + cb  # this thread's query columns cl + 8 j + {0, 1}",
        "            rb = (b * Hq + h) * Sq"]
    if feat[3]:  # (pair (query cl + c, key r): -slope / scale |cq + c|)
        L += ["            ans = -slopes[b * slope_b + h] * F32(LOG2E) / sl"]
        L += [f"            cq{rr} = cl + adg - r{rr}" for rr in (0, 1)]
    for j in range(st // 8):  # their L and delta, loaded before the stage's wait (in flight
        # under it and S^T's products; TMA can't: a box's first byte must be 16-B aligned,
        # (b Hq + h) Sq 4 bytes is not when Sq % 4 != 0, an illegal instruction on the H200)
        for e in (0, 1):
            c, k = 8 * j + e, 2 * j + e
            L += [f"            inq = cl + {c} < Sq  # (past Sq: row Sq - 1 read, unused)",
                  f"            lv = sel(inq, lse[rb + min(cl + {c}, Sq - 1)], NEG)",
                  f"            L{k} = sel(lv > NEG, lv * LOG2E, INF)",
                  f"            dl{k} = sel(inq, dl[rb + min(cl + {c}, Sq - 1)], F32(0))"]
    L += _step_wait(D, stages, st) + _kmajor_lines(D, (("sv", "base", BLOCK, "sa", st),
                                                  ("dp", "res2", BLOCK, f"sa + {st * D * 2}", st)),
                                              " " * 12) + [
        "            wgmma_commit()", "            wgmma_wait(0)",
        f"            need = (i0 + {st} > lqb) | (n0 + w * 64 + 64 > lkb) | ((causal != 0) & "
        f"((n0 + w * 64 + 63 - i0 - dg > win_hi) | (n0 + w * 64 - i0 - {st - 1} - dg < "
        "win_lo)))",
        "            rq0 = r0 - cl - dg - win_lo  # (pair (cl + c, r) is in the band where",
        "            rq1 = r1 - cl - dg - win_lo  # U64(rq - c) <= wband, one unsigned compare)"]

    def at(k):  # pair k's mask element: query cl + co, key r_rr
        co, rr = 8 * (k // 4) + k % 2, (k % 4) // 2
        return f"b * ms0 + h * ms1 + (cl + {co}) * ms2 + r{rr} * ms3"

    def masked(k):
        co, rr = 8 * (k // 4) + k % 2, (k % 4) // 2
        safe = f"(cl + {co} >= lqb) | (r{rr} >= lkb) | ((causal != 0) & (U64(rq{rr} - {co}) > " \
            "wband))"
        return safe + (f" or mb[{at(k)}] == 0" if feat[0] == 1 else "")  # (bitwise: no
        # branches in numba's IR; the mask's read stays behind the pair's bounds)

    def added(k):  # (read for every pair: a pair past Sq or Sk reads the last row or
        # key's value, in bounds, and masked() drops it)
        co, rr = 8 * (k // 4) + k % 2, (k % 4) // 2
        return (f"mask_term(widen(ma[b * ms0 + h * ms1 + min(cl + {co}, Sq - 1) * ms2 + "
                f"min(r{rr}, Sk - 1) * ms3]), isc)")
    def alibi_of(k):
        co, rr = 8 * (k // 4) + k % 2, (k % 4) // 2
        return f"ans * F32(abs(cq{rr} + {co}))"
    L += _grad_lines(" " * 12, masked, lambda k: f"L{2 * (k // 4) + k % 2}",
                     lambda k: f"dl{2 * (k // 4) + k % 2}", True, st, feat,
                     lambda j, ind: _keep_lines("dkv", j, ind), added, alibi_of)
    L += ["            wgmma_fence()"] + _rs_lines((("dv", "ap", f"sa + {st * D * 2}"),
                                                    ("dk", "ad", "sa")), " " * 12, st) + _release()
    L += _store_lines("dk", D, "Sk", "b * kb + hk * kh + rw * krow + cb", "sc", "rw >= lkb") + \
        _store_lines("dv", D, "Sk", "b * kb + hk * kh + rw * krow + cb", "F32(1)", "rw >= lkb")
    L.insert(L.index("        dk = zero_acc()"), "        sc = F32(scale)")
    return name, "\n".join(L) + "\n"


def dq_source(kind, D, stages, feat=(False, False, False, False)):
    """(name, source) of the dQ kernel (module docstring); feat as dkv_source's."""
    st = step_of("dq", D)
    name = f"attention_flash_dq_{kind}_d{D}_s{stages}" + _suffix(feat)
    args = ("map_a, map_b, map_c, map_d, lse, dl, dq_out, lq, lk, Hq, G, Sq, Sk, has_lq, "
            "has_lk, causal, win_lo, win_hi, bhsd, scale_log2, scale, qb, qh, qrow, " +
            _FEATURES)
    start, setup = _start(name, args, ("map_a", "map_b", "map_c", "map_d"), D, stages, st)
    geo = [f"    tiles = (Sq + {BLOCK - 1}) // {BLOCK}",
           "    bh = cuda.blockIdx.x // tiles  # b Hq + h",
           "    mt = cuda.blockIdx.x % tiles",
           "    if causal != 0:", "        mt = tiles - 1 - mt  # (a head's longest rows first)",
           f"    m0 = mt * {BLOCK}",
           "    b = bh // Hq", "    h = bh % Hq", "    hk = h // G",
           "    lqb = lq[b] if has_lq != 0 else Sq",
           "    lkb = lk[b] if has_lk != 0 else Sk",
           "    kend = lkb",
           "    dg = (min(max(lkb, 0), Sk) - min(max(lqb, 0), Sq)) if causal == 2 else 0",
           f"    if causal != 0 and m0 + {BLOCK} + dg + win_hi < kend:",
           f"        kend = max(m0 + {BLOCK} + dg + win_hi, 0)",
           "    if m0 >= lqb:", "        kend = 0",
           f"    u1 = (kend + {st - 1}) // {st}",
           f"    u0 = min(max(m0 + dg + win_lo, 0) // {st}, u1) if causal != 0 else 0",
           "    nsteps = u1 - u0  # (key steps u0 .. u1 - 1: those the block's bands meet)",
           "    zq = bh if bhsd != 0 else b", f"    xq = 0 if bhsd != 0 else h * {D}",
           "    zk = b * (Hq // G) + hk if bhsd != 0 else b", f"    xk = 0 if bhsd != 0 else hk * {D}"]
    resident = _boxes("base", "map_a", "xq", "m0", "zq", BLOCK, D, "rfull") + \
        _boxes("res2", "map_b", "xq", "m0", "zq", BLOCK, D, "rfull")
    step = [f"n0 = (u0 + u) * {st}"] + \
        _boxes("sa", "map_c", "xk", "n0", "zk", st, D, "full0 + 8 * s") + \
        _boxes(f"sa + {st * D * 2}", "map_d", "xk", "n0", "zk", st, D, "full0 + 8 * s")
    L = _helpers(D, st) + start + geo + setup + \
        _producer(D, stages, resident, step, 2 * st * D * 2, st) + \
        _consumer_head(D, stages, feat[2]) + [
        "        wrow = m0 + w * 64",
        "        r0 = wrow + 16 * (i // 32) + lane // 4  # this thread's queries r0, r0 + 8",
        "        r1 = r0 + 8", "        sc = F32(scale)"]
    for rr in (0, 1):
        L += [f"        ls = lse[bh * Sq + r{rr}] if r{rr} < Sq else NEG",
              f"        L{rr} = ls * LOG2E if ls > NEG else INF  # (no live pair: P = 0)",
              f"        dl{rr} = dl[bh * Sq + r{rr}] if r{rr} < Sq else F32(0)"]
    L += live_lines("        ") + [
          "        dq = zero_acc()", "        sv = zero_s()", "        dp = zero_s()"]
    if feat[3]:
        L += alibi_lines("        ", "r0", "r1")
    if feat[0]:  # (rows past Sq read row Sq - 1: in bounds, never stored)
        L += [f"        mq{rr} = b * ms0 + h * ms1 + min(r{rr}, Sq - 1) * ms2" for rr in (0, 1)]
    if feat[1]:
        L += ["        eb = U64(bh * Sq + (r0 if lane % 2 == 0 else r1)) * U64(Sk) "
              "+ U64(4 * ((lane % 4) // 2))",
              "        ev = lane % 2 == 0"]
    L += ["        for u in range(nsteps):", f"            n0 = (u0 + u) * {st}"] + \
        _step_wait(D, stages, st) + _kmajor_lines(D, (("sv", "base", BLOCK, "sa", st),
                                                  ("dp", "res2", BLOCK, f"sa + {st * D * 2}", st)),
                                              " " * 12) + [
        "            wgmma_commit()", "            wgmma_wait(0)",
        f"            need = (n0 + {st} > lkb) | ((causal != 0) & ((n0 + {st - 1} > wrow + dg + "
        "win_hi) | (n0 < wrow + 63 + dg + win_lo)))",
        "            cl = n0 + cb",
        "            ck0 = U64(cl - lo0)", "            ck1 = U64(cl - lo1)"]
    if feat[3]:  # (pair (query r, key cl + c): -slope / scale |ca - c|)
        L += [f"            ca{rr} = ai{rr} - cl" for rr in (0, 1)]

    def at(k):  # pair k's mask element: query r_rr (its row offset mq), key cl + co
        co, rr = 8 * (k // 4) + k % 2, (k % 4) // 2
        return f"mq{rr} + (cl + {co}) * ms3"

    def masked(k):
        co, rr = 8 * (k // 4) + k % 2, (k % 4) // 2
        return f"ck{rr} + U64({co}) >= wd{rr}" + (f" or mb[{at(k)}] == 0" if feat[0] == 1 else "")

    def added(k):  # (a key past Sk is not read; masked() drops its pair)
        co = 8 * (k // 4) + k % 2
        return f"added_term(ma, {at(k)}, cl + {co} < Sk, isc)"
    def alibi_of(k):
        co, rr = 8 * (k // 4) + k % 2, (k % 4) // 2
        return f"ans * F32(abs(ca{rr} - {co}))"
    L += _grad_lines(" " * 12, masked, lambda k: f"L{(k % 4) // 2}",
                     lambda k: f"dl{(k % 4) // 2}", False, st, feat,
                     lambda j, ind: _keep_lines("dq", j, ind), added, alibi_of)
    L += ["            wgmma_fence()"] + _rs_lines((("dq", "ad", "sa"),), " " * 12, st) + _release()
    L += _store_lines("dq", D, "Sq", "b * qb + h * qh + rw * qrow + cb", "sc", "rw >= lqb")
    return name, "\n".join(L) + "\n"

"""Generated source of the implicit-GEMM convolution (nbdnn.cuda.conv's docstring
describes it). Per group g (grid.y) the convolution is the GEMM

    Y_g (M = N*P rows, Kg = K/g columns) = X_g (M x Kr) @ W_g^T (Kr x Kg),  Kr = C/g*T*R*S

where row m of X_g is the receptive field of output position m, formed on the fly
while loading the A tile (zero outside the padded input), and W_g is the group's
filters as stored (K-major: (c, t, r, s) order for NCHW, (t, r, s, c) for NHWC, so a
reduction index means the same tap in both operands). The tile product and the
thread layout are the GEMM's (nbdnn/cuda/matmul/gemm_source.py); the epilogue writes
y[n, g*Kg + k, p] through the layout's strides.

A tile: each thread's rows (output positions) are decoded once, before the k loop,
into the input offset of the receptive field's corner (xb) and its coordinates (bd,
bh, bw). A reduction index kx is a tap: `taps[4*kx:4*kx+4]` (nbdnn.cuda.conv builds
it on the host, cached per geometry) holds its offset in x and its (d, h, w)
displacement, so a k-step costs a thread four cached table loads an element instead
of the six runtime 64-bit divisions that decoded kx in variant 1 (2.8 TFLOP/s on
ResNet's 3x3 layers, 9% of cuDNN). The bounds test folds each
coordinate's two sides into one unsigned compare. Channels-last takes consecutive
reduction indices in consecutive threads (c is contiguous in x); channels-first takes
consecutive output positions. The k loop is the GEMM's (two stages, one barrier).

Variant 2 (above; `igemm_source`) serves C/g < BK (the 3-channel stem) and filters of
more than 64 taps, with the 64x64 and 32x32 tiles only. Variant 3
(`igemm_chunked_source`, the rest): the reduction runs tap by tap, BK channels a step,
so the bounds test and base address are per tap and an element costs an add, a compare and a select (Nsight Compute on variant 2:
249 M instructions for 116 M FFMAs on ResNet's s2 3x3, 3.1 of 9.4 cycles a warp
waiting on the table's L1 loads; variant 3 took ResNet's forward from 30% to 39% of
cuDNN, its epilogue below to 55%).
"""
import numpy as np

from ..matmul.gemm_source import PAD, block_setup, col_expr, main_loop, row_expr, tile_loads
from ..runtime.memory.arrays import to_device
from ..runtime.device import key as device_key

_GEOM = ("N, C, K, G, D, H, W, T, R, S, PD, PH, PW, sd, sh, sw, qd, qh, qw, dd, dh, dw, "
         "flip, last")


def _a_loads(BM, BK, T, L):
    """The A tile's (setup, fetch, stash): one output row a thread (so one row decode),
    L consecutive taps of it channels-last, taps T/BM apart channels-first."""
    assert BK % L == 0 and T % BM == 0 and BM * BK == L * T
    setup = ["    if last:",
             f"        r = t // {BK // L}", f"        kk_a = (t % {BK // L}) * {L}",
             "        dk_a = 1",
             "    else:",
             f"        r = t % {BM}", f"        kk_a = t // {BM}", f"        dk_a = {T // BM}",
             "    m = m0 + r",
             "    ok_a = m < Mg"] + _row_decode(4) + [f"    dst_a = kk_a * {BM + PAD} + r"]
    fetch, stash = [], []
    for l in range(L):
        v = f"a{l}"
        fetch += [f"        r_{v} = ZERO",
                  f"        kx = k0 + kk_a + {l} * dk_a",
                  "        if ok_a and kx < kend:",
                  "            j = U(4 * kx)",
                  "            if (UB(bd + taps[j + U(1)]) < UB(D) and UB(bh + taps[j + U(2)]) < "
                  "UB(H)",
                  "                    and UB(bw + taps[j + U(3)]) < UB(W)):",
                  f"                r_{v} = widen(x[U(xb + taps[j])])"]
        stash.append(f"        As[U(so_a + dst_a + {l} * {BM + PAD} * dk_a)] = r_{v}")
    return setup, fetch, stash


def _head(name, BM, BN, BK, TM, TN, swap):
    """The def line and what both variants set up: the block's output positions
    [m0, m0 + PT) and filters [n0, n0 + FT) of group g, strides, accumulators. The
    positions are the tile's rows (A side), or with `swap` its columns (B side)."""
    PT, FT = (BN, BM) if swap else (BM, BN)
    src = [f"def {name}(x, w, y, bias, z, taps, {_GEOM}, has_bias, has_z, act, coef, alpha, "
           "beta, vec):"]
    src += block_setup(BM, BN, BK, TM, TN)
    return src + ["    Cg = C // G", "    Kg = K // G",
                  "    Mg = N * PD * PH * PW", "    Kr = Cg * T * R * S",
                  "    xn, xc, xd, xh, xw = strides(C, D, H, W, last)",
                  "    g = cuda.blockIdx.y",
                  f"    ntn = (Kg + {FT - 1}) // {FT}",
                  f"    m0 = (cuda.blockIdx.x // ntn) * {PT}",
                  f"    n0 = (cuda.blockIdx.x % ntn) * {FT}",
                  "    xg = g * Cg * xc", "    woff = g * Kg * Kr"]


def _row_decode(ind):
    """Output position m -> its receptive field's corner (bd, bh, bw) and the input
    offset xb of that corner (split divides unsigned)."""
    p = " " * ind
    return [f"{p}n, _, pd, ph, pw = split(m, 1, PD, PH, PW, False)",
            f"{p}bd = pd * sd - qd", f"{p}bh = ph * sh - qh", f"{p}bw = pw * sw - qw",
            f"{p}xb = n * xn + xg + bd * xd + bh * xh + bw * xw"]


def igemm_source(BM, BN, BK, TM, TN):
    """(name, source) of variant 2, `conv_igemm_<config>`: conv_fwd's arguments after
    the tap table (one entry a reduction index), then `vec`."""
    TY, TX = BM // TM, BN // TN
    T = TX * TY
    assert BM * BK % T == 0 and BN * BK % T == 0, "tile loads must split evenly"
    name = f"conv_igemm_{BM}x{BN}x{BK}_{TM}x{TN}"
    src = _head(name, BM, BN, BK, TM, TN, False) + ["    kbeg = 0", "    kend = Kr"]
    setup_a, fetch_a, stash_a = _a_loads(BM, BK, T, BM * BK // T)
    # the filters: the GEMM's B side, k-contiguous (as op(b) with trans_b)
    setup_b, fetch_b, stash_b = tile_loads("w", BN, "1", BN * BK // T, T, BK, "Kg",
                                           red="Kr", side="b", load="widen")
    src += setup_a + setup_b
    src += main_loop(BM, BN, BK, TM, TN, fetch_a + fetch_b, stash_a + stash_b)
    src += _epilogue(BM, BN, TM, TN, False)
    return name, "\n".join(src) + "\n"


def _chunk_loads(BM, BN, BK, T, swap):
    """(setup, fetch, stash) of variant 3's two tiles at k-step (tap, c0): the x tile's
    rows are output positions (consecutive threads take consecutive positions
    channels-first, consecutive channels channels-last), the w tile's rows filters
    (k-contiguous in the (K, T*R*S, C/g) filter copy); with `swap` the x tile is the B
    side. Each thread tests once, before the loop, which taps of its position land
    inside the input (a bit each in `mask`), then keeps one source index a side,
    advanced by BK channels a step and re-based when the tap changes (the table's
    offset load is uniform across the block and runs once every ceil(Cg/BK) steps).
    Every element load is unconditional: one outside the input or past C/g reads
    index 0 and is replaced by zero, so a thread's loads issue back to back."""
    PT, FT = (BN, BM) if swap else (BM, BN)
    xt, xs, wt, ws = ("Bs", "so_b", "As", "so_a") if swap else ("As", "so_a", "Bs", "so_b")
    LA, LB = PT * BK // T, FT * BK // T
    assert BK % LA == 0 and T % PT == 0 and BK % LB == 0 and T % FT == 0
    setup = ["    if last:",
             f"        r = t // {BK // LA}", f"        kk_a = (t % {BK // LA}) * {LA}",
             "        dk_a = 1",
             "    else:",
             f"        r = t % {PT}", f"        kk_a = t // {PT}", f"        dk_a = {T // PT}",
             "    m = m0 + r", "    ok_a = m < Mg"] + _row_decode(4)
    setup += ["    xb += kk_a * xc", "    ls_a = dk_a * xc", "    lim_a = Cg - kk_a",
              f"    dst_a = kk_a * {PT + PAD} + r",
              "    mask = U(0)",
              "    for tp in range(TRS if ok_a else 0):",
              "        j = U(4 * tp)",
              "        if (UB(bd + taps[j + U(1)]) < UB(D) and UB(bh + taps[j + U(2)]) < UB(H)",
              "                and UB(bw + taps[j + U(3)]) < UB(W)):",
              "            mask |= U(1) << U(tp)",
              f"    rb = t // {BK // LB}", f"    kk_b = (t % {BK // LB}) * {LB}",
              "    ok_b = n0 + rb < Kg", "    src_b = woff + (n0 + rb) * Kr + kk_b",
              "    lim_b = Cg - kk_b",
              f"    dst_b = kk_b * {FT + PAD} + rb",
              "    tap = 0", "    c0 = 0", "    src_a = xb + taps[0]",
              "    okt = (mask & U(1)) != 0"]
    fetch, stash = [], []
    for l in range(LA):
        fetch += [f"        ok = okt & (c0 + {l} * dk_a < lim_a)",
                  f"        v = widen(x[U(src_a + {l} * ls_a) if ok else U(0)])",
                  f"        r_a{l} = v if ok else ZERO"]
        stash.append(f"        {xt}[U({xs} + dst_a + {l * (PT + PAD)} * dk_a)] = r_a{l}")
    for l in range(LB):
        fetch += [f"        ok = ok_b & (c0 + {l} < lim_b)",
                  f"        v = widen(w[U(src_b + {l}) if ok else U(0)])",
                  f"        r_b{l} = v if ok else ZERO"]
        stash.append(f"        {wt}[U({ws} + dst_b + {l * (FT + PAD)})] = r_b{l}")
    fetch += [f"        c0 += {BK}", f"        src_a += {BK} * xc", f"        src_b += {BK}",
              "        if c0 >= Cg:",  # next tap (the table's entry TRS is a sentinel)
              "            src_b += Cg - c0", "            c0 = 0", "            tap += 1",
              "            src_a = xb + taps[U(4 * tap)]",
              "            okt = ((mask >> U(tap)) & U(1)) != 0"]
    return setup, fetch, stash


def igemm_chunked_source(BM, BN, BK, TM, TN, swap):
    """(name, source) of variant 3, `conv_igemm_chunked_<config>[_t]`: the reduction
    runs over taps (t, r, s) and, within a tap, over chunks of BK channels, so a
    k-step's x elements share one tap: the bounds test and base address are per tap,
    and an element costs an add, a compare and a select. The filters come as a
    (K, T*R*S, C/g) copy (w itself for NHWC), `taps` holds one entry a tap and a
    sentinel. When C/g is not a multiple of BK the last chunk of each tap is part
    padding (zeros): this variant is for C/g >= BK and T*R*S <= 64 (the mask's bits).
    `swap` (the "_t" kernels, for channels-first) puts the output positions on the
    tile's columns: a warp's lanes then run along p, which is contiguous in an NCHW
    y, so the epilogue's stores coalesce."""
    TY, TX = BM // TM, BN // TN
    T = TX * TY
    name = f"conv_igemm_chunked_{BM}x{BN}x{BK}_{TM}x{TN}" + ("_t" if swap else "")
    src = _head(name, BM, BN, BK, TM, TN, swap)
    src += ["    TRS = T * R * S", "    kbeg = 0",
            f"    kend = TRS * ((Cg + {BK - 1}) // {BK}) * {BK}"]  # k0 only counts steps
    setup, fetch, stash = _chunk_loads(BM, BN, BK, T, swap)
    src += setup + main_loop(BM, BN, BK, TM, TN, fetch, stash)
    src += _epilogue(BM, BN, TM, TN, swap)
    return name, "\n".join(src) + "\n"


def _value(acc, o):
    """Lines leaving act(alpha * acc + beta * z[o] + bias) in v."""
    return [f"    v = alpha * {acc}",
            "    if beta != ZERO:",
            f"        v += beta * widen(z[{o}] if has_z else y[{o}])",
            "    v += bb",
            "    if act >= 0:",
            "        v = act_fn(v, act, coef)"]


def _epilogue(BM, BN, TM, TN, swap):
    """y[n, g*Kg + k, p] = act(alpha * acc + beta * z + bias[k]). With the P = PD*PH*PW
    positions merged, y's offset is m*K + k channels-last and (m // P)*K*P + k*P +
    m % P channels-first: one unsigned division a position, none channels-last. The
    tile's columns come in runs of 4 consecutive indices (the fragments'); when `vec`
    (the host checked that such a run is 4 contiguous, aligned elements of y: filters
    channels-last, positions channels-first) each run is one 16-byte store. The two
    store paths each compute their values (the activation is inlined in both): a run's
    four values computed once, each under its own guard, before one `vec` test a run,
    ran 20-28% slower on 1x1 layers and the fused conv+bias+relu
    for the same NVVM compile time (~35 s for the 128x128 kernels)."""
    pos_n, fil_n = (TN, TM) if swap else (TM, TN)
    pos_x = (lambda a: col_expr(BN, TN, a)) if swap else (lambda a: row_expr(BM, TM, a))
    fil_x = (lambda b: row_expr(BM, TM, b)) if swap else (lambda b: col_expr(BN, TN, b))
    src = ["    P = PD * PH * PW", "    yk = 1 if last else P"]
    for b in range(fil_n):
        src += [f"    kl{b} = n0 + {fil_x(b)}", f"    live{b} = kl{b} < Kg",
                f"    bb{b} = ZERO",
                f"    if has_bias != 0 and live{b}:",
                f"        bb{b} = widen(bias[U(g * Kg + kl{b})])",
                f"    ko{b} = U(g * Kg + kl{b}) * U(yk)"]
    for a in range(pos_n):
        src += [f"    m = m0 + {pos_x(a)}", f"    okm{a} = m < Mg", f"    nq = U(m) // U(P)",
                f"    yb{a} = U(m) * U(K) if last else nq * U(K * P) + U(m) - nq * U(P)"]

    def elem(i, j, ind):
        a, b = (j, i) if swap else (i, j)
        body = [f"o = yb{a} + ko{b}", f"bb = bb{b}"] + [ln[4:] for ln in _value(
            f"acc{i}_{j}", "o")]
        return [" " * ind + ln for ln in body]

    if TN % 4:  # no runs of 4 (the simulator's small tiles): vec is ignored
        src.append("    if True:")
    else:
        src.append("    if vec:")  # runs of 4 columns: 4 consecutive y elements
    for i in range(TM if TN % 4 == 0 else 0):
        for q in range(0, TN, 4):
            a, b = (q, i) if swap else (i, q)
            src += [f"        if okm{a} and live{b}:"]
            for e in range(4):
                src += elem(i, q + e, 12) + [f"            v{e} = v"]
            src += [f"            store4(y, (yb{a} + ko{b}) // U(4), narrow4((v0, v1, v2, v3), y))"]
    if TN % 4 == 0:
        src.append("    else:")
    for i in range(TM):
        for j in range(TN):
            a, b = (j, i) if swap else (i, j)
            src += [f"        if okm{a} and live{b}:"] + elem(i, j, 12) + ["            y[o] = narrow(v, y)"]
    return src


_taps_cache = {}


def taps_table(g, chunked):
    """The implicit GEMM's tap table (this module's kernels): for each reduction
    index kx, in the filters' storage order (variant 2), or each tap (t, r, s) (variant
    3, chunked, plus a sentinel), its offset in x from the receptive field's corner
    and its (d, h, w) displacement; int64 (4, n) interleaved."""
    N, C, K, G, D, H, W, T, R, S = g[:10]
    dd, dh, dw, flip, last = g.dd, g.dh, g.dw, g.flip, g.last
    key = g[1:10] + (dd, dh, dw, flip, last, chunked, device_key())
    tab = _taps_cache.get(key)
    if tab is None:
        Cg = 1 if chunked else C // G
        c, t, r, s = np.meshgrid(np.arange(Cg), np.arange(T), np.arange(R), np.arange(S),
                                 indexing="ij")
        if last:  # reduction order (t, r, s, c)
            c, t, r, s = (a.transpose(1, 2, 3, 0) for a in (c, t, r, s))
        if flip:
            t, r, s = T - 1 - t, R - 1 - r, S - 1 - s
        sc, sd_, sh_, sw_ = (1, H * W * C, W * C, C) if last else (D * H * W, H * W, W, 1)
        td, th, tw = t * dd, r * dh, s * dw
        host = np.stack([c * sc + td * sd_ + th * sh_ + tw * sw_, td, th, tw], axis=-1)
        host = np.append(host.ravel(), [0] * 4 * chunked)  # chunked: a sentinel tap
        if len(_taps_cache) > 256:
            _taps_cache.clear()
        tab = _taps_cache[key] = to_device(np.ascontiguousarray(host, np.int64).ravel())
    return tab

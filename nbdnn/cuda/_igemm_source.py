"""Generated source of the implicit-GEMM convolution (nbdnn.cuda.conv's docstring
describes it). Per group g (grid.y) the convolution is the GEMM

    Y_g (M = N*P rows, Kg = K/g columns) = X_g (M x Kr) @ W_g^T (Kr x Kg),  Kr = C/g*T*R*S

where row m of X_g is the receptive field of output position m, formed on the fly
while loading the A tile (zero outside the padded input), and W_g is the group's
filters as stored (K-major: (c, t, r, s) order for NCHW, (t, r, s, c) for NHWC, so a
reduction index means the same tap in both operands). The tile product and the
thread layout are the GEMM's (nbdnn/cuda/_gemm_source.py); the epilogue writes
y[n, g*Kg + k, p] through the layout's strides.

A tile: each thread's rows (output positions) are decoded once, before the k loop,
into the input offset of the receptive field's corner (xb) and its coordinates (bd,
bh, bw). A reduction index kx is a tap: `taps[4*kx:4*kx+4]` (nbdnn.cuda.conv builds
it on the host, cached per geometry) holds its offset in x and its (d, h, w)
displacement, so a k-step costs a thread four cached table loads an element instead
of the six runtime 64-bit divisions that decoded kx in variant 1 (2.8 TFLOP/s on
ResNet's 3x3 layers, 9% of cuDNN; perf/RESULTS.md run D). The bounds test folds each
coordinate's two sides into one unsigned compare. Channels-last takes consecutive
reduction indices in consecutive threads (c is contiguous in x); channels-first takes
consecutive output positions. The k loop is the GEMM's (two stages, one barrier).
"""
from ._gemm_source import PAD, block_setup, col_expr, main_loop, row_expr, tile_loads

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
             "    ok_a = m < Mg",
             "    pw = m % PW", "    q = m // PW", "    ph = q % PH", "    q //= PH",
             "    pd = q % PD", "    n = q // PD",
             "    bd = pd * sd - qd", "    bh = ph * sh - qh", "    bw = pw * sw - qw",
             "    xb = n * xn + xg + bd * xd + bh * xh + bw * xw",
             f"    dst_a = kk_a * {BM + PAD} + r"]
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
                  f"                r_{v} = CT(x[U(xb + taps[j])])"]
        stash.append(f"        As[U(so_a + dst_a + {l} * {BM + PAD} * dk_a)] = r_{v}")
    return setup, fetch, stash


def igemm_source(BM, BN, BK, TM, TN):
    """(name, source) of kernel `conv_igemm_<config>`: conv_fwd's arguments after the
    tap table."""
    TY, TX = BM // TM, BN // TN
    T = TX * TY
    assert BM * BK % T == 0 and BN * BK % T == 0, "tile loads must split evenly"
    name = f"conv_igemm_{BM}x{BN}x{BK}_{TM}x{TN}"
    src = [f"def {name}(x, w, y, bias, z, taps, {_GEOM}, has_bias, has_z, act, coef, alpha, "
           "beta):"]
    src += block_setup(BM, BN, BK, TM, TN)
    src += ["    Cg = C // G", "    Kg = K // G",
            "    Mg = N * PD * PH * PW", "    Kr = Cg * T * R * S",
            "    kbeg = 0", "    kend = Kr",
            "    xn, xc, xd, xh, xw = strides(C, D, H, W, last)",
            "    yn, yc, yd, yh, yw = strides(K, PD, PH, PW, last)",
            "    g = cuda.blockIdx.y",
            f"    ntn = (Kg + {BN - 1}) // {BN}",
            f"    m0 = (cuda.blockIdx.x // ntn) * {BM}",
            f"    n0 = (cuda.blockIdx.x % ntn) * {BN}",
            "    xg = g * Cg * xc", "    woff = g * Kg * Kr"]
    setup_a, fetch_a, stash_a = _a_loads(BM, BK, T, BM * BK // T)
    # the filters: the GEMM's B side, k-contiguous (as op(b) with trans_b)
    setup_b, fetch_b, stash_b = tile_loads("w", BN, "1", BN * BK // T, T, BK, "Kg",
                                           red="Kr", side="b")
    src += setup_a + setup_b
    src += main_loop(BM, BN, BK, TM, TN, fetch_a + fetch_b, stash_a + stash_b)
    for j in range(TN):
        src += [f"    kl{j} = n0 + {col_expr(BN, TN, j)}",
                f"    k{j} = g * Kg + kl{j}",
                f"    live{j} = kl{j} < Kg",
                f"    bb{j} = ZERO",
                f"    if has_bias != 0 and live{j}:",
                f"        bb{j} = CT(bias[U(k{j})])"]
    for i in range(TM):
        src += [f"    m = m0 + {row_expr(BM, TM, i)}", "    if m < Mg:",
                "        pw = m % PW", "        q = m // PW", "        ph = q % PH",
                "        q //= PH", "        pd = q % PD", "        n = q // PD",
                "        yb = n * yn + pd * yd + ph * yh + pw * yw"]
        for j in range(TN):
            src += [f"        if live{j}:",
                    f"            o = U(yb + k{j} * yc)",
                    f"            v = alpha * acc{i}_{j}",
                    "            if beta != ZERO:",
                    "                v += beta * CT(z[o] if has_z else y[o])",
                    f"            v += bb{j}",
                    "            if act >= 0:",
                    "                v = act_fn(v, act, coef)",
                    "            y[o] = v"]
    return name, "\n".join(src) + "\n"

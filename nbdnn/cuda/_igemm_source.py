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
into an input base offset and the top-left input coordinate; per k-step the
reduction index is decoded into (c, t, r, s) (runtime divisions). Channels-last takes
consecutive reduction indices in consecutive threads (c is contiguous in x);
channels-first takes consecutive output positions.
"""
from ._gemm_source import block_setup, tile_loads, tile_products

_GEOM = ("N, C, K, G, D, H, W, T, R, S, PD, PH, PW, sd, sh, sw, qd, qh, qw, dd, dh, dw, "
         "flip, last")


def _a_loads(BM, BK, T, L):
    setup, loop = [], []
    for l in range(L):
        v = f"a{l}"
        setup += [f"    e = t + {l * T}",
                  "    if last:", f"        r = e // {BK}", f"        kk_{v} = e % {BK}",
                  "    else:", f"        r = e % {BM}", f"        kk_{v} = e // {BM}",
                  "    m = m0 + r",
                  f"    ok_{v} = m < Mg",
                  "    pw = m % PW", "    q = m // PW", "    ph = q % PH", "    q //= PH",
                  "    pd = q % PD", "    n = q // PD",
                  f"    xb_{v} = n * xn + xg",
                  f"    bd_{v} = pd * sd - qd", f"    bh_{v} = ph * sh - qh",
                  f"    bw_{v} = pw * sw - qw",
                  f"    dst_{v} = kk_{v} * {BM} + r"]
        loop += ["        v = ZERO",
                 f"        kx = k0 + kk_{v}",
                 f"        if ok_{v} and kx < Kr:",
                 "            if last:",
                 "                c = kx % Cg", "                q = kx // Cg",
                 "                s = q % S", "                q //= S",
                 "                r = q % R", "                tt = q // R",
                 "            else:",
                 "                s = kx % S", "                q = kx // S",
                 "                r = q % R", "                q //= R",
                 "                tt = q % T", "                c = q // T",
                 "            if flip:",
                 "                tt, r, s = T - 1 - tt, R - 1 - r, S - 1 - s",
                 f"            idd = bd_{v} + tt * dd",
                 f"            ih = bh_{v} + r * dh",
                 f"            iw = bw_{v} + s * dw",
                 "            if 0 <= idd < D and 0 <= ih < H and 0 <= iw < W:",
                 f"                v = CT(x[U(xb_{v} + c * xc + idd * xd + ih * xh + iw * xw)])",
                 f"        As[U(dst_{v})] = v"]
    return setup, loop


def igemm_source(BM, BN, BK, TM, TN):
    """(name, source) of kernel `conv_igemm_<config>`, with conv_fwd's arguments."""
    TY, TX = BM // TM, BN // TN
    T = TX * TY
    assert BM * BK % T == 0 and BN * BK % T == 0, "tile loads must split evenly"
    name = f"conv_igemm_{BM}x{BN}x{BK}_{TM}x{TN}"
    src = [f"def {name}(x, w, y, bias, z, {_GEOM}, has_bias, has_z, act, coef, alpha, beta):"]
    src += block_setup(BM, BN, BK, TM, TN)
    src += ["    Cg = C // G", "    Kg = K // G",
            "    Mg = N * PD * PH * PW", "    Kr = Cg * T * R * S",
            "    xn, xc, xd, xh, xw = strides(C, D, H, W, last)",
            "    yn, yc, yd, yh, yw = strides(K, PD, PH, PW, last)",
            "    g = cuda.blockIdx.y",
            f"    ntn = (Kg + {BN - 1}) // {BN}",
            f"    m0 = (cuda.blockIdx.x // ntn) * {BM}",
            f"    n0 = (cuda.blockIdx.x % ntn) * {BN}",
            "    xg = g * Cg * xc", "    woff = g * Kg * Kr"]
    setup_a, loop_a = _a_loads(BM, BK, T, BM * BK // T)
    # the filters: the GEMM's B side, k-contiguous (as op(b) with trans_b)
    setup_b, loop_b = tile_loads("w", BN, "1", BN * BK // T, T, BK, "Kg", red="Kr", side="b")
    src += setup_a + setup_b
    src.append(f"    for k0 in range(0, Kr, {BK}):")
    src += loop_a + loop_b + tile_products(BM, BN, BK, TM, TN)
    for j in range(TN):
        src += [f"    k{j} = g * Kg + n0 + tx + {j * TX}",
                f"    live{j} = n0 + tx + {j * TX} < Kg",
                f"    bb{j} = ZERO",
                f"    if has_bias != 0 and live{j}:",
                f"        bb{j} = CT(bias[U(k{j})])"]
    for i in range(TM):
        src += [f"    m = m0 + ty + {i * TY}", "    if m < Mg:",
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

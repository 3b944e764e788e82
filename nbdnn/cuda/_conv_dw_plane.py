"""Depthwise forward, variant 3 `dw_plane_<R>x<S>s<st>_<GROUP>`: a whole (padded) input
plane in shared memory, for the small maps of a network's late layers.

Variant 2 (a thread a 4x4 block of outputs, _conv_depthwise.py) reaches 2.0 TB/s on
112x112 maps but 0.7-0.9x cuDNN at 7x7 and 14x14: a 7x7 plane has four 4x4 blocks, so
a warp's 32 threads spread over eight planes and each of their row loads touches its
own sectors. Here GROUP threads own one (n, k) plane: they copy the receptive field
of the whole output plane, (PH-1)*st + R rows of (PW-1)*st + S columns, zero-padded,
from x into shared memory with consecutive threads on consecutive addresses (the
plane is contiguous in NCHW), synchronise, and each computes outputs o = lane,
lane + GROUP, ... from shared memory with the R*S weights in registers, storing y
contiguously. Traffic: x read once and y written once, both coalesced (8 B an element
in float32); per output R*S shared loads and FMAs and one 32-bit index split.

Configurations (threads a plane, planes a block, shared elements a plane): GROUP 32 x 4
planes x 1024 elements for fields up to 32x32 (28x28 with a 3x3 filter), GROUP 256 x 1
plane x 4096 for fields up to 64x64 (56x56). Larger maps, channels-last tensors,
dilation and uneven strides take variants 1 and 2. PLANE_MAX (shared elements) is
the switch: 0 turns this variant off (the tests force variant 2 that way).
"""
from . import SIMULATOR

SPECS = ((3, 3, 1), (3, 3, 2), (5, 5, 1), (5, 5, 2))   # (R, S, square stride)
BUF = 4096                                             # shared elements a block
# GROUP -> PLANES; the simulator runs a thread per OS thread: fewer threads a plane
CONFIGS = {8: 4, 16: 1} if SIMULATOR else {32: 4, 256: 1}  # the same PLANES
SMALL, LARGE = sorted(CONFIGS)
PLANE_MAX = BUF


def plane_source(R, S, st, GROUP):
    """(name, source) of the kernel: conv_fwd's arguments; blocks loop over groups of
    PLANES planes (every thread reaches every barrier)."""
    PLANES = CONFIGS[GROUP]
    MAXP = BUF // PLANES
    name = f"dw_plane_{R}x{S}s{st}_{GROUP}"
    src = [f"def {name}(x, w, y, bias, z, N, C, K, G, D, H, W, T, R_, S_, PD, PH, PW, sd, "
           "sh_, sw, qd, qh, qw, dd, dh, dw, flip, last, has_bias, has_z, act, coef, alpha, "
           "beta):",
           f"    buf = cuda.shared.array({BUF}, CT)",
           "    t = cuda.threadIdx.x",
           f"    sb = (t // {GROUP}) * {MAXP}",
           f"    lane = U32(t % {GROUP})",
           f"    WB = U32((PW - 1) * {st} + {S})",
           f"    HWB = U32(((PH - 1) * {st} + {R}) * WB)",
           "    PQ = U32(PH * PW)",
           "    PWu = U32(PW)",
           "    HW = H * W",
           "    Kg = K // G",
           "    NK = N * K",
           "    plain = alpha == CT(1) and beta == ZERO and act < 0",
           "    bi = cuda.blockIdx.x",
           f"    while bi * {PLANES} < NK:",
           f"        pl = bi * {PLANES} + t // {GROUP}",
           "        live = pl < NK",
           "        n = pl // K",
           "        k = pl - n * K",
           "        if live:",
           "            xb = (n * C + k // Kg) * HW",
           "            b = lane",
           "            while b < HWB:",  # the zero-padded field, coalesced along rows
           "                hb = b // WB",
           "                ih = I(hb) - qh",
           "                iw = I(b - hb * WB) - qw",
           "                ok = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)",
           "                v = CT(x[U(xb + (ih * W + iw if ok else 0))])",
           "                buf[sb + b] = v if ok else ZERO",
           f"                b = U32(b + {GROUP})",
           "        cuda.syncthreads()",
           "        if live:",
           f"            wb = k * {R * S}"]
    for r in range(R):
        for s in range(S):
            src.append(f"            w{r}_{s} = CT(w[U(wb + ({R * S - 1 - r * S - s} if flip "
                       f"else {r * S + s}))])")
    taps = " + ".join(f"buf[c + {r} * WB + {s}] * w{r}_{s}" for r in range(R) for s in range(S))
    src += ["            bb = CT(bias[k]) if has_bias else ZERO",
            "            yb = pl * I(PQ)",
            "            o = lane",
            "            while o < PQ:",
            "                p = o // PWu",
            f"                c = sb + p * {st} * WB + (o - p * PWu) * {st}",
            f"                acc = {taps}",
            "                if plain:",
            "                    y[U(yb + o)] = acc + bb",
            "                else:",
            "                    epilogue(acc, y, z, bias, U(yb + o), k, has_bias, has_z, act, "
            "coef, alpha, beta)",
            f"                o = U32(o + {GROUP})",
            "        cuda.syncthreads()",
            "        bi += cuda.gridDim.x"]
    assert PLANES * MAXP == BUF
    return name, "\n".join(src) + "\n"


def field(g):
    """Shared elements of one plane's zero-padded receptive field."""
    R, S, PH, PW, st = g[8], g[9], g[11], g[12], g[14]
    return ((PH - 1) * st + R) * ((PW - 1) * st + S)


def plane_spec(g):
    """(R, S, stride, GROUP) of the kernel for geometry g, or None."""
    N, C, K, G, D, H, W, T, R, S = g[:10]
    sh, sw, dh, dw, last = g[14], g[15], g[20], g[21], g[23]
    if not (C == G and T == 1 and D == 1 and sh == sw and dh == dw == 1 and not last
            and (R, S, sh) in SPECS):
        return None
    f = field(g)
    if f > min(PLANE_MAX, BUF):
        return None
    return (R, S, sh, SMALL if f <= BUF // CONFIGS[SMALL] else LARGE)


def forward(table, x, y, w, bias, z, g, tail, stream, dtype):
    """Launch variant 3 when it applies; False otherwise."""
    spec = plane_spec(g)
    if spec is None:
        return False
    NK = g[0] * g[2]
    if NK and g[11] * g[12]:
        R, S, st, GROUP = spec
        k, sig = table[f"dw_plane_{R}x{S}s{st}_{GROUP}", dtype]
        planes = CONFIGS[GROUP]
        k.launch(sig, min(-(-NK // planes), 2 ** 31 - 1), GROUP * planes, stream, x, w, y,
                 bias, z, *g, *tail)
    return True


def sources():
    return dict(plane_source(*spec, group) for spec in SPECS for group in CONFIGS)


def signatures(fwd_sig):
    """name -> signature: conv_fwd's."""
    return {f"dw_plane_{R}x{S}s{st}_{group}": fwd_sig for R, S, st in SPECS
            for group in CONFIGS}

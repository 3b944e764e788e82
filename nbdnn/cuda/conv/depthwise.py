"""Algorithm "depthwise": convolutions with one input channel a group (C/g == 1, any
channel multiplier K/g), 1-d and 2-d, generated per filter size so the taps unroll.

Depthwise layers do 2*R*S flops per output and read each input ~R*S times from L1:
memory-bound, and instruction-bound as soon as a kernel spends more than a few
instructions a tap (the general direct kernel spends ~20: 0.2 TFLOP/s, 11% of cuDNN on
MobileNet's 3x3 layers).

- forward, variant 1 `dw_fwd_<R>x<S>s<sh>` (any stride and dilation along W): a
  thread computes VH outputs down a column (fixed n, k, ow). It walks the
  (VH-1)*sh + R input rows once, loads each row's S taps into registers and adds
  each into the outputs whose window holds that row, with the R*S weights in
  registers: per output, R*S FMAs and (R + (VH-1)*sh)*S/VH loads (4.5 for 3x3,
  stride 1, VH = 8). Nsight Compute (3x3, 64 channels at 112x112): 174 instructions
  an output, issue-bound at 1.0-1.2x cuDNN.
- forward, variant 2 `dw_tile_<R>x<S>s<st>` (square stride 1 or 2, dilation 1): a
  thread computes a VH x VW block (4x4; 2x4 for 5x5), so the index work, the
  weights and each loaded value serve up to 16 outputs, with every load
  unconditional, a 32-bit index split, an epilogue of one add an output for plain
  calls and 16-byte stores of aligned rows. 80 instructions an output and 1.6-2.2x
  cuDNN on the 56x56 and 112x112 layers.
  Consecutive threads take consecutive ow (NCHW) or consecutive k (NHWC): coalesced.
- forward, variant 3 `dw_rows` (conv/depthwise_rows.py), the default for every
  channels-first layer with a window of up to 64 taps: lanes along the output row, up
  to 8 vertical outputs a thread, the window geometry compiled in. 1.2-1.6x variant
  2's speed on every MobileNet layer. Variants 1 and 2 serve
  channels-last layers (and channels-first ones of 2**31 elements or more).
- tried and removed: a variant staging whole planes in shared memory (a group of
  threads a plane, coalesced loads and stores, for maps up to 56x56) ran 1.7-2x
  slower than variant 2 at 7x7-56x56; one staging many
  planes a block (one coalesced copy, one output a thread from shared memory) ran
  1.5-2.4x slower than variant 3 at 7x7-28x28.
- backward data, stride 1, dilation 1, multiplier 1: the forward kernels (rows or
  tiles, by layout) on dy with the flipped filter and pre-padding R-1-q
  (nbdnn/cpu/conv.py derives it).
- backward filter `dw_filter_<R>x<S>`: block (k, j) sums dy * x over the j-th chunk of
  the N*P*Q output positions for all R*S taps at once (registers), reduces them across
  the block in shared memory in a fixed tree order, and writes partial[k, j, tap];
  reduce_tensor sums the chunks in order (deterministic, no atomics).
Other depthwise geometries (3-d, dilated rows, filter sizes not generated) take the
direct kernels.
"""

from typing import NamedTuple

from ..runtime import variants
from ..runtime.simulator import SIMULATOR
from ..runtime.variants import Variant
from . import depthwise_rows as _conv_depthwise_rows
from .geometry import ConvGeometry
from ..runtime.memory.arrays import dtype_name, empty, size, vector_aligned
from ..runtime.launch.grid import BLOCK
from ..runtime.device_code.intrinsics import array_type
from ..runtime.device import sm_count
from ..tensor import reduce_tensor

FWD_SPECS = ((3, 3, 1), (3, 3, 2), (5, 5, 1), (5, 5, 2))   # (R, S, stride along H)
FILTER_SPECS = ((3, 3), (5, 5))
FILTER_THREADS = 8 if SIMULATOR else 256  # the simulator runs a thread per OS thread (16
# held its crosscheck rows at 33-50 s each)
_GEOM = ("N, C, K, G, D, H, W, T, R_, S_, PD, PH, PW, sd, sh_, sw, qd, qh, qw, dd, dh, dw, "
         "flip, last")


def _vh(sh):
    return 8 if sh == 1 else 4


def fwd_source(R, S, sh):
    """(name, source) of the forward kernel; conv_fwd's arguments, grid-stride over
    column strips."""
    VH = _vh(sh)
    rows = (VH - 1) * sh + R
    name = f"dw_fwd_{R}x{S}s{sh}"
    src = [f"def {name}(x, w, y, bias, z, {_GEOM}, has_bias, has_z, act, coef, alpha, beta, "
           "exact):",
           "    Kg = K // G",
           f"    HS = (PH + {VH - 1}) // {VH}",
           "    total = N * K * HS * PW",
           "    xn, xc, xd, xh, xw = strides(C, D, H, W, last)",
           "    yn, yc, yd, yh, yw = strides(K, PD, PH, PW, last)",
           "    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x",
           "    while i < total:",
           "        if last:",
           "            k = i % K", "            q = i // K", "            ow = q % PW",
           "            q //= PW", "            hs = q % HS", "            n = q // HS",
           "        else:",
           "            ow = i % PW", "            q = i // PW", "            hs = q % HS",
           "            q //= HS", "            k = q % K", "            n = q // K",
           f"        wb = k * {R * S}"]
    for r in range(R):
        for s in range(S):
            src.append(f"        w{r}_{s} = widen(w[U(wb + ({R * S - 1 - r * S - s} if flip else "
                       f"{r * S + s}))])")
    src += [f"        oh0 = hs * {VH}", f"        ih0 = oh0 * {sh} - qh",
            "        iw0 = ow * sw - qw", "        xb = n * xn + (k // Kg) * xc"]
    for s in range(S):
        src += [f"        cw{s} = iw0 + {s} * dw", f"        ok{s} = 0 <= cw{s} < W",
                f"        cw{s} *= xw"]
    src += [f"        acc{v} = ZERO" for v in range(VH)]
    for j in range(rows):
        # a padded row is zeros that take part in the products (0 * inf = nan)
        src += [f"        ih = ih0 + {j}", "        okh = 0 <= ih < H",
                "        rb = xb + ih * xh"]
        src += [f"        x{s} = widen(x[U(rb + cw{s})]) if okh and ok{s} else ZERO"
                for s in range(S)]
        for v in range(VH):
            r = j - v * sh
            if 0 <= r < R:
                src += [f"        acc{v} += " + " + ".join(
                    f"x{s} * w{r}_{s}" for s in range(S))]
    src += _exact_lines([f"acc{v}" for v in range(VH)], 1, sh, 1, "ow", f"{R}, {S}, 1, dw")
    for v in range(VH):
        src += [f"        if oh0 + {v} < PH:",
                f"            o = n * yn + k * yc + (oh0 + {v}) * yh + ow * yw",
                f"            epilogue(acc{v}, y, z, bias, o, k, has_bias, has_z, act, coef, "
                "alpha, beta)"]
    src.append("        i += cuda.gridDim.x * cuda.blockDim.x")
    return name, "\n".join(src) + "\n"


# (R, S, stride in H and W) -> a thread's block of outputs (rows VH, columns VW). 5x5
# takes 2 rows: a 4x4 block's 121 loads and 400 FMAs (stride 2) took NVVM 44 s.
TILE_SPECS = {(3, 3, 1): (4, 4), (3, 3, 2): (4, 4), (5, 5, 1): (2, 4), (5, 5, 2): (2, 4)}


def tile_source(R, S, st, VH, VW):
    """(name, source) of variant 2 of the forward: stride st along H and W, dilation 1.
    A thread computes a VH x VW block of outputs (fixed n, k): it loads the block's
    (VH-1)*st + R input rows of (VW-1)*st + S columns once each and adds every value
    into each output whose window holds it. Per output: R*S FMAs, ((VH-1)*st + R) *
    ((VW-1)*st + S) / (VH*VW) loads (2.25 for 3x3/1), and the index and epilogue work
    of one output in VH*VW. Every load is unconditional (clamped, then masked), so a
    thread has all of them in flight at once. When `vec` (the host checked that each
    output row's VW = 4 columns are 4 contiguous, 16-byte aligned elements of y:
    channels-first, PW % 4 == 0) a row of the block is one 16-byte store."""
    rows, cols = (VH - 1) * st + R, (VW - 1) * st + S
    name = f"dw_tile_{R}x{S}s{st}"
    src = [f"def {name}(x, w, y, bias, z, {_GEOM}, has_bias, has_z, act, coef, alpha, beta, "
           "vec, exact):",
           f"    HS = U(PH + {VH - 1}) // U({VH})", f"    WS = U(PW + {VW - 1}) // U({VW})",
           "    total = N * K * I(HS * WS)",
           "    xn, xc, xd, xh, xw = strides(C, D, H, W, last)",
           "    yn, yc, yd, yh, yw = strides(K, PD, PH, PW, last)",
           "    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x",
           "    plain = alpha == CT(1) and beta == ZERO and act < 0",
           "    while i < total:",
           "        if total <= 4294967295:",
           "            n, k, _, hs, ws = split32(i, K, 1, I(HS), I(WS), last)",
           "        else:",
           "            n, k, _, hs, ws = split(i, K, 1, I(HS), I(WS), last)",
           f"        wb = k * {R * S}"]
    for r in range(R):
        for s in range(S):
            src.append(f"        w{r}_{s} = widen(w[U(wb + ({R * S - 1 - r * S - s} if flip else "
                       f"{r * S + s}))])")
    src += ["        bb = widen(bias[k]) if has_bias else ZERO",
            f"        oh0 = hs * {VH}", f"        ow0 = ws * {VW}",
            f"        ih0 = oh0 * {st} - qh", f"        iw0 = ow0 * {st} - qw",
            "        xb = n * xn + (k if G == K else k // (K // G)) * xc"]
    for c in range(cols):  # clamped column offsets and their masks
        src += [f"        iw = iw0 + {c}", f"        okw{c} = (iw >= 0) & (iw < W)",
                f"        cw{c} = (iw if okw{c} else 0) * xw"]
    src += [f"        acc{v}_{u} = ZERO" for v in range(VH) for u in range(VW)]
    for j in range(rows):
        src += [f"        ih = ih0 + {j}", "        okh = (ih >= 0) & (ih < H)",
                "        rb = xb + (ih if okh else 0) * xh"]
        for c in range(cols):
            src += [f"        x{c} = widen(x[U(rb + cw{c})])",
                    f"        x{c} = x{c} if okh & okw{c} else ZERO"]
        for v in range(VH):
            r = j - v * st
            if 0 <= r < R:
                for u in range(VW):
                    src += [f"        acc{v}_{u} += x{u * st + s} * w{r}_{s}" for s in range(S)]
    src += [f"        okc{u} = ow0 + {u} < PW" for u in range(VW)]
    src += _exact_lines([f"acc{v}_{u}" for v in range(VH) for u in range(VW)], VW, st, st,
                        "ow0", f"{R}, {S}, 1, 1")
    for v in range(VH):  # y = act(alpha * acc + beta * z + bias), a row at a time
        src += [f"        if oh0 + {v} < PH:",
                f"            ob = n * yn + k * yc + (oh0 + {v}) * yh + ow0 * yw",
                "            if plain:"]  # (the common call: one add an output)
        src += [f"                v{u} = acc{v}_{u} + bb" for u in range(VW)]
        src += _tile_stores(VW, 16)
        src.append("            else:")
        for u in range(VW):
            src += [f"                v{u} = alpha * acc{v}_{u}",
                    "                if beta != ZERO:",
                    f"                    o = ob + {u} * yw if okc{u} else 0",
                    f"                    v{u} += beta * widen(z[U(o)] if has_z else y[U(o)])",
                    f"                v{u} += bb",
                    "                if act >= 0:",
                    f"                    v{u} = act_fn(v{u}, act, coef)"]
        src += _tile_stores(VW, 16)
    src.append("        i += cuda.gridDim.x * cuda.blockDim.x")
    return name, "\n".join(src) + "\n"


def _exact_lines(accs, VW, sh, sw, ow, window):
    """Backward data (exact): when a thread's sums (accs: its VH x VW outputs, row by
    row) are not all finite, each output goes through window_sum (the taps inside dy
    alone) and the epilogue, then on to the next item; one call site in a loop keeps
    the kernel small."""
    return ["        if exact != 0 and not abs(" + " + ".join(accs) + ") < INF:",
            f"            for vu in range({len(accs)}):",
            f"                v = vu // {VW}", f"                u = vu % {VW}",
            f"                if oh0 + v < PH and {ow} + u < PW:",
            f"                    a = window_sum(x, w, xb, wb, ih0 + v * {sh}, iw0 + u * {sw}, "
            f"H, W, {window}, xh, xw, flip)",
            f"                    epilogue(a, y, z, bias, n * yn + k * yc + (oh0 + v) * yh + "
            f"({ow} + u) * yw, k, has_bias, has_z, act, coef, alpha, beta)",
            "            i += cuda.gridDim.x * cuda.blockDim.x",
            "            continue"]


def _tile_stores(VW, ind):
    """Lines storing v0..v{VW-1} at ob + u*yw: one 16-byte store when vec."""
    p = " " * ind
    src = []
    if VW == 4:
        src += [f"{p}if vec:", f"{p}    store4(y, U(ob) // U(4), narrow4((v0, v1, v2, v3), y))",
                f"{p}else:"]
        p += "    "
    for u in range(VW):
        src += [f"{p}if okc{u}:", f"{p}    y[U(ob + {u} * yw)] = narrow(v{u}, y)"]
    return src


def filter_source(R, S):
    """(name, source) of the backward-filter partial sums: grid (K, chunks)."""
    T = FILTER_THREADS
    name = f"dw_filter_{R}x{S}"
    src = [f"def {name}(dy, x, part, {_GEOM}, chunk):",
           f"    red = cuda.shared.array({T}, CT)",
           "    k = cuda.blockIdx.x", "    j = cuda.blockIdx.y", "    t = cuda.threadIdx.x",
           "    Kg = K // G", "    PQ = PH * PW", "    NPQ = N * PQ",
           "    xn, xc, xd, xh, xw = strides(C, D, H, W, last)",
           "    yn, yc, yd, yh, yw = strides(K, PD, PH, PW, last)",
           "    xk = (k // Kg) * xc",
           "    p = j * chunk + t", "    pend = min(NPQ, j * chunk + chunk)"]
    src += [f"    a{r}_{s} = ZERO" for r in range(R) for s in range(S)]
    src += ["    while p < pend:",
            "        n = p // PQ", "        q = p % PQ", "        oh = q // PW", "        ow = q % PW",
            "        g = widen(dy[U(n * yn + k * yc + oh * yh + ow * yw)])",
            "        ih0 = oh * sh_ - qh", "        iw0 = ow * sw - qw",
            "        xb = n * xn + xk"]
    for s in range(S):
        src += [f"        cw{s} = iw0 + {s} * dw", f"        ok{s} = 0 <= cw{s} < W"]
    for r in range(R):  # a padded x is a zero that takes part (dy = inf: nan, as forward)
        src += [f"        ih = ih0 + {r} * dh", "        okh = 0 <= ih < H",
                "        rb = xb + ih * xh"]
        src += [f"        a{r}_{s} += g * (widen(x[U(rb + cw{s} * xw)]) if okh and ok{s} else ZERO)"
                for s in range(S)]
    src.append(f"        p += {T}")
    for r in range(R):
        for s in range(S):  # block sum in a fixed tree order
            src += [f"    red[t] = a{r}_{s}", "    cuda.syncthreads()"]
            h = T // 2
            while h:
                src += [f"    if t < {h}:", f"        red[t] += red[t + {h}]",
                        "    cuda.syncthreads()"]
                h //= 2
            src += ["    if t == 0:",
                    f"        tap = {R * S - 1 - r * S - s} if flip else {r * S + s}",
                    f"        part[U((k * cuda.gridDim.y + j) * {R * S} + tap)] = "
                    "narrow(red[0], part)",
                    "    cuda.syncthreads()"]
    return name, "\n".join(src) + "\n"


def fwd_spec(g):
    """The generated forward kernel's (R, S, sh) for geometry g, or None."""
    key = (g.R, g.S, g.sh)
    return key if g.C == g.G and g.planar and g.dh == 1 and key in FWD_SPECS \
        else None


def tile_spec(g):
    """The tiled forward kernel's (R, S, stride) for geometry g, or None."""
    key = (g.R, g.S, g.sh)
    return key if g.C == g.G and g.planar and g.sh == g.sw and \
        g.dh == g.dw == 1 and key in TILE_SPECS else None


class Depthwise(NamedTuple):
    """A depthwise forward as FORWARD's variants take it; tail: (has_bias, has_z, act,
    coef, alpha, beta); exact: 1 for a data gradient through the forward kernel."""
    table: object
    x: object
    y: object
    w: object
    bias: object
    z: object
    g: object
    tail: tuple
    stream: object
    exact: int


def _rows(c):
    dtype = dtype_name(c.x)
    _conv_depthwise_rows.launch(c.x, c.y, c.w, c.bias, c.z, c.g, c.tail, dtype,
                                "float64" if dtype == "float64" else "float32", c.stream,
                                sm_count(), c.exact)


def _generated(tiled):
    """Variant 2 (tiled) or 1 (column strips)."""
    def run(c):
        g = c.g
        N, K, PH, PW = g.N, g.K, g.PH, g.PW
        if tiled:
            spec = tile_spec(g)
            name = f"dw_tile_{spec[0]}x{spec[1]}s{spec[2]}"
            VH, VW = TILE_SPECS[spec]
            total = N * K * -(-PH // VH) * -(-PW // VW)
        else:
            spec = fwd_spec(g)
            name = f"dw_fwd_{spec[0]}x{spec[1]}s{spec[2]}"
            total = N * K * -(-PH // _vh(spec[2])) * PW
        if total:
            k, sig = c.table[name, dtype_name(c.x)]
            vec = (_vector_rows(c.y, PW, g.last),) if tiled else ()
            k.launch(sig, min(-(-total // BLOCK), 2 ** 31 - 1), BLOCK, c.stream, c.x, c.w, c.y,
                     c.bias, c.z, *g, *c.tail, *vec, c.exact)
    return run


FORWARD = (  # in order of preference
    Variant("depthwise_rows", lambda c: _conv_depthwise_rows.usable(c.g, size(c.x), size(c.y)),
            _rows, "variant 3, depthwise_rows.py: channels-first windows of up to 64 taps"),
    Variant("depthwise_tiles", lambda c: tile_spec(c.g) is not None, _generated(True),
            "variant 2: a tile of outputs a thread (TILE_SPECS)"),
    Variant("depthwise_strips", lambda c: fwd_spec(c.g) is not None, _generated(False),
            "variant 1: column strips, any stride and dilation along W (FWD_SPECS)"),
)


def forward_usable(g, x_size, y_size):
    """Whether a generated kernel takes the depthwise forward (`forward`)."""
    return _conv_depthwise_rows.usable(g, x_size, y_size) or tile_spec(g) is not None or \
        fwd_spec(g) is not None


def forward(table, x, y, w, bias, z, g, tail, stream, exact=0):
    """y = epilogue(depthwise conv) (`forward_usable`); g the geometry: FORWARD's first
    usable variant."""
    c = Depthwise(table, x, y, w, bias, z, g, tail, stream, exact)
    variants.choose("conv", "depthwise", FORWARD, c).run(c)


def _vector_rows(y, PW, last):
    """1 when the tile kernel's rows of 4 outputs are aligned 16-byte runs of y."""
    return int(not last and PW % 4 == 0 and vector_aligned(y))


def _data_geometry(g):
    """The forward geometry over dy that computes dx (stride 1, dilation 1, multiplier
    1: the filter flipped, the padding mirrored), or None."""
    N, C, K, G, D, H, W, T, R, S, PD, PH, PW = g[:13]
    st, dil = (g.sd, g.sh, g.sw), (g.dd, g.dh, g.dw)
    if not (C == G == K and g.planar and st == (1, 1, 1) and dil == (1, 1, 1)):
        return None
    gt = ConvGeometry(N, C, C, C, 1, PH, PW, 1, R, S, 1, H, W, 1, 1, 1, 0, R - 1 - g.qh,
                      S - 1 - g.qw, 1, 1, 1, 1 - g.flip, g.last)
    return gt if fwd_spec(gt) is not None else None


def data_usable(g):
    """Whether backward_data takes the call."""
    return _data_geometry(g) is not None


def backward_data(table, dy, w, dx, g, alpha, beta, stream):
    """dx as the forward kernel over dy (`data_usable`)."""
    forward(table, dy, dx, w, dx, dx, _data_geometry(g), (0, 0, -1, 0.0, alpha, beta),
            stream, 1)


def filter_usable(g):
    """Whether backward_filter takes the call: depthwise 2-d 3x3 or 5x5."""
    return g.C == g.G and g.planar and (g.R, g.S) in FILTER_SPECS


def backward_filter(table, dy, x, dwt, g, alpha, beta, stream, sm_count):
    """dw from per-chunk partial sums (`filter_usable`)."""
    N, C, K, G, D, H, W, T, R, S, PD, PH, PW = g[:13]
    npq = N * PH * PW
    if K == 0:
        return
    chunks = max(1, min(-(-2 * sm_count // K), -(-npq // (8 * FILTER_THREADS))))
    chunk = -(-npq // chunks)
    dtype = dtype_name(dy)
    part = empty(dy, (K, chunks, R * S), dtype)
    k, sig = table[f"dw_filter_{R}x{S}", dtype]
    k.launch(sig, (K, chunks, 1), FILTER_THREADS, stream, dy, x, part, *g, chunk)
    reduce_tensor(part, "add", (1,), False, False, alpha=alpha, beta=beta,
                  out=dwt.reshape((K, R * S)), stream=stream)


def sources():
    """Every generated kernel: name -> source."""
    out = dict(fwd_source(*spec) for spec in FWD_SPECS)
    out.update(tile_source(*spec, *shape) for spec, shape in TILE_SPECS.items())
    out.update(filter_source(*spec) for spec in FILTER_SPECS)
    return out


def signatures(t, ct, geom):
    a = f"{array_type(t)}[::1]"
    sig = {}
    for R, S, sh in FWD_SPECS:
        sig[f"dw_fwd_{R}x{S}s{sh}"] = (f"void({a}, {a}, {a}, {a}, {a}, {geom}, int64, int64, "
                                       f"int64, {ct}, {ct}, {ct}, int64)")
    for R, S, st in TILE_SPECS:
        sig[f"dw_tile_{R}x{S}s{st}"] = sig[f"dw_fwd_{R}x{S}s{st}"][:-1] + ", int64)"
    for R, S in FILTER_SPECS:
        sig[f"dw_filter_{R}x{S}"] = f"void({a}, {a}, {a}, {geom}, int64)"
    return sig

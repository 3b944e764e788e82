"""Convolution algorithms "winograd" F(2x2, 3x3) and "winograd4" F(4x4, 3x3), for 2-d,
3x3 filters, stride 1, dilation 1 (any padding, groups, mode, layout). Lavin & Gray's
transform with m outputs a tile side and a = m + 2 inputs:

    U = G g G^T   (a x a per filter k, channel c)           (a*a, G, K/g, C/g)
    V = B^T d B   (a x a per input tile, tiles step m)      (a*a, G, C/g, tiles)
    M = U @ V     (a*a*G batched GEMMs: the matmul kernel)  (a*a, G, K/g, tiles)
    Y = A^T M A   (m x m outputs per tile) + the epilogue

tiles = N * ceil(P/m) * ceil(Q/m); workspace a*a*(K*C/g + C*tiles + K*tiles) elements.
Multiplies in the product per output, against direct's 9: 16/4 = 4 for F(2x2) (2.25x
fewer), 36/16 = 2.25 for F(4x4) (4x fewer), which also moves 36/16 = 2.25 transformed
values per output through the GEMM instead of 4. F(4x4)'s larger coefficients (B^T up
to 5, A^T up to 8, G's 1/6 and 1/24) cost about 4x F(2x2)'s rounding error, so
"winograd4" keeps float16 layers' workspace and GEMM in float32 (float16 tiles would
lose ~3 bits); F(2x2) works in the layer's dtype.
The transforms are written out as straight-line expressions (generated source), each
coefficient other than +-1 a constant of the compute type. Registers on the H200,
F(4x4) filter / input / output transforms: 66 / 72 / 56
(float32), 96 / 96 / 72 (float64), no local memory. Each transform is memory-bound:
the input transform reads x once and writes 36/16 = 2.25 values an input element
(F(2x2): 4), the output transform reads 2.25 (4) products an output element.
"""
from fractions import Fraction as Fr

import numpy as np
from numba import cuda

from ..runtime.memory.arrays import dtype_name, empty
from ..runtime.launch.grid import U, launch, split, strides
from ..runtime.device_code.intrinsics import array_type, narrow, widen
from ..runtime.launch.codegen import compile_source

_MATRICES = {  # m: (B^T, G, A^T)
    2: (((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1)),
        ((1, 0, 0), (Fr(1, 2), Fr(1, 2), Fr(1, 2)), (Fr(1, 2), Fr(-1, 2), Fr(1, 2)),
         (0, 0, 1)),
        ((1, 1, 1, 0), (0, 1, -1, -1))),
    4: (((4, 0, -5, 0, 1, 0), (0, -4, -4, 1, 1, 0), (0, 4, -4, -1, 1, 0),
         (0, -2, -1, 2, 1, 0), (0, 2, -1, -2, 1, 0), (0, 4, 0, -5, 0, 1)),
        ((Fr(1, 4), 0, 0), (Fr(-1, 6), Fr(-1, 6), Fr(-1, 6)), (Fr(-1, 6), Fr(1, 6), Fr(-1, 6)),
         (Fr(1, 24), Fr(1, 12), Fr(1, 6)), (Fr(1, 24), Fr(-1, 12), Fr(1, 6)), (0, 0, 1)),
        ((1, 1, 1, 1, 1, 0), (0, 1, -1, 2, -2, 0), (0, 1, 1, 4, 4, 0),
         (0, 1, -1, 8, -8, 1))),
}
NAMES = {2: "winograd", 4: "winograd4"}  # the algo= name, also the kernels' prefix


def _const(c):
    """The generated name of the constant |c| (c not +-1)."""
    c = abs(Fr(c))
    if c == Fr(1, 2):
        return "HALF"
    return f"C{c.numerator}" + (f"_{c.denominator}" if c.denominator != 1 else "")


def _lin(row, names):
    terms = [f"{'+' if c > 0 else '-'} {'' if abs(c) == 1 else _const(c) + ' * '}{n}"
             for c, n in zip(row, names) if c]
    return " ".join(terms).lstrip("+ ") if terms[0][0] == "+" else " ".join(terms)


def _sandwich(L, src, dst, n_in):
    """Lines computing dst{i}_{j} = (L src L^T)[i][j] from src{a}_{b} (n_in x n_in)."""
    lines = []
    for i, row in enumerate(L):  # tmp = L src
        for b in range(n_in):
            lines.append(f"    t{i}_{b} = {_lin(row, [f'{src}{a}_{b}' for a in range(n_in)])}")
    for i in range(len(L)):      # dst = tmp L^T
        for j, row in enumerate(L):
            lines.append(f"    {dst}{i}_{j} = {_lin(row, [f't{i}_{b}' for b in range(n_in)])}")
    return lines


def _filter_source(m, G_):
    a = m + 2
    src = [f"def {NAMES[m]}_filter(w, U, K, G, Cg, flip, last):",
           "    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x",
           "    if i >= K * Cg:", "        return",
           "    k = i // Cg", "    c = i % Cg",
           "    wk, wc, wt, wr, ws = strides(Cg, 1, 3, 3, last)"]
    for r in range(3):
        for s in range(3):
            src.append(f"    g{r}_{s} = widen(w[k * wk + c * wc + "
                       f"({2 - r} if flip else {r}) * wr + ({2 - s} if flip else {s}) * ws])")
    src += _sandwich(G_, "g", "u", 3)
    src += ["    g = k // (K // G)", "    kl = k % (K // G)",
            "    base = (g * (K // G) + kl) * Cg + c"]
    return src + [f"    U[{a * i + j} * K * Cg + base] = narrow(u{i}_{j}, U)" for i in range(a)
                  for j in range(a)]


def _input_source(m, BT):
    a = m + 2
    src = [f"def {NAMES[m]}_input(x, V, N, C, G, H, W, TH, TW, qh, qw, last):",
           "    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x",
           "    ntile = N * TH * TW",
           "    if i >= C * ntile:", "        return",
           "    c, n, _, th, tw = split(i, N, 1, TH, TW, False)",
           "    xn, xc, xd, xh, xw = strides(C, 1, H, W, last)",
           f"    h0 = {m} * th - qh", f"    w0 = {m} * tw - qw", "    base = n * xn + c * xc"]
    # all a*a loads unconditional (outside taps read a clamped address, then zero)
    for r in range(a):
        src += [f"    ih = h0 + {r}", f"    okh{r} = (ih >= 0) & (ih < H)",
                f"    oh{r} = (ih if okh{r} else 0) * xh",
                f"    iw = w0 + {r}", f"    okw{r} = (iw >= 0) & (iw < W)",
                f"    ow{r} = (iw if okw{r} else 0) * xw"]
    for r in range(a):
        for s in range(a):
            src += [f"    d{r}_{s} = widen(x[U(base + oh{r} + ow{s})])",
                    f"    d{r}_{s} = d{r}_{s} if okh{r} & okw{s} else ZERO"]
    src += _sandwich(BT, "d", "v", a)
    return src + [f"    V[U({a * i + j} * C * ntile + i)] = narrow(v{i}_{j}, V)" for i in range(a)
                  for j in range(a)]


def _output_source(m, AT):
    """Y = A^T M A, then the epilogue. When a tile's outputs are not all finite, each is
    summed again directly (tap_sum): B^T d B mixes a tile's inputs, so one inf in a tile would
    reach outputs whose windows never hold it (inf - inf = nan), and finite inputs can
    overflow there; the direct sum gives the reference's answer (nbdnn/cpu/conv.py)."""
    a = m + 2
    src = [f"def {NAMES[m]}_output(Mw, y, bias, z, x, w, N, K, P, Q, TH, TW, C, G, H, W, qh, "
           "qw, flip, last, has_bias, has_z, act, coef, alpha, beta):",
           "    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x",
           "    ntile = N * TH * TW",
           "    if i >= K * ntile:", "        return",
           "    k, n, _, th, tw = split(i, N, 1, TH, TW, False)",
           "    yn, yc, yd, yh, yw = strides(K, 1, P, Q, last)"]
    src += [f"    m{r}_{s} = widen(Mw[U({a * r + s} * K * ntile + i)])" for r in range(a)
            for s in range(a)]
    src += _sandwich(AT, "m", "o", a)
    outs = [f"o{r}_{s}" for r in range(m) for s in range(m)]
    src += ["    if not abs(" + " + ".join(outs) + ") < INF:",  # (one call site: small code)
            f"        for rs in range({m * m}):",
            f"            r, s = rs // {m}, rs % {m}",
            f"            if {m} * th + r < P and {m} * tw + s < Q:",
            f"                v = tap_sum(x, w, n, k, {m} * th + r - qh, {m} * tw + s - qw, C, K, "
            "G, H, W, flip, last)",
            f"                epilogue(v, y, z, bias, n * yn + k * yc + ({m} * th + r) * yh + "
            f"({m} * tw + s) * yw, k, has_bias, has_z, act, coef, alpha, beta)",
            "        return"]
    for r in range(m):
        for s in range(m):
            src += [f"    if {m} * th + {r} < P and {m} * tw + {s} < Q:",
                    f"        epilogue(o{r}_{s}, y, z, bias, n * yn + k * yc + ({m} * th + {r})"
                    f" * yh + ({m} * tw + {s}) * yw, k, has_bias, has_z, act, coef, alpha, "
                    "beta)"]
    return src


def _source(m):
    BT, G_, AT = _MATRICES[m]
    return "\n".join(_filter_source(m, G_) + ["", ""] + _input_source(m, BT) + ["", ""] +
                     _output_source(m, AT)) + "\n"


def make_tap_sum(CT):
    """tap_sum(x, w, n, k, h0, w0, C, K, G, H, W, flip, last): output (n, k) of the 3x3
    window at (h0, w0) summed directly over x_pad (a tap outside x is a zero times the
    weight, as the reference's padding)."""
    @cuda.jit(device=True)
    def tap_sum(x, w, n, k, h0, w0, C, K, G, H, W, flip, last):
        Cg = C // G
        xn, xc, xd, xh, xw = strides(C, 1, H, W, last)
        wk, wc, wt, wr, ws = strides(Cg, 1, 3, 3, last)
        c0 = (k // (K // G)) * Cg
        acc = CT(0)
        for c in range(Cg):
            for r in range(3):
                for s in range(3):
                    ih, iw = h0 + r, w0 + s
                    xv = CT(0)
                    if 0 <= ih < H and 0 <= iw < W:
                        xv = widen(x[n * xn + (c0 + c) * xc + ih * xh + iw * xw])
                    fr, fs = (2 - r, 2 - s) if flip else (r, s)
                    acc += xv * widen(w[k * wk + c * wc + fr * wr + fs * ws])
        return acc
    return tap_sum


def kernels(CT, epilogue):
    ns = {"cuda": cuda, "CT": CT, "ZERO": CT(0), "INF": CT(np.inf), "strides": strides,
          "split": split, "U": U, "epilogue": epilogue, "tap_sum": make_tap_sum(CT),
          "widen": widen, "narrow": narrow}
    out = {}
    for m, mats in _MATRICES.items():
        ns.update({_const(c): CT(float(abs(Fr(c)))) for mat in mats for row in mat
                   for c in row if c and abs(c) != 1})
        about = {"what": f"winograd F({m}x{m}, 3x3) filter, input and output transforms",
                 "traffic": f"a tile: {(m + 2) ** 2} inputs in, {m * m} outputs out (the "
                            f"{(m + 2) ** 2} batched GEMMs between are matmul's)"}
        compile_source(f"{NAMES[m]}_filter", _source(m), ns, about,
                       label=f"{NAMES[m]}_transforms_{CT}")
        out.update({f"{NAMES[m]}_{p}": ns[f"{NAMES[m]}_{p}"]
                    for p in ("filter", "input", "output")})
    return out


def workspace_dtype(dtype, m):
    return "float32" if dtype in ("float16", "bfloat16") and m == 4 else dtype


def signatures(t, ct):
    """Arrays of dtype t; the workspace (U, V, M) of workspace_dtype."""
    a = f"{array_type(t)}[::1]"
    i = "int64"
    sigs = {}
    for m, name in NAMES.items():
        ws = f"{array_type(workspace_dtype(t, m))}[::1]"
        sigs.update({f"{name}_filter": f"void({a}, {ws}, {i}, {i}, {i}, {i}, {i})",
                     f"{name}_input": f"void({a}, {ws}, " + ", ".join([i] * 10) + ")",
                     f"{name}_output": f"void({ws}, {a}, {a}, {a}, {a}, {a}, " +
                                       ", ".join([i] * 17) + f", {ct}, {ct}, {ct})"})
    return sigs


def forward(table, gemm, x, w, y, bias, residual, g, act, coef, alpha, beta, stream, m=2):
    """g: the call's ConvGeometry (geometry.py) (2-d problems: D = T = PD = 1); m: 2 or 4
    outputs a tile side."""
    N, C, K, G, _, H, W = g[:7]
    P, Q, qh, qw, flip, last = g.PH, g.PW, g.qh, g.qw, g.flip, g.last
    Cg, Kg, a, name = C // G, K // G, m + 2, NAMES[m]
    TH, TW = -(-P // m), -(-Q // m)
    ntile = N * TH * TW
    dtype = dtype_name(x)
    wdtype = workspace_dtype(dtype, m)
    U = empty(x, (a * a, G, Kg, Cg), wdtype)
    V = empty(x, (a * a, G, Cg, ntile), wdtype)
    launch(table, f"{name}_filter", dtype, K * Cg, stream, w, U, K, G, Cg, flip, last)
    launch(table, f"{name}_input", dtype, C * ntile, stream, x, V, N, C, G, H, W, TH, TW, qh,
           qw, last)
    Mw = gemm(U.reshape((a * a * G, Kg, Cg)), V.reshape((a * a * G, Cg, ntile)), False, False,
              None, None, 0.0, 1.0, 0.0, None, stream)
    launch(table, f"{name}_output", dtype, K * ntile, stream, Mw, y,
           bias if bias is not None else y, residual if residual is not None else y, x, w,
           N, K, P, Q, TH, TW, C, G, H, W, qh, qw, flip, last, int(bias is not None),
           int(residual is not None), act, coef, alpha, beta)

"""Convolution algorithm "winograd": F(2x2, 3x3) for 2-d, 3x3 filters, stride 1,
dilation 1 (any padding, groups, mode, layout). Lavin & Gray's transform:

    U = G g G^T   (4x4 per filter k, channel c)          (16, G, K/g, C/g)
    V = B^T d B   (4x4 per 4x4 input tile, stride 2)      (16, G, C/g, tiles)
    M = U @ V     (16*G batched GEMMs: the matmul kernel) (16, G, K/g, tiles)
    Y = A^T M A   (2x2 outputs per tile) + the epilogue

tiles = N * ceil(P/2) * ceil(Q/2). 2.25x fewer multiplies than direct for the product,
at the cost of the transforms and a workspace of 16*(K*C/g + C*tiles + K*tiles)
elements. The transforms are written out as straight-line
expressions (generated source): G, B^T and A^T have entries 0, +-1, 1/2.
"""
from numba import cuda

from ._arrays import dtype_name, empty
from ._conv_index import U, launch, split, strides

_BT = ((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1))
_G = ((1, 0, 0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0, 0, 1))
_AT = ((1, 1, 1, 0), (0, 1, -1, -1))


def _lin(row, names):
    terms = [f"{'+' if c > 0 else '-'} {'' if abs(c) == 1 else 'HALF * '}{n}"
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


def _source():
    src = ["def winograd_filter(w, U, K, G, Cg, flip, last):",
           "    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x",
           "    if i >= K * Cg:", "        return",
           "    k = i // Cg", "    c = i % Cg",
           "    wk, wc, wt, wr, ws = strides(Cg, 1, 3, 3, last)"]
    for r in range(3):
        for s in range(3):
            src.append(f"    g{r}_{s} = CT(w[k * wk + c * wc + "
                       f"({2 - r} if flip else {r}) * wr + ({2 - s} if flip else {s}) * ws])")
    src += _sandwich(_G, "g", "u", 3)
    src += ["    g = k // (K // G)", "    kl = k % (K // G)",
            "    base = (g * (K // G) + kl) * Cg + c"]
    src += [f"    U[{4 * i + j} * K * Cg + base] = u{i}_{j}" for i in range(4) for j in range(4)]
    src += ["", "",
            "def winograd_input(x, V, N, C, G, H, W, TH, TW, qh, qw, last):",
            "    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x",
            "    ntile = N * TH * TW",
            "    if i >= C * ntile:", "        return",
            "    c, n, _, th, tw = split(i, N, 1, TH, TW, False)",
            "    xn, xc, xd, xh, xw = strides(C, 1, H, W, last)",
            "    h0 = 2 * th - qh", "    w0 = 2 * tw - qw", "    base = n * xn + c * xc"]
    # all 16 loads unconditional (outside taps read a clamped address, then zero)
    for a in range(4):
        src += [f"    ih = h0 + {a}", f"    okh{a} = (ih >= 0) & (ih < H)",
                f"    oh{a} = (ih if okh{a} else 0) * xh",
                f"    iw = w0 + {a}", f"    okw{a} = (iw >= 0) & (iw < W)",
                f"    ow{a} = (iw if okw{a} else 0) * xw"]
    for a in range(4):
        for b in range(4):
            src += [f"    d{a}_{b} = CT(x[U(base + oh{a} + ow{b})])",
                    f"    d{a}_{b} = d{a}_{b} if okh{a} & okw{b} else ZERO"]
    src += _sandwich(_BT, "d", "v", 4)
    src += [f"    V[U({4 * i + j} * C * ntile + i)] = v{i}_{j}" for i in range(4)
            for j in range(4)]
    src += ["", "",
            "def winograd_output(Mw, y, bias, z, N, K, P, Q, TH, TW, last, has_bias, has_z, "
            "act, coef, alpha, beta):",
            "    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x",
            "    ntile = N * TH * TW",
            "    if i >= K * ntile:", "        return",
            "    k, n, _, th, tw = split(i, N, 1, TH, TW, False)",
            "    yn, yc, yd, yh, yw = strides(K, 1, P, Q, last)"]
    src += [f"    m{a}_{b} = CT(Mw[U({4 * a + b} * K * ntile + i)])" for a in range(4)
            for b in range(4)]
    src += _sandwich(_AT, "m", "o", 4)
    for a in range(2):
        for b in range(2):
            src += [f"    if 2 * th + {a} < P and 2 * tw + {b} < Q:",
                    f"        epilogue(o{a}_{b}, y, z, bias, n * yn + k * yc + (2 * th + {a}) * yh"
                    f" + (2 * tw + {b}) * yw, k, has_bias, has_z, act, coef, alpha, beta)"]
    return "\n".join(src) + "\n"


def kernels(CT, epilogue):
    ns = {"cuda": cuda, "CT": CT, "ZERO": CT(0), "HALF": CT(0.5), "strides": strides,
          "split": split, "U": U, "epilogue": epilogue}
    exec(compile(_source(), "<nbdnn.cuda._conv_winograd>", "exec"), ns)
    return {n: ns[n] for n in ("winograd_filter", "winograd_input", "winograd_output")}


def signatures(t, ct):
    a = f"{t}[::1]"
    i = "int64"
    return {"winograd_filter": f"void({a}, {a}, {i}, {i}, {i}, {i}, {i})",
            "winograd_input": f"void({a}, {a}, " + ", ".join([i] * 10) + ")",
            "winograd_output": f"void({a}, {a}, {a}, {a}, " + ", ".join([i] * 10) +
                               f", {ct}, {ct}, {ct})"}


def forward(table, gemm, x, w, y, bias, residual, g, act, coef, alpha, beta, stream):
    """g: nbdnn.cuda.conv._geometry's 24 ints (2-d problems: D = T = PD = 1)."""
    N, C, K, G, _, H, W = g[:7]
    P, Q, qh, qw, flip, last = g[11], g[12], g[17], g[18], g[22], g[23]
    Cg, Kg = C // G, K // G
    TH, TW = -(-P // 2), -(-Q // 2)
    ntile = N * TH * TW
    dtype = dtype_name(x)
    U = empty(x, (16, G, Kg, Cg), dtype)
    V = empty(x, (16, G, Cg, ntile), dtype)
    launch(table, "winograd_filter", dtype, K * Cg, stream, w, U, K, G, Cg, flip, last)
    launch(table, "winograd_input", dtype, C * ntile, stream, x, V, N, C, G, H, W, TH, TW, qh,
         qw, last)
    Mw = gemm(U.reshape((16 * G, Kg, Cg)), V.reshape((16 * G, Cg, ntile)), False, False,
              None, None, 0.0, 1.0, 0.0, None, stream)
    launch(table, "winograd_output", dtype, K * ntile, stream, Mw, y,
         bias if bias is not None else y, residual if residual is not None else y, N, K, P,
         Q, TH, TW, last, int(bias is not None), int(residual is not None), act, coef,
         alpha, beta)

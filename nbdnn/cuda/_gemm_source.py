"""Generated source of the tiled GEMM kernel (nbdnn.cuda.matmul's docstring describes
it): every loop over the tile is unrolled in the text, and the TM x TN accumulators
and the fragments are named scalars, so they stay in registers (numba has no unroll
pragma, and a local array indexed by a loop variable goes to local memory).

Block tile BM x BN, k-step BK, thread tile TM x TN, TX = BN/TN by TY = BM/TM threads.
Thread (tx, ty) owns rows ty + i*TY and columns tx + j*TX of the block tile (strided,
so that a warp reads consecutive shared-memory words of the B tile and writes
consecutive columns of c). Shared tiles are k-major: As[k*BM + m], Bs[k*BN + n].
Per k-step a block reads (BM + BN)*BK elements from global memory and each thread
does TM*TN*BK multiply-adds from (TM + TN)*BK shared-memory loads.

Every index is cast to unsigned (`U`, numba's uint64) where it is used: numba wraps
negative signed indices around (a compare and select per access), which kept each
of the unrolled shared-memory addresses in its own register (197 registers for the
4x4 tile, ptxas -v); unsigned, they fold into the loads' immediate offsets.
"""


def tile_loads(arr, rows, trans, L, T, BK, dim, red="K", side="a"):
    """(setup, loop) lines loading `rows` x BK elements of op(arr) (rows of op(a) when
    side is "a", columns of op(b) when "b"; `dim` of them in all, `red` the reduction
    length) into shared memory, L a thread; `{arr}off` is the matrix's offset.
    Element (r, k) sits at r*red + k when side a is not transposed or side b is
    ("k-contiguous"), else at k*dim + r; consecutive threads take consecutive
    addresses either way. Everything but the k offset is computed once, before the
    k loop: per load a source index that advances by BK*step a k-step, a row-in-range
    flag, the k within the tile and the shared-memory slot."""
    kc = f"{trans} == {'0' if side == 'a' else '1'}"
    o0 = "m0" if side == "a" else "n0"
    setup = [f"    step_{arr} = 1 if {kc} else {dim}"]
    loop = []
    for l in range(L):
        v = f"{arr}{l}"
        setup += [f"    e = t + {l * T}",
                  f"    if {kc}:",
                  f"        r = e // {BK}", f"        kk_{v} = e % {BK}",
                  f"        src_{v} = {arr}off + ({o0} + r) * {red} + kk_{v}",
                  "    else:",
                  f"        r = e % {rows}", f"        kk_{v} = e // {rows}",
                  f"        src_{v} = {arr}off + kk_{v} * {dim} + {o0} + r",
                  f"    ok_{v} = {o0} + r < {dim}",
                  f"    dst_{v} = kk_{v} * {rows} + r"]
        loop += ["        v = ZERO",
                 f"        if ok_{v} and kk_{v} < {red} - k0:",
                 f"            v = CT({arr}[U(src_{v})])",
                 f"        {'As' if side == 'a' else 'Bs'}[U(dst_{v})] = v",
                 f"        src_{v} += {BK} * step_{arr}"]
    return setup, loop


def block_setup(BM, BN, BK, TM, TN):
    """Lines every tiled kernel starts with: shared tiles, the thread's place (tx, ty)
    and fragment rows/columns (pa, pb), zeroed accumulators."""
    TY, TX = BM // TM, BN // TN
    src = [f"    As = cuda.shared.array({BK * BM}, CT)",
           f"    Bs = cuda.shared.array({BK * BN}, CT)",
           "    t = cuda.threadIdx.x",
           f"    tx = t % {TX}", f"    ty = t // {TX}"]
    src += [f"    pa{i} = ty + {i * TY}" for i in range(TM)]
    src += [f"    pb{j} = tx + {j * TX}" for j in range(TN)]
    src += [f"    acc{i}_{j} = ZERO" for i in range(TM) for j in range(TN)]
    return src


def tile_products(BM, BN, BK, TM, TN):
    """The k-step's multiply-adds from the shared tiles (inside the k loop, after the
    loads), fenced by barriers."""
    src = ["        cuda.syncthreads()"]
    for kk in range(BK):
        src += [f"        a{i} = As[U(pa{i} + {kk * BM})]" for i in range(TM)]
        src += [f"        b{j} = Bs[U(pb{j} + {kk * BN})]" for j in range(TN)]
        src += [f"        acc{i}_{j} += a{i} * b{j}" for i in range(TM) for j in range(TN)]
    return src + ["        cuda.syncthreads()"]


def gemm_source(BM, BN, BK, TM, TN):
    """(name, source) of kernel `gemm_<config>`: c[z] = epilogue(op(a[z]) @ op(b[z]))."""
    TY, TX = BM // TM, BN // TN
    T = TX * TY
    assert BM * BK % T == 0 and BN * BK % T == 0, "tile loads must split evenly"
    name = f"gemm_{BM}x{BN}x{BK}_{TM}x{TN}"
    src = [f"def {name}(a, b, c, bias, offs, M, N, K, trans_a, trans_b, has_bias, act, "
           "coef, alpha, beta):"] + block_setup(BM, BN, BK, TM, TN)
    src += [f"    ntn = (N + {BN - 1}) // {BN}",
            f"    m0 = (cuda.blockIdx.x // ntn) * {BM}",
            f"    n0 = (cuda.blockIdx.x % ntn) * {BN}",
            "    z = cuda.blockIdx.y",
            "    aoff = offs[U(2 * z)]", "    boff = offs[U(2 * z + 1)]", "    coff = z * M * N"]
    setup_a, loop_a = tile_loads("a", BM, "trans_a", BM * BK // T, T, BK, "M")
    setup_b, loop_b = tile_loads("b", BN, "trans_b", BN * BK // T, T, BK, "N", side="b")
    src += setup_a + setup_b
    src.append(f"    for k0 in range(0, K, {BK}):")
    src += loop_a + loop_b + tile_products(BM, BN, BK, TM, TN)
    for j in range(TN):
        src += [f"    col{j} = n0 + tx + {j * TX}",
                f"    bb{j} = ZERO",
                f"    if has_bias != 0 and col{j} < N:",
                f"        bb{j} = CT(bias[U(col{j})])"]
    for i in range(TM):
        src += [f"    m = m0 + ty + {i * TY}", "    if m < M:"]
        for j in range(TN):
            src += [f"        if col{j} < N:",
                    f"            r = acc{i}_{j} + bb{j}",
                    "            if act >= 0:",
                    "                r = act_fn(r, act, coef)",
                    "            r = alpha * r",
                    "            if beta != ZERO:",
                    f"                r += beta * CT(c[U(coff + m * N + col{j})])",
                    f"            c[U(coff + m * N + col{j})] = r"]
    return name, "\n".join(src) + "\n"

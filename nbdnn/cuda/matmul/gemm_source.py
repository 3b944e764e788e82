"""Generated source of the tiled GEMM kernel (nbdnn.cuda.matmul's docstring describes
it): every loop over the tile is unrolled in the text, and the TM x TN accumulators
and the fragments are named scalars, so they stay in registers (numba has no unroll
pragma, and a local array indexed by a loop variable goes to local memory).

Block tile BM x BN, k-step BK, thread tile TM x TN, TX = BN/TN by TY = BM/TM threads.
Shared tiles are k-major with a padded row: As[k*(BM+4) + m], Bs[k*(BN+4) + n].

Variant 2 (this file; variant 1 is in: 21.5 TFLOP/s, 42% of
cuBLAS at 4096^2, shared-memory bound):
- Fragments of VA = min(4, TM) consecutive rows (VB columns): thread (tx, ty) owns
  rows ty*VA + g*TY*VA + q, q < VA, g < TM/VA (columns likewise). Four consecutive
  floats from a 16-byte-aligned base load as one LDS.128, so a k-step costs a thread
  (TM + TN)/4 shared loads instead of TM + TN: at 8x8, 4 wavefronts of the SM's one
  shared-memory pipe per 64 FMAs, where variant 1 spent 16 and saturated it.
- The +4 pad spreads the k-contiguous tile stores (8 consecutive threads write 8
  different k rows) over the banks: without it they hit one bank 8 ways.
- Two shared stages: the next k-step's global loads go to registers before the
  products and to the other stage after them: one barrier a k-step, and the global
  latency hides behind the FMAs.
- Split-K: grid.z cuts the reduction into chunks of `ksplit` (a multiple of BK);
  chunk z writes its own c slice and the caller sums them in order (deterministic).

Every index is cast to unsigned (`U`, numba's uint64) where it is used: numba wraps
negative signed indices around (a compare and select per access), which kept each
of the unrolled shared-memory addresses in its own register; unsigned, they fold into
the loads' immediate offsets.
"""
from ..runtime.simulator import SIMULATOR

PAD = 4
_ALIGN = "" if SIMULATOR else ", alignment=16"  # the simulator rejects alignment=


def _vec(T):
    return min(4, T)


def row_expr(BM, TM, i):
    """The block-tile row of a thread's accumulator row i (a string of ty)."""
    V, TY = _vec(TM), BM // TM
    return f"ty * {V} + {(i // V) * TY * V + i % V}"


def col_expr(BN, TN, j):
    V, TX = _vec(TN), BN // TN
    return f"tx * {V} + {(j // V) * TX * V + j % V}"


def tile_loads(arr, rows, trans, L, T, BK, dim, red="K", side="a", load="CT"):
    """(setup, fetch, stash) lines moving `rows` x BK elements of op(arr) (rows of
    op(a) when side is "a", columns of op(b) when "b"; `dim` of them in all, `red` the
    reduction length) into shared memory, L a thread; `{arr}off` is the matrix's
    offset and the reduction runs over [kbeg, kend). Element (r, k) sits at r*red + k
    when side a is not transposed or side b is ("k-contiguous"), else at k*dim + r.

    Every thread loads one row r: k-contiguous, L consecutive k (a warp reads 16 rows
    x 32 bytes: whole sectors); otherwise consecutive threads take consecutive rows
    and a thread's L loads step T/rows in k. So a thread keeps one source index, one
    row test and one k base per side, not one per load (variant 1 kept all of them per
    load: ~40 registers in the 128x128 tile). fetch (in the k loop, k0 the k-step)
    loads into registers r_{arr}{l}; stash stores them at stage offset `so_a`/`so_b`.
    load: the name that widens a loaded element to the compute type (CT, or LD for
    bfloat16 bits)."""
    kc = f"{trans} == {'0' if side == 'a' else '1'}"
    o0 = "m0" if side == "a" else "n0"
    tile = "As" if side == "a" else "Bs"
    assert BK % L == 0 and T % rows == 0 and rows * BK == L * T
    p = arr
    setup = [f"    if {kc}:",
             f"        r = t // {BK // L}", f"        kk_{p} = (t % {BK // L}) * {L}",
             f"        dk_{p} = 1",
             f"        src_{p} = {arr}off + ({o0} + r) * {red} + kbeg + kk_{p}",
             f"        ls_{p} = 1",
             "    else:",
             f"        r = t % {rows}", f"        kk_{p} = t // {rows}",
             f"        dk_{p} = {T // rows}",
             f"        src_{p} = {arr}off + (kbeg + kk_{p}) * {dim} + {o0} + r",
             f"        ls_{p} = {T // rows} * {dim}",
             f"    ok_{p} = {o0} + r < {dim}",
             f"    dst_{p} = kk_{p} * {rows + PAD} + r",
             f"    step_{p} = {BK} if {kc} else {BK} * {dim}"]
    fetch, stash = [], []
    for l in range(L):
        v = f"{arr}{l}"
        fetch += [f"        r_{v} = ZERO",
                  f"        if ok_{p} and kk_{p} + {l} * dk_{p} < kend - k0:",
                  f"            r_{v} = {load}({arr}[U(src_{p} + {l} * ls_{p})])"]
        stash.append(f"        {tile}[U(so_{side} + dst_{p} + {l} * {rows + PAD} * dk_{p})] "
                     f"= r_{v}")
    fetch.append(f"        src_{p} += step_{p}")
    return setup, fetch, stash


def block_setup(BM, BN, BK, TM, TN):
    """Lines every tiled kernel starts with: two stages of padded shared tiles, the
    thread's place (tx, ty), fragment bases, zeroed accumulators."""
    TY, TX = BM // TM, BN // TN
    src = [f"    As = cuda.shared.array({2 * BK * (BM + PAD)}, CT{_ALIGN})",
           f"    Bs = cuda.shared.array({2 * BK * (BN + PAD)}, CT{_ALIGN})",
           "    t = cuda.threadIdx.x",
           f"    tx = t % {TX}", f"    ty = t // {TX}",
           f"    pa = ty * {_vec(TM)}", f"    pb = tx * {_vec(TN)}"]
    src += [f"    acc{i}_{j} = ZERO" for i in range(TM) for j in range(TN)]
    return src


def tile_products(BM, BN, BK, TM, TN):
    """The k-step's multiply-adds from the shared stage at so_a/so_b."""
    TY, TX = BM // TM, BN // TN
    VA, VB = _vec(TM), _vec(TN)
    src = ["        ba = so_a + pa", "        bb = so_b + pb"]
    for kk in range(BK):
        src += [f"        a{i} = As[U(ba + {kk * (BM + PAD) + (i // VA) * TY * VA + i % VA})]"
                for i in range(TM)]
        src += [f"        b{j} = Bs[U(bb + {kk * (BN + PAD) + (j // VB) * TX * VB + j % VB})]"
                for j in range(TN)]
        src += [f"        acc{i}_{j} += a{i} * b{j}" for i in range(TM) for j in range(TN)]
    return src


def main_loop(BM, BN, BK, TM, TN, fetch, stash):
    """Double-buffered k loop over [kbeg, kend): prologue fills stage 0; each step
    fetches the next tile into registers, multiplies the current stage, stashes the
    fetched tile into the other stage, one barrier."""
    za, zb = BK * (BM + PAD), BK * (BN + PAD)
    src = ["    so_a = 0", "    so_b = 0", "    k0 = kbeg"]
    src += [line[4:] for line in fetch + stash] + ["    cuda.syncthreads()",
                            f"    for k0 in range(kbeg + {BK}, kend + {BK}, {BK}):",
                            "        more = k0 < kend",
                            "        if more:"]
    src += ["    " + s for s in fetch]
    src += tile_products(BM, BN, BK, TM, TN)
    src += ["        so_a = " + f"{za} - so_a", "        so_b = " + f"{zb} - so_b",
            "        if more:"]
    src += ["    " + s for s in stash]
    return src + ["        cuda.syncthreads()"]


def gemm_about(ct_name, size, cfg, what="the tiled GEMM (matmul, conv gemm/winograd)"):
    """The header of a generated GEMM-family kernel (runtime/launch/codegen.py): its tile and
    what one block's k-step moves and computes."""
    BM, BN, BK, TM, TN = cfg
    item = 8 if ct_name == "float64" else 4
    return {"what": f"{what}, {ct_name} compute, tile '{size}'",
            "config": f"block tile {BM}x{BN}, k-step {BK}, thread tile {TM}x{TN}, "
                      f"{(BM // TM) * (BN // TN)} threads, 2 shared stages",
            "per k-step": f"{(BM + BN) * BK * item} B of a and b from global memory "
                          f"(compute-type bytes; float16 storage moves half), "
                          f"{2 * BM * BN * BK} flops: {2 * BM * BN * BK / ((BM + BN) * BK * item):.1f} "
                          "flop/B",
            "why": "gemm_source.py's docstring (variant 2: vector fragments, padded shared "
                   "tiles, two stages, split-K)"}


def gemm_source(BM, BN, BK, TM, TN, bf16=False):
    """(name, source) of kernel `gemm_<config>`: c[kz, z] = epilogue(op(a[z]) @ op(b[z]))
    over the reduction chunk kz (grid.z) of length ksplit. bf16: the arrays hold
    bfloat16 bits, widened by LD and rounded back by ST (runtime/device_code/intrinsics.py)."""
    ld = "LD" if bf16 else "CT"
    TY, TX = BM // TM, BN // TN
    T = TX * TY
    assert BM * BK % T == 0 and BN * BK % T == 0, "tile loads must split evenly"
    assert TM % _vec(TM) == 0 and TN % _vec(TN) == 0
    name = f"gemm_{BM}x{BN}x{BK}_{TM}x{TN}" + ("_bf16" if bf16 else "")
    src = [f"def {name}(a, b, c, bias, offs, M, N, K, trans_a, trans_b, has_bias, act, "
           "coef, alpha, beta, ksplit):"] + block_setup(BM, BN, BK, TM, TN)
    src += [f"    ntn = (N + {BN - 1}) // {BN}",
            f"    m0 = (cuda.blockIdx.x // ntn) * {BM}",
            f"    n0 = (cuda.blockIdx.x % ntn) * {BN}",
            "    z = cuda.blockIdx.y",
            "    kbeg = cuda.blockIdx.z * ksplit", "    kend = min(K, kbeg + ksplit)",
            "    aoff = offs[U(2 * z)]", "    boff = offs[U(2 * z + 1)]",
            "    coff = (cuda.blockIdx.z * cuda.gridDim.y + z) * M * N"]
    setup_a, fetch_a, stash_a = tile_loads("a", BM, "trans_a", BM * BK // T, T, BK, "M",
                                           load=ld)
    setup_b, fetch_b, stash_b = tile_loads("b", BN, "trans_b", BN * BK // T, T, BK, "N",
                                           side="b", load=ld)
    src += setup_a + setup_b
    src += main_loop(BM, BN, BK, TM, TN, fetch_a + fetch_b, stash_a + stash_b)
    for j in range(TN):
        src += [f"    col{j} = n0 + {col_expr(BN, TN, j)}",
                f"    bb{j} = ZERO",
                f"    if has_bias != 0 and col{j} < N:",
                f"        bb{j} = {ld}(bias[U(col{j})])"]
    for i in range(TM):
        src += [f"    m = m0 + {row_expr(BM, TM, i)}", "    if m < M:"]
        for j in range(TN):
            src += [f"        if col{j} < N:",
                    f"            r = acc{i}_{j} + bb{j}",
                    "            if act >= 0:",
                    "                r = act_fn(r, act, coef)",
                    "            r = alpha * r",
                    "            if beta != ZERO:",
                    f"                r += beta * {ld}(c[U(coff + m * N + col{j})])",
                    f"            c[U(coff + m * N + col{j})] = {'ST(r)' if bf16 else 'r'}"]
    return name, "\n".join(src) + "\n"

"""The wgmma GEMM's tile schedule (wgmma_gemm.py): which tile t of a persistent block's
loop is, and where its k-chunk and batch matrices start. Generated source lines.

Tile t -> (zk, m0, n0): zk counts matrices and then split-K chunks (z = zk % nz, chunk
zk // nz); within a matrix, groups of `group` tile rows, down the rows first, then
across the columns (a wave of blocks shares fewer B columns in L2).

    tile rows ->  group 0      group 1
                 0  3  6  9 | 24 ...
                 1  4  7 10 | 25
                 2  5  8 11 |          (group = 3: t runs down a group's rows)

The lean setup (wgmma_gemm.LEAN_SETUP): the producer's first TMA copy waited ~1.8 us
after the block's prologue (docs/decisions.md "gemm_timeline"), behind tile_of's
arithmetic and the batch table's global read (offs[2z], offs[2z + 1]). Lean: no table
read for one matrix (nz == 1: the table is [0, 0]), and the tile arithmetic in uint32
(numba keeps uint32 // uint32 in 32 bits: div.u32). The int64 version's PTX already
branches to div.u32 when both operands fit (LLVM's slow-division bypass: 20 div.s64
and 20 div.u32 sites in the bf16 kernel, 3 and 11 lean), so the read is the suspect;
the 32-bit arithmetic drops the checks and the 64-bit paths. Tile counts stay far
below 2^32 (a tile is 128 x 128 or more).
"""


def helper_lines(bm, bn, lean, nw=None):
    """zero_acc (a consumer's float32 accumulators' zeros, nw / 2 of them for its nw
    columns (default bn), in a device function of their own: numba's bytecode peephole
    for long tuple literals fails inside the kernel's branches) and tile_of."""
    L = ["@cuda.jit(device=True)", "def zero_acc():",
         "    return (" + "F32(0), " * ((nw or bn) // 2) + ")", "", "",
         "@cuda.jit(device=True)",
         "def tile_of(t, tm, tn, group):",
         '    """Tile t -> (matrix z, m0, n0): per matrix, groups of `group` tile rows,',
         '    down the rows first, then across the columns."""']
    if not lean:
        return L + [
            "    z = t // (tm * tn)  # (the split-K chunk's matrices come after the last z's)",
            "    pid = t % (tm * tn)",
            "    width = group * tn",
            "    first = (pid // width) * group",
            "    gm = min(tm - first, group)",
            f"    return z, (first + (pid % width) % gm) * {bm}, ((pid % width) // gm) * {bn}",
            "", ""]
    return L + [  # (U32 around each product: numba widens uint32 * uint32 to 64 bits)
        "    tt = U32(t)",
        "    per = U32(U32(tm) * U32(tn))",
        "    z = tt // per  # (the split-K chunk's matrices come after the last z's)",
        "    pid = U32(tt - U32(z * per))",
        "    width = U32(U32(group) * U32(tn))",
        "    q = pid // width",
        "    r = U32(pid - U32(q * width))",
        "    first = U32(q * U32(group))",
        "    gm = min(U32(U32(tm) - first), U32(group))",
        "    g = r // gm",
        f"    return I(z), I(U32(first + U32(r - U32(g * gm)))) * {bm}, I(g) * {bn}",
        "", ""]


def chunk_lines(indent, lean, matrix=True):
    """k0 (this tile's first k) and, with matrix, z (its batch matrix) from zk."""
    if not lean:
        return ([f"{indent}z = zk % nz"] if matrix else []) + \
            [f"{indent}k0 = (zk // nz) * ksplit"]
    return [f"{indent}zq = U32(zk) // U32(nz)"] + \
        ([f"{indent}z = I(U32(U32(zk) - U32(zq * U32(nz))))"] if matrix else []) + \
        [f"{indent}k0 = I(zq) * ksplit"]


def batch_lines(indent, lean):
    """za, zb: the matrices of a and b that matrix z multiplies (the batch table)."""
    if not lean:
        return [f"{indent}za = I32(offs[2 * z])", f"{indent}zb = I32(offs[2 * z + 1])"]
    return [f"{indent}za = I32(offs[2 * z]) if nz > 1 else I32(0)",
            f"{indent}zb = I32(offs[2 * z + 1]) if nz > 1 else I32(0)"]

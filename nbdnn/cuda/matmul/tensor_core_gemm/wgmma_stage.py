"""A pipeline stage of the wgmma GEMM (wgmma_gemm.py): its shared-memory layout, the
producer's TMA loads into it and the consumers' operand addresses and descriptors.

A tile is BM x BN: BM = 128, the two consumer warpgroups take 64 rows each (m64nBNk16);
BM = 64 (skinny M), they share A's 64 rows and take BN / 2 columns each (m64n(BN/2)k16),
so a stage holds half the A and the pipeline one more stage. Shared memory of a stage
(dynamic, 1024-byte aligned for the swizzle atom):

    A  K-major:  BM rows (m) x 128 B (64 k)      MN-major: BM / 64 boxes [64 k rows x 128 B (64 m)]
    B  K-major:  BN rows (n) x 128 B (64 k)      MN-major: BN / 64 boxes [64 k rows x 128 B (64 n)]
    descriptors  K-major: LBO unused, SBO 1024 (8 rows), +32 B a k-step of 16
                 MN-major: LBO 8192 (the next 64-wide box), SBO 1024 (8 k-rows), +2048 B
                 a k-step
    a consumer   BM 128: A + w * 8 KB (its 64 rows), all of B
                 BM 64:  all of A, B + w * BN / 2 * 128 B (its BN / 2 rows or boxes)

128 x 256 with 4 stages: A 16 KB + B 32 KB = 48 KB a stage, 192 KB; 64 x 256: A 8 KB +
B 32 KB = 40 KB, 5 stages 200 KB (4 beside TMA stores' 32 KB staging).
"""
BK = 64                                  # a 16-bit k-tile (128 B a row)
BOX = 64                                 # MN-major boxes: 64 elements = 128 B wide
MAX_SHARED = 227 * 1024                  # an H200 block's dynamic shared memory


def consumer_columns(bn, bm):
    """Columns of the tile a consumer warpgroup computes (its wgmma's N)."""
    return bn if bm == 128 else bn // 2


def a_bytes(bm):
    return bm * BK * 2


def stage_bytes(bn, bm=128):
    return a_bytes(bm) + bn * BK * 2


def shared_bytes(bn, stages, staging=0, bm=128):
    """Dynamic shared memory of a block: the stages + C's staging tiles (TMA stores) +
    the swizzle atom's alignment slack."""
    return stages * stage_bytes(bn, bm) + staging + 1024


def loads(side, k_major, bk, rows):
    """The producer's TMA lines for one operand (`rows` of it: BM or BN) into stage
    address `sa`/`sb` (bk: the k-tile in elements)."""
    dst, tmap, z, o0 = ("sa", "map_a", "za", "m0") if side == "a" else ("sb", "map_b", "zb", "n0")
    if k_major:  # one box: rows x 64 k (x = k, y = row, z = matrix)
        return [f"                tma_load_3d(U32({dst}), {tmap}, I32(k0 + kt * {bk}), I32({o0}), "
                f"{z}, U32(full0 + 8 * s))"]
    return [f"                tma_load_3d(U32({dst} + {i * BOX * BK * 2}), {tmap}, "
            f"I32({o0} + {i * BOX}), I32(k0 + kt * {BK}), {z}, U32(full0 + 8 * s))"
            for i in range(rows // BOX)]


def descriptor(addr, k_major, ks):
    """wgmma's shared-memory descriptor of k-step ks (16 k) of the operand at addr."""
    if k_major:
        return f"descriptor({addr} + {32 * ks}, 16, 1024, SW128)"
    return f"descriptor({addr} + {2048 * ks}, {BOX * BK * 2}, 1024, SW128)"


def operand_lines(bm, bn, sb_bytes):
    """A consumer's operand addresses in stage s (module docstring)."""
    if bm == 128:
        return [f"                sa = base + s * {sb_bytes} + w * {64 * BK * 2}",
                f"                sb = base + s * {sb_bytes} + {a_bytes(bm)}"]
    return [f"                sa = base + s * {sb_bytes}",
            f"                sb = base + s * {sb_bytes} + {a_bytes(bm)} + w * {bn // 2 * 128}"]


def place_lines(bm, bn):
    """A consumer thread's first row r and column pair cb of the tile (wgmma's D
    fragment: rows 16 (i // 32) + (i % 32) // 4 and + 8, columns 2 (i % 4) + 8 j)."""
    if bm == 128:
        return ["            r = m0 + w * 64 + 16 * (i // 32) + (i % 32) // 4",
                "            cb = n0 + 2 * (i % 4)"]
    return ["            r = m0 + 16 * (i // 32) + (i % 32) // 4",
            f"            cb = n0 + w * {bn // 2} + 2 * (i % 4)"]

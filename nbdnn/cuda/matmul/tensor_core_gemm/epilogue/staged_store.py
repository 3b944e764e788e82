"""The wgmma GEMM's epilogue through shared memory and TMA stores (wgmma_gemm.TMA_STORE).

The direct epilogue (pairs.py) has every thread store 4 bytes at a time to C:
64 st.global a thread for a 64 x 256 half-tile, each warp instruction writing 16 bytes
of eight rows. Here a consumer warpgroup instead writes its 64 x BN accumulators,
finished (bias, activation, alpha) and packed to 16 bits, into a 64 x 64 staging tile
in shared memory, and one thread hands the tile to TMA (cp.async.bulk.tensor, a bulk
group), which writes whole 128-byte rows and clips rows >= M and columns >= N itself.
Two staging tiles a warpgroup alternate chunk by chunk across its tiles (sq, the tile
next written), so the products of one chunk are written while the previous chunk's
store still reads the other tile. (Before they alternated within a tile, q % 2:
a tile of one or three chunks - 64 or 192 columns a consumer, 16-bit - began on the
tile its last chunk's store might still be reading. A profile saw ResNet-50's stem
forward (24 tiles a block) and a 64-wide 1x1 data gradient come out wrong, once.)

A staging tile: 64 rows x 128 B (64 columns), TMA's 128-byte swizzle (the 16-byte
chunk c of row r sits at chunk c ^ (r % 8)), 1024-byte aligned:

    row r:  | c0^s | c1^s | c2^s | ... | c7^s |    s = r % 8, one chunk = 8 columns
            thread i (warp i // 32, lane l) holds, for column group j (8 columns) of the
            chunk, columns 2 (l % 4), +1 of rows 16 (i // 32) + l // 4 and that + 8:
            one 4-byte store each, at chunk j ^ s. The eight rows of a warp's store
            have eight different s, so its 32 stores fill 32 different banks.

Shared memory: 2 warpgroups x 2 tiles x 8 KB = 32 KB beside the 4 stages of 48 KB
(225 KB of the 227 KB an H200 block may have). Per chunk a warpgroup syncs twice on its
own named barrier (1 + w; 128 threads): once after thread 0 has seen the tile's last
store finish reading (cp.async.bulk.wait_group.read 1), once after every thread's
fence.proxy.async made its writes visible to TMA. Before the kernel ends thread 0
waits for its stores (wait_group 0).

float32 C (the tf32 kernels' C, split-K's chunks in their workspace; f32 below): the
same 64 x 128-byte tiles hold 64 x 32 values, so a warpgroup's half-tile leaves in
BN / 32 chunks; thread i's pair (columns 2 (l % 4), +1 of group j: bytes 8 (l % 4) of
the group's 32) is one 8-byte st.shared.v2.f32 in 16-byte chunk 2 (j % 4) + (l % 4) // 2
at offset 8 (l % 2), the chunk swizzled as above.

Used when beta = 0 (no old C to read), N a multiple of 8 (16-bit) or 4 (float32) and
C 16-byte aligned (TMA's row strides and base); the direct epilogue otherwise.
"""
from .pairs import bias_lines, conv_value_lines, value_lines

TILE_BYTES = 64 * 128                 # a 64 x 128-byte staging tile (64 16-bit columns,
#                                       or 32 float32)
STAGING_BYTES = 2 * 2 * TILE_BYTES    # two consumer warpgroups x two tiles: 32 KB


def columns(f32):
    """Columns of C a staging tile holds (128 bytes a row): TMA's box width."""
    return 32 if f32 else 64


def usable(kind, partial, beta, N, c_address, f32=False, width=64):
    """Whether a call's epilogue can go through TMA stores (module docstring); a float32
    C (tf32, split-K's chunks) only with f32 (wgmma_gemm.TMA_STORE_F32). width: the
    columns a consumer warpgroup holds (wgmma_stage.consumer_columns), whole staging
    tiles of them (a 64 x 64 tile's 32-wide consumers, 16-bit, store directly: a
    64-column box would write over the other consumer's half)."""
    wide = kind == "tf32" or partial
    return (f32 or not wide) and not beta and N % (4 if wide else 8) == 0 and \
        c_address % 16 == 0 and width % columns(wide) == 0


def prologue_lines(indent):
    """A consumer's setup: its staging tiles, and thread 0 acquires C's tensor map."""
    return [f"{indent}stage_c = ebase + w * {2 * TILE_BYTES}",
            f"{indent}sq = 0  # the staging tile next written: 0 or 1, chunk after chunk",
            f"{indent}sw = (i % 32) // 4  # this thread's rows r, r + 8 mod 8: the swizzle",
            f"{indent}rl = 16 * (i // 32) + sw  # its first row in the warpgroup's 64",
            f"{indent}if i == 0:",
            f"{indent}    fence_proxy_tensormap_acquire(map_c)"]


def tile_lines(bn, bias, act, f32=False, partial=False, row0="m0 + w * 64", col0="n0",
               conv=None):
    """One tile's epilogue for a consumer warpgroup (accumulators d[4j .. 4j + 3]: column
    pair cb + 8 j, rows r and r + 8, as the direct epilogue), chunk by chunk: bn columns
    from (row0, col0), expressions (the warpgroup's 64 x bn part of C). f32: float32 C;
    partial: split-K's raw chunk sums (float32, no epilogue); conv: a convolution's
    order (pairs.conv_value_lines), True reading beta's z from `zin` (each
    thread its own pairs, before the tile's TMA store), False without z."""
    L, cols = [], columns(f32 or partial)
    if bn % cols:
        raise ValueError(f"staged store: {bn} columns a consumer, not whole {cols}-column tiles")
    groups = cols // 8  # column groups of 8 a chunk
    for q in range(bn // cols):
        buf = f"stage_c + sq * {TILE_BYTES}"
        L += ["if i == 0:", "    bulk_wait_read(1)  # tile sq's last store has read it",
              "bar_sync(U32(1 + w), U32(128))"]
        for j in range(groups * q, groups * q + groups):
            # (N % 8 or % 4 == 0: a pair is in or out of bounds whole; TMA clips it)
            L += bias_lines(f"cb + {8 * j}", f32) if bias and not partial else []
            if groups == 8:  # 16-bit: a 4-byte pair in chunk j % 8
                at = f"{buf} + rl * 128 + (({j % 8} ^ sw) << 4) + 4 * (i % 4)"
            else:  # float32: an 8-byte pair in chunk 2 (j % 4) + (i % 4) // 2
                chunk = f"({2 * (j % 4)} + (i // 2) % 2)"
                at = f"{buf} + rl * 128 + (({chunk} ^ sw) << 4) + 8 * (i % 2)"
            for k, row_off in ((0, 0), (2, 8 * 128)):
                v0, v1 = f"d[{4 * j + k}]", f"d[{4 * j + k + 1}]"
                if partial:
                    L += [f"st_shared_v2_f32(U32({at} + {row_off}), {v0}, {v1})"]
                    continue
                if conv is not None:  # (16-bit C)
                    rr, col = f"(r + {k * 4})", f"cb + {8 * j}"
                    L += (["z0 = F32(0)", "z1 = F32(0)", f"if {rr} < M and {col} < N:",
                           f"    z0, z1 = unpack(zin[(coff + {rr} * N + {col}) // 2])"]
                          if conv else []) + conv_value_lines(v0, v1, bias, act, conv) + \
                        [f"st_shared_u32(U32({at} + {row_off}), cvt(v0, v1))"]
                    continue
                L += value_lines(v0, v1, bias, act) + \
                    [f"st_shared_v2_f32(U32({at} + {row_off}), a * v0, a * v1)" if f32 else
                     f"st_shared_u32(U32({at} + {row_off}), cvt(a * v0, a * v1))"]
        L += ["fence_proxy_async()  # the tile's writes, visible to TMA",
              "bar_sync(U32(1 + w), U32(128))",
              "if i == 0:",
              f"    tma_store_3d(map_c, I32({col0} + {cols * q}), I32({row0}), I32(zk), "
              f"U32({buf}))",
              "    bulk_commit()",
              "sq ^= 1"]
    return L


def final_lines(indent):
    """After a consumer's last tile: its stores done before the block ends."""
    return [f"{indent}if i == 0:", f"{indent}    bulk_wait(0)"]

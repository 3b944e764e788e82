"""The wgmma GEMM's operands for a convolution (implicit GEMM): A gathered from a
channels-last activation by TMA's im2col mode, B the filters as stored. The producer
lines that replace the GEMM's tile setup and TMA loads (wgmma_gemm.source(conv=1 or 2));
nbdnn/cuda/conv/wgmma_conv.py builds the maps and the geometry and launches it.

GEMM view of y = conv(x, w), x (N, H, W, C), w (K, R, S, C), y (N, OH, OW, K):

    A[m, (j, c)]  = x[n, oy sh - ph + r dh, ox sw - pw + s dw, c]   (0 outside x)
                    m = (n, oy, ox) an output position (M = N OH OW rows),
                    tap j = (r, s) (filter as stored; mode "convolution" reads the
                    input at the flipped tap (R-1-r, S-1-s))
    B[k, (j, c)]  = w[k, r, s, c]
    C[m, k]       = y as stored (N OH OW rows of K)

The reduction runs over k-tiles of 64 channels of one tap: k-tile i = (channel block
cb, tap j) = (i // taps, i % taps), taps innermost (a tile's taps read neighbouring
pixels of the same 64 channels: L2 hits). C is padded to Cp = 64 ceil(C / 64) by TMA's
out-of-bounds zeros on both sides, so the GEMM's reduction length is taps x Cp.

A k-tile's loads (one thread, both onto the stage's mbarrier):
    A  im2col: BM consecutive output positions from the tile's first, m0 = (n, oy, ox):
       coordinates (cb 64, ox sw - pw, oy sh - ph, n) and the tap's offsets (s dw, r dh);
       TMA walks ox, then oy, then n by the map's strides inside its bounding box (the
       window corners of all output positions), so one box crosses rows and images;
       each pixel is one 128-byte row of the 128-byte-swizzled stage, as a K-major A.
    B  tiled, 3-d map (K, taps, C): the box (BN filters, 1 tap, 64 channels) at
       (n0, j, cb 64): BN rows of 128 bytes, a K-major B.

Geometry (int32, the kernel's `offs`, which a GEMM uses for its batch table): GEOMETRY
below. A 1-d convolution runs as a 2-d one with H = 1.
"""
GEOMETRY = ("ow", "oh", "sw", "sh", "pw", "ph", "taps", "fs", "fr", "dw", "dh", "flip")


FILTER_GEOMETRY = GEOMETRY + ("cp",)  # the filter gradient's: + C (a multiple of 64)


def geometry_lines(indent, names=GEOMETRY):
    """The producer's geometry values, read once (g_ow, g_oh, ...)."""
    return [f"{indent}g_{n} = I(offs[{i}])" for i, n in enumerate(names)]


def tile_lines(indent, bk):
    """A tile's start: its first output position's window corner (x0, y0, image nn) and
    its first k-tile's (channel block cb, tap, filter row fr, column fs); k0 the tile's
    (split-K chunk's) first reduction index, m0 its first row."""
    return [f"{indent}tq = m0 // g_ow",
            f"{indent}nn = tq // g_oh",
            f"{indent}x0 = (m0 - tq * g_ow) * g_sw - g_pw",
            f"{indent}y0 = (tq - nn * g_oh) * g_sh - g_ph",
            f"{indent}cb = (k0 // {bk}) // g_taps",
            f"{indent}tap = (k0 // {bk}) - cb * g_taps",
            f"{indent}fr = tap // g_fs",
            f"{indent}fc = tap - fr * g_fs"]


def load_lines(indent, bk, b_k=True, bn=256):
    """One k-tile's TMA loads into stage s (addresses sa, sb), then the next k-tile's
    (tap, filter row and column, channel block). B K-major: one box (BN filters, 1 tap,
    64 channels) of w (K, taps, C). B MN-major (b_k False: a data gradient's filter as
    stored, w (reduction channels, taps, output channels)): BN / 64 boxes (64
    reduction channels, 1 tap, 64 output channels), one 8 KB swizzled chunk each, as
    the GEMM's MN-major loads."""
    off_w = "(g_fs - 1 - fc) * g_dw if g_flip != 0 else fc * g_dw"
    off_h = "(g_fr - 1 - fr) * g_dh if g_flip != 0 else fr * g_dh"
    b = [f"{indent}tma_load_3d(U32(sb), map_b, I32(cb * {bk}), I32(tap), I32(n0), "
         f"U32(full0 + 8 * s))"] if b_k else \
        [f"{indent}tma_load_3d(U32(sb + {i * 64 * bk * 2}), map_b, I32(n0 + {64 * i}), "
         f"I32(tap), I32(cb * {bk}), U32(full0 + 8 * s))" for i in range(bn // 64)]
    return [f"{indent}ow_ = {off_w}",
            f"{indent}oh_ = {off_h}",
            f"{indent}tma_load_im2col_4d(U32(sa), map_a, I32(cb * {bk}), I32(x0), I32(y0), "
            f"I32(nn), U16(ow_), U16(oh_), U32(full0 + 8 * s))"] + b + [
            f"{indent}tap += 1",
            f"{indent}fc += 1",
            f"{indent}if fc == g_fs:",
            f"{indent}    fc = 0",
            f"{indent}    fr += 1",
            f"{indent}if tap == g_taps:",
            f"{indent}    tap = 0",
            f"{indent}    fr = 0",
            f"{indent}    cb += 1"]


# The filter gradient (wgmma_source.source(conv=3)): dW (K, taps x C) = dy^T @ im2col(x),
# a GEMM of M = K filters, N = taps x C columns, reduction over the N OH OW output
# positions. A = dy^T: dy (positions, K) as stored is an MN-major A (64-position x
# 64-filter boxes, the GEMM's own loads); B = im2col(x): a k-tile's 64 positions of one
# tap's 64 channels are one im2col box, 64 pixel rows of 128 B: an MN-major B box
# (64 k rows x 64 n), so a BN-wide tile takes BN / 64 im2col loads a k-tile, box i at
# column n0 + 64 i = (tap t_i, channel c_i) (C % 64 == 0: a box never spans two taps).
#
# The producer is one thread in 40 registers (setmaxnreg) and issues a k-tile's loads
# in series, so its arithmetic a k-tile is the kernel's floor where the tiles are few.
# A first version worked each box's tap and offsets out a k-tile (3 runtime divisions and ~10
# geometry reads a box, 4 boxes): a profile found every filter gradient at ~1.8
# us a k-tile whatever its shape (3x the tensor cores' time for a 128 x 256 x 64 step).
# A box's (channel, offsets) depend on its column only: FILTER_COLUMNS, one word a
# 64-column block after the geometry, worked out on the host (filter_offsets) and read
# once a box; the k-tile's own position keeps its 2 divisions.
FILTER_GEOMETRY = GEOMETRY + ("cp",)  # the filter gradient's: + C (a multiple of 64)
FILTER_COLUMNS = len(FILTER_GEOMETRY)  # offs[FILTER_COLUMNS + j]: 64-column block j's
# channel | s offset << 16 | r offset << 24 (C < 65536, offsets <= 127: wgmma_conv checks)


def filter_column_words(geometry, C, blocks):
    """The words of column blocks 0 .. blocks - 1 (FILTER_COLUMNS) for geometry values
    in GEOMETRY's order: block j at column 64 j = tap x C + channel; blocks past the
    last tap read the last tap (their sums are never stored)."""
    g = dict(zip(GEOMETRY, geometry))
    words = []
    for j in range(blocks):
        tq = 64 * j // C
        cb = 64 * j - tq * C
        tq = min(tq, g["taps"] - 1)
        fr, fc = divmod(tq, g["fs"])
        if g["flip"]:
            fr, fc = g["fr"] - 1 - fr, g["fs"] - 1 - fc
        words.append(cb | (fc * g["dw"]) << 16 | (fr * g["dh"]) << 24)
    return tuple(words)


def _g(name):
    """A filter-gradient geometry value read where used (from L1) and not held: the
    producer runs in 40 registers (setmaxnreg), which holding the 13 values and 64-bit
    divisions exceeded (ptxas: 208 B spilled)."""
    return f"U32(offs[{FILTER_GEOMETRY.index(name)}])"


def filter_tile_lines(indent, bn):
    """A tile's setup: A's matrix (one); cw, the offs index of the tile's first column
    block's word (FILTER_COLUMNS)."""
    return [f"{indent}za = I32(0)",
            f"{indent}cw = {FILTER_COLUMNS} + n0 // 64"]


def _box_lines(indent, i):
    """Box i's channel cb_ and tap offsets (ow_, oh_): its column block's word."""
    return [f"{indent}v = U32(offs[cw + {i}])",
            f"{indent}cb_ = v & U32(0xffff)",
            f"{indent}ow_ = (v >> U32(16)) & U32(0xff)",
            f"{indent}oh_ = v >> U32(24)"]


def filter_load_lines(indent, bk, bm, bn):
    """One k-tile's loads into stage s: the k-tile's 64 positions from m_ = k0 + kt bk
    (window corner x0, y0 of image nn, as tile_lines), A's bm / 64 boxes of dy, B's
    bn / 64 im2col boxes."""
    L = [f"{indent}m_ = U32(k0 + kt * {bk})",
         f"{indent}tq = m_ // {_g('ow')}",
         f"{indent}nn = tq // {_g('oh')}",
         f"{indent}x0 = I32(m_ - tq * {_g('ow')}) * I32({_g('sw')}) - I32({_g('pw')})",
         f"{indent}y0 = I32(tq - nn * {_g('oh')}) * I32({_g('sh')}) - I32({_g('ph')})"]
    L += [f"{indent}tma_load_3d(U32(sa + {i * 64 * bk * 2}), map_a, I32(m0 + {64 * i}), "
          f"I32(m_), za, U32(full0 + 8 * s))" for i in range(bm // 64)]
    for i in range(bn // 64):
        L += _box_lines(indent, i) + [
            f"{indent}tma_load_im2col_4d(U32(sb + {i * 64 * bk * 2}), map_b, I32(cb_), "
            f"x0, y0, I32(nn), U16(ow_), U16(oh_), U32(full0 + 8 * s))"]
    return L

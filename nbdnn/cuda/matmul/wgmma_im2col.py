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


def geometry_lines(indent):
    """The producer's geometry values, read once (g_ow, g_oh, ...)."""
    return [f"{indent}g_{n} = I(offs[{i}])" for i, n in enumerate(GEOMETRY)]


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


def load_lines(indent, bk):
    """One k-tile's two TMA loads into stage s (addresses sa, sb), then the next
    k-tile's (tap, filter row and column, channel block)."""
    off_w = "(g_fs - 1 - fc) * g_dw if g_flip != 0 else fc * g_dw"
    off_h = "(g_fr - 1 - fr) * g_dh if g_flip != 0 else fr * g_dh"
    return [f"{indent}ow_ = {off_w}",
            f"{indent}oh_ = {off_h}",
            f"{indent}tma_load_im2col_4d(U32(sa), map_a, I32(cb * {bk}), I32(x0), I32(y0), "
            f"I32(nn), U16(ow_), U16(oh_), U32(full0 + 8 * s))",
            f"{indent}tma_load_3d(U32(sb), map_b, I32(cb * {bk}), I32(tap), I32(n0), "
            f"U32(full0 + 8 * s))",
            f"{indent}tap += 1",
            f"{indent}fc += 1",
            f"{indent}if fc == g_fs:",
            f"{indent}    fc = 0",
            f"{indent}    fr += 1",
            f"{indent}if tap == g_taps:",
            f"{indent}    tap = 0",
            f"{indent}    fr = 0",
            f"{indent}    cb += 1"]

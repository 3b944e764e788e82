"""Convolution forward on the tensor cores (sm_90a): float16 / bfloat16, channels-last,
1-d and 2-d, one group. The wgmma GEMM kernel (nbdnn/cuda/matmul/tensor_core_gemm/wgmma_gemm.py) with
its A operand gathered by TMA's im2col mode and B the filters as stored
(nbdnn/cuda/matmul/tensor_core_gemm/wgmma_im2col.py draws the GEMM view): no im2col workspace, no
epilogue pass, float32 accumulation, the fused epilogue from the accumulators.

    x (N, H, W, C) -> A: M = N OH OW rows, reduction taps x Cp (Cp = C padded to 64)
    w (K, R, S, C) -> B: K rows, the same reduction
    y (N, OH, OW, K) = C (M x K, row-major): TMA stores, or 4-byte pairs

Per k-tile a block moves (BM + BN) x 128 B and does 2 BM BN 64 flops, as the GEMM; the
activation is read R S times over (from L2: neighbouring taps of a tile overlap).

Used (`usable`) when the tensor-core GEMM runs here, the call is channels-last with one
group, 1-d or 2-d, C and K multiples of 8 (TMA's 16-byte strides) and the base
addresses 16-byte aligned, strides at most 8 (TMA's element strides), the window
corners' box within TMA's range ([-128, 127] for a 4-d map) and the taps' offsets
under 128. The epilogue is a
convolution's, act(alpha acc + beta z + bias) with z the residual or y
(epilogue/pairs.conv_pair_lines), split-K only without alpha and z (its sum applies
the GEMM's order). Everything else runs the SIMT algorithms. The tensor maps are
encoded on the host per address (a kernel cannot rewrite an im2col map's address the
way the GEMM's own maps do): an eager call plan's replay encodes them for its tensors
(tensormap.map_address; before, such calls ran in full every time), and
inside a stream capture a new address's map is written on the stream (tensormap.py).

Tile: 128 output positions x BN filters, BN from WIDTHS by waves x (BM + BN) (`plan`:
K = 64 takes 64 wide, where 256 would compute four times the filters); the 64-row
tile and split-K as the GEMM picks them.

float32 with math "tf32" (`tf32_usable`; conv's variant tf32_tensor_cores): the same kernel in
wgmma's tf32 kind, both maps TFLOAT32 (TMA rounds each operand to nearest as it
loads: the CPU reference's tf32()), k-tiles of 32 channels (128 B), float32 C; the
GEMM's epilogue order only (alpha 1, no z), the rest through algorithm "gemm".

A stride-1 data gradient (forward's w_stored): the same kernel over dy with the filter
read as stored, (K, R, S, C) as an MN-major B (64 x 64 boxes of reduction channels by
output channels, wgmma's transposed-B descriptor), no transposed copy. The filter
gradient (backward_filter): dW = dy^T @ im2col(x), both operands MN-major, a k-tile's
B boxes placed by precomputed column words (wgmma_im2col.FILTER_COLUMNS).
"""
import numpy as np

from ..matmul.tensor_core_gemm import split_k, wgmma_gemm as W
from ..matmul.tensor_core_gemm.epilogue import staged_store as staged
from ..matmul.tensor_core_gemm.wgmma_im2col import GEOMETRY, filter_column_words
from ..runtime.memory.arrays import dtype_name, empty, ptr, to_device
from ..runtime.device import key as device_key, sm_count
from ..tensorcore.tensormap import encoded, encoded_im2col
from .. import activation as _act

# Measured (H200): a 3 x 9 x 11 x 72 input with 96 3x3 filters at stride 2 left y
# unwritten. A probe found why (docs/decisions.md "conv_tc_probe", one factor at a time):
# every call of 64-row tiles 64 wide failed, every other passed; its consumers hold 32
# columns each, and the staged TMA-store epilogue wrote whole 64-column tiles only, so
# none (staged_store.usable now sends them to the direct stores).
# The tf32 kind (H200): tests/test_conv_tf32.py passed, memcheck and racecheck clean,
# SASS 4 HGMMA and no local memory, and the ResNet-50 NHWC layers at batch 32 took 0.96x
# cuDNN TF32's time (geomean; "gemm", the im2col + tf32 GEMM path: 0.22x).
WIDTHS = (64, 128, 192, 256)               # BN candidates (split_k.tile_width's rule)
STAGES = {64: 6, 128: 6, 192: 5, 256: 4}   # pipeline depth a width (shared memory)
MAX_OFFSET, CORNER = 127, (-128, 127)      # 4-d im2col map limits


def usable(x, w, y, g, bias, residual, alpha, beta):
    """Whether this kernel takes the call (module docstring); g the ConvGeometry."""
    if dtype_name(x) not in ("float16", "bfloat16") or not g.last or g.G != 1 or \
            not g.planar:
        return False
    if g.C % 8 or g.K % 8 or any(ptr(a) % 16 for a in (x, w, y)) or \
            (bias is not None and ptr(bias) % 4) or max(g.sh, g.sw) > 8 or \
            (residual is not None and ptr(residual) % 4):
        return False
    return _maps_fit(g)


def tf32_usable(x, w, y, g, bias, residual, alpha, beta):
    """Whether forward takes a float32 call in math "tf32" (module docstring)."""
    if dtype_name(x) != "float32" or residual is not None or \
            alpha != 1 or beta != 0 or not g.last or g.G != 1 or not g.planar:
        return False
    if g.C % 4 or g.K % 4 or any(ptr(a) % 16 for a in (x, w, y)) or max(g.sh, g.sw) > 8 or \
            (bias is not None and ptr(bias) % 4):
        return False
    return _maps_fit(g)


def _maps_fit(g):
    """The im2col map's limits: the window corners' box within CORNER, the taps'
    offsets at most MAX_OFFSET, and some output."""
    lower, upper = corners(g)
    return all(CORNER[0] <= v <= CORNER[1] for v in lower + upper) and \
        max((g.R - 1) * g.dh, (g.S - 1) * g.dw) <= MAX_OFFSET and g.N * g.PH * g.PW > 0


def corners(g):
    """The bounding box of the output positions' window corners (h, w): from -padding
    to the last corner, (out - 1) stride - padding, as TMA wants it: lower relative to
    0, upper relative to the axis' last element."""
    return ((-g.qh, -g.qw), ((g.PH - 1) * g.sh - g.qh - (g.H - 1),
                             (g.PW - 1) * g.sw - g.qw - (g.W - 1)))


_geometry_cache = {}


def geometry_values(g):
    """The kernel's geometry (wgmma_im2col.GEOMETRY's order) for ConvGeometry g."""
    values = dict(ow=g.PW, oh=g.PH, sw=g.sw, sh=g.sh, pw=g.qw, ph=g.qh, taps=g.R * g.S,
                  fs=g.S, fr=g.R, dw=g.dw, dh=g.dh, flip=g.flip)
    return tuple(values[n] for n in GEOMETRY)


def geometry_table(g):
    """geometry_values as int32 on the device, cached (per device)."""
    values = geometry_values(g)
    key = (device_key(),) + values
    t = _geometry_cache.get(key)
    if t is None:
        if len(_geometry_cache) > 256:
            _geometry_cache.clear()
        t = _geometry_cache[key] = to_device(np.array(values, dtype=np.int32))
    return t


def plan(g, dtype, can_split=True, w_stored=False):
    """(tile, splits, chunk, reduction length) for the call: BN from WIDTHS (the width
    whose waves x (BM + BN) is least: a k-tile's loads, which bound these tiles, move
    BM + BN rows of 128 B), the GEMM's 64-row tile for few rows, split-K when the tiles
    fill fewer than half the SMs (can_split: the epilogue is the GEMM's, which
    splitk_sum applies). w_stored (B MN-major): a 64-row tile's consumers take half
    its columns each, whole 64-column chunks of B: 128 wide at least."""
    M, taps = g.N * g.PH * g.PW, g.R * g.S
    bk = W.BK_OF[W.KINDS[dtype]]  # (a k-tile: 128 B of channels)
    red = taps * -(-g.C // bk) * bk
    skinny = W.SKINNY_TILE and M <= W.SKINNY_ROWS
    bm = 64 if skinny else W.BM
    sm = sm_count()
    widths = [b for b in WIDTHS if b % 128 == 0] if w_stored and skinny else WIDTHS
    bn = min(widths, key=lambda b: (-(-(-(-M // bm) * -(-g.K // b)) // sm) * (bm + b), -b))
    tile = (bn, STAGES[bn] + (1 if skinny and bn == 256 else 0)) + ((64,) if skinny else ())
    splits, chunk = split_k.split(-(-M // bm) * -(-g.K // bn), red, bk) if can_split \
        else (1, red)
    return tile, splits, chunk, red


def forward(x, w, y, bias, residual, act, coef, alpha, beta, g, stream, w_stored=False):
    """y = act(alpha * conv(x, w) + beta * z + bias) on the tensor cores, z = residual
    or y itself; `usable` true; act a mode name or None. w_stored (16-bit): w is
    (C, R, S, K), a data gradient's filter as stored (reduction channels first), read
    as an MN-major B (wgmma_im2col.load_lines) instead of (K, R, S, C)."""
    dtype = dtype_name(x)
    kind = W.KINDS[dtype]
    bk, mdt = W.BK_OF[kind], W.TF32_MAP if kind == "tf32" else dtype
    M, K = g.N * g.PH * g.PW, g.K
    z = residual if residual is not None else y
    zord = beta != 0  # (the epilogue reads z)
    tile, splits, chunk, red = plan(g, dtype, alpha == 1 and not zord, w_stored)
    bn, stages = tile[:2]
    bm = tile[2] if len(tile) > 2 else W.BM
    lower, upper = corners(g)
    ma = encoded_im2col(ptr(x), (g.N, g.H, g.W, g.C), mdt, bm, bk, lower, upper,
                        (g.sh, g.sw), stream=stream, like=x)
    mb = encoded(ptr(w), (g.C, g.R * g.S, K), mdt, (64, 1, bk), "128B", stream, w) \
        if w_stored else encoded(ptr(w), (K, g.R * g.S, g.C), mdt, (bn, 1, bk), "128B",
                                 stream, w)
    partial = splits > 1
    out = empty(y, (splits * M * K,), "float32") if partial else y
    store = W.TMA_STORE and staged.usable(kind, partial, False, K, ptr(out),
                                          W.TMA_STORE_F32, W.ws.consumer_columns(bn, bm))
    while W.shared_bytes(bn, stages, store, bm) > W.MAX_SHARED:
        stages -= 1
    tile = (bn, stages) + ((bm,) if bm != W.BM else ())
    shmem = W.shared_bytes(bn, stages, store, bm)
    epilogue = (False, None, False) if partial else (bias is not None, act, zord)
    k = W.kernel(dtype, True, not w_stored, *epilogue, partial=partial, tile=tile, store=store,
                 lean=W.LEAN_SETUP, conv=2 if alpha != 1 or zord else 1)  # (1: the
    # GEMM's epilogue order, the kernels that ran right; the same result for alpha 1, no z)
    maps, owners = (ma, mb), [ma[1], mb[1], y, x, w]  # (x, w: read through the maps)
    if store:
        f32 = partial or kind == "tf32"
        maps += (encoded(ptr(out), (splits, M, K), "float32" if f32 else dtype,
                         (1, 64, staged.columns(f32)), "128B", stream, out),)
    owners += [m[1] for m in maps[2:]] + ([bias] if bias is not None else []) + \
        ([residual] if residual is not None else [])
    bias_arg = (ptr(bias), K) if bias is not None else (ptr(y), 1)
    tiles = -(-M // bm) * -(-K // bn)
    grid = min(tiles * splits, sm_count())
    total = M * K
    pairs = total if kind == "tf32" else total // 2  # (c as float32, or 16-bit pairs)
    k.launch(k.sigs[0], grid, W.THREADS, stream, *(m[0] for m in maps),
             *((out,) if partial else ((ptr(y), pairs),) + (((ptr(z), total // 2),)
                                                            if zord else ())),
             bias_arg, geometry_table(g), M, K, red, 1, W.GROUP_M, alpha, beta, coef, chunk,
             shmem=shmem, owners=owners)
    if partial:
        ks, sig = split_k.splitk_sum(dtype)
        ks.launch(sig, -(-total // 256), 256, stream, out, (ptr(y), total), bias_arg, splits,
                  total, K, int(bias is not None),
                  -1 if act is None else _act.MODES.index(act), coef, 1.0, 0.0,
                  owners=owners)
    return y


# The filter gradient on the tensor cores (wgmma_im2col.filter_tile_lines; conv's
# variant tensor_cores of FILTER).
# The filter gradient's BN candidates for 128-row tiles (the forward's rule, `plan`);
# 64-row tiles (M <= 128 filters) stay 256 wide. Measured (H200, bf16, batch 32, kernel
# time x cuDNN's) on ResNet-50's 3x3 layers, 256 only -> these: s3 0.54 -> 0.61, s4
# 0.80 -> 0.78 (same), while 128-wide 64-row tiles lost (s1 0.78 -> 0.74, s2 0.77 ->
# 0.68) and 64 wide lost more (s3 0.44: a k-tile's producer work, for a quarter of
# the flops). A 64 x 64 tile read out of bounds (its consumers took half an MN-major
# chunk of B each): 64-row tiles take widths that are whole chunks a consumer.
FILTER_WIDTHS = (128, 192, 256)


def filter_usable(dy, x, dw, g):
    """Whether backward_filter takes the call: 16-bit, channels-last, one group, 1-d or
    2-d, C a multiple of 64 (a 64-channel box never spans two taps) under 65536, K of 8,
    16-byte bases, the forward's TMA limits (strides, corners, offsets)."""
    if dtype_name(x) not in ("float16", "bfloat16") or \
            not g.last or g.G != 1 or not g.planar or g.C % 64 or g.K % 8 or \
            g.C >= 1 << 16:  # (a column word's channel: wgmma_im2col.FILTER_COLUMNS)
        return False
    if any(ptr(a) % 16 for a in (dy, x, dw)) or max(g.sh, g.sw) > 8:
        return False
    return _maps_fit(g)


def backward_filter(dy, x, dw, g, alpha, beta, stream):
    """dw (K, R, S, C) = alpha * dy^T @ im2col(x) + beta * dw on the tensor cores
    (`filter_usable`): M = K filters, N = taps x C, reduced over the N OH OW positions,
    split-K (split_k.split: deterministic chunk sums) where the tiles are few."""
    dtype = dtype_name(x)
    M, N, red = g.K, g.R * g.S * g.C, g.N * g.PH * g.PW
    bm = 64 if W.SKINNY_TILE and M <= W.SKINNY_ROWS else W.BM
    sm = sm_count()
    widths = FILTER_WIDTHS if bm == 128 else (256,)  # (FILTER_WIDTHS' comment)
    bn = min(widths, key=lambda b: (-(-(-(-M // bm) * -(-N // b)) // sm) * (bm + b), -b))
    stages = STAGES[bn] + (bm == 64 and bn == 256)
    tiles = -(-M // bm) * -(-N // bn)
    splits, chunk = split_k.split(tiles, red, W.BK)
    partial = splits > 1
    out = empty(dw, (splits * M * N,), "float32") if partial else dw
    lower, upper = corners(g)
    ma = encoded(ptr(dy), (1, red, M), dtype, (1, W.BK, 64), "128B", stream, dy)
    mb = encoded_im2col(ptr(x), (g.N, g.H, g.W, g.C), dtype, W.BK, 64, lower, upper,
                        (g.sh, g.sw), stream=stream, like=x)
    tile = (bn, stages) + ((bm,) if bm != W.BM else ())
    shmem = W.shared_bytes(bn, stages, False, bm)
    k = W.kernel(dtype, False, False, False, None, beta != 0 and not partial,
                 partial=partial, tile=tile, lean=W.LEAN_SETUP, conv=3)
    owners = [ma[1], mb[1], dw, dy, x] + ([out] if partial else [])
    table = _filter_table(g)
    total = M * N
    k.launch(k.sigs[0], min(tiles * splits, sm_count()), W.THREADS, stream, ma[0], mb[0],
             *((out,) if partial else ((ptr(dw), total // 2),)), (ptr(dw), 1), table, M,
             N, red, 1, W.GROUP_M, 1.0 if partial else alpha, 0.0 if partial else beta,
             0.0, chunk, shmem=shmem, owners=owners + [table])
    if partial:
        ks, sig = split_k.splitk_sum(dtype)
        ks.launch(sig, -(-total // 256), 256, stream, out, (ptr(dw), total), (ptr(dw), 1),
                  splits, total, N, 0, -1, 0.0, alpha, beta, owners=owners)
    return dw


def filter_offsets(g):
    """The filter gradient's offs: its geometry (wgmma_im2col.FILTER_GEOMETRY), then a
    word a 64-column block of dW (FILTER_COLUMNS), through the last tile's columns of
    any width."""
    values = geometry_values(g)
    blocks = -(-(g.R * g.S * g.C) // 64) + 3
    return values + (g.C,) + filter_column_words(values, g.C, blocks)


def _filter_table(g):
    """filter_offsets on the device, cached by geometry and C (the words follow from
    them: worked out once, not every call)."""
    key = ("filter", device_key()) + geometry_values(g) + (g.R, g.S, g.C)
    t = _geometry_cache.get(key)
    if t is None:
        t = _geometry_cache[key] = to_device(np.array(filter_offsets(g), dtype=np.int32))
    return t

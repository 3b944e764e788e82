"""matmul and matmul_backward on the GPU: one tiled GEMM kernel with a fused epilogue,
and for float16 / bfloat16 and float32's tf32 / 3xtf32 math modes on sm_90 the
tensor-core kernel (wgmma_gemm.py: TMA + wgmma, split-K in split_k.py) wherever its
limits hold (wgmma_gemm.usable: 16-byte rows and bases; 16-bit operands that miss them
are copied into padded rows first: variant wgmma_padded); on sm_80-89 float16 /
bfloat16 run mma_gemm.py (mma.sync + ldmatrix + cp.async, the same limits and even N);
what they cannot take runs the SIMT kernel below, bfloat16 through its bits. The TF32 modes multiply K-major
operands on either unit: rounded parts from tf32_parts.py, or for "tf32" on the
tensor cores an input that already is K-major, rounded by TMA (_tf32_operands).

Kernel (generated source, nbdnn/cuda/matmul/gemm_source.py): a block computes a BM x BN tile
of c[z] = op(a[z]) @ op(b[z]) in k-steps of BK: the block stages BM x BK of op(a) and
BK x BN of op(b) in shared memory (zero-filled past the edges), each of its
(BM/TM)*(BN/TN) threads accumulates a TM x TN tile in registers, and the epilogue
applies bias, the activation (a runtime mode; nbdnn.cuda.activation's device
functions) and the alpha/beta blend before the only write of c. Transposes are
runtime flags that only change how tiles are loaded. Batches run on grid.y, each
block reading its a/b offsets from a small table, which expresses any NumPy batch
broadcast (a table is built once per batch layout and cached).

Arithmetic: float32 for float16/float32 storage (float16 is converted on load),
float64 for float64. Traffic per block and k-step: (BM + BN)*BK loads, BM*BN*BK FMAs.

Tile configs (TILES): "large" 128x128x8 with 8x8 a thread, "small" 64x64x8 with
4x4, "tiny" 32x32x8 with 2x2 (256 threads each); float64 uses half the thread tile.
`choose_tile` picks the tile and the split-K chunks from H200 measurements (perf/suites/sgemm.py,
 62-63% of cuBLAS from 2048^2 up, 64-67% at 512-1024, 52-69% on M = 64).
Registers (driver JIT, H200): float32 large 128 under a cap (32 B spilled; 163
uncapped and slower), small 55, tiny 32; float16 large runs uncapped (the cap spilled
56 B); float64 large 128, no spills.

Backward is the same kernel with transposes, summed over broadcast batch axes by
reduce_tensor (fixed order: deterministic), dbias by reduce_tensor over all rows.
"""
import math
import threading
from typing import NamedTuple

import numpy as np
from numba import cuda, float32, float64, uint64

from ..runtime import variants
from ..runtime.simulator import SIMULATOR
from ..runtime.variants import Variant
from .. import activation as _act
from ..runtime.memory.arrays import dtype_name, empty, ptr, size as size_of
from ..runtime.memory.strided import padded_rows
from .gemm_source import gemm_about, gemm_source
from . import tf32_parts as _tf32_parts
from ..runtime.device import describe, sm_count
from ..runtime.device_code.intrinsics import bf16_load, bf16_store
from .tensor_core_gemm import mma_gemm as _mma, wgmma_gemm as _tc
from .tensor_core_gemm.split_k import splitk_sum
from .batches import table as batch_table
from ..runtime.launch.codegen import compile_source
from ..runtime.launch.kernel import Kernel
from ..tensor import reduce_tensor
from ...errors import NotSupportedError
from ..._vocab import FLOAT_DTYPES as DTYPES

HW_TILES = {"float32": {"large": (128, 128, 8, 8, 8), "small": (64, 64, 8, 4, 4),
                        "tiny": (32, 32, 8, 2, 2)},
            "float64": {"large": (64, 64, 8, 4, 4), "small": (32, 32, 8, 2, 2),
                        "tiny": (16, 16, 16, 1, 1)}}
SIM_TILES = {"float32": {"large": (8, 16, 4, 2, 4), "small": (4, 4, 4, 2, 2),  # a few dozen
                         "tiny": (2, 2, 2, 1, 1)}}                           # threads a block
TILES = dict(SIM_TILES if SIMULATOR else HW_TILES)
TILES.setdefault("float64", TILES["float32"])
MAX_BATCH = 65535                     # grid.y
MIN_CHUNK, MAX_SPLITS = 128, 64        # split-K: shortest chunk, most chunks (grid.z)
SPLIT_BLOCKS_PER_SM = 4                # split-K's target: the small tile fits 4 an SM
# The one knob that forces a tile: None (choose_tile decides), or (tile, chunks) with
# chunks None for the split choose_tile would give that tile. Every GEMM-family call
# obeys it (matmul, conv's gemm, winograd and implicit GEMM); perf/suites/sgemm.py and
# the path tests set it. Call nbdnn.ops._plan.clear() after changing it.
FORCE_TILE = None
# 3xtf32 on the wgmma kernel adding each k-tile's product into its accumulators on the
# CUDA cores (wgmma_gemm's promote): the tensor cores' float32 accumulation truncates
# toward zero at every wgmma, a bias growing with K that 3xtf32's 3K products made 4.5e-5
# at 4096^3 on the H100 (docs/decisions.md "tf32_promote_ab"). Promoted: 1.6e-6
# (cuBLAS's IEEE SGEMM 2.9e-6), 75 against 119 TFLOP/s (1.45x SGEMM's speed, was 2.3x);
# False trades the accuracy back for that speed (a build option of the wgmma kernel).
PROMOTE_3XTF32 = True


def tensor_cores():
    """True on a GPU that runs the wgmma kernel (sm_90: the H100 / H200)."""
    return _tc_arch() >= 90


def _tc_arch():
    """The GPU's compute capability as 10 major + minor (0: none, the simulator)."""
    if not _cc:
        d = describe()
        _cc.append(0 if d is None else 10 * d[1][0] + d[1][1])
    return _cc[0]


_cc = []


def _build():
    table = {}
    for ct_name, CT, nt, bf16 in (("float32", float32, np.float32, False),
                                  ("float64", float64, np.float64, False),
                                  ("float32", float32, np.float32, True)):
        ns = {"cuda": cuda, "CT": CT, "ZERO": nt(0), "U": int if SIMULATOR else uint64,
              "act_fn": _act.fused(nt), "LD": bf16_load, "ST": bf16_store}
        for size, cfg in TILES[ct_name].items():
            name, src = gemm_source(*cfg, bf16=bf16)
            compile_source(name, src, ns, label=f"{name}_{ct_name}",
                           about=gemm_about(ct_name, size, cfg))
            dts = ["bfloat16"] if bf16 else \
                [d for d in DTYPES if (d == "float64") == (ct_name == "float64")]
            for t in dts:
                a = "uint16[::1]" if bf16 else f"{t}[::1]"  # (bfloat16: its bits)
                sig = (f"void({a}, {a}, {a}, {a}, int64[::1], int64, int64, int64, int64, "
                       f"int64, int64, int64, {ct_name}, {ct_name}, {ct_name}, int64)")
                # capped, the 128x128 tile spills 32 B and two blocks share an SM:
                # 62-63% of cuBLAS against 58-60% at 163 registers
                cap = {} if SIMULATOR or (size, t) != ("large", "float32") else \
                    {"max_registers": 128}  # float16's converting loads would spill 56 B
                table[size, t] = (Kernel(ns[name], [sig], **cap), sig, cfg)
    return table


_KERNELS = _build()


def gemm_call(a, b, trans_a, trans_b, bias, act, coef, alpha, beta, out, stream,
          math_mode="ieee"):
    """c = alpha * act(op(a) @ op(b) + bias) + beta * out; shapes already checked;
    math_mode: float32's (tf32_parts.py rewrites the operands for the TF32 modes)."""
    if math_mode != "ieee" and dtype_name(a) == "float32":
        a, b, trans_a, trans_b = _tf32_operands(a, b, trans_a, trans_b, math_mode, stream)
    ash, bsh = tuple(int(s) for s in a.shape), tuple(int(s) for s in b.shape)
    M, K = (ash[-1], ash[-2]) if trans_a else (ash[-2], ash[-1])
    N = bsh[-2] if trans_b else bsh[-1]
    batch = ash[:-2] if ash[:-2] == bsh[:-2] else \
        tuple(np.broadcast_shapes(ash[:-2], bsh[:-2]))
    dtype = dtype_name(a)
    c = out if out is not None else empty(a, batch + (M, N), dtype)
    nb = math.prod(batch)
    if nb == 0 or M == 0 or N == 0:
        return c
    g = Gemm(a, b, c, trans_a, trans_b, bias, act, coef, alpha, beta, stream, math_mode,
             M, N, K, batch, dtype)
    return variants.choose("matmul", "matmul", GEMM, g).run(g)


class Gemm(NamedTuple):
    """One product as the variants take it: c = alpha * act(op(a) @ op(b) + bias) + beta
    * c over the broadcast batch; math_mode: float32's (the operands already rewritten
    for a TF32 mode)."""
    a: object
    b: object
    c: object
    trans_a: bool
    trans_b: bool
    bias: object
    act: str
    coef: float
    alpha: float
    beta: float
    stream: object
    math_mode: str
    M: int
    N: int
    K: int
    batch: tuple
    dtype: str

    def tensor_cores_take(self, odd=False):
        """Both tensor-core kernels' limits (wgmma_gemm.usable: 16-byte rows and bases;
        odd: C of any width, the wgmma kernel's element stores)."""
        return _tc.usable(self.a, self.b, self.c, self.trans_a, self.trans_b, self.M, self.N,
                          self.K, odd)


def _wgmma(g):
    kw = {"promote": True} if g.math_mode == "3xtf32" and PROMOTE_3XTF32 else {}
    return _tc.gemm(g.a, g.b, g.c, g.trans_a, g.trans_b, g.bias, g.act, g.coef, g.alpha,
                    g.beta, g.stream, **kw)


# .copies: {(address, shape, pitch): padded copy} while one matmul_backward runs (its
# two products read dc alike: an LM head's 8192 x 50,257 gradient is padded once, not
# twice); None otherwise
_padded = threading.local()


def _wgmma_padded(g):
    """Each operand whose rows (its contiguous extent: K, or M / N transposed) are not a
    multiple of 8 elements or whose base is not 16-byte aligned, copied into rows of the
    next multiple of 8, zeros after; the product over the copies reads the true M, N, K
    (dims). A pad in K multiplies zeros; one in M or N makes rows or columns of C that
    the epilogue never stores."""
    def fit(x, inner):
        if inner % 8 == 0 and ptr(x) % 16 == 0:
            return x
        pitch = -(-inner // 8) * 8
        copies = getattr(_padded, "copies", None)
        if copies is None:
            return padded_rows(x, pitch, g.stream)
        key = ptr(x), tuple(int(s) for s in x.shape), pitch
        if key not in copies:
            copies[key] = padded_rows(x, pitch, g.stream)
        return copies[key]
    a = fit(g.a, g.M if g.trans_a else g.K)
    b = fit(g.b, g.K if g.trans_b else g.N)
    return _tc.gemm(a, b, g.c, g.trans_a, g.trans_b, g.bias, g.act, g.coef, g.alpha, g.beta,
                    g.stream, dims=(g.M, g.N, g.K))


def _simt(g):
    a, b, c, M, N, K, dtype = g.a, g.b, g.c, g.M, g.N, g.K, g.dtype
    nb = math.prod(g.batch)
    if nb > MAX_BATCH:
        raise NotSupportedError(f"matmul: {nb} matrices in a batch exceed the grid limit "
                                f"{MAX_BATCH}; split the batch")
    fused = g.bias is not None or g.act is not None
    # split-K's chunks are summed in order by reduce_tensor, or with a bias or activation
    # by split_k's float32 sum and epilogue: a small-batch Linear splits too (ResNet-50's
    # float32 inference profile on an H100 had one unsplit 32x32-tile SIMT GEMM, 0.13 ms:
    # its classifier's shape, 32 x 1000 over K 2048, fills 32 blocks of 132 SMs unsplit)
    size, splits = choose_tile(M, N, K, nb, dtype, dtype == "float32" or
                               (dtype == "float64" and not fused))
    kernel, sig, (BM, BN, BK, TM, TN) = _KERNELS[size, dtype]
    ash, bsh = tuple(int(s) for s in a.shape), tuple(int(s) for s in b.shape)
    offs = batch_table(ash[:-2], bsh[:-2], g.batch, M * K, K * N)
    tiles = -(-M // BM) * -(-N // BN)
    chunk = -(-K // (splits * BK)) * BK
    splits = -(-K // chunk) if K else 1
    dst = c if splits == 1 else empty(a, (splits,) + g.batch + (M, N), dtype)
    mode = -1 if g.act is None else _act.MODES.index(g.act)
    whole = splits == 1
    kernel.launch(sig, (tiles, nb, splits), (BM // TM) * (BN // TN), g.stream, a, b, dst,
                  g.bias if g.bias is not None else c, offs, M, N, K, int(g.trans_a),
                  int(g.trans_b), int(g.bias is not None and whole), mode if whole else -1,
                  g.coef, g.alpha if whole else 1.0, g.beta if whole else 0.0,
                  max(chunk, BK))
    if whole:
        return c
    if fused:  # the chunks summed in chunk order, then bias, activation, alpha and beta
        total = size_of(c)
        ks, ks_sig = splitk_sum(dtype)
        ks.launch(ks_sig, -(-total // 256), 256, g.stream, dst.reshape((splits * total,)),
                  c.reshape((total,)), g.bias if g.bias is not None else c.reshape((total,)),
                  splits, total, N, int(g.bias is not None), mode, g.coef, g.alpha, g.beta)
        return c
    reduce_tensor(dst, "add", (0,), False, False, alpha=g.alpha, beta=g.beta, out=c,
                  stream=g.stream)  # (the chunks' partial products, summed in chunk order)
    return c


GEMM = (  # in order of preference
    Variant("wgmma", lambda g: _tc_arch() >= 90 and g.dtype in _tc.KINDS and
            not (g.dtype == "float32" and g.math_mode == "ieee") and g.tensor_cores_take(True),
            _wgmma,
            "wgmma_gemm.py: TMA + wgmma (sm_90), float16 / bfloat16 and float32's TF32 "
            "modes; split-K in split_k.py; 16-bit C of any width"),
    Variant("wgmma_padded", lambda g: _tc_arch() >= 90 and g.dtype in _mma.KINDS and g.K > 0,
            _wgmma_padded,
            "16-bit operands whose rows are not 16-byte multiples (a GPT-2 LM head's 50,257 "
            "logits as the gradient's operand): each such operand copied into rows of a "
            "16-byte pitch, zeros after (memory/strided.padded_rows: 2 x its bytes), then "
            "wgmma over the copies (aligned operands are not copied)"),
    Variant("mma_sync", lambda g: _tc_arch() >= 80 and g.dtype in _mma.KINDS and
            math.prod(g.batch) <= MAX_BATCH and g.tensor_cores_take(),
            lambda g: _mma.gemm(g.a, g.b, g.c, g.trans_a, g.trans_b, g.bias, g.act, g.coef,
                                g.alpha, g.beta, g.stream),
            "mma_gemm.py: mma.sync + ldmatrix + cp.async for float16 / bfloat16 (sm_80-89; "
            "forced, on sm_90 too)",
            wanted=lambda g: _tc_arch() < 90),
    Variant("simt", lambda g: True, _simt,
            "gemm_source.py: the tiled CUDA-core kernel, every dtype (bfloat16 through its "
            "bits), batches on grid.y, split-K by choose_tile"),
)


def forced(name):
    """Inside (this thread): products run the variant `name` of GEMM (matmul, and the
    GEMMs inside conv and attention), or raise NotSupportedError where its kernel cannot
    take one (runtime/variants.py)."""
    return variants.forced("matmul", name, variants.names(GEMM))


def _tf32_operands(a, b, trans_a, trans_b, math_mode, stream):
    """(a, b, trans_a, trans_b) for a TF32 mode: K-major operands, a plain A and a
    transposed B. "tf32" on the tensor cores takes an operand that already is one, K a
    multiple of 4 and 16-byte aligned, as it is: TMA rounds it (a TFLOAT32 map, ties
    to even, docs/decisions.md "tf32_gemm"). Every other operand goes through
    tf32_parts: rounded (and split, for 3xtf32) into a K-major copy."""
    ash = tuple(int(s) for s in a.shape)  # (the simulator's shapes take no negative index)
    K = ash[-2] if trans_a else ash[-1]
    direct = math_mode == "tf32" and K % 4 == 0 and tensor_cores()
    if not (direct and not trans_a and ptr(a) % 16 == 0):
        a = _tf32_parts.operand(a, not trans_a, 0, math_mode, stream)
    if not (direct and trans_b and ptr(b) % 16 == 0):
        b = _tf32_parts.operand(b, trans_b, 1, math_mode, stream)
    return a, b, False, True


def choose_tile(M, N, K, nb, dtype, can_split):
    """(tile size, split-K chunks), from perf/suites/sgemm.py on the H200:
    "large" when its grid is at least 1.5 waves (62-63% of cuBLAS from 2048^2 up; at
    1024^2 "small" unsplit gives 64% against large's 47% even split three ways);
    else "small", its reduction split into at most MAX_SPLITS chunks of at least
    MIN_CHUNK until about SPLIT_BLOCKS_PER_SM blocks an SM, while that reaches half a
    wave; else "tiny", split likewise. can_split: the caller's (the SIMT GEMM's: float32,
    or float64 without an epilogue; the partial sums are stored in the output dtype and
    summed in chunk order: deterministic)."""
    tiles = TILES["float64" if dtype == "float64" else "float32"]
    sm = sm_count()

    def blocks(size):
        BM, BN = tiles[size][:2]
        return -(-M // BM) * -(-N // BN) * nb

    def chunks(n):
        return split_count(n, K) if can_split else 1

    if FORCE_TILE is not None:
        size, n = FORCE_TILE
        return size, (chunks(blocks(size)) if n is None else n) if can_split else 1
    if 2 * blocks("large") >= 3 * sm:
        return "large", 1
    n = blocks("small")
    if 2 * n * chunks(n) >= sm:
        return "small", chunks(n)
    return "tiny", chunks(blocks("tiny"))


def split_count(blocks, K):
    """Reduction chunks for a grid of `blocks` tiles: none when the grid covers every
    SM; else enough for SPLIT_BLOCKS_PER_SM blocks an SM, each chunk at least MIN_CHUNK
    long, at most MAX_SPLITS. (Aiming at one block an SM left
    M = 64 at 38-47% of cuBLAS; four, whose latency the SM hides by switching blocks,
    gave 52-67%, and 68% against 55% at 512^3 with chunks of 128.)"""
    sm = sm_count()
    if blocks >= sm:
        return 1
    return max(1, min(-(-SPLIT_BLOCKS_PER_SM * sm // blocks), K // MIN_CHUNK, MAX_SPLITS))


def matmul(a, b, trans_a, trans_b, bias, activation, coef, math_mode="ieee", *, alpha, beta,
           out, stream):
    return gemm_call(a, b, trans_a, trans_b, bias, activation, coef, alpha, beta, out, stream,
                 math_mode)


def _reduced_to(g, shape, alpha, beta, out, stream):
    """alpha * (g summed over the batch axes broadcast to reach shape) + beta * out."""
    gsh = tuple(int(s) for s in g.shape)
    lead = len(gsh) - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape[:-2])
                                      if n == 1 and gsh[lead + i] != 1)
    keep = tuple(1 if i in axes else n for i, n in enumerate(gsh))
    dst = out.reshape(keep) if out is not None else None
    r = reduce_tensor(g, "add", axes, True, False, alpha=alpha, beta=beta, out=dst,
                      stream=stream)
    return r.reshape(tuple(shape)) if out is None else out


def _out_shape(x, y, tx, ty):
    xs, ys = tuple(int(s) for s in x.shape), tuple(int(s) for s in y.shape)
    rows, cols = xs[-1] if tx else xs[-2], ys[-2] if ty else ys[-1]
    return tuple(np.broadcast_shapes(xs[:-2], ys[:-2])) + (rows, cols)


def matmul_backward(dc, a, b, trans_a, trans_b, bias, math_mode="ieee", *, alpha, beta, out,
                    stream):
    outs = out if out is not None else (None,) * (3 if bias else 2)
    _padded.copies = {}  # (an operand both products pad: one copy)
    try:
        return _backward(dc, a, b, trans_a, trans_b, bias, math_mode, alpha, beta, outs,
                         stream)
    finally:
        _padded.copies = None


def _backward(dc, a, b, trans_a, trans_b, bias, math_mode, alpha, beta, outs, stream):
    grads = []
    ash, bsh = tuple(int(s) for s in a.shape), tuple(int(s) for s in b.shape)
    # d op(a) = dc @ op(b)^T, stored transposed when trans_a; d op(b) = op(a)^T @ dc
    for (x, y, tx, ty), target, o in (
            ((b, dc, trans_b, True) if trans_a else (dc, b, False, not trans_b), a, outs[0]),
            ((dc, a, True, trans_a) if trans_b else (a, dc, not trans_a, False), b, outs[1])):
        shape = tuple(int(s) for s in target.shape)
        if target is b and len(ash) > 2 and math.prod(bsh[:-2]) == 1 and not trans_a and \
                ash[:-2] == tuple(int(s) for s in dc.shape[:-2]):
            # one b for a batch of a: the sum over z of a[z]^T dc[z] is one product of
            # the stacked rows, (n M x K)^T @ (n M x N): no per-matrix partials to add
            rows = math.prod(ash[:-1])
            a2, dc2 = a.reshape((rows, ash[-1])), dc.reshape((rows, int(dc.shape[len(ash) - 1])))
            o2 = o.reshape(bsh[-2:]) if o is not None else None
            g = gemm_call(dc2, a2, True, False, None, None, 0.0, alpha, beta, o2, stream,
                      math_mode) if trans_b else \
                gemm_call(a2, dc2, True, False, None, None, 0.0, alpha, beta, o2, stream, math_mode)
            grads.append(o if o is not None else g.reshape(shape))
        elif _out_shape(x, y, tx, ty) == shape:  # no broadcast: blend in the epilogue
            grads.append(gemm_call(x, y, tx, ty, None, None, 0.0, alpha, beta, o, stream, math_mode))
        else:
            full = gemm_call(x, y, tx, ty, None, None, 0.0, 1.0, 0.0, None, stream, math_mode)
            grads.append(_reduced_to(full, shape, alpha, beta, o, stream))
    if bias:
        dsh = tuple(int(s) for s in dc.shape)
        n, rows = dsh[-1], math.prod(dsh[:-1])
        grads.append(reduce_tensor(dc.reshape((rows, n)), "add", (0,), False, False,
                                   alpha=alpha, beta=beta, out=outs[2], stream=stream))
    return tuple(grads)

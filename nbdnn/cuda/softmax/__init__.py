"""Softmax forward and backward over any axis: x viewed as (outer, L, inner), L the
softmax axis. Arithmetic in float32 for float16/bfloat16/float32 storage, float64 for
float64 (one source for every storage dtype: loads widen, stores narrow; bfloat16 as its
bits, runtime/device_code/intrinsics.py).
algo is a runtime int (FAST 0, ACCURATE 1, LOG 2): uniform per launch, so no divergence.

Kernels (traffic per element, float32; +4 B when beta != 0 reads out):
1. rows (inner == 1, L up to ROWS_MAX): G lanes per row, each holding 4*V values in
   registers (generated source in softmax/rows.py; named scalars, so nothing goes to
   local memory). One read + one write: 8 B forward, 12 B backward (dy, y in, dx
   out). 16-byte `load4`/`store4` when L % 4 == 0 and the bases are aligned; otherwise
   coalesced scalar accesses. `rows_config`:
     L <= 128:    V = 1, G = pow2(L/4) <= 32, ROWS_BLOCK/G rows a block (shuffles only)
     L <= 1024:   G = 32 (a warp a row), V = pow2(L/128) in 2..8
     longer:      a block a row, V = 8 (V = 16 forward past ROWS_V16_MIN),
                  G = pow2(L/(4V)) >= 64; shuffles + one shared-memory step;
                  register caps keep the blocks launchable.
2. fused (inner == 1, past the register cache up to FUSED_MAX, at least one row per
   SM): a block of FUSED_BLOCK threads a row streams it twice, the second read from L2
   when the resident rows fit there (8 B forward and 12 B backward from DRAM; the write
   pass uses evict-first stores so that it does not push the waiting rows out).
   Measured 65-72% of copy at 32k-64k (docs/decisions.md "diagnose" softmax_long), L2-bound.
3. long (inner == 1, longer rows or too few rows to fill the GPU; up to 2**31 elements
   a row): each row cut into C chunks, C chosen so that rows * C reaches ~4 blocks per
   SM; pass A reduces each chunk to an online (max, sum) pair (backward: a sum), pass B
   combines the row's pairs in a fixed order and writes its chunk. 12 B forward,
   20 B backward.
4. strided (inner > 1, softmax over a non-last axis, e.g. NCHW channels): a block of
   BX x BY threads (BX = min(pow2(inner), 32)), BX consecutive columns of inner
   (coalesced), BY threads splitting L; online (max, sum) per thread, partials combined
   in a fixed order, then a write pass; the second read mostly hits L2.
Kernels 2-4 live in softmax/stream.py.

log-softmax is computed as (x - m) - log(s), so large |x| (1e4) loses nothing to
rounding m + log(s). Non-finite inputs follow nbdnn/cpu/softmax.py: NaN or +inf in a
row makes the row NaN (the online kernels force it: their sum stays finite when the max
is +inf). Under the simulator (no warp shuffles) every reduction goes through shared
memory, and LONG_*/STRIDED_* sizes shrink to keep thread counts small. `forced(name)`
("rows", "rows_block", "fused", "long", "strided") makes this thread's calls take one
path where the shape allows it (tests, benchmarks; runtime/variants.py).
"""
import math

import numpy as np
from numba import cuda, float32, float64

from ..runtime.simulator import SIMULATOR
from ..runtime.memory.arrays import dtype_name, empty, size, vector_aligned
from ..runtime.device_code.intrinsics import (array_type, load4, narrow, store4, vector_alignment,
    widen)
from ..runtime.launch.kernel import Kernel
from ..runtime import variants
from ..runtime.device_code.block_reduce import FAST, LOG, SHM, device_functions
from .rows import rows_kernel as _rows_kernel
from .stream import stream_kernels
from ...errors import NotSupportedError
from ..._vocab import BF16_DTYPES as DTYPES

ALGOS = {"fast": FAST, "accurate": 1, "log": LOG}

# kernel 1: register-cached rows
ROWS_VS = (1, 2, 4, 8, 16)        # 4-element vectors per lane (generated kernels)
ROWS_V16_MIN = 8192               # forward rows longer than this hold 64 values a lane
ROWS_BLOCK = 128                  # block size when G <= 32 (ROWS_BLOCK // G rows a block)
ROWS_MAX = {False: 32768, True: 16384}   # longest cached row: forward, backward
ROWS_MAX_G = {False: 1024, True: 512}    # backward caches 2 arrays: half the lanes
# kernel 2: fused two-pass rows (measured: docs/decisions.md "diagnose" softmax)
FUSED_MAX = 65536                 # longer rows: kernel 3 (rows past ROWS_MAX: here)
FUSED_BLOCK = {False: 8, True: 8} if SIMULATOR else {False: 512, True: 1024}  # (simulator: an
# OS thread a CUDA thread; 32 held softmax's fused crosscheck rows at 15-25 s)
FUSED_MAXREG = None
# kernel 3: long rows
LONG_BLOCK = 32 if SIMULATOR else 256
LONG_MIN_CHUNK = 32 if SIMULATOR else 4096   # >= 16 elements a thread per pass
# kernel 4: strided
STRIDED_BLOCK = 64 if SIMULATOR else 256
STRIDED_BX = 32                   # columns a block (fewer when inner is smaller)
MAX_GRID = 2 ** 31 - 1
_target_blocks = []               # 4 blocks per SM, measured once


def _pow2(n):
    return 1 << max(0, int(n) - 1).bit_length()


# ---- building and launching -----------------------------------------------------

def row_vs(wide, backward):
    """The V of kernel 1 for a compute type: float64 stops before it would spill."""
    vmax = (4 if backward else 2) if wide else (8 if backward else 16)
    return [V for V in ROWS_VS if V <= vmax]


def _build(streaming=True, fused_maxreg=None):
    """kernels[(name, dtype)] -> (Kernel, sig) for every storage dtype. The arguments
    are the fused kernel's tuning knobs (docs/decisions.md "diagnose" varies them)."""
    table = {}
    for ct_name, CT, nt in (("float32", float32, np.float32), ("float64", float64, np.float64)):
        f = device_functions(nt)
        ns = dict(f, cuda=cuda, math=math, load4=load4, store4=store4, CT=CT, SHM=SHM,
                  FAST=FAST, LOG=LOG, widen=widen, narrow=narrow)  # the row kernels' globals
        others = stream_kernels(f, CT, SHM, STRIDED_BLOCK, streaming)
        for t in (d for d in DTYPES if (d == "float64") == (ct_name == "float64")):
            a, c = f"{array_type(t)}[::1]", ct_name
            sigs = {
                "fused": f"void({a}, {a}, int64, int64, int64, {c}, {c}, int64)",
                "fused_bwd": f"void({a}, {a}, {a}, int64, int64, int64, {c}, {c}, int64)",
                "long_stats": f"void({a}, {c}[::1], int64, int64, int64, int64, int64, int64)",
                "long_apply": f"void({a}, {a}, {c}[::1], int64, int64, int64, int64, int64, "
                              f"{c}, {c}, int64)",
                "strided": f"void({a}, {a}, int64, int64, int64, int64, int64, {c}, {c})",
                "long_stats_bwd": f"void({a}, {a}, {c}[::1], int64, int64, int64, int64, "
                                  "int64, int64)",
                "long_apply_bwd": f"void({a}, {a}, {a}, {c}[::1], int64, int64, int64, "
                                  f"int64, int64, {c}, {c}, int64)",
                "strided_bwd": f"void({a}, {a}, {a}, int64, int64, int64, int64, int64, "
                               f"{c}, {c})",
            }
            for name, sig in sigs.items():
                cap = fused_maxreg if name.startswith("fused") and not SIMULATOR else None
                opts = {"max_registers": cap} if cap else {}
                table[name, t] = (Kernel(others[name], [sig], **opts), sig)
            for bwd in (False, True):
                arrs = ", ".join([a] * (3 if bwd else 2))
                sig = f"void({arrs}, int64, int64, int64, int64, {c}, {c}, int64)"
                for V in row_vs(ct_name == "float64", bwd):
                    # a block of G lanes must fit 64K registers: 1024 x 64 (V = 4, 8
                    # forward), 512 x 128 (V = 16 forward; V = 4, 8 backward)
                    cap = 128 if bwd or V == 16 else 64
                    opts = {} if SIMULATOR or V < 4 else {"max_registers": cap}
                    k = Kernel(_rows_kernel(V, bwd, ns), [sig], **opts)
                    table[f"rows_{'bwd' if bwd else 'fwd'}_v{V}", t] = (k, sig)
    return table


_KERNELS = _build(fused_maxreg=FUSED_MAXREG)
_ALIGN = {n: vector_alignment(n) for n in (2, 4, 8)}  # itemsize -> bytes
_NAMES = {np.dtype(d): d for d in DTYPES}  # (np.dtype.name is a slow property)


def rows_config(L, backward, block, wide=False):
    """(V, G) for kernel 1, or None when the row does not fit the register cache.
    block=True forces a block per row (G >= 64) even for short rows (tests); wide: the
    compute type is float64 (two registers a value).

    Past 128 elements the lanes hold as many values as they can: fewer lanes with more
    values each won at every length measured (H200, 8192 rows, docs/decisions.md "diagnose";
    RESULTS.md): L = 4096 V = 8 95% of copy; L = 8192 V = 8 95%, V = 16 97%;
    L = 16384 V = 16 (256 lanes, 2 blocks an SM) 95% against 72% with V = 8 (512 lanes);
    L = 32768 V = 16 (512 lanes, 1 block an SM) 75% against 52% with V = 8. Backward
    holds two arrays: V <= 8. float64 stops where its kernels would spill
    (docs/decisions.md "softmax_caps"): V <= 2 forward, V <= 4 backward, rows of up to 8192."""
    if L <= 128 and not block:
        return 1, _pow2(-(-L // 4))
    vmax = row_vs(wide, backward)[-1]
    if not wide and not backward and L <= ROWS_V16_MIN:
        vmax = 8
    if L <= 128 * min(vmax, 8) and not block:  # a warp a row
        return _pow2(-(-L // 128)), 32
    G = max(64, _pow2(-(-L // (4 * vmax))))
    V = min(vmax, _pow2(-(-L // (4 * G))))
    return (V, G) if G <= ROWS_MAX_G[backward] and L <= ROWS_MAX[backward] else None


def _target():
    if not _target_blocks:
        n = 2 if SIMULATOR else cuda.get_current_device().MULTIPROCESSOR_COUNT
        _target_blocks.append(4 * n)
    return _target_blocks[0]


def _long_config(rows, L):
    """(C, chunk): C chunks of `chunk` elements (a multiple of 4) per row."""
    C = max(1, min(-(-L // LONG_MIN_CHUNK), -(-_target() // rows)))
    chunk = -(-(-(-L // C)) // 4) * 4
    return -(-L // chunk), chunk


def _strided_bx(inner):
    return min(_pow2(inner), STRIDED_BX, STRIDED_BLOCK)


def _check_grid(op, blocks):
    if blocks > MAX_GRID:
        raise NotSupportedError(f"{op}: {blocks} blocks exceed the CUDA grid limit "
                                f"{MAX_GRID}; split the tensor")
    return blocks


def _split(shape, axis):
    outer = math.prod(shape[:axis])
    return outer, shape[axis], math.prod(shape[axis + 1:])


def _path(outer, L, inner, backward, force, wide=False):
    if inner > 1 or force == "strided":
        return "strided", None
    if force == "fused":
        return "fused", None
    cfg = None if force == "long" else rows_config(L, backward, force == "rows_block", wide)
    if cfg is not None:
        return "rows", cfg
    if force is None and L <= FUSED_MAX and 4 * outer >= _target():
        return "fused", None
    return "long", None


_CHOICES = {}  # (shape, axis, backward, force, dtype name) -> _launch_choice's result; a test that
# changes the ROWS_*/FUSED_*/LONG_* constants gives it a fresh dict (monkeypatch)


def _launch_choice(op, shape, axis, backward, force, dtype):
    """How a call of this geometry runs, cached (the eager path's Python, not the GPU's
    work): ("one", (kernel, sig, grid, block, scalars after the arrays)) for the
    one-kernel paths, rows and fused; (kind, (outer, L, inner)) for long and strided."""
    key = (shape, axis, backward, force, dtype)
    choice = _CHOICES.get(key)
    if choice is not None:
        return choice
    outer, L, inner = _split(shape, axis)
    kind, cfg = _path(outer, L, inner, backward, force, dtype == "float64")
    sfx = "_bwd" if backward else ""
    if kind == "rows":
        V, G = cfg
        k, sig = _KERNELS[f"rows_{'bwd' if backward else 'fwd'}_v{V}", dtype]
        block = G if G > 32 else ROWS_BLOCK  # a block a row past a warp
        choice = "one", (k, sig, _check_grid(op, -(-outer // (block // G))), block,
                       (outer, L, G))
    elif kind == "fused":
        k, sig = _KERNELS["fused" + sfx, dtype]
        choice = "one", (k, sig, _check_grid(op, outer), FUSED_BLOCK[backward], (outer, L))
    else:
        choice = kind, (outer, L, inner)
    if len(_CHOICES) >= 4096:  # many shapes: start over rather than grow without bound
        _CHOICES.clear()
    _CHOICES[key] = choice
    return choice


def _run(op, arrays, dst, shape, axis, algo, alpha, beta, force, stream):
    """Pick the kernel for (outer, L, inner) and launch it. arrays: (x,) or (dy, y)."""
    if size(dst) == 0:
        return
    backward = len(arrays) == 2
    dtype = dtype_name(dst)
    kind, how = _launch_choice(op, shape, axis, backward, force, dtype)
    a = ALGOS[algo]
    sfx = "_bwd" if backward else ""
    if kind == "one":
        k, sig, grid, block, scalars = how
        aligned = int(scalars[1] % 4 == 0 and vector_aligned(*arrays, dst))
        k.launch(sig, grid, block, stream, *arrays, dst, *scalars, a, alpha, beta, aligned)
    elif kind == "long":
        outer, L, _ = how
        aligned = int(L % 4 == 0 and vector_aligned(*arrays, dst))
        C, chunk = _long_config(outer, L)
        grid = _check_grid(op, outer * C)
        ct = "float64" if dtype == "float64" else "float32"
        part = empty(dst, ((1 if backward else 2) * grid,), ct)
        k, sig = _KERNELS["long_stats" + sfx, dtype]
        k.launch(sig, grid, LONG_BLOCK, stream, *arrays, part, outer, L, C, chunk, a,
                 aligned)
        k, sig = _KERNELS["long_apply" + sfx, dtype]
        k.launch(sig, grid, LONG_BLOCK, stream, *arrays, dst, part, outer, L, C, chunk, a,
                 alpha, beta, aligned)
    else:
        outer, L, inner = how
        bx = _strided_bx(inner)
        grid = _check_grid(op, outer * -(-inner // bx))
        k, sig = _KERNELS["strided" + sfx, dtype]
        k.launch(sig, grid, STRIDED_BLOCK, stream, *arrays, dst, outer, L, inner, bx, a,
                 alpha, beta)


PATHS = ("rows", "rows_block", "fused", "long", "strided")


def forced(name):
    """Inside (this thread): calls take the path `name` (one of PATHS) where the shape
    allows it: "rows_block" needs a row configuration (else "long"), "rows"/"fused"/
    "long" a softmax over the last axis (else "strided")."""
    return variants.forced("softmax", name, PATHS)


def softmax(x, axis, algo, *, alpha, beta, out, stream):
    """y = alpha * softmax(x, axis) + beta * out; x contiguous (ops made it so)."""
    y = out if out is not None else empty(x, x.shape, dtype_name(x))
    _run("softmax", (x,), y, tuple(x.shape), axis, algo, alpha, beta,
         variants.forced_variant("softmax"), stream)
    return y


def softmax_backward(dy, y, axis, algo, *, alpha, beta, out, stream):
    """dx = alpha * softmax'(dy, y) + beta * out."""
    dx = out if out is not None else empty(y, y.shape, dtype_name(y))
    _run("softmax_backward", (dy, y), dx, tuple(y.shape), axis, algo, alpha, beta,
         variants.forced_variant("softmax"), stream)
    return dx

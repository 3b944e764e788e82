"""The cross-check harness: one OpSpec row per op, input makers, tolerances,
assert_close and crosscheck().

A row says how to draw a valid call of an op (shapes, parameters, inputs) and how close
the CUDA result must be to the CPU reference run in float64 on the same inputs.
tests/test_crosscheck.py draws rows with hypothesis; `nbdnn check` draws them with a
seeded NumPy generator; both end in `crosscheck()`.

A maker is `make(draw, dtype, big) -> Case`: `draw(lo, hi)` returns an int in [lo, hi]
(hypothesis's draw in tests, a seeded generator in `nbdnn check`), `big` is True on a
real GPU (larger shapes) and False under the simulator (a few hundred threads).
"""
import contextlib
import dataclasses
import math
from typing import Callable, Optional

import numpy as np

from .._vocab import BF16_DTYPES as DTYPES, FLOAT_DTYPES

# |gpu - ref| <= atol + rtol * |ref| for an elementwise op whose result is rounded once
ELEMENTWISE_TOL = {"float16": (2e-3, 2e-3), "bfloat16": (1.6e-2, 1.6e-2),
                   "float32": (2e-6, 4e-6), "float64": (1e-12, 1e-11)}
EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -23,
       "float64": 2.0 ** -52}


def reduction_tol(dtype, length):
    """Tolerance for a sum of `length` terms accumulated in float32 (float64 for
    float64): error grows like sqrt(length) for pairwise/tree sums, with slack."""
    acc = "float64" if dtype == "float64" else "float32"
    out_eps = EPS[dtype]
    r = 4 * EPS[acc] * math.sqrt(max(length, 1)) * 4 + 2 * out_eps
    return r, r


@dataclasses.dataclass
class Case:
    """One call: positional args (NumPy arrays for the tensors), keyword params, and
    the indices of args that are tensors (moved to the device, maybe made strided)."""
    args: tuple
    kwargs: dict
    tol: tuple = None  # (atol, rtol) override for this case
    blend: bool = True  # False: the call takes out= but not beta != 0 (conv's residual)
    forced: Callable = None  # () -> a context the CUDA call runs inside (a forced variant)


@dataclasses.dataclass
class OpSpec:
    name: str                      # row name, e.g. "activation/gelu"
    fn: Callable                   # the public op
    make: Callable                 # make(draw, dtype, big) -> Case
    dtypes: tuple = FLOAT_DTYPES   # (DTYPES, with bfloat16, for the ops that take it)
    tol: dict = dataclasses.field(default_factory=lambda: dict(ELEMENTWISE_TOL))
    blend: bool = True             # takes alpha/beta/out= (first output)
    family: str = ""
    strided_ok: bool = True        # False for in-place ops, which refuse strided views
    ops: tuple = ()                # the registry's ops the row calls (default: fn's name)
    # fixed calls beside the random draws, where off-by-ones live (ceil mode, padding
    # at its limit, tile tails, prime sizes): name -> boundary(dtype) -> Case
    boundary: dict = dataclasses.field(default_factory=dict)
    # the first output's dtype for an input dtype (None: the input's; cast_tensor's rows)
    out_dtype: Optional[Callable] = None

    def __post_init__(self):
        if not self.ops:
            self.ops = (self.fn.__name__,)

    def tolerance(self, dtype, case):
        return case.tol if case.tol is not None else self.tol[dtype]


def rand(rng, shape, dtype, low=-3.0, high=3.0):
    """Uniform random values, rounded to dtype (so the float64 oracle sees the same
    numbers the GPU sees)."""
    return rng.uniform(low, high, size=shape).astype(dtype)


def shape_nd(draw, big, ndim_lo=1, ndim_hi=4, total_small=256, total_big=1 << 16):
    """A random shape with size-1 and odd dims, bounded in total size."""
    ndim = draw(ndim_lo, ndim_hi)
    limit = total_big if big else total_small
    shape = []
    for _ in range(ndim):
        room = max(1, limit // max(1, math.prod(shape)))
        shape.append(draw(1, max(1, min(room, 64 if big else 9))))
    return tuple(shape)


# ---- comparing ----------------------------------------------------------------------

def compare(actual, expected, atol, rtol):
    """Elementwise |a - e| <= atol + rtol * |e|, NaN matching NaN and infinities
    matching exactly. Returns (ok, max_abs_err, max_rel_err, first_bad_index, msg)."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape:
        return False, math.inf, math.inf, None, f"shape {a.shape} != expected {e.shape}"
    nan_a, nan_e = np.isnan(a), np.isnan(e)
    finite = np.isfinite(e) & np.isfinite(a)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.where(finite, np.abs(a - e), 0.0)
        bad = finite & (err > atol + rtol * np.abs(e))
        bad |= nan_a != nan_e
        bad |= (np.isinf(e) | np.isinf(a)) & ~(a == e)
        rel = np.where(finite & (e != 0), err / np.abs(np.where(e == 0, 1, e)), 0.0)
    max_abs = float(err.max()) if err.size else 0.0
    max_rel = float(rel.max()) if rel.size else 0.0
    if not bad.any():
        return True, max_abs, max_rel, None, ""
    idx = tuple(int(i) for i in np.argwhere(bad)[0])
    msg = (f"{int(bad.sum())} of {bad.size} elements off; first at {idx}: got {a[idx]!r}, "
           f"expected {e[idx]!r} (atol {atol:g}, rtol {rtol:g}); max abs err {max_abs:.3g}, "
           f"max rel err {max_rel:.3g}")
    return False, max_abs, max_rel, idx, msg


def tolerance_used(actual, expected, atol, rtol):
    """The largest |a - e| / (atol + rtol |e|) over the finite elements: the share of its
    allowed error the worst element uses (<= 1 passes). Unlike the largest relative
    error, it says why a row passes: a relative error of 1 on an element near zero is
    within an absolute tolerance."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape or not a.size:
        return 0.0
    finite = np.isfinite(a) & np.isfinite(e)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        used = np.where(finite, np.abs(a - e) / (atol + rtol * np.abs(e)), 0.0)
    return float(np.nanmax(used)) if used.size else 0.0


def _rounded_overflow(e, dtype):
    """The reference with values past the output dtype's range replaced by the +-inf
    they round to (a float16 sum of 66269 is inf): the only correctly rounded result."""
    if dtype.kind != "f" or dtype.itemsize >= 8:
        return e
    with np.errstate(over="ignore"):
        r = e.astype(dtype).astype(np.float64)
    return np.where(np.isinf(r) & np.isfinite(e), r, e)


def assert_close(actual, expected, atol, rtol, what=""):
    ok, _, _, _, msg = compare(actual, expected, atol, rtol)
    if not ok:
        raise AssertionError(f"{what}: {msg}" if what else msg)


def _as_tuple(r):
    return r if isinstance(r, tuple) else (r,)


def _to_device(a, strided):
    """A device copy of a; with strided=True a non-contiguous view holding a's values
    (every other element of a wider last axis)."""
    from nbdnn.cuda.runtime.memory import arrays as _arrays
    if not strided or a.ndim == 0:
        return _arrays.to_device(a)
    wide = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
    wide[..., ::2] = a
    view = (slice(None),) * (a.ndim - 1) + (slice(None, None, 2),)
    return _arrays.to_device(wide)[view]  # (bfloat16 on a GPU: a torch tensor's view)


def _floating(a):
    """A float array, ml_dtypes' bfloat16 (NumPy kind 'V') included."""
    return a.dtype.kind == "f" or a.dtype.name == "bfloat16"


def crosscheck(spec, case, dtype, strided=(), blend=None):
    """Run `case` on the CUDA backend (device arrays; args listed in `strided` passed as
    non-contiguous views) and on the CPU backend in float64; compare every output.

    blend: None, or (alpha, beta, out_seed): pass alpha, beta and an `out=` buffer to
    both backends (with beta == 0 the device buffer holds NaN: it must not be read).
    Returns a dict: ok, max_abs, max_rel, tol, msg, shapes."""
    from nbdnn.cuda.runtime.memory import arrays as _arrays
    args, kw = case.args, dict(case.kwargs)
    ref_args = tuple(a.astype(np.float64) if isinstance(a, np.ndarray) and _floating(a)
                     else a for a in args)
    ref_kw = dict(kw)
    strided = strided if spec.strided_ok else ()
    dev_args = tuple(_to_device(a, i in strided) if isinstance(a, np.ndarray) else a
                     for i, a in enumerate(args))
    if blend is not None:
        alpha, beta, seed = blend
        beta = beta if case.blend else 0.0
        shape0 = _as_tuple(spec.fn(*ref_args, **ref_kw))[0].shape
        out0 = np.random.default_rng(seed).uniform(-2, 2, shape0).astype(dtype)
        ref_kw.update(alpha=alpha, beta=beta, out=out0.astype(np.float64))
        dev_out = np.full(shape0, np.nan, dtype) if beta == 0 else out0
        kw.update(alpha=alpha, beta=beta, out=_arrays.to_device(dev_out))
    expected = _as_tuple(spec.fn(*ref_args, **ref_kw))
    with case.forced() if case.forced is not None else contextlib.nullcontext():
        got = _as_tuple(spec.fn(*dev_args, **kw))
    atol, rtol = spec.tolerance(dtype, case)
    res = {"ok": True, "max_abs": 0.0, "max_rel": 0.0, "used": 0.0, "tol": (atol, rtol),
           "msg": "",
           "shapes": [tuple(a.shape) for a in args if isinstance(a, np.ndarray)]}
    if len(got) != len(expected):
        res.update(ok=False, msg=f"{len(got)} outputs, reference gives {len(expected)}")
        return res
    for k, (g, e) in enumerate(zip(got, expected)):
        g = _arrays.to_host(g) if not isinstance(g, (np.ndarray, np.generic, float, int)) else g
        e = np.asarray(e)
        if np.asarray(g).dtype.kind in "iub":  # indices, masks: exact
            ok = np.array_equal(np.asarray(g), e)
            msg = "" if ok else f"output {k}: integer results differ"
            ma = mr = 0.0
        else:
            want = spec.out_dtype(dtype) if spec.out_dtype else dtype
            if np.asarray(g).dtype != np.dtype(want) and k == 0:
                res.update(ok=False, msg=f"output dtype {np.asarray(g).dtype} != {want}")
                return res
            want_e = _rounded_overflow(e, np.asarray(g).dtype)
            ok, ma, mr, _, msg = compare(g, want_e, atol, rtol)
            res["used"] = max(res["used"], tolerance_used(g, want_e, atol, rtol))
            msg = f"output {k}: {msg}" if msg else ""
        res["max_abs"], res["max_rel"] = max(res["max_abs"], ma), max(res["max_rel"], mr)
        if not ok and res["ok"]:
            res.update(ok=False, msg=msg)
    return res

"""Bad inputs never crash raw and never answer wrong: for every registry op (one
cross-check row each) and every bad-input class, the call either raises an NbdnnError
whose message names the op, or returns a result on which the CPU reference and the
CUDA backend (the simulator without a GPU) agree; inputs are never modified (but the
arguments an op documents as updated in place). The CUDA call is made four times
(the 4th replays an eager call plan where one is learnt) and must answer alike. A hypothesis property, derandomised
in CI; the calls are drawn from the row's own maker with a drawn seed, so shapes are
not the minimal ones."""
import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import nbdnn
from nbdnn.cuda.runtime.memory.arrays import to_device, to_host
from nbdnn.testing import SPECS, compare
from nbdnn.testing.harness import _to_device

ROWS = list({s.ops[0]: s for s in SPECS}.values())
CLASSES = ("dtype", "rank", "zero_size", "zero_d", "list", "none", "shape", "nonfinite",
           "strided", "reversed", "read_only", "param", "out_shape", "out_dtype", "out_kind",
           "out_read_only", "beta_without_out", "subclass", "stream")
BAD_STREAMS = ("x", -1, 1.5, True, object(), [0], 2 ** 64)
# arguments an op updates in place (positions in the row's call; kwargs by name)
IN_PLACE_ARGS = {"set_tensor": {0}, "batch_norm_train": {3, 4}, "dropout": {"offset"},
                 "sgd_update": {0, 2, 3}}
MAX_ELEMENTS = 256
# Open: whether zero padding takes part in a NaN/Inf product. The CPU reference's
# gradients (im2col over zero-padded arrays, or col2im) and the GPU's kernels (some
# skip padded taps, some multiply the zeros) differ there; one definition, in every
# kernel, is issue 22's remaining work. Until then these two pairs are not fuzzed.
BAD_PARAMS = (float("nan"), float("inf"), -1, 1.5, "nosuch", None, 10 ** 12)
# (op, class) pairs whose answer is rounding, not semantics. The attention backward
# given an Inf in q or k, with the forward's finite lse: p = exp(s - lse) = inf where
# a consistent call has p <= 1, and ds = p (dp - delta) is inf times a rounding
# residue (dp - delta: 0 exactly in one order of summation, 1e-8 in another): NaN on
# one backend, +-inf on the other. A NaN in any input, an Inf in v, do, o or the mask,
# and the forward's own Infs stay fuzzed (the forward's row).
ILL_POSED = {("scaled_dot_product_attention_backward", "nonfinite")}
# (op, argument) pairs the GPU reads on the device only, where the CPU checks values: a
# paged call's block table (graph-safe: no host read; a page outside the cache is absent
# there, test_paged_attention's test_a_page_outside_the_cache_is_absent_on_the_gpu).
DEVICE_READ = {("paged_attention", "block_table")}


def _case(spec, seed):
    """A valid call from the row's maker, of at most MAX_ELEMENTS an array (the
    simulator runs a thread an element, and a bad call may be retried while shrinking)."""
    dtype = "float32" if "float32" in spec.dtypes else spec.dtypes[0]
    for k in range(8):
        rng = np.random.default_rng(seed + k)
        draw = lambda lo, hi: int(rng.integers(lo, hi + 1))  # noqa: E731
        case = spec.make(draw, dtype, False)
        if all(a.size <= MAX_ELEMENTS for a in case.args if isinstance(a, np.ndarray)):
            break
    return case, dtype


def _mutate(spec, case, kind, data):
    """(args, kwargs, device_view) of the bad call; device_view(i, a) makes arg i's
    device form (strided classes keep their layout there)."""
    args, kw = list(case.args), dict(case.kwargs)
    arrays = [i for i, a in enumerate(args) if isinstance(a, np.ndarray)]
    strided = set()
    first = None
    try:
        first = spec.fn(*case.args, **case.kwargs)
    except nbdnn.NbdnnError:
        pass
    first = first[0] if isinstance(first, tuple) else first
    if kind == "stream":
        kw["stream"] = data.draw(st.sampled_from(BAD_STREAMS))
        return args, kw, strided
    if kind in ("param",):
        names = [k for k, v in kw.items() if k != "nd" and not isinstance(v, bool)]
        if not names:
            return None
        kw[data.draw(st.sampled_from(names))] = data.draw(st.sampled_from(BAD_PARAMS))
        return args, kw, strided
    if kind.startswith("out") or kind == "beta_without_out":
        if first is None or "out" in kw or spec.ops[0] in ("set_tensor", "sgd_update") or \
                kind == "beta_without_out" and not spec.blend:
            return None  # (set_tensor's x, sgd_update's w are outputs; ops without beta
            # take none)
        if kind == "beta_without_out":
            kw["beta"] = 0.5
        elif kind == "out_kind":
            kw["out"] = data.draw(st.sampled_from([3, "x", [1.0, 2.0], (1, 2)]))
        elif kind == "out_shape":
            kw["out"] = np.zeros(first.shape + (2,), first.dtype)
        elif kind == "out_dtype":
            kw["out"] = np.zeros(first.shape, np.float64 if first.dtype != np.float64
                                 else np.float32)
        else:
            o = np.zeros(first.shape, first.dtype)
            o.flags.writeable = False
            kw["out"] = o
        return args, kw, strided
    if spec.ops[0] == "set_tensor" and kind in ("reversed", "read_only"):
        return None  # its x is an output (out_* classes, CPU); no device array is read-only
    if not arrays:
        return None
    i = data.draw(st.sampled_from(arrays))
    a = args[i]
    if kind == "read_only" and i in IN_PLACE_ARGS.get(spec.ops[0], ()):
        return None  # (refused on the CPU; no device array is read-only)
    if kind == "dtype":
        args[i] = a.astype(data.draw(st.sampled_from([np.int32, np.complex64, np.bool_])))
    elif kind == "rank":
        args[i] = a[None] if data.draw(st.booleans()) or a.ndim == 0 else a[0]
    elif kind == "zero_size":
        args[i] = a[:0] if a.ndim else a
    elif kind == "zero_d":
        args[i] = np.array(1.0, a.dtype)
    elif kind == "list":
        args[i] = a.tolist()
    elif kind == "none":
        args[i] = None
    elif kind == "shape":
        if not a.ndim:
            return None
        ax = data.draw(st.integers(0, a.ndim - 1))
        args[i] = np.concatenate([a, np.take(a, [0], axis=ax)], axis=ax)
    elif kind == "nonfinite":
        if a.dtype.kind != "f" or not a.size:
            return None
        v = a.copy()
        where = data.draw(st.lists(st.integers(0, a.size - 1), min_size=1, max_size=3))
        v.reshape(-1)[where] = data.draw(st.sampled_from([np.nan, np.inf, -np.inf]))
        args[i] = v
    elif kind == "strided":
        if not a.ndim or not a.size:
            return None
        strided.add(i)  # every other element of a wider array, on both backends
        wide = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
        wide[..., ::2] = a
        args[i] = wide[..., ::2]
    elif kind == "reversed":
        if not a.ndim:
            return None
        if i in IN_PLACE_ARGS.get(spec.ops[0], ()):
            strided.add(i)  # (updated in place: a device copy would hide the view, so
            # the CUDA call gets a strided view too, and both refuse it)
        args[i] = a[..., ::-1]
    elif kind == "read_only":
        v = a.copy()
        v.flags.writeable = False
        args[i] = v
    elif kind == "subclass":  # (a masked array, an np.matrix: refused on both backends)
        args[i] = np.ma.masked_array(a) if a.ndim != 2 or data.draw(st.booleans()) else \
            np.asmatrix(a)
    return args, kw, strided


def _device(a, strided):
    if not isinstance(a, np.ndarray):
        return a
    if strided:
        return _to_device(np.ascontiguousarray(a), True)
    return to_device(a)  # (a reversed view: a contiguous copy of the same values)


def _call(spec, args, kw):
    """('ok', [results as NumPy]) or ('error', NbdnnError)."""
    try:
        r = spec.fn(*args, **kw)
    except nbdnn.NbdnnError as e:
        return "error", e
    rs = r if isinstance(r, tuple) else (r,)
    return "ok", [x if isinstance(x, (np.ndarray, np.generic, float, int)) or x is None
                  else to_host(x) for x in rs]


def _cuda_call(spec, fresh, strided, kw, keep, host=False):
    """The bad call on the CUDA backend four times, on new device copies each time (a
    signature's 4th call replays its eager call plan, ops/_plan.py): all four must give
    one answer, the replayed one included; the 4th is returned. host: the arrays stay
    NumPy (an ndarray subclass, which a device copy would not keep), on backend "cuda"."""
    outcomes = []
    for _ in range(4):
        if host:  # (NBDNN_BACKEND: every row's wrapper passes no backend= of its own)
            os.environ["NBDNN_BACKEND"] = "cuda"
            try:
                outcomes.append(_call(spec, list(fresh), kw))
            finally:
                del os.environ["NBDNN_BACKEND"]
            continue
        dev_kw = {k: (_device(v, False) if isinstance(v, np.ndarray) and k not in keep
                      else v) for k, v in kw.items()}
        outcomes.append(_call(spec, [_device(a, i in strided) for i, a in enumerate(fresh)],
                              dev_kw))
    first, last = outcomes[0], outcomes[-1]
    assert first[0] == last[0], f"call 1: {first}; call 4 (replayed): {last}"
    if first[0] == "error":
        assert (type(first[1]), str(first[1])) == (type(last[1]), str(last[1])), (first, last)
    else:
        for a, b in zip(first[1], last[1]):
            assert np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True), \
                "call 4 (replayed) differs from call 1"
    return last


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@settings(max_examples=max(1, settings().max_examples // 3))  # 44 ops x 17 classes
@pytest.mark.parametrize("kind", CLASSES)
@pytest.mark.parametrize("spec", ROWS, ids=lambda s: s.ops[0])
@given(data=st.data())
def test_a_bad_call_is_a_named_error_or_agrees(spec, kind, data):
    case, dtype = _case(spec, data.draw(st.integers(0, 2 ** 16), label="seed"))
    bad = _mutate(spec, case, kind, data)
    if bad is None:
        return  # the class does not apply to this row
    args, kw, strided = bad
    if (spec.ops[0], kind) in ILL_POSED and any(
            isinstance(a, np.ndarray) and a.dtype.kind == "f" and np.isinf(a).any()
            for a in args[1:3]):
        return  # (an Inf in q or k against a finite lse: ILL_POSED)
    keep = IN_PLACE_ARGS.get(spec.ops[0], set())
    before = {i: a.copy() for i, a in enumerate(args) if isinstance(a, np.ndarray)
              and i not in keep}
    # the CUDA call gets the in-place arguments as they were before the CPU call
    # updated them (non-contiguous ones are refused before any update)
    fresh = [a.copy() if isinstance(a, np.ndarray) and i in keep and a.flags.c_contiguous
             else a for i, a in enumerate(args)]
    got = {"cpu": _call(spec, args, kw)}
    if kind == "out_read_only":  # no device array is read-only: the CPU's refusal alone
        assert got["cpu"][0] == "error" and any(op in str(got["cpu"][1]) for op in spec.ops)
        return
    got["cuda"] = _cuda_call(spec, fresh, strided, kw, keep, host=kind == "subclass")
    for i, b in before.items():
        assert np.array_equal(args[i], b, equal_nan=True), f"input {i} was modified"
    kinds = {k for k, _ in got.values()}
    if "error" in kinds:
        if got["cuda"][0] == "ok" and isinstance(got["cpu"][1], nbdnn.BadParamError) and any(
                op == spec.ops[0] and f"{name}[" in str(got["cpu"][1])
                for op, name in DEVICE_READ):
            return  # (a value only the device reads: DEVICE_READ)
        assert kinds == {"error"}, f"one backend raised, the other answered: {got}"
        for backend, (_, e) in got.items():
            assert any(op in str(e) for op in spec.ops), f"{backend}: {e!r} names no op"
        return
    atol, rtol = spec.tolerance(dtype, case)
    cpu, cuda = got["cpu"][1], got["cuda"][1]
    assert len(cpu) == len(cuda)
    for k, (a, b) in enumerate(zip(cpu, cuda)):
        if isinstance(a, np.ndarray):
            assert np.asarray(b).shape == a.shape, (k, a.shape, np.asarray(b).shape)
            ok, _, _, _, msg = compare(b, a, 8 * atol + 1e-6, 8 * rtol + 1e-6)
            assert ok, f"output {k}: CPU and CUDA disagree: {msg}"

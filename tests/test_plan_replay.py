"""A replayed call answers exactly as the full call would, result or refusal
(nbdnn/ops/_plan.py). For every cross-check row: a signature is called four times
(the 4th replays its plan), then once more with one thing changed that the plan must
not paper over, and that call is compared with the same call made with plans off:

(a) one scalar argument changed once (a keyword such as `alpha` or `lr`, or a
    positional one such as dropout's p): a key that dropped a scalar replays the old
    value;
(b) another math mode (nbdnn.math_mode / set_math): a key without the process's mode
    replays TF32 kernels in IEEE mode and the other way round;
(c) out= overlapping an input by a shifted view: a key that only knows which arrays
    share a start replays into memory the kernels still read (refused unplanned).

The results must be bit-equal (the same kernels on the same data) or the same
NbdnnError (class and message)."""
import numpy as np
import pytest

import nbdnn
from nbdnn.cuda.runtime.memory.arrays import to_device, to_host
from nbdnn.ops import _plan
from nbdnn.testing import SPECS

ROWS = [s for s in SPECS if s.name != "cast_tensor/to_bfloat16"]  # (no plan: a host copy)


def _draw(seed, above=0):
    """The first draw (a row's data seed) varies; the rest sit `above` steps over their
    lowest value (0: the smallest shapes and first parameter choices, which every row
    plans: tests/test_plan.py)."""
    first = [True]

    def draw(lo, hi):
        if first[0]:
            first[0] = False
            return lo + seed % (hi - lo + 1)
        return min(hi, lo + above)
    return draw


def _dtype(spec):
    return "float32" if "float32" in spec.dtypes else spec.dtypes[0]


def _device(args):
    return [to_device(a) if isinstance(a, np.ndarray) else a for a in args]


def _attempt(call, planned):
    """('ok', call()'s results as a tuple) or ('error', class, message), with eager call
    plans on (planned) or off (every call in full)."""
    was, _plan.ENABLED = _plan.ENABLED, planned
    try:
        r = call()
    except nbdnn.NbdnnError as e:
        return ("error", type(e), str(e))
    finally:
        _plan.ENABLED = was
    return ("ok", r if isinstance(r, tuple) else (r,))


def _outcome(fn, args, kw, planned=True):
    """_attempt of fn on fresh device copies of args (in-place ops update their
    arguments; each call starts from the same), results on the host."""
    dev = _device(args)
    dkw = {k: to_device(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    r = _attempt(lambda: fn(*dev, **dkw), planned)
    if r[0] == "error":
        return r
    return ("ok", [None if x is None else np.asarray(x) if isinstance(x, (float, int))
                   else to_host(x) for x in r[1]])


def _same(a, b):
    if a[0] != b[0] or a[0] == "error":
        return a == b
    return len(a[1]) == len(b[1]) and all(
        (x is None and y is None) or (x is not None and y is not None and x.shape == y.shape
                                      and np.array_equal(x, y, equal_nan=True))
        for x, y in zip(a[1], b[1]))


def _learn(fn, args, kw):
    """Four calls of one signature: the 4th replays a plan (asserted), which the next
    call of a neighbouring signature must not reach."""
    for _ in range(4):
        r = _outcome(fn, args, kw)
    assert r[0] == "ok", r
    assert any(type(s) is _plan.Plan for s in _plan.plans_of_this_thread().values()), \
        "no plan after four calls"


def _changed(v):
    """A valid-looking neighbour of scalar v (None when v is no plain scalar)."""
    if type(v) is bool:
        return not v
    if type(v) is int:
        return v + 1
    if type(v) is float:
        return v * 0.5 + 0.125 if v else 0.125
    return None


def _case(spec, seed=1, above=0):
    return spec.make(_draw(seed, above), _dtype(spec), False)


@pytest.mark.parametrize("spec", ROWS, ids=lambda s: s.name)
def test_a_changed_scalar_is_not_replayed(spec):
    case = _case(spec)
    args, kw = list(case.args), dict(case.kwargs)
    if spec.blend:
        kw.setdefault("alpha", 1.0)  # (learnt with alpha given, then changed)
    _learn(spec.fn, args, kw)
    changed = 0
    for where in [("kw", k) for k in kw] + [("arg", i) for i in range(len(args))]:
        v = kw[where[1]] if where[0] == "kw" else args[where[1]]
        new = _changed(v)
        if new is None or where[1] == "nd":  # (nd: the row's own rank, not the op's)
            continue
        a2, k2 = list(args), dict(kw)
        if where[0] == "kw":
            k2[where[1]] = new
        else:
            a2[where[1]] = new
        planned, full = _outcome(spec.fn, a2, k2), _outcome(spec.fn, a2, k2, planned=False)
        assert _same(planned, full), f"{where[1]}={new!r}: planned {planned}, full {full}"
        changed += 1
    assert changed or not spec.blend, "no scalar to change"


@pytest.mark.parametrize("learnt, then", [("tf32", "ieee"), ("ieee", "3xtf32"),
                                          ("3xtf32", "tf32")])
@pytest.mark.parametrize("spec", ROWS, ids=lambda s: s.name)
def test_another_math_mode_is_not_replayed(spec, learnt, then):
    """The row's own math= taken out: the mode comes from a math_mode block, and the
    4 calls learnt in one mode are followed by a call in another."""
    case = _case(spec)
    args, kw = list(case.args), dict(case.kwargs)
    kw.pop("math", None)
    with nbdnn.math_mode(learnt):
        for _ in range(4):
            _outcome(spec.fn, args, kw)
    with nbdnn.math_mode(then):
        planned, full = _outcome(spec.fn, args, kw), _outcome(spec.fn, args, kw, planned=False)
    assert _same(planned, full), f"learnt in {learnt}, called in {then}: {planned} / {full}"


def test_set_math_is_part_of_the_signature():
    """The process default (set_math), not only a block: a matmul learnt in tf32
    answers in ieee afterwards, bit for bit as with plans off."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((16, 16)).astype(np.float32), \
        rng.standard_normal((16, 16)).astype(np.float32)
    try:
        nbdnn.set_math("tf32")
        for _ in range(4):
            _outcome(nbdnn.matmul, [a, b], {})
    finally:
        nbdnn.set_math("ieee")
    planned, full = _outcome(nbdnn.matmul, [a, b], {}), \
        _outcome(nbdnn.matmul, [a, b], {}, planned=False)
    assert _same(planned, full)
    exact = a.astype(np.float64) @ b
    assert np.abs(planned[1][0] - exact).max() < 1e-5  # ieee's error, not tf32's (~1e-2)


def test_a_direct_conv_refused_in_tf32_is_refused_planned():
    """conv2d(algo="direct") is refused inside a tf32 block (the direct kernel runs IEEE
    only), however often it ran outside one."""
    x, w = np.ones((1, 2, 5, 5), np.float32), np.ones((3, 2, 3, 3), np.float32)
    _learn(nbdnn.conv2d, [x, w], {"algo": "direct"})
    with nbdnn.math_mode("tf32"):
        planned = _outcome(nbdnn.conv2d, [x, w], {"algo": "direct"})
        full = _outcome(nbdnn.conv2d, [x, w], {"algo": "direct"}, planned=False)
    assert planned[0] == "error" and planned[1] is nbdnn.BadParamError
    assert _same(planned, full)


def _first_output(spec, args, kw):
    r = _outcome(spec.fn, args, kw, planned=False)
    return None if r[0] != "ok" or r[1][0] is None else r[1][0]


@pytest.mark.parametrize("spec", [s for s in ROWS if s.blend], ids=lambda s: s.name)
def test_out_overlapping_an_input_is_refused_planned_or_not(spec):
    """out= a view shifted by 16 bytes into the largest input's buffer, after four calls
    with out= the same view of a separate buffer (same shapes, same alignment: a key
    blind to overlap is the same key)."""
    case = _case(spec, seed=2, above=2)  # (a few elements: room to shift into)
    args, kw = list(case.args), dict(case.kwargs)
    first = _first_output(spec, args, kw)
    big = max((i for i, a in enumerate(args) if isinstance(a, np.ndarray)),
              key=lambda i: args[i].size)
    a = args[big]
    shift = 16 // a.dtype.itemsize
    if first is None or first.dtype != a.dtype or a.size <= shift:
        pytest.skip("no out= of the input's dtype that can overlap it")
    n_out = first.size

    def call(overlapping, planned=True):
        buf = to_device(np.concatenate([a.reshape(-1), np.zeros(shift + n_out, a.dtype)]))
        dev = _device(args)
        dev[big] = buf[:a.size].reshape(a.shape)
        home = buf if overlapping else to_device(np.zeros(a.size + shift + n_out, a.dtype))
        out = home[shift:shift + n_out].reshape(first.shape)
        r = _attempt(lambda: spec.fn(*dev, **kw, out=out), planned)
        return r if r[0] == "error" else ("ok", [to_host(out)])

    for _ in range(4):
        r = call(False)
    assert r[0] == "ok", r
    assert any(type(s) is _plan.Plan for s in _plan.plans_of_this_thread().values())
    planned, full = call(True), call(True, planned=False)
    assert full[0] == "error" and full[1] is nbdnn.BadParamError, full
    assert _same(planned, full), (planned, full)


def test_sgd_velocity_overlapping_the_gradient_is_refused_after_a_plan():
    """sgd_update updates w and velocity in place: a velocity that overlaps grad by a
    shifted view is refused on the 5th call as on the 1st."""
    n = 12

    def call(overlapping, planned=True):
        w = to_device(np.ones(n, np.float32))
        buf = to_device(np.zeros(2 * n + 4, np.float32))
        grad = buf[:n]
        v = buf[4:4 + n] if overlapping else to_device(np.zeros(2 * n + 4, np.float32))[4:4 + n]
        r = _attempt(lambda: nbdnn.sgd_update(w, grad, v, lr=0.1, momentum=0.9), planned)
        return r if r[0] == "error" else ("ok", [to_host(w)])

    for _ in range(4):
        assert call(False)[0] == "ok"
    planned, full = call(True), call(True, planned=False)
    assert full[0] == "error", full
    assert _same(planned, full)


def test_replay_sources_are_freed_with_their_plans():
    """A plan's generated replay source lives in linecache only while its plan does:
    _plan.clear() (or a plan forgotten for room) gives the memory back."""
    import gc
    import linecache

    from nbdnn.cuda.runtime.launch import codegen

    def replay_files():
        return {f for f in linecache.cache if f.startswith("<nbdnn:run#")}

    before = replay_files()
    x = np.ones(8, np.float32)
    for n in range(1, 6):  # five signatures (five lengths), each planned
        for _ in range(4):
            _outcome(nbdnn.activation, [x[:n], "relu"], {})
    grown = replay_files() - before
    assert len(grown) == 5
    assert grown <= set(codegen.sources.__globals__["_BUILT"])
    _plan.clear()
    gc.collect()
    assert not (replay_files() & grown)
    assert not [t for t in codegen.sources("run") if "eager call plan" in t]

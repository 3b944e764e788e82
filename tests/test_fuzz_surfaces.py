"""Hostile inputs on the surfaces around the ops (tests/test_fuzz_errors.py fuzzes the ops'
own arguments): each a hypothesis property, derandomised in CI.

- process state: op calls interleaved with math-mode changes (set_math, math_mode
  blocks), planned, each equal to the same call made unplanned in the same mode;
- checkpoints: a saved model's file cut, overwritten or extended at drawn places loads
  into a model whole or raises an NbdnnError naming the file, leaving the model as it was;
- the command line: drawn arguments end in 0 or a usage error (exit 2, or a message),
  never a traceback (the work itself stubbed: the parsing and checks are fuzzed);
- the kernel cache: an entry's bytes damaged at drawn places are compiled over with a
  warning, never loaded and never a crash;
- nbdnn.torch's int-or-tuple arguments: drawn stride / padding / dilation / kernel
  values (floats, negatives, tuples of any length, strings, None) either refused by both
  torch.nn.functional and nbdnn.torch, or taken by both with equal results."""
import contextlib
import io
import os
import warnings

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

import nbdnn
from nbdnn import nn


# ---- process state: math modes between planned calls
MODES = ("ieee", "tf32", "3xtf32")


def _float32_call(op, rng):
    """(function of no arguments) an op on device arrays (what plans replay) whose result
    the math mode changes; its result on the host."""
    from nbdnn.cuda.runtime.memory.arrays import to_device, to_host
    a, b, x, w = (to_device(rng.standard_normal(s).astype(np.float32))
                  for s in ((4, 6), (6, 5), (1, 2, 5, 5), (3, 2, 3, 3)))
    return {"matmul": lambda: to_host(nbdnn.matmul(a, b)),
            "conv2d": lambda: to_host(nbdnn.conv2d(x, w, padding=1, algo="gemm"))}[op]


@settings(max_examples=12)
@given(st.lists(st.tuples(st.sampled_from(("set", "block", "call")), st.sampled_from(MODES),
                          st.sampled_from(("matmul", "conv2d"))), min_size=4, max_size=12))
def test_math_mode_changes_between_planned_calls(steps):
    from nbdnn.ops import _plan
    rng = np.random.default_rng(0)
    calls = {op: _float32_call(op, rng) for op in ("matmul", "conv2d")}
    before = nbdnn.get_math()
    try:
        for action, mode, op in steps:
            if action == "set":
                nbdnn.set_math(mode)
            ctx = nbdnn.math_mode(mode) if action == "block" else contextlib.nullcontext()
            with ctx:
                got = calls[op]()
                _plan.ENABLED = False
                try:
                    want = calls[op]()
                finally:
                    _plan.ENABLED = True
            np.testing.assert_array_equal(got, want, err_msg=f"{op} in {nbdnn.get_math()}")
    finally:
        nbdnn.set_math(before)


# ---- checkpoints
def _model(seed=0):
    return nn.Sequential([nn.Linear(4, 3, seed=seed), nn.ReLU(), nn.Linear(3, 2, seed=seed + 1)])


def _params(m):
    return [np.array(p.params[k], copy=True) for p, k in m.parameters()]


@settings(max_examples=60)
@given(st.sampled_from(("cut", "overwrite", "extend")), st.floats(0, 1), st.binary(max_size=64))
def test_a_damaged_checkpoint_loads_whole_or_is_refused(tmp_path_factory, how, where, junk):
    path = str(tmp_path_factory.mktemp("ckpt") / "model.npz")
    _model(1).save(path)
    with open(path, "rb") as f:
        data = f.read()
    at = int(where * len(data))
    data = {"cut": data[:at], "overwrite": data[:at] + junk + data[at + len(junk):],
            "extend": data[:at] + junk + data[at:]}[how]
    with open(path, "wb") as f:
        f.write(data)
    m = _model(2)
    before = _params(m)
    try:
        m.load(path)
    except nbdnn.NbdnnError as e:
        assert "model.npz" in str(e), str(e)
        for a, b in zip(before, _params(m)):
            np.testing.assert_array_equal(a, b)  # (nothing written before the refusal)
    else:
        for a, b in zip(_params(_model(1)), _params(m)):
            np.testing.assert_array_equal(a, b)  # (what loads is what was saved)


# ---- the command line
# each command's options: (a value it takes, values it must refuse)
COMMANDS = {
    "info": {},
    "check": {"--ops": ("softmax", ("nosuch", "")), "--dtype": ("float16", ("int8",)),
              "--examples": ("1", ("0", "-1", "x")), "--seed": ("7", ("-1", "1.5"))},
    "bench": {"--ops": ("softmax", ("nosuch",)), "--json": ("rows.json", ("no/dir/r.json",)),
              "--plot": ("rows.png", ()), "--no-cpu": None, "--size-mb": ("1", ("-3", "nan")),
              "--graph": None, "--dtype": ("bfloat16", ("int8",))},
    "cache": {"info": None, "clear": None},
    "demo": {},
    "": {"--version": None, "--help": None}}
STRAYS = ("x", "-1", "--bogus", "", "--")


@st.composite
def _argv(draw):
    """A command (or none); each of its options with probability 1/2, mostly with a
    value it takes (so that one bad value is often the only one); perhaps a stray token."""
    cmd = draw(st.sampled_from(sorted(COMMANDS)))
    argv = [cmd] if cmd else []
    for flag, values in COMMANDS[cmd].items():
        if draw(st.booleans()):
            argv.append(flag)
            if values is not None:
                good, bad = values
                pick = draw(st.integers(0, 2 * len(bad) + 1))
                argv += [] if pick == 0 else [bad[pick - 1]] if pick <= len(bad) else [good]
    if draw(st.integers(0, 4)) == 0:
        argv.append(draw(st.sampled_from(STRAYS)))
    return argv


@settings(max_examples=300)
@given(_argv())
@example(["check", "--seed", "-1"])
@example(["bench", "--size-mb", "-1"])
@example(["demo", "--plot", "x.png"])
def test_the_command_line_never_prints_a_traceback(monkeypatch, tmp_path_factory, argv):
    from nbdnn import cli, testing
    folder = tmp_path_factory.mktemp("cli")
    monkeypatch.setenv("NBDNN_KERNEL_CACHE", str(folder / "kc"))
    monkeypatch.chdir(folder)
    # the work stubbed: the parsing, the checks up front and the output are fuzzed
    monkeypatch.setattr(testing, "crosscheck", lambda spec, case, dtype, **kw: {
        "ok": True, "max_abs": 0.0, "used": 0.0, "tol": (0.0, 0.0), "msg": "", "shapes": []})
    monkeypatch.setattr("nbdnn.demo.main", lambda argv: None)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = cli.main(list(argv))
        except SystemExit as e:  # (argparse's usage errors, sys.exit(message))
            status = e.code
    assert status in (0, 1, 2) or isinstance(status, str), (argv, status)
    assert "Traceback" not in out.getvalue() + err.getvalue(), argv


# ---- the kernel cache
@settings(max_examples=40)
@given(st.floats(0, 1), st.binary(min_size=1, max_size=16), st.booleans())
def test_a_damaged_cache_entry_is_compiled_over(tmp_path_factory, where, junk, cut):
    from nbdnn.cuda.runtime.launch import kernel_cache
    from test_kernel_cache import SIG, FakeKernel, FakeLibrary, built
    folder = tmp_path_factory.mktemp("kc") / "kc"
    loads = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NBDNN_KERNEL_CACHE", str(folder))
        mp.setattr(kernel_cache, "_cc", lambda: (9, 0))
        mp.setattr(kernel_cache, "_load", lambda entry, cubin: loads.append(cubin) or 99)
        mp.setattr(kernel_cache.store, "_folders", {})
        k = FakeKernel(built())
        kernel_cache.compiled(k, SIG)
        (name,) = [n for n in os.listdir(folder) if not n.startswith(".")]
        path = folder / name
        data = path.read_bytes()
        at = int(where * (len(data) - 1))
        bad = data[:at] if cut else data[:at] + bytes(
            b ^ j for b, j in zip(data[at:at + len(junk)], junk)) + data[at + len(junk):]
        path.write_bytes(bad)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            handle, _ = kernel_cache.compiled(k, SIG)
        if bad == data:
            return
        if handle == 99:  # (loaded: only where the damage left the same entry, as a
            # header's space turned into another whitespace)
            assert loads[-1] == FakeLibrary(SIG).cubin, "a damaged entry was loaded"
            return
        assert handle == 1234 and k.dispatcher.compiles == 2, "not compiled over"
        assert any("ignored" in str(w.message) for w in seen), [str(w.message) for w in seen]


# ---- nbdnn.torch's int-or-tuple arguments
INTS = st.one_of(st.integers(-2, 4), st.floats(0.5, 2.5), st.none(), st.just("same"),
                 st.just("x"), st.lists(st.integers(-1, 3), max_size=4).map(tuple),
                 st.lists(st.floats(0.5, 2.0), min_size=1, max_size=2).map(tuple))


def _outcome(fn):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - PyTorch's classes vary
        return e


@settings(max_examples=60)
@given(st.sampled_from(("conv2d", "max_pool2d", "avg_pool2d", "conv_transpose2d")),
       st.fixed_dictionaries({}, optional={"stride": INTS, "padding": INTS, "dilation": INTS,
                                           "kernel_size": INTS, "output_padding": INTS}))
def test_torch_int_arguments_as_torch_takes_them(fn, kw):
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F
    import nbdnn.torch as nt
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 2, 7, 7, dtype=torch.float64, generator=g)
    if fn.startswith("conv"):
        kw.pop("kernel_size", None)
        w = torch.randn(2, 2, 3, 3, dtype=torch.float64, generator=g)
        args = (x, w)
        if fn == "conv2d":
            kw.pop("output_padding", None)
    else:
        kw.pop("output_padding", None)
        kw.setdefault("kernel_size", 3)
        if fn == "avg_pool2d":
            kw.pop("dilation", None)
        args = (x,)
    want = _outcome(lambda: getattr(F, fn)(*args, **kw))
    got = _outcome(lambda: getattr(nt, fn)(*args, **kw))
    if isinstance(got, Exception) or isinstance(want, Exception):
        assert isinstance(got, Exception) and isinstance(want, Exception), \
            f"{fn}{kw}: PyTorch {want!r}; nbdnn.torch {got!r}"
        assert isinstance(got, (nbdnn.NbdnnError, TypeError)) or \
            type(got).__module__.startswith("torch"), f"{fn}{kw}: a raw {got!r}"
        return
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)

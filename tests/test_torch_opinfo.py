"""PyTorch's own samples against nbdnn.torch (torch.testing._internal): every OpInfo sample
of every torch.nn.functional function nbdnn.torch has, and every ModuleInfo sample of
every module `convert` replaces, in float64 and float32 on the CPU (nbdnn's reference).

Each sample: PyTorch's answer and nbdnn.torch's agree (values to 1e-10 in float64, to
float32 rounding in float32; a dropout's values are its own random draw, so its shape
and dtype), or both raise; nbdnn.torch may refuse only with a NotSupportedError whose
reason is in NOT_SUPPORTED below (the documented differences, nbdnn/torch/__init__.py).
Every OpInfo `error_inputs` sample (a call PyTorch refuses) is refused by nbdnn.torch
with an NbdnnError."""
import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("expecttest")  # (torch.testing._internal imports it)
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402
from torch.testing._internal.common_modules import module_db  # noqa: E402

# (importing torch.testing._internal freezes torch.backends' flags for the whole session,
# torch.backends.disable_global_flags(); the other tests set and restore TF32 flags)
torch.backends.flags_frozen.__globals__["__allow_nonbracketed_mutation_flag"] = True

import nbdnn  # noqa: E402
import nbdnn.torch as nt  # noqa: E402
from nbdnn.torch import functional as NF, modules as M  # noqa: E402

# function -> the reasons it may give NotSupportedError with (documented in
# nbdnn/torch/__init__.py: what nbdnn cannot compute with PyTorch's meaning, yet)
NOT_SUPPORTED = {
    "hardtanh": ("min_val",),
    "instance_norm": ("eps", "momentum"),
    "dropout": ("p 1",), "batch_norm": ("eps", "momentum"), "layer_norm": ("eps",),
    "rms_norm": ("eps",), "group_norm": ("eps",),
    "scaled_dot_product_attention": ("enable_gqa with query, key and value of different ranks",),
}
DTYPES = (torch.float64, torch.float32)


def _ops():
    found = []
    for op in op_db:
        name = op.name.replace("nn.functional.", "")
        if (op.name.startswith("nn.functional.") or op.name in ("softmax", "log_softmax")) \
                and name in NF.__all__ and op.variant_test_name != "complex":
            found.append((name, op))
    return found


OPS = _ops()


def _random(name, kw):
    return name == "dropout" or kw.get("dropout_p", 0) > 0


def _outcome(fn, args, kw):
    try:
        return fn(*args, **kw)
    except Exception as e:  # noqa: BLE001 - PyTorch's own classes vary
        return e


def _check_sample(name, fn, want, got, dtype, random):
    if isinstance(got, nbdnn.NotSupportedError):
        assert any(why in str(got) for why in NOT_SUPPORTED.get(name, ())), \
            f"undocumented NotSupportedError: {got}"
        return "not supported"
    if isinstance(want, Exception) or isinstance(got, Exception):
        assert isinstance(want, Exception) and isinstance(got, Exception), \
            f"PyTorch: {want!r}; nbdnn.torch: {got!r}"
        return "both raise"
    assert len(_tensors(got)) == len(_tensors(want)), "a different number of results"
    for w, g in zip(_tensors(want), _tensors(got)):  # (max_pool's indices too: exact)
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        if not random:
            tol = 1e-10 if dtype == torch.float64 else 2e-5
            torch.testing.assert_close(g, w, rtol=tol, atol=tol, equal_nan=True,
                                       check_stride=False)
    return "ok"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name,op", OPS, ids=[f"{n}-{o.variant_test_name or 'default'}"
                                              for n, o in OPS])
def test_opinfo_samples(name, op, dtype):
    fn = getattr(NF, name)
    seen = []
    for s in op.sample_inputs("cpu", dtype, requires_grad=False):
        args, kw = (s.input,) + tuple(s.args), dict(s.kwargs)
        want = _outcome(op.op, args, kw)
        got = _outcome(fn, args, kw)
        try:
            seen.append(_check_sample(name, fn, want, got, dtype, _random(name, kw)))
        except AssertionError as e:
            raise AssertionError(f"{name} on {[getattr(a, 'shape', a) for a in args]} "
                                 f"{kw}: {e}") from None
    assert "ok" in seen or set(seen) <= {"not supported", "both raise"} and seen


@pytest.mark.parametrize("name,op", OPS, ids=[f"{n}-{o.variant_test_name or 'default'}"
                                              for n, o in OPS])
def test_opinfo_error_inputs_are_refused(name, op):
    fn = getattr(NF, name)
    if op.error_inputs_func is None:
        pytest.skip("PyTorch's OpInfo has no error inputs for it")
    for e in op.error_inputs("cpu"):
        si = e.sample_input
        got = _outcome(fn, (si.input,) + tuple(si.args), dict(si.kwargs))
        assert isinstance(got, Exception), f"{name} took a call PyTorch refuses " \
                                           f"({e.error_regex}): {si.kwargs}"
        assert isinstance(got, (nbdnn.NbdnnError, RuntimeError)), repr(got)


MODULES = [m for m in module_db if m.module_cls in M.REPLACEMENTS]


def _tensors(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    return []


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("info", MODULES, ids=lambda m: m.module_cls.__name__)
def test_moduleinfo_samples(info, dtype, training):
    """Each ModuleInfo sample module, converted, against itself native on the same
    input (and the same state: running statistics start equal); a module convert
    leaves native must say why (its report)."""
    inputs = info.module_inputs_func(info, device="cpu", dtype=dtype, requires_grad=False,
                                     training=training)
    for mi in inputs:
        if mi.forward_input is None:
            continue
        c = mi.constructor_input
        try:
            native = info.module_cls(*c.args, **c.kwargs).to(dtype).train(training)
        except Exception:  # noqa: BLE001 - a sample of a constructor error
            continue
        ours, report = nt.convert(copy.deepcopy(native))
        if not report.converted:
            assert report.native, "neither converted nor reported native"
        f = mi.forward_input
        want = _outcome(native, tuple(f.args), dict(f.kwargs))
        got = _outcome(ours, copy.deepcopy(tuple(f.args)), copy.deepcopy(dict(f.kwargs)))
        name = info.module_cls.__name__
        if isinstance(got, nbdnn.NotSupportedError):
            raise AssertionError(f"{name}: a converted module refused a call: {got}")
        if isinstance(want, Exception) or isinstance(got, Exception):
            assert isinstance(want, Exception) and isinstance(got, Exception), \
                f"{name} {c.kwargs}: PyTorch {want!r}; nbdnn.torch {got!r}"
            continue
        random = name == "MultiheadAttention" and training and native.dropout > 0
        for w, g in zip(_tensors(want), _tensors(got)):
            assert g.shape == w.shape and g.dtype == w.dtype
            if not random:  # (MaxPool's indices: exact)
                tol = 1e-10 if dtype == torch.float64 else 2e-5
                torch.testing.assert_close(g, w, rtol=tol, atol=tol, equal_nan=True,
                                           check_stride=False)

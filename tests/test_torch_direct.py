"""nbdnn.torch's direct entries (`_bridge.direct`) hand nbdnn's ops exactly what the
custom ops' implementations hand them on PyTorch's CUDA path.

An entry writes an op's common CUDA call out flat, to save run()'s generic walk over
the arguments; it must not change what nbdnn is asked. Without a GPU the CUDA branch
is taken for CPU tensors by making `stream_of` answer a stream (0, PyTorch's legacy
default, given to nbdnn as no keyword; 7, another, given as stream=7), and nbdnn's ops
are replaced by recorders: each case runs through the entry and through the
implementation, and the two recordings (the nbdnn function, every positional
argument and keyword in order; a tensor by its memory, shape, strides and dtype) and
the results' layouts must be equal. The real computation of each path is tested
elsewhere: on the CPU reference (test_torch_functional.py and the rest, which run
through the entries' fallback) and on the GPU."""
import pytest

torch = pytest.importorskip("torch")

import nbdnn  # noqa: E402
from nbdnn.torch import _bridge, _ops_basic, _ops_conv, _ops_norm  # noqa: E402

MODULES = (_bridge, _ops_basic, _ops_conv, _ops_norm)
RECORDED = ("activation", "activation_backward", "matmul", "layer_norm", "conv1d", "conv2d", "conv3d")


@pytest.fixture(params=[0, 7], ids=["default-stream", "stream-7"])
def recorder(request, monkeypatch):
    """The calls nbdnn's ops receive, with stream_of answering request.param."""
    calls = []
    for m in MODULES:
        monkeypatch.setattr(m, "stream_of", lambda t: request.param)

    def recording(name):
        def op(*args, **kw):
            calls.append((name, args, kw))
            x = args[0]
            if name == "layer_norm":
                return x.clone(), x.new_empty(2), x.new_empty(2)
            return x.new_empty(x.shape[:-1] + args[1].shape[:1]) if name == "matmul" \
                else x.new_empty(x.shape)
        return op
    fns = {n: recording(n) for n in RECORDED}
    for n, f in fns.items():
        flag = _bridge.PRODUCTS.get(getattr(nbdnn, n))  # (the recorders stand in run()'s
        # table of products that follow PyTorch's TF32 flags)
        if flag is not None:
            monkeypatch.setitem(_bridge.PRODUCTS, f, flag)
        monkeypatch.setattr(nbdnn, n, f)
    monkeypatch.setattr(_ops_conv, "CONVS", {1: fns["conv1d"], 2: fns["conv2d"],
                                             3: fns["conv3d"]})
    return calls


@pytest.fixture
def tf32_flag():
    """set(module, value): module.allow_tf32 (PyTorch's flag objects refuse monkeypatch's
    delete), restored after the test."""
    before = []

    def set_flag(module, value):
        before.append((module, module.allow_tf32))
        module.allow_tf32 = value
    yield set_flag
    for module, value in reversed(before):
        module.allow_tf32 = value


def facts(v, inputs):
    """What nbdnn can see of an argument: a tensor's memory (the caller's, by address;
    a copy, by its values), shape, strides and dtype; anything else, its value."""
    if isinstance(v, torch.Tensor):
        assert not v.requires_grad and v.grad_fn is None, "handed over with autograd history"
        assert v._base is None or not v._base.requires_grad, "a view of a graph's tensor"
        memory = v.data_ptr() if v.data_ptr() in inputs else ("copy", tuple(v.flatten().tolist()))
        return ("tensor", memory, tuple(v.shape), v.stride(), v.dtype)
    if isinstance(v, tuple):
        return tuple(facts(e, inputs) for e in v)
    return v


def recording_of(calls, inputs):
    return [(n, [facts(a, inputs) for a in args], [(k, facts(v, inputs)) for k, v in kw.items()])
            for n, args, kw in calls]


def layout(out):
    if isinstance(out, tuple):
        return tuple(layout(o) for o in out)
    return tuple(out.shape), out.stride(), out.dtype


def both_paths(calls, op, *args):
    """(recording, result layout) through op's direct entry, then its implementation."""
    got, inputs = [], {a.data_ptr() for a in args if isinstance(a, torch.Tensor)}
    for fn in (_bridge.DIRECT[op], op._init_fn):
        del calls[:]
        out = fn(*args)
        got.append((recording_of(calls, inputs), layout(out)))
    return got


def tensor(*shape, dtype=torch.float32, grad=False, last=False):
    t = torch.randn(*shape, dtype=dtype)
    if last:
        t = t.contiguous(memory_format=torch.channels_last)
    return t.requires_grad_() if grad else t


@pytest.mark.parametrize("case", ["plain", "grad", "channels-last", "channels-last-grad",
                                  "strided", "bf16"])
def test_activation_entry_hands_over_as_the_implementation(recorder, case):
    x = {"plain": lambda: tensor(4, 8), "grad": lambda: tensor(4, 8, grad=True),
         "channels-last": lambda: tensor(2, 3, 4, 5, last=True),
         "channels-last-grad": lambda: tensor(2, 3, 4, 5, last=True, grad=True) * 2,
         "strided": lambda: tensor(8, 4).t(),
         "bf16": lambda: tensor(3, 5, dtype=torch.bfloat16)}[case]()
    direct, impl = both_paths(recorder, _ops_basic.activation, x, "gelu", 0.0)
    assert direct == impl and direct[0]


@pytest.mark.parametrize("case", ["plain", "grad", "channels-last", "mixed", "strided"])
def test_activation_backward_entry_hands_over_as_the_implementation(recorder, case):
    x = tensor(2, 3, 4, 5, last=case in ("channels-last", "mixed"), grad=case == "grad")
    dy = tensor(2, 3, 4, 5, last=case == "channels-last", grad=case == "grad")
    if case == "strided":
        dy = tensor(2, 3, 5, 4).transpose(-1, -2)
    direct, impl = both_paths(recorder, _ops_basic.activation_backward, dy, x, "silu", 1.0)
    assert direct == impl and direct[0]


@pytest.mark.parametrize("tf32", [False, True])
@pytest.mark.parametrize("case", ["bias", "no-bias", "grad", "3-d", "float64", "strided-w"])
def test_linear_entry_hands_over_as_the_implementation(recorder, tf32_flag, tf32, case):
    tf32_flag(torch.backends.cuda.matmul, tf32)
    dtype = torch.float64 if case == "float64" else torch.float32
    x = tensor(2, 5, 8, dtype=dtype) if case == "3-d" else tensor(5, 8, dtype=dtype,
                                                                  grad=case == "grad")
    w = tensor(8, 6, dtype=dtype).t() if case == "strided-w" else \
        tensor(6, 8, dtype=dtype, grad=case == "grad")
    b = None if case == "no-bias" else tensor(6, dtype=dtype, grad=case == "grad")
    direct, impl = both_paths(recorder, _ops_basic.linear, x, w, b)
    assert direct == impl and direct[0]
    assert (("math", "tf32") in direct[0][0][2]) == (tf32 and dtype == torch.float32)


@pytest.mark.parametrize("case", ["affine", "no-bias", "no-affine", "grad", "2-axes"])
def test_layer_norm_entry_hands_over_as_the_implementation(recorder, case):
    ndim = 2 if case == "2-axes" else 1
    x = tensor(3, 4, 6, grad=case == "grad")
    shape = x.shape[-ndim:]
    w = None if case == "no-affine" else tensor(*shape, grad=case == "grad")
    b = None if case in ("no-bias", "no-affine") else tensor(*shape)
    direct, impl = both_paths(recorder, _ops_norm.layer_norm, x, w, b, ndim, 1e-5)
    assert direct == impl and direct[0]


CONV_CASES = {  # name: (x shape, w shape, stride, per-side padding, dilation, groups)
    "1d": ((2, 4, 9), (6, 4, 3), [1], [1, 1], [1], 1),
    "2d": ((2, 4, 7, 9), (6, 4, 3, 3), [1, 1], [1, 1, 1, 1], [1, 1], 1),
    "2d-strided": ((2, 4, 9, 9), (6, 2, 3, 1), [2, 1], [0, 1, 2, 2], [1, 2], 2),
    "3d": ((1, 2, 5, 6, 7), (4, 2, 3, 3, 3), [1, 2, 1], [1] * 6, [1, 1, 1], 1),
}


@pytest.mark.parametrize("tf32", [False, True])
@pytest.mark.parametrize("layout", ["nchw", "channels-last", "channels-last-grad", "grad",
                                    "strided", "no-bias"])
@pytest.mark.parametrize("name", sorted(CONV_CASES))
def test_conv_entry_hands_over_as_the_implementation(recorder, tf32_flag, tf32, layout, name):
    tf32_flag(torch.backends.cudnn, tf32)
    xs, ws, stride, padding, dilation, groups = CONV_CASES[name]
    last = layout.startswith("channels-last") and len(xs) == 4
    grad = layout.endswith("grad")
    x = tensor(*xs, grad=grad, last=last)
    if layout == "strided":
        x = x.transpose(-1, -2).contiguous().transpose(-1, -2)
    w = tensor(*ws, grad=grad, last=last)
    b = None if layout == "no-bias" else tensor(ws[0], grad=grad)
    direct, impl = both_paths(recorder, _ops_conv.conv, x, w, b, stride, padding, dilation,
                              groups)
    assert direct == impl and direct[0]
    assert (("math", "tf32") in direct[0][0][2]) == tf32


def test_eager_calls_run_the_entries_until_a_transform_has_run(monkeypatch):
    """call() and the autograd forward take an op's direct entry; once a torch.func
    transform has run, its implementation (run() unwraps the transform's leftovers)."""
    op = _ops_basic.activation
    monkeypatch.setattr(_bridge, "TRANSFORMED", False)  # (as before any transform)
    monkeypatch.setattr(_bridge, "IMPLS", {})
    assert _bridge.eager_impl(op) is _bridge.DIRECT[op]
    assert _bridge.eager_impl(_ops_basic.softmax) is _ops_basic.softmax._init_fn
    monkeypatch.setattr(_bridge, "TRANSFORMED", True)
    _bridge.IMPLS.clear()
    assert _bridge.eager_impl(op) is op._init_fn

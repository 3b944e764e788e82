"""nbdnn.torch's functions against torch.nn.functional: forward and every gradient
(autograd through the custom ops) in float64 on the CPU (nbdnn's reference; tolerance
1e-10), the same on CUDA tensors in float32 where a GPU is present; torch.library.opcheck
over each custom op (schema, fake implementation, autograd registration, AOT dispatch);
and a small model under torch.compile(fullgraph=True, backend="aot_eager")."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional
nt = pytest.importorskip("nbdnn.torch")
import nbdnn  # noqa: E402
from nbdnn.errors import BadParamError, ShapeError  # noqa: E402

R = np.random.default_rng(0)
TORCH_2_13 = tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 13)


def _t(*shape, lo=-2.0, hi=2.0):
    return torch.tensor(R.uniform(lo, hi, shape))


def _cl(*shape):
    return _t(*shape).contiguous(memory_format=torch.channels_last)


# name: (inputs (x first, then weights), keyword arguments); nbdnn.torch.<name> against
# F.<name> with the same call
CASES = {
    "relu": ([_t(3, 40)], {}),
    "leaky_relu": ([_t(3, 40)], {"negative_slope": 0.2}),
    "elu": ([_t(3, 40)], {"alpha": 0.7}),
    "gelu": ([_t(3, 40)], {}),
    "gelu-tanh": ([_t(3, 40)], {"approximate": "tanh"}),
    "silu": ([_t(3, 40)], {}),
    "sigmoid": ([_t(3, 40)], {}),
    "tanh": ([_t(3, 40)], {}),
    "softplus": ([_t(3, 40, lo=-30, hi=13)], {"beta": 1.5}),  # (beta x <= 20: the
    # threshold past which PyTorch returns x, nbdnn the exact value; 1e-10 apart there)
    "hardtanh": ([_t(3, 40, lo=-3, hi=9)], {"min_val": 0.0, "max_val": 4.0}),
    "relu6": ([_t(3, 40, lo=-3, hi=9)], {}),
    "hardtanh-default": ([_t(3, 40, lo=-3, hi=3)], {}),  # (-1, 1: nbdnn's clamp)
    "hardswish": ([_t(3, 40, lo=-5, hi=5)], {}),
    "hardsigmoid": ([_t(3, 40, lo=-5, hi=5)], {}),
    "softmax": ([_t(2, 5, 7, lo=-9, hi=9)], {"dim": 1}),
    "log_softmax": ([_t(2, 5, 7, lo=-9, hi=9)], {"dim": -1}),
    "linear": ([_t(2, 3, 6), _t(5, 6), _t(5)], {}),
    "linear-nobias": ([_t(6), _t(5, 6)], {}),
    "linear-2d": ([_t(4, 6), _t(5, 6), _t(5)], {}),
    "local_response_norm": ([_t(2, 7, 4, 3)], {"size": 3, "alpha": 0.3, "beta": 0.6,
                                               "k": 1.5}),
    "conv1d": ([_t(2, 4, 11), _t(6, 2, 3), _t(6)], {"stride": 2, "padding": 1, "groups": 2}),
    "conv2d": ([_t(2, 3, 9, 8), _t(4, 3, 3, 2), _t(4)], {"padding": "same",
                                                          "dilation": (2, 1)}),
    "conv2d-valid": ([_t(1, 3, 7, 7), _t(2, 3, 3, 3)], {"stride": (2, 1), "padding": "valid"}),
    "conv3d": ([_t(1, 2, 5, 4, 6), _t(3, 2, 2, 3, 2), _t(3)], {"padding": (1, 0, 1)}),
    "conv_transpose2d": ([_t(2, 4, 5, 6), _t(4, 3, 3, 2), _t(6)],
                         {"stride": (2, 3), "padding": (1, 0), "output_padding": (1, 2),
                          "groups": 2, "dilation": (1, 2)}),
    "conv_transpose1d": ([_t(2, 3, 7), _t(3, 2, 4)], {"stride": 2, "padding": 1}),
    "conv_transpose3d": ([_t(1, 2, 3, 4, 3), _t(2, 2, 2, 2, 3), _t(2)], {"stride": 2}),
    "max_pool1d": ([_t(2, 3, 11)], {"kernel_size": 3, "stride": 2, "padding": 1,
                                    "ceil_mode": True}),
    "max_pool2d": ([_t(2, 3, 9, 8)], {"kernel_size": (3, 2), "dilation": (1, 2)}),
    "max_pool3d": ([_t(1, 2, 5, 6, 4)], {"kernel_size": 2}),
    "avg_pool1d": ([_t(2, 3, 11)], {"kernel_size": 4, "stride": 3, "padding": 2,
                                    "count_include_pad": False}),
    "avg_pool2d": ([_t(2, 3, 9, 8)], {"kernel_size": 3, "stride": 2, "padding": 1,
                                      "ceil_mode": True}),
    "avg_pool3d": ([_t(1, 2, 5, 6, 4)], {"kernel_size": (2, 3, 2)}),
    "avg_pool2d-divisor": ([_t(2, 3, 9, 8)], {"kernel_size": 3, "stride": 2, "padding": 1,
                                              "ceil_mode": True, "divisor_override": 5}),
    "avg_pool3d-divisor": ([_t(1, 2, 5, 6, 4)], {"kernel_size": 2, "count_include_pad": False,
                                                 "padding": 1, "divisor_override": -3}),
    "adaptive_avg_pool2d": ([_t(2, 5, 7, 6)], {"output_size": 1}),
    "layer_norm": ([_t(3, 4, 5)], {"normalized_shape": (4, 5), "weight": _t(4, 5),
                                   "bias": _t(4, 5)}),
    "layer_norm-noaffine": ([_t(3, 4, 5)], {"normalized_shape": (5,), "eps": 0.01}),
    "rms_norm": ([_t(3, 4, 5)], {"normalized_shape": (5,), "weight": _t(5), "eps": 1e-6}),
    "group_norm": ([_t(2, 6, 3, 4)], {"num_groups": 3, "weight": _t(6), "bias": _t(6)}),
    "instance_norm": ([_t(2, 3, 5, 4)], {"weight": _t(3), "bias": _t(3)}),
    "batch_norm-train": ([_t(4, 3, 5, 2)], {"running_mean": _t(3), "running_var": _t(3, lo=1),
                                            "weight": _t(3), "bias": _t(3), "training": True,
                                            "momentum": 0.3}),
    "batch_norm-2d": ([_t(6, 3)], {"running_mean": None, "running_var": None,
                                   "training": True, "eps": 0.01}),
    "scaled_dot_product_attention": ([_t(2, 4, 9, 16), _t(2, 2, 7, 16), _t(2, 2, 7, 8)],
                                     {"is_causal": True, "enable_gqa": True}),
    "scaled_dot_product_attention-mask": ([_t(2, 3, 5, 8), _t(2, 3, 6, 8), _t(2, 3, 6, 8)],
                                          {"attn_mask": torch.tensor(R.random((5, 6)) > 0.3),
                                           "scale": 0.3}),
    "scaled_dot_product_attention-3d": ([_t(2, 5, 8), _t(2, 6, 8), _t(2, 6, 8)],
                                        {"attn_mask": _t(2, 5, 6)}),
    # a float mask broadcast over batch and heads: its gradient summed over them
    "scaled_dot_product_attention-float_mask": ([_t(2, 3, 5, 8), _t(2, 3, 6, 8),
                                                 _t(2, 3, 6, 4)], {"attn_mask": _t(5, 6)}),
    # channels-last inputs (NHWC in memory): nbdnn runs them as NHWC, results stay so
    "conv2d-nhwc": ([_cl(2, 6, 7, 8), _t(4, 3, 3, 3), _t(4)], {"padding": 1, "stride": (2, 1),
                                                              "groups": 2}),
    "max_pool2d-nhwc": ([_cl(2, 3, 9, 8)], {"kernel_size": 3, "stride": 2, "padding": 1}),
    "avg_pool2d-nhwc": ([_cl(2, 3, 9, 8)], {"kernel_size": 2}),
    "adaptive_avg_pool2d-nhwc": ([_cl(2, 5, 7, 6)], {"output_size": 1}),
    "relu-nhwc": ([_cl(2, 3, 5, 4)], {}),
    "gelu-nhwc": ([_cl(2, 3, 5, 4)], {}),
    "batch_norm-nhwc": ([_cl(4, 3, 5, 2)], {"running_mean": _t(3),
                                            "running_var": _t(3, lo=1), "weight": _t(3),
                                            "bias": _t(3), "training": True}),
    "batch_norm-nhwc_eval": ([_cl(4, 3, 5, 2)], {"running_mean": _t(3),
                                                 "running_var": _t(3, lo=0.5),
                                                 "weight": _t(3), "bias": _t(3)}),
    "group_norm-nhwc": ([_cl(2, 6, 3, 4)], {"num_groups": 3, "weight": _t(6), "eps": 0.01}),
    "batch_norm-eval": ([_t(4, 3, 5)], {"running_mean": _t(3), "running_var": _t(3, lo=0.5),
                                        "weight": _t(3), "bias": _t(3), "eps": 0.01}),
    # one sample (no batch axis) and 0-d softmax, as PyTorch takes them
    "conv2d-sample": ([_t(3, 9, 8), _t(4, 3, 3, 2), _t(4)], {"padding": 1}),
    "conv_transpose1d-sample": ([_t(3, 7), _t(3, 2, 4)], {"stride": 2}),
    # output_padding past the stride (up to the dilation): output rows no stride reaches
    "conv_transpose2d-op_past_stride": ([_t(2, 4, 5, 3), _t(4, 2, 2, 3), _t(4)],
                                        {"stride": (1, 2), "dilation": (3, 2),
                                         "output_padding": (2, 1), "groups": 2}),
    "max_pool2d-sample": ([_t(3, 9, 8)], {"kernel_size": 2}),
    "max_pool2d-ceil_past": ([_t(2, 3, 2, 4)], {"kernel_size": 3, "stride": 2, "padding": 1,
                                                "dilation": 2, "ceil_mode": True}),
    "avg_pool2d-ceil_past": ([_t(2, 3, 3, 2)], {"kernel_size": (4, 3), "stride": 3,
                                                "ceil_mode": True}),
    "avg_pool1d-sample": ([_t(3, 11)], {"kernel_size": 3, "padding": 1}),
    "adaptive_avg_pool2d-sample": ([_t(5, 7, 6)], {"output_size": (1, 1)}),
    # adaptive pooling's other sizes: dividing (a pool), uneven and growing (products)
    "adaptive_avg_pool2d-divides": ([_t(2, 3, 8, 6)], {"output_size": (4, None)}),
    "adaptive_avg_pool2d-uneven": ([_t(2, 3, 10, 9)], {"output_size": (3, 4)}),
    "adaptive_avg_pool2d-grows": ([_t(1, 2, 2, 3)], {"output_size": 7}),
    "adaptive_avg_pool2d-nhwc_uneven": ([_cl(2, 3, 5, 7)], {"output_size": (2, 3)}),
    "softmax-0d": ([_t()], {"dim": 0}),
    "log_softmax-0d": ([_t()], {"dim": -1}),
    # the vmap rules' boundary (nbdnn/torch/_batching.py): a norm over the whole sample
    # and a softmax over its first axis mix what folding the batch would keep apart
    "softmax-dim0": ([_t(3, 5, lo=-9, hi=9)], {"dim": 0}),
    "layer_norm-whole": ([_t(3, 4, 5)], {"normalized_shape": (3, 4, 5), "weight": _t(3, 4, 5),
                                         "bias": _t(3, 4, 5)}),
    "rms_norm-whole": ([_t(4, 5)], {"normalized_shape": (4, 5), "weight": _t(4, 5),
                                    "eps": 1e-6}),
}

def _call(fn, args, kw, device, dtype):
    """fn on copies of args and kw's tensors on device in dtype, the floating ones but
    running statistics requiring grad; (output, grads of those inputs, the copies)."""
    def conv(v, grad):
        if not isinstance(v, torch.Tensor):
            return v
        v = v.detach().to(device, dtype if v.is_floating_point() else v.dtype)
        return v.requires_grad_(grad and v.is_floating_point())
    args = [conv(a, True) for a in args]
    kw = {k: conv(v, k not in ("running_mean", "running_var"))  # (a float attn_mask too)
          for k, v in kw.items()}
    y = fn(*args, **kw)
    leaves = [a for a in args + list(kw.values()) if isinstance(a, torch.Tensor) and
              a.requires_grad]
    dy = torch.tensor(R.standard_normal(tuple(y.shape))).to(device, dtype)
    return y, torch.autograd.grad(y, leaves, dy), (args, kw), dy


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_torch_functional(case):
    name = case.split("-")[0]
    args, kw = CASES[case]
    _compare(getattr(nt, name), getattr(F, name), args, kw, "cpu", torch.float64,
             LOOSER.get(name, 1e-10))


# PyTorch's hardsigmoid backward multiplies by 1/6 rounded to float32 (its kernels'
# constant 1.0f / 6.0f), in float64 too; nbdnn by 1/6: 3e-8 apart relative
LOOSER = {"hardsigmoid": 3e-8}


def test_conv_geometry_is_remembered_per_kernel_and_form():
    """The conv op remembers nbdnn's keywords by its stride, padding and dilation
    (_ops_conv._geometry): kernels of several shapes with "same" (other paddings each),
    one padding as int, tuple and list, each equals F.conv2d's."""
    x = _t(1, 2, 9, 8)
    for R, S in ((3, 3), (5, 2), (3, 3), (1, 4)):
        w = _t(3, 2, R, S)
        for kw in ({"padding": "same"}, {"padding": "same", "dilation": 2},
                   {"padding": 1, "stride": 2}, {"padding": (1, 1), "stride": (2, 2)},
                   {"padding": [1, 1], "stride": [2, 2]}):
            torch.testing.assert_close(nt.conv2d(x, w, **kw), F.conv2d(x, w, **kw),
                                       rtol=1e-10, atol=1e-12)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device for torch")
@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_torch_functional_on_cuda(case):
    name = case.split("-")[0]
    args, kw = CASES[case]
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    _compare(getattr(nt, name), getattr(F, name), args, kw, "cuda", torch.float32, 2e-4)


# PyTorch's CUDA kernels whose result's memory format is the kernel's choice, not the
# input's: group_norm copies a channels-last x to contiguous (its CPU kernel keeps
# channels-last, as nbdnn does on both: no copies); attention's format follows the
# backend PyTorch picks (the efficient kernel returns a (B, S, H, D) buffer's view)
FORMAT_FREE_ON_CUDA = {"group_norm", "scaled_dot_product_attention"}


def _compare(ours, theirs, args, kw, device, dtype, tol):
    state = R.bit_generator.state  # (both calls draw the same dy)
    y, grads, (a1, k1), _ = _call(ours, args, kw, device, dtype)
    R.bit_generator.state = state
    y2, grads2, (a2, k2), _ = _call(theirs, args, kw, device, dtype)
    scale = max(1.0, float(y2.detach().abs().max()))
    assert y.is_contiguous() == y2.is_contiguous() or args[0].dim() != 4 or \
        (device == "cuda" and ours.__name__ in FORMAT_FREE_ON_CUDA), \
        "the memory format differs from PyTorch's"
    torch.testing.assert_close(y, y2, rtol=tol, atol=tol * scale)
    for g, g2 in zip(grads, grads2):
        torch.testing.assert_close(g, g2, rtol=tol, atol=tol * max(1.0, float(g2.abs().max())))
    for k in ("running_mean", "running_var"):  # (advanced in place alike)
        if k in k1:
            torch.testing.assert_close(k1[k], k2[k], rtol=tol, atol=tol)



def _recorded_calls():
    """Every torch.ops.nbdnn call (forward and backward) the CASES make, with its
    arguments, recorded below autograd by a dispatch mode: one list that follows the
    functions as they change."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "nbdnn":
                calls[f"{case}:{str(func.name()).split('::')[1]}"] = func, args, kwargs or {}
            return func(*args, **(kwargs or {}))
    calls = {}
    for case, (args, kw) in sorted(CASES.items()):
        with Record():
            _call(getattr(nt, case.split("-")[0]), args, kw, "cpu", torch.float64)
    case = "dropout"
    with Record():
        _call(lambda x: nt.dropout(x, 0.3), [_t(3, 40)], {}, "cpu", torch.float64)
    case = "batch_norm_act"  # (no F counterpart: tests/test_torch_fused.py compares it)
    with Record():
        _call(lambda x, r: nt.batch_norm_act(x, torch.zeros(3, dtype=x.dtype),
                                             torch.ones(3, dtype=x.dtype), training=True,
                                             residual=r), [_t(4, 3, 5, 2), _t(4, 3, 5, 2)],
              {}, "cpu", torch.float64)
    case = "batch_norm_act-nhwc_swish"
    with Record():
        _call(lambda x, w: nt.batch_norm_act(x, None, None, w, w, training=True,
                                             activation="swish"),
              [_cl(4, 3, 5, 2), _t(3)], {}, "cpu", torch.float64)
    case = "paged_attention"  # (compared with SDPA in its own test)
    with Record(), torch.no_grad():
        nt.paged_attention(*_paged_inputs("cpu", torch.float64), causal=True)
    case = "max_pool2d-indices"
    with Record():
        _call(lambda x: nt.max_pool2d(x, 3, 2, 1, return_indices=True)[0], [_t(2, 3, 9, 8)], {},
              "cpu", torch.float64)
    return calls


# max_pool's return_indices: (function, input shape, keywords), ties in every draw
INDEXED_POOLS = [
    ("max_pool1d", (2, 3, 11), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    ("max_pool2d", (2, 3, 9, 8), dict(kernel_size=(3, 2), dilation=(1, 2), padding=1)),
    ("max_pool2d", (3, 9, 8), dict(kernel_size=3, stride=1)),  # (one sample)
    ("max_pool3d", (1, 2, 5, 6, 4), dict(kernel_size=2, stride=(1, 2, 1), padding=1)),
]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("fn,shape,kw", INDEXED_POOLS, ids=lambda v: str(v))
def test_max_pool_indices_are_pytorchs(fn, shape, kw, device):
    """return_indices: the same (output, indices) as F's on few distinct values (ties:
    the first maximal element), channels-last kept, and the gradient exactly where the
    indices point."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device for torch")
    x = torch.tensor(R.integers(0, 4, shape), dtype=torch.float32, device=device)
    for t in (x, x.contiguous(memory_format=torch.channels_last)) if x.dim() == 4 else (x,):
        t = t.detach().requires_grad_()
        y, i = getattr(nt, fn)(t, return_indices=True, **kw)
        y0, i0 = getattr(F, fn)(x, return_indices=True, **kw)
        assert i.dtype == torch.int64 and torch.equal(i, i0) and torch.equal(y, y0)
        assert i.is_contiguous() == t.is_contiguous()
        (g,) = torch.autograd.grad(y, t, torch.ones_like(y))
        lead = x.dim() - int(fn[-2])  # (the (n, c) planes the indices count within)
        planes = math.prod(x.shape[:lead])
        want = torch.zeros(planes, math.prod(x.shape[lead:]), device=device).scatter_add_(
            1, i0.reshape(planes, -1), torch.ones(planes, math.prod(i0.shape[lead:]),
                                                  device=device))
        torch.testing.assert_close(g, want.reshape(x.shape), rtol=0, atol=0)


def _paged_inputs(device, dtype):
    """q (2, 3, 4, 8), caches of 5 pages of 4 rows and 2 kv heads (Dv 6), a table whose
    unused entry is -1, int32 lengths 7 and 2."""
    g = torch.Generator().manual_seed(5)
    q, kc, vc = (torch.randn(*s, generator=g, dtype=torch.float64).to(device, dtype)
                 for s in ((2, 3, 4, 8), (5, 4, 2, 8), (5, 4, 2, 6)))
    table = torch.tensor([[4, 0], [2, -1]], dtype=torch.int32, device=device)
    return q, kc, vc, table, torch.tensor([7, 2], dtype=torch.int32, device=device)


CALLS = _recorded_calls()


def test_every_custom_op_is_recorded():
    """Each op nbdnn.torch registers is among the recorded calls (so opcheck runs it)."""
    import torch._library.custom_ops as co
    ours = {name for name in co.OPDEFS if name.startswith("nbdnn::")}
    assert ours == {str(f.name()) for f, _, _ in CALLS.values()}, ours


@pytest.mark.parametrize("call", sorted(CALLS))
def test_opcheck(call):
    """torch.library.opcheck: the schema, the fake implementation against the real one
    (shapes, dtypes, strides), autograd's registration, AOT dispatch with dynamic shapes.
    Every op's floating inputs require grad: a forward's backward is exercised, and a
    backward op's own (the second order, nbdnn/torch/_second_order.py)."""
    func, args, kw = CALLS[call]
    grad = not str(func.name()).endswith("_backward") or TORCH_2_13  # (PyTorch 2.11's AOT
    # tracing fails on the torch.func.vjp inside a backward op's own autograd: "Attempting
    # to use FunctionalTensor on its own"; 2.13 traces it)

    def prep(a):
        if isinstance(a, torch.Tensor):
            return a.detach().clone().requires_grad_(grad and a.is_floating_point())
        return a
    torch.library.opcheck(func, tuple(prep(a) for a in args), {k: prep(v) for k, v in kw.items()})


def _small_net(p, x, training):
    """conv, batch norm (running statistics advanced), relu, max pool, group norm, gelu,
    global average pool, linear, log_softmax: every op family once."""
    y = nt.conv2d(x, p["w1"], p["b1"], padding=1)
    y = nt.batch_norm(y, p["rm"], p["rv"], p["g"], p["be"], training=training)
    y = nt.max_pool2d(nt.relu(y), 2)
    y = nt.gelu(nt.group_norm(y, 2, p["g"], p["be"]))
    y = nt.adaptive_avg_pool2d(y, (1, 1)).flatten(1)
    return nt.log_softmax(nt.linear(y, p["w2"], p["b2"]), dim=1)


def _net_params(device="cpu", dtype=torch.float64):
    g = torch.Generator().manual_seed(1)

    def r(*s):
        return torch.randn(*s, generator=g, dtype=torch.float64).to(device, dtype)
    return {"w1": r(4, 3, 3, 3), "b1": r(4), "rm": r(4), "rv": r(4).abs() + 0.5, "g": r(4),
            "be": r(4), "w2": r(5, 4), "b2": r(5)}


def _run_net(fn, p, x, training):
    leaves = {k: v.clone().requires_grad_(not k.startswith("r")) for k, v in p.items()}
    y = fn(leaves, x, training)
    grads = torch.autograd.grad(y.square().sum(), [v for v in leaves.values() if v.requires_grad])
    return y, grads, leaves["rm"], leaves["rv"]


@pytest.mark.parametrize("training", [True, False])
def test_compiles_fullgraph(training):
    """torch.compile(fullgraph=True) with AOT autograd (aot_eager: no compiler needed)
    traces the model through the custom ops with no graph break; its output, gradients
    and running statistics equal eager's."""
    torch._dynamo.reset()
    p, x = _net_params(), torch.randn(2, 3, 8, 8, dtype=torch.float64)
    compiled = torch.compile(_small_net, fullgraph=True, backend="aot_eager")
    for got, want in zip(_run_net(compiled, p, x, training), _run_net(_small_net, p, x, training)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_reference_mode_runs_the_reference():
    """nbdnn.torch.reference() runs every call on nbdnn's CPU reference (CPU tensors
    here: the launches it would make on a GPU never happen) and restores the backend."""
    from nbdnn.torch import _bridge
    p, x = _net_params(), torch.randn(2, 3, 8, 8, dtype=torch.float64)
    with nt.reference():
        assert _bridge.BACKEND == "cpu"
        y = _small_net(p, x, False)
    assert _bridge.BACKEND is None
    torch.testing.assert_close(y, _small_net(p, x, False))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device for torch")
def test_cuda_graph_capture_and_reference_on_cuda():
    """On CUDA tensors: the model captured by torch.cuda.graphs replays to its eager
    result (nbdnn's kernels on PyTorch's capture stream), and reference() gives the CPU
    reference's answer for the same CUDA tensors."""
    torch.backends.cudnn.allow_tf32 = False  # (the reference's float32 is IEEE)
    p = _net_params("cuda", torch.float32)
    x = torch.randn(4, 3, 16, 16, device="cuda")
    want = _small_net(p, x, False)
    static_x = x.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        _small_net(p, static_x, False)  # (warm-up: JIT and plans outside the capture)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = _small_net(p, static_x, False)
    static_x.copy_(x)
    graph.replay()
    torch.testing.assert_close(static_y, want, rtol=1e-5, atol=1e-5)
    with nt.reference():
        ref = _small_net(p, x, False)
    assert ref.device == x.device
    torch.testing.assert_close(ref, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device for torch"))])
@pytest.mark.parametrize("allowed", [False, True])
def test_float32_products_follow_torch_tf32_flags(device, allowed):
    """float32 convolutions follow torch.backends.cudnn.allow_tf32, linear and attention
    torch.backends.cuda.matmul.allow_tf32, as PyTorch's own do: on CUDA each call equals
    nbdnn's op in math mode "tf32" where allowed, "ieee" where not, forward and backward;
    the CPU reference stays IEEE (PyTorch's CPU kernels ignore the flags)."""
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = allowed
    math = "tf32" if allowed and device == "cuda" else "ieee"
    g = torch.Generator().manual_seed(3)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(device).requires_grad_()
    x, w, q = rand(2, 8, 12, 12), rand(16, 8, 3, 3), rand(2, 4, 40, 32)
    a, wl = rand(24, 48), rand(32, 48)
    cases = [(nt.conv2d(x, w, padding=1), nbdnn.conv2d, (x, w), dict(padding=(1, 1))),
             (nt.linear(a, wl), nbdnn.matmul, (a, wl), dict(trans_b=True)),
             (nt.scaled_dot_product_attention(q, q, q), nbdnn.scaled_dot_product_attention,
              (q, q, q), {})]  # (nbdnn's attention: (o, lse))
    for got, op, args, kw in cases:
        want = op(*map(_arr, args), math=math, **kw, **_where(x))
        want = torch.as_tensor(want[0] if isinstance(want, tuple) else want, device=device)
        torch.testing.assert_close(got.detach(), want, rtol=0, atol=0)
        got.sum().backward()  # (the backward's products: the same flags, no error)
    if device == "cuda" and allowed:  # (TF32 rounding shows: not IEEE's answer)
        assert not torch.equal(nt.linear(a, wl), nbdnn.matmul(
            _arr(a), _arr(wl), trans_b=True, math="ieee", **_where(a)))


def _arr(t):
    """Tensor t as nbdnn takes it: the CUDA tensor, or a CPU tensor's NumPy view."""
    return t.detach() if t.is_cuda else t.detach().numpy()


def _where(t):
    """nbdnn's backend arguments for tensor t: its CUDA stream, or the CPU reference."""
    if t.is_cuda:
        return {"stream": torch.cuda.current_stream().cuda_stream}
    return {"backend": "cpu"}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device for torch"))])
def test_dropout_follows_torch_seed_and_nbdnn_stream(device):
    """nbdnn.torch.dropout's mask: fixed by torch.manual_seed, the one nbdnn.dropout's
    CPU reference draws for the key taken from torch's generator (CPU: the seed from its
    CPU generator; CUDA: the offset its CUDA generator draws on the device, seed 0), its
    gradient zero exactly where the output is; training False or p 0: the input."""
    x = torch.randn(3000, dtype=torch.float64).to(device).requires_grad_()
    torch.manual_seed(5)
    y = nt.dropout(x, 0.25)
    torch.manual_seed(5)
    drawn = nt.functional.draw_seed(x)
    key = dict(seed=0, offset=int(drawn)) if device == "cuda" else dict(seed=int(drawn))
    want, mask = nbdnn.dropout(x.detach().cpu().numpy(), 0.25, **key)
    torch.testing.assert_close(y.detach().cpu(), torch.from_numpy(want))
    assert 0.2 < 1 - mask.mean() < 0.3
    (g,) = torch.autograd.grad(y.sum(), x)
    assert torch.equal((g == 0).cpu(), torch.from_numpy(mask == 0))
    assert nt.dropout(x, 0.5, training=False) is x and nt.dropout(x, 0.0) is x


# what each function's backward keeps (autograd's saved tensors), by shape: exactly the
# tensors nbdnn's backward reads, nothing recomputed
SAVED = {
    "relu": lambda x: [x.shape],                                   # x (f'(x) from x)
    "softmax": lambda x: [x.shape],                                # y
    "conv2d": lambda x, w: [x.shape, w.shape],                     # x, w
    "max_pool2d": lambda x: [x.shape],                             # x
    "linear": lambda x, w: [x.shape, w.shape],                     # x, w
    "layer_norm": lambda x, w: [x.shape, x.shape[:1], x.shape[:1], w.shape],  # x, stats, w
    "batch_norm": lambda x, w: [x.shape, w.shape, w.shape, w.shape],  # x, w, mean, invstd
}


@pytest.mark.parametrize("name", sorted(SAVED))
def test_saved_tensors_are_what_the_backward_reads(name):
    x, w = _t(4, 3, 6, 6).requires_grad_(), _t(3).requires_grad_()
    calls = {"relu": lambda: nt.relu(x), "softmax": lambda: nt.softmax(x, dim=1),
             "conv2d": lambda: nt.conv2d(x, w4), "max_pool2d": lambda: nt.max_pool2d(x, 2),
             "linear": lambda: nt.linear(x2, w2),
             "layer_norm": lambda: nt.layer_norm(x2, (6,), w6),
             "batch_norm": lambda: nt.batch_norm(x, None, None, w, w, training=True)}
    w4, w2 = _t(2, 3, 3, 3).requires_grad_(), _t(5, 6).requires_grad_()
    x2, w6 = _t(4, 6).requires_grad_(), _t(6).requires_grad_()
    args = {"conv2d": (x, w4), "linear": (x2, w2), "layer_norm": (x2, w6),
            "batch_norm": (x, w)}.get(name, (x,))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(
            lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        calls[name]()
    assert sorted(saved) == sorted(tuple(s) for s in SAVED[name](*args)), saved


def test_functional_calls_mode():
    """Within nbdnn.torch.functional_calls(), a model's own torch.nn.functional calls
    (and the torch.* / Tensor aliases) run nbdnn's functions, with autograd; a call nbdnn
    cannot take runs PyTorch's and is reported with the reason, not raised."""
    x = _t(2, 3, 8, 8).requires_grad_()
    w = _t(4, 3, 3, 3).requires_grad_()
    with nt.functional_calls() as calls:
        y = F.conv2d(F.relu(x), w, padding=1).softmax(1)
        z = F.hardtanh(x, -0.5, 2.0)  # (bounds nbdnn has no kernel for)
    want = F.conv2d(F.relu(x), w, padding=1).softmax(1)
    torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(z, F.hardtanh(x, -0.5, 2.0))
    g, g2 = (torch.autograd.grad(t.square().sum(), (x, w)) for t in (y, want))
    for a, b in zip(g, g2):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert calls.nbdnn == {"relu": 1, "conv2d": 1, "softmax": 1}, calls.nbdnn
    assert list(calls.native) == [("hardtanh", "min_val -0.5 with max_val 2.0 (nbdnn's "
                                   "clipped relu and clamp: min_val 0, or -max_val)")]
    assert "native hardtanh" in calls.report()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", ["relu", "conv2d", "linear", "layer_norm", "softmax",
                                  "max_pool2d", "batch_norm-train", "group_norm"])
def test_16_bit_tensors(case, dtype):
    """float16 and bfloat16 CPU tensors through the bridge (NumPy's float16, ml_dtypes'
    bfloat16, zero-copy): results and gradients keep the dtype and match F computed in
    float32 on the same 16-bit values within the storage's rounding."""
    name = case.split("-")[0]
    args, kw = CASES[case]
    low = [a.to(dtype) for a in args]
    kw_low = {k: v.to(dtype) if isinstance(v, torch.Tensor) and k not in
              ("running_mean", "running_var") else v for k, v in kw.items()}
    y, grads, _, dy = _call(getattr(nt, name), low, kw_low, "cpu", dtype)
    assert y.dtype == dtype and all(g.dtype == dtype for g in grads)
    x32 = [a.float().requires_grad_() for a in low]
    kw32 = {k: v.float().requires_grad_(k not in ("running_mean", "running_var"))
            if isinstance(v, torch.Tensor) else v for k, v in kw_low.items()}
    want = getattr(F, name)(*x32, **kw32)
    leaves = x32 + [v for v in kw32.values() if isinstance(v, torch.Tensor) and v.requires_grad]
    want_grads = torch.autograd.grad(want, leaves, dy.float())
    for got, w in [(y, want)] + list(zip(grads, want_grads)):
        err = float((got.float() - w).abs().max() / w.abs().max().clamp_min(1e-6))
        assert err <= (2e-2 if dtype == torch.bfloat16 else 4e-3), (err, got.shape)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device for torch"))])
def test_paged_attention_softcap_is_the_capped_formula(device):
    """nt.paged_attention(softcap=c) (flash_attn_with_kvcache's) against the formula in
    PyTorch's ops over each sequence's gathered keys (c tanh(s / c) of the scaled
    scores, bottom-right causal rows): outputs and gradients."""
    dtype = torch.float64 if device == "cpu" else torch.float32
    q, kc, vc, table, lens = _paged_inputs(device, dtype)
    leaves = [(3 * t).clone().requires_grad_() for t in (q, kc, vc)]
    o = nt.paged_attention(*leaves, table, lens, causal=True, softcap=1.5)
    g = torch.randn(o.shape, generator=torch.Generator().manual_seed(2),
                    dtype=torch.float64).to(device, dtype)
    got = torch.autograd.grad(o, leaves, g)
    ref = [(3 * t).clone().requires_grad_() for t in (q, kc, vc)]
    want = []
    for b in range(2):
        L = int(lens[b])
        pages = table[b, :-(-L // 4)].long()
        k, v = (c[pages].reshape(-1, 2, c.shape[3])[:L].transpose(0, 1) for c in ref[1:])
        k, v = k.repeat_interleave(2, 0), v.repeat_interleave(2, 0)
        s = ref[0][b].transpose(0, 1) @ k.transpose(1, 2) / 8 ** 0.5
        s = 1.5 * torch.tanh(s / 1.5)
        mask = torch.ones(3, L, dtype=torch.bool, device=device).tril(L - 3)
        p = torch.softmax(s.masked_fill(~mask, -torch.inf), -1)  # (a row before every
        want.append((torch.nan_to_num(p, nan=0.0) @ v).transpose(0, 1))  # key: NaN -> 0)
    want = torch.stack(want)
    tol = dict(rtol=1e-5, atol=1e-5) if device == "cuda" else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(o, want, **tol)
    for a, b in zip(got, torch.autograd.grad(want, ref, g)):
        torch.testing.assert_close(a, b, **tol)


def test_paged_attention_refuses_a_bad_window_size():
    q, kc, vc, table, lens = _paged_inputs("cpu", torch.float64)
    for bad in ((-2, 0), (1,), (0.5, 1), "ab", (True, 0), None):
        with pytest.raises(BadParamError, match="window_size"):
            nt.paged_attention(q, kc, vc, table, lens, window_size=bad)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device for torch"))])
@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)),
                                           (True, (2, -1)), (False, (1, 1))])
def test_paged_attention_is_sdpa_over_the_gathered_pages(device, causal, window):
    """nt.paged_attention (flash_attn_with_kvcache's conventions) against PyTorch's SDPA
    over each sequence's keys gathered from its pages, the causal rows aligned
    bottom-right (torch.ones(Sq, L).tril(L - Sq)), a window_size about that diagonal
    (-1: open), outputs and gradients (q's and the caches': its math form's)."""
    dtype = torch.float64 if device == "cpu" else torch.float32
    q, kc, vc, table, lens = _paged_inputs(device, dtype)
    leaves = [t.clone().requires_grad_() for t in (q, kc, vc)]
    o = nt.paged_attention(*leaves, table, lens, causal=causal, window_size=window)
    assert o.shape == (2, 3, 4, 6) and o.dtype == dtype
    g = torch.randn(o.shape, generator=torch.Generator().manual_seed(6),
                    dtype=torch.float64).to(device, dtype)
    got = torch.autograd.grad(o, leaves, g)
    ref = [t.clone().requires_grad_() for t in (q, kc, vc)]
    want = []
    for b in range(2):
        L = int(lens[b])
        pages = table[b, :-(-L // 4)].long()
        k, v = (c[pages].reshape(-1, 2, c.shape[3])[:L].transpose(0, 1) for c in ref[1:])
        off = torch.arange(L, device=device)[None, :] - torch.arange(3, device=device)[:, None] \
            - (L - 3)  # (key j - row i's diagonal)
        mask = torch.ones(3, L, dtype=torch.bool, device=device)
        for keep, on in ((off <= 0, causal), (off >= -window[0], window[0] >= 0),
                         (off <= window[1], window[1] >= 0)):
            mask = mask & keep if on else mask
        w = F.scaled_dot_product_attention(ref[0][b].transpose(0, 1), k, v, attn_mask=mask,
                                           enable_gqa=True).transpose(0, 1)
        want.append(torch.nan_to_num(w, nan=0.0))  # (a row before every key: PyTorch NaN,
        # nbdnn 0)
    want = torch.stack(want)
    tol = dict(rtol=1e-5, atol=1e-5) if device == "cuda" else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(o, want, **tol)
    for a, b in zip(got, torch.autograd.grad(want, ref, g)):
        torch.testing.assert_close(a, b, **tol)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device for torch"))])
@pytest.mark.parametrize("variant", ["upper_left", "lower_right"])
@pytest.mark.parametrize("Sq,Sk", [(3, 7), (5, 5), (7, 3)])
def test_sdpa_takes_pytorchs_causal_bias_objects(device, variant, Sq, Sk):
    """torch.nn.attention.bias.causal_upper_left / causal_lower_right as attn_mask (a
    tensor subclass whose elements are not the mask): upper-left is is_causal, lower-right
    row i attends keys j <= i + Sk - Sq; directly and under functional_calls, outputs
    and gradients as PyTorch's (a row left without keys: PyTorch NaN, nbdnn 0)."""
    from torch.nn.attention import bias as attn_bias
    dtype = torch.float64 if device == "cpu" else torch.float32
    gen = torch.Generator().manual_seed(Sq * 10 + Sk)
    q, k, v = (torch.randn(2, 3, S, 8, generator=gen, dtype=torch.float64).to(device, dtype)
               for S in (Sq, Sk, Sk))
    make = getattr(attn_bias, "causal_" + variant)
    g = torch.randn(2, 3, Sq, 8, generator=gen, dtype=torch.float64).to(device, dtype)
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    shift = Sk - Sq if variant == "lower_right" else 0
    mask = torch.ones(Sq, Sk, dtype=torch.bool, device=device).tril(shift)
    want = torch.nan_to_num(F.scaled_dot_product_attention(*ref, attn_mask=mask), nan=0.0)
    want_grads = torch.autograd.grad(want, ref, g)
    tol = dict(rtol=1e-5, atol=1e-5) if device == "cuda" else dict(rtol=1e-12, atol=1e-12)
    for functional in (False, True):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        if functional:
            with nt.functional_calls() as calls:
                o = F.scaled_dot_product_attention(*leaves, attn_mask=make(Sq, Sk))
            assert calls.nbdnn["scaled_dot_product_attention"] == 1, calls.report()
        else:
            o = nt.scaled_dot_product_attention(*leaves, attn_mask=make(Sq, Sk))
        torch.testing.assert_close(o, want, **tol)
        for a, b in zip(torch.autograd.grad(o, leaves, g), want_grads):
            torch.testing.assert_close(a, b, **tol)


def test_sdpa_lower_right_causal_bias_is_bottom_right_alignment_not_a_mask(monkeypatch):
    """causal_lower_right reaches nbdnn's attention as is_causal with alignment
    "bottom_right" (the kernels' own diagonal: no (Sq, Sk) mask built and read per
    score), forward and backward; upper-left as plain is_causal."""
    from torch.nn.attention.bias import causal_lower_right, causal_upper_left
    seen = []
    for name in ("scaled_dot_product_attention", "scaled_dot_product_attention_backward"):
        def spy(*args, _real=getattr(nbdnn, name), **kw):
            seen.append(kw)
            return _real(*args, **kw)
        monkeypatch.setattr(nbdnn, name, spy)
    q, k = (torch.randn(1, 2, S, 8, dtype=torch.float64, requires_grad=True) for S in (3, 5))
    o = nt.scaled_dot_product_attention(q, k, k, attn_mask=causal_lower_right(3, 5))
    o.sum().backward()
    nt.scaled_dot_product_attention(q, k, k, attn_mask=causal_upper_left(3, 5))
    assert [(kw["attn_mask"], kw["is_causal"], kw["alignment"]) for kw in seen] == \
        [(None, True, "bottom_right")] * 2 + [(None, True, "top_left")]


def test_sdpa_lower_right_causal_bias_higher_derivatives():
    """Forward mode (jvp) and a second derivative through causal_lower_right, which
    PyTorch's formula of the op computes (nbdnn/torch/_ops_random.attention_math): its
    diagonal bottom-right too, against the math form with the explicit mask."""
    from torch.nn.attention.bias import causal_lower_right
    gen = torch.Generator().manual_seed(4)
    q, k, v, tq, tk, tv = (torch.randn(1, 2, S, 8, generator=gen, dtype=torch.float64)
                           for S in (3, 5, 5, 3, 5, 5))
    mask = torch.ones(3, 5, dtype=torch.bool).tril(2)

    def ours(q, k, v):
        return nt.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(3, 5))

    def native(q, k, v):  # (the math form: F's CPU kernels have no forward mode)
        s = (q @ k.transpose(-2, -1) / math.sqrt(8)).masked_fill(~mask, float("-inf"))
        return torch.softmax(s, -1) @ v
    for f in (ours, native):
        f.jvp = torch.func.jvp(f, (q, k, v), (tq, tk, tv))[1]
        qq = q.clone().requires_grad_()
        (dq,) = torch.autograd.grad((f(qq, k, v) ** 2).sum(), qq, create_graph=True)
        f.second = torch.autograd.grad(dq.sum(), qq)[0]
    torch.testing.assert_close(ours.jvp, native.jvp, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ours.second, native.second, rtol=1e-10, atol=1e-12)


def test_sdpa_refuses_a_causal_bias_of_other_lengths_or_with_is_causal():
    from torch.nn.attention.bias import causal_lower_right
    q, k = torch.randn(1, 2, 3, 8, dtype=torch.float64), torch.randn(1, 2, 5, 8,
                                                                     dtype=torch.float64)
    with pytest.raises(ShapeError, match="CausalBias is for 3 queries and 6 keys"):
        nt.scaled_dot_product_attention(q, k, k, attn_mask=causal_lower_right(3, 6))
    with pytest.raises(BadParamError, match="CausalBias attn_mask with is_causal=True"):
        nt.scaled_dot_product_attention(q, k, k, attn_mask=causal_lower_right(3, 5),
                                        is_causal=True)


def _dispatched(fn):
    """The aten ops fn dispatches (TorchDispatchMode: the autograd engine's own calls
    included)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))
    with Record() as r:
        fn()
    return r.ops


def test_ops_of_several_outputs_make_no_zero_gradients():
    """A converted conv, batch norm, ReLU and layer norm's backward makes no zeros for the
    gradients of the statistics autograd leaves undefined (a fill kernel each on the
    GPU: 4 a batch norm), and its gradients are native's."""
    torch.manual_seed(0)
    native = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4),
                                 torch.nn.ReLU(), torch.nn.LayerNorm(6)).double()
    ours, _ = nt.convert(native)
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    loss = ours(x).square().sum()
    ops = _dispatched(loss.backward)
    assert not [o for o in ops if "zero" in o or "fill" in o], ops
    native.zero_grad()
    native(x).square().sum().backward()
    for a, b in zip(ours.parameters(), native.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
def test_an_undefined_first_gradient_is_zeros_of_its_layout(layout):
    """Where autograd hands an op of several outputs no gradient at all, its backward
    takes zeros in the first output's shape and strides: what it gives for them."""
    x = torch.randn(2, 4, 5, 5, dtype=torch.float64).to(memory_format=layout)
    x.requires_grad_()
    w, b = (torch.randn(4, dtype=torch.float64, requires_grad=True) for _ in range(2))
    y = nt.functional.batch_norm(x, torch.zeros(4, dtype=torch.float64),
                                 torch.ones(4, dtype=torch.float64), w, b, training=True)
    n = 5  # (y and the batch norm's four statistics)
    got = y.grad_fn.apply(*(None,) * n)
    want = y.grad_fn.apply(torch.zeros_like(y), *(None,) * (n - 1))
    for g, z in zip(got, want):
        assert (g is None and z is None) or (torch.equal(g, z) and g.stride() == z.stride())

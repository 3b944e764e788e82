"""torch.func's transforms over nbdnn.torch (nbdnn/torch/_bridge.py transformable(),
nbdnn/torch/_forward_mode.py): for every case of test_torch_functional's table, float64
on the CPU reference, torch.func.vjp and torch.func.jvp against torch.nn.functional's
(1e-9); per-sample gradients (vmap of grad), jacrev, jacfwd and hessian of small
networks; vmap of plain calls (one nbdnn call a sample)."""
import warnings

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional
nt = pytest.importorskip("nbdnn.torch")
from torch.func import grad, hessian, jacfwd, jacrev, jvp, vjp, vmap  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from test_torch_functional import CASES, LOOSER, R  # noqa: E402

CONSTANT = ("running_mean", "running_var")  # (no gradient, as in the table)


def _function(fn, args, kw, device, dtype):
    """(f(*differentiable tensors) -> y, those tensors as copies on device in dtype; the
    other tensor arguments moved alike)."""
    def to(v):
        return v.to(device, dtype if v.is_floating_point() else v.dtype) \
            if isinstance(v, torch.Tensor) else v
    args, kw = [to(a) for a in args], {k: to(v) for k, v in kw.items()}
    slots = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    keys = [k for k, v in kw.items() if isinstance(v, torch.Tensor) and v.is_floating_point()
            and k not in CONSTANT]

    def f(*ts):
        a = list(args)
        for i, t in zip(slots, ts):
            a[i] = t
        return fn(*a, **{**kw, **dict(zip(keys, ts[len(slots):]))})
    return f, [args[i].clone() for i in slots] + [kw[k].clone() for k in keys]


def _draw(shape, device="cpu", dtype=torch.float64):
    return torch.tensor(R.standard_normal(tuple(shape))).to(device, dtype)


def _transformed(name, args, kw, device="cpu", dtype=torch.float64):
    """(nbdnn's, PyTorch's) results of jvp and vjp at the same random tangents."""
    out = []
    state = R.bit_generator.state
    theirs = getattr(F, name)
    if name == "group_norm":  # (PyTorch 2.13's forward mode views a channels-last x wrongly)
        theirs = lambda x, *a, **k: F.group_norm(x.contiguous(), *a, **k)  # noqa: E731
    for fn in (getattr(nt, name), theirs):
        R.bit_generator.state = state
        f, primals = _function(fn, args, kw, device, dtype)
        tangents = [_draw(p.shape, device, dtype) for p in primals]
        with sdpa_kernel(SDPBackend.MATH):  # (PyTorch's flash attention has no jvp)
            y, ty = jvp(f, tuple(primals), tuple(tangents))
            _, pull = vjp(f, *primals)
            out.append([ty, *pull(_draw(y.shape, device, dtype))])
    return out


def _compare(case, device, dtype, tol):
    ours, theirs = _transformed(case.split("-")[0], *CASES[case], device, dtype)
    for g, g2 in zip(ours, theirs):
        torch.testing.assert_close(g, g2, rtol=tol, atol=tol * max(1.0, float(g2.abs().max())))


@pytest.mark.parametrize("case", sorted(CASES))
def test_jvp_and_vjp_match_torch_functional(case):
    _compare(case, "cpu", torch.float64, max(1e-9, LOOSER.get(case.split("-")[0], 0)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device for torch")
@pytest.mark.parametrize("case", sorted(CASES))
def test_jvp_and_vjp_match_torch_functional_on_cuda(case):
    """CUDA tensors in float32 (the transforms hand nbdnn's kernels unwrapped tensors)."""
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    _compare(case, "cuda", torch.float32, 1e-3)


def _net(m, params, x):
    """conv, layer norm, gelu, max pool, linear, log_softmax on one sample or a batch."""
    w1, w2 = params
    y = m.max_pool2d(m.gelu(m.layer_norm(m.conv2d(x, w1, padding=1), (6, 6))), 2)
    return m.log_softmax(m.linear(y.flatten(-3), w2), -1)


def _params():
    return (_draw((4, 3, 3, 3)), _draw((5, 4 * 3 * 3)))


def test_per_sample_gradients():
    """vmap(grad): each sample's gradient of its loss, as Opacus-style training takes
    them; the vmap rule runs nbdnn's ops a sample at a time."""
    params, x = _params(), _draw((4, 3, 6, 6))

    def per_sample(m):
        def loss(p, xi):
            return _net(m, p, xi.unsqueeze(0))[0, 1]
        return vmap(grad(loss), in_dims=(None, 0))(params, x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for g, g2 in zip(per_sample(nt), per_sample(F)):
            torch.testing.assert_close(g, g2, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("transform", [jacrev, jacfwd])
def test_jacobians(transform):
    params, x = _params(), _draw((1, 3, 6, 6))
    ours, theirs = (transform(lambda x: _net(m, params, x))(x) for m in (nt, F))
    torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-11)


def test_hessian():
    """torch.func.hessian (jacfwd of jacrev): forward mode over reverse mode, through
    the backward ops' jvp rules."""
    w = _draw((3, 5))
    x = _draw((5,))
    ours, theirs = (hessian(lambda x: m.log_softmax(m.linear(m.gelu(x), w), 0).square().sum())(x)
                    for m in (nt, F))
    torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-11)


def _clones(kw):
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_vmap_matches_each_sample(case):
    """vmap over three variants of each case's first input (the other arguments shared)
    equals F on each sample: the batch folded into one nbdnn call where the op allows
    (nbdnn/torch/_batching.py), a call a sample otherwise."""
    name = case.split("-")[0]
    args, kw = CASES[case]
    if kw.get("training") and kw.get("running_mean") is not None:
        with pytest.raises(RuntimeError, match="running statistics"):  # (PyTorch's vmap
            # refuses unbatched running statistics of a batched input too)
            vmap(lambda x: getattr(nt, name)(x, *args[1:], **_clones(kw)))(
                torch.stack([args[0]] * 2))
        return
    xs = torch.stack([args[0], 0.5 * args[0] + 0.1, -args[0]])
    ours = vmap(lambda x: getattr(nt, name)(x, *args[1:], **_clones(kw)))(xs)
    kw2 = _clones(kw)
    want = torch.stack([getattr(F, name)(x, *args[1:], **kw2) for x in xs])
    torch.testing.assert_close(ours, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("fn, calls", [("conv2d", 1), ("batch_norm", 3)])
def test_vmap_folds_the_batch_where_it_can(monkeypatch, fn, calls):
    """A convolution under vmap is one nbdnn call for the batch; batch norm in training
    (statistics over the samples' own axis) one a sample."""
    import nbdnn
    from nbdnn.torch import _ops_conv
    count = []

    def counted(f):
        return lambda *a, **k: count.append(1) or f(*a, **k)
    if fn == "conv2d":
        monkeypatch.setitem(_ops_conv.CONVS, 2, counted(_ops_conv.CONVS[2]))
    else:
        monkeypatch.setattr(nbdnn, "batch_norm_train", counted(nbdnn.batch_norm_train))
    x, w = _draw((3, 2, 4, 5, 5)), _draw((6, 4, 3, 3))
    if fn == "conv2d":
        vmap(lambda x: nt.conv2d(x, w))(x)
    else:
        vmap(lambda x: nt.batch_norm(x, None, None, training=True))(x)
    assert len(count) == calls


def test_vmap_runs_each_sample():
    """Under torch.func.vmap the tensors are functorch's batched wrappers (plain Tensors
    to Python, no storage): the calls go through the op's torch.func-ready Function,
    whose vmap rule runs nbdnn's op on each slice."""
    x, w, b = _draw((4, 3, 6)), _draw((5, 6)), _draw((5,))
    torch.testing.assert_close(vmap(nt.relu)(x), F.relu(x), rtol=0, atol=0)
    torch.testing.assert_close(vmap(nt.linear, in_dims=(0, None, None))(x, w, b),
                               F.linear(x, w, b), rtol=1e-12, atol=1e-12)
    k = _draw((2, 3, 3))  # (each sample (3, 6): one sample without the batch axis)
    torch.testing.assert_close(vmap(nt.conv1d, in_dims=(0, None))(x, k),
                               vmap(F.conv1d, in_dims=(0, None))(x, k), rtol=1e-12, atol=1e-12)


def test_every_op_has_its_transform_rules():
    """Each torch.ops.nbdnn op has autograd and a jvp rule (a vmap rule: the loop at
    least), so no transform meets an op it cannot take."""
    import torch._library.custom_ops as co
    from nbdnn.torch import _bridge
    ours = {n for n in co.OPDEFS if n.startswith("nbdnn::")}
    assert {f"{op._namespace}::{op._name}" for op in _bridge.AUTOGRAD} == ours
    assert {f"{op._namespace}::{op._name}" for op in _bridge.JVP} == ours


def test_each_op_has_one_record_of_rules():
    """nbdnn/torch/rules.py holds a record for every torch.ops.nbdnn op: a backward op
    its second-order formula, a forward op its jvp formula (or no tangent: integers)."""
    import torch._library.custom_ops as co
    from nbdnn.torch.rules import RULES
    ours = {n for n in co.OPDEFS if n.startswith("nbdnn::")}
    assert {f"{op._namespace}::{op._name}" for op in RULES} == ours
    for op, r in RULES.items():
        if op._name.endswith("_backward"):
            assert r.second is not None and r.jvp is None, op._name
        else:
            assert (r.jvp is not None) != r.no_tangent and r.second is None, op._name

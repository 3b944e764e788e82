"""nbdnn.torch's fused batch norm (batch_norm_act: act(batch_norm(x) + residual), one op
forward and one backward, cuDNN's fused batch norm) against PyTorch's three ops in
float64 on the CPU reference: values, running statistics, every gradient, forward mode
and a second order; and torchvision's ResNet blocks, which convert runs through it."""
import pytest

torch = pytest.importorskip("torch")
nt = pytest.importorskip("nbdnn.torch")
from nbdnn.errors import BadParamError, DtypeError, ShapeError  # noqa: E402

F = torch.nn.functional
ACTS = {"relu": lambda t: F.relu(t), "swish": lambda t: F.silu(t),
        "clipped_relu": lambda t: F.hardtanh(t, 0.0, 6.0)}


def _case(last, residual, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 6, 5, 3, generator=g, dtype=torch.float64) * 3
    if last:
        x = x.contiguous(memory_format=torch.channels_last)
    w, b = (torch.randn(6, generator=g, dtype=torch.float64) for _ in range(2))
    r = torch.randn(x.shape, generator=g, dtype=torch.float64).to(
        memory_format=torch.channels_last if last else torch.contiguous_format) \
        if residual else None
    dy = torch.randn(x.shape, generator=g, dtype=torch.float64)
    return x, w, b, r, dy


@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("last", [False, True])
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_act_is_the_three_ops(training, last, residual, act):
    """y, the advanced running statistics and the gradients of x, w, b and the residual
    equal PyTorch's batch_norm, add and activation; training runs the fused op's
    backward, and an inference-mode call that is differentiated runs the ops apart; a
    channels-last x gives a channels-last y."""
    x0, w0, b0, r0, dy = _case(last, residual)
    got = []
    for fused in (False, True):
        x, w, b = (t.clone().requires_grad_() for t in (x0, w0, b0))
        r = r0.clone().requires_grad_() if residual else None
        rm = torch.full((6,), 0.5, dtype=torch.float64)
        rv = torch.full((6,), 2.0, dtype=torch.float64)
        if fused:
            y = nt.batch_norm_act(x, rm, rv, w, b, training, 0.2, 1e-4, residual=r,
                                  activation=act, coef=6.0 if act == "clipped_relu" else None)
            assert y.is_contiguous(memory_format=torch.channels_last) == last
            assert (type(y.grad_fn).__name__ == "batch_norm_actBackward") == training
        else:
            y = F.batch_norm(x, rm, rv, w, b, training, 0.2, 1e-4)
            y = ACTS[act](y if r is None else y + r)
        grads = torch.autograd.grad(y, [x, w, b] + ([r] if residual else []), dy)
        got.append((y.detach(), rm, rv) + grads)
    for want, have in zip(*got):
        torch.testing.assert_close(have, want, rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device for torch")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("last", [False, True])
def test_batch_norm_act_on_cuda(last, residual, dtype):
    """nbdnn's CUDA kernels through the fused op (channels-last as NHWC, the residual
    too): y, running statistics and gradients against PyTorch's ops on the same GPU."""
    x0, w0, b0, r0, dy = (t.cuda() if t is not None else None for t in _case(last, residual))
    got = []
    for fused in (False, True):
        x, r = x0.to(dtype).requires_grad_(), r0.to(dtype).requires_grad_() if residual \
            else None
        w, b = (t.float().requires_grad_() for t in (w0, b0))
        rm, rv = torch.zeros(6, device="cuda"), torch.ones(6, device="cuda")
        with torch.autocast("cuda", dtype, enabled=dtype != torch.float32):
            if fused:
                y = nt.batch_norm_act(x, rm, rv, w, b, True, 0.1, 1e-5, residual=r)
            else:
                y = F.batch_norm(x, rm, rv, w, b, True, 0.1, 1e-5)
                y = F.relu(y if r is None else y + r)
        grads = torch.autograd.grad(y, [x, w, b] + ([r] if residual else []), dy.to(y.dtype))
        got.append((y.float(), rm, rv) + tuple(g.float() for g in grads))
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    for want, have in zip(*got):
        torch.testing.assert_close(have, want, rtol=tol, atol=tol * max(1.0, float(
            want.abs().max())))


def test_batch_norm_act_without_grad_is_the_fused_op_in_both_modes():
    """No gradient wanted: inference-mode calls run the fused op too (one pass)."""
    x, w, b, r, _ = _case(False, True)
    rm, rv = torch.zeros(6, dtype=torch.float64), torch.ones(6, dtype=torch.float64)
    with torch.no_grad():
        y = nt.batch_norm_act(x, rm, rv, w, b, False, residual=r)
    want = F.relu(F.batch_norm(x, rm, rv, w, b, False) + r)
    torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12)


def test_batch_norm_act_forward_mode_and_second_order():
    """torch.func.jvp and a double backward (a gradient penalty) through the fused op
    equal PyTorch's ops' (its rules: PyTorch's formula at nbdnn's values)."""
    x0, w0, b0, r0, dy = _case(False, True, seed=3)
    tangents = tuple(torch.randn_like(t) for t in (x0, w0, b0, r0))

    def ours(x, w, b, r):
        return nt.batch_norm_act(x, None, None, w, b, True, residual=r, activation="swish",
                                 coef=1.0)

    def theirs(x, w, b, r):
        return F.silu(F.batch_norm(x, None, None, w, b, True) + r)
    for fn in (ours, theirs):
        fn.jvp = torch.func.jvp(fn, (x0, w0, b0, r0), tangents)[1]
        x, w, b, r = (t.clone().requires_grad_() for t in (x0, w0, b0, r0))
        (gx,) = torch.autograd.grad((fn(x, w, b, r) * dy).sum(), x, create_graph=True)
        fn.second = torch.autograd.grad(gx.square().sum(), [x, w, b, r])
    torch.testing.assert_close(ours.jvp, theirs.jvp, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ours.second, theirs.second, rtol=1e-9, atol=1e-9)


def test_batch_norm_act_refusals():
    x, w, b, r, _ = _case(False, True)
    with pytest.raises(ShapeError, match="residual"):
        nt.batch_norm_act(x, None, None, w, b, True, residual=r[:, :3])
    with pytest.raises(DtypeError, match="residual"):
        nt.batch_norm_act(x, None, None, w, b, True, residual=r.float())
    with pytest.raises(BadParamError, match="activation"):
        nt.batch_norm_act(x, None, None, w, b, True, activation="nope")
    with pytest.raises(BadParamError, match="momentum"):
        nt.batch_norm_act(x, torch.zeros(6), torch.ones(6), w, b, True, momentum=None)


@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
def test_torchvision_blocks_run_fused(name):
    """convert gives torchvision's BasicBlock / Bottleneck the fused forward: the
    report lists them, each batch norm runs as one fused op (none of PyTorch's adds or
    ReLUs between), and the model's outputs, gradients and running statistics are
    native's in float64; a hook on a block's child (or a child of another kind) makes
    the block run its own forward, calling the child."""
    tv = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    net = getattr(tv.models, name)(num_classes=10).double()
    model, report = nt.convert(net)
    blocks = [n for n, t in report.converted if t in ("BasicBlock", "Bottleneck")]
    assert len(blocks) == (8 if name == "resnet18" else 16)
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)  # (layer4's batch norms see 8
    # values a channel: fewer make them ill-conditioned, float64's rounding amplified)
    calls = []
    real = nt.functional.batch_norm_act
    nt.functional.batch_norm_act = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        out, want = model(x), net(x)
    finally:
        nt.functional.batch_norm_act = real
    per_block = 2 if name == "resnet18" else 3
    assert len(calls) == per_block * len(blocks)
    torch.testing.assert_close(out, want, rtol=1e-11, atol=1e-11)
    out.square().sum().backward()
    want.square().sum().backward()
    for (n, p), q in zip(model.named_parameters(), net.parameters()):
        err = float((p.grad - q.grad).abs().max() / q.grad.abs().max())
        assert err < 1e-11, (n, err)
    for (k, v), u in zip(model.state_dict().items(), net.state_dict().values()):
        torch.testing.assert_close(v, u, rtol=1e-12, atol=1e-12, msg=k)
    seen = []
    block = model.get_submodule(blocks[0])
    block.bn1.register_forward_hook(lambda m, a, o: seen.append(o.shape))
    model(x)
    assert len(seen) == 1


@pytest.mark.parametrize("act,fused", [("relu", "relu"), ("silu", "swish"),
                                       ("hard_swish", "hardswish"), ("gelu", None)])
def test_timm_batch_norm_act_runs_fused(act, fused):
    """timm's BatchNormAct2d with no drop and a ReLU, SiLU or Hardswish runs as one fused
    batch norm (others, a drop layer or a hooked activation: batch norm, then the
    children), with native's outputs, gradients and running statistics in float64."""
    pytest.importorskip("timm")
    from timm.layers import BatchNormAct2d
    torch.manual_seed(0)
    x = torch.randn(4, 6, 5, 5, dtype=torch.float64)
    for variant in ("plain", "drop", "hooked"):
        net = BatchNormAct2d(6, act_layer=act, drop_layer=torch.nn.Dropout
                             if variant == "drop" else None).double()
        if variant == "drop":
            net.drop.p = 0.0  # (deterministic: a dropout module all the same)
        model, _ = nt.convert(net)
        if variant == "hooked":
            model.act.register_forward_hook(lambda m, a, o: None)
        calls = []
        real = nt.functional.batch_norm_act
        nt.functional.batch_norm_act = lambda *a, **k: calls.append(k["activation"]) or \
            real(*a, **k)
        try:
            for training in (True, False):
                net.train(training), model.train(training)
                xs = [x.clone().requires_grad_() for _ in range(2)]
                ys = [m(t) for m, t in zip((net, model), xs)]
                torch.testing.assert_close(ys[1], ys[0], rtol=1e-12, atol=1e-12)
                gs = [torch.autograd.grad(y.square().sum(), (t, m.weight, m.bias))
                      for y, t, m in zip(ys, xs, (net, model))]
                torch.testing.assert_close(gs[1], gs[0], rtol=1e-10, atol=1e-10)
        finally:
            nt.functional.batch_norm_act = real
        torch.testing.assert_close(model.running_var, net.running_var, rtol=1e-12,
                                   atol=1e-12)
        want = [fused] * 2 if fused and variant == "plain" else []
        assert calls == want, (variant, calls)

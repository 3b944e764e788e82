"""nbdnn.torch.convert and compare: which modules convert and why others stay native,
state_dict both ways, a converted residual network against the native one (forward,
gradients, running statistics, SGD steps) in float64 on the CPU reference and in
float32 on CUDA where present; torchvision's ResNet-18 where torchvision is installed."""
import io

import pytest

torch = pytest.importorskip("torch")
nt = pytest.importorskip("nbdnn.torch")
from torch import nn  # noqa: E402
from torch_graphs import captured_step  # noqa: E402  (tests/torch_graphs.py)


class Block(nn.Module):
    """A ResNet basic block (conv, BN, ReLU twice, an identity or 1x1 shortcut)."""
    def __init__(self, c_in, c_out, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.down = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False),
                                  nn.BatchNorm2d(c_out)) if stride != 1 or c_in != c_out \
            else nn.Identity()

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(y)) + self.down(x))


def small_resnet(classes=10):
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.MaxPool2d(3, 2, 1), Block(8, 8, 1), Block(8, 16, 2),
                         nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(), nn.Dropout(0.0),
                         nn.Linear(16, classes))


def test_report_says_what_converted_and_why_not():
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Hardtanh(-0.5, 2.0), nn.Conv2d(4, 4, 3, padding=1,
                        padding_mode="reflect"), nn.MaxPool2d(2, return_indices=False),
                        nn.AvgPool2d(2, divisor_override=3), nn.Flatten(), nn.Linear(4, 2),
                        nn.GELU())
    model, report = nt.convert(net, exclude=["7"])
    assert [n for n, _ in report.converted] == ["0", "3", "4", "6"]
    why = {n: w for n, _, w in report.native}
    assert why["1"].startswith("min_val -0.5") and why["2"] == "padding_mode 'reflect'"
    assert why["5"] == "not a module nbdnn replaces"
    assert why["7"] == "in exclude" and "nbdnn   0: Conv2d" in str(report)
    assert type(net[0]) is nn.Conv2d and type(model[0]) is nt.modules.Conv2d  # (a copy)
    assert type(model[0]).__name__ == "Conv2d" and isinstance(model[0], nn.Conv2d)
    only, rep = nt.convert(net, include=[nn.Linear, "0"], inplace=True)
    assert only is net and [n for n, _ in rep.converted] == ["0", "6"]
    _, rep = nt.convert(nn.Linear(2, 2, dtype=torch.complex64))  # (a dtype nbdnn lacks)
    assert rep.native == [("", "Linear", "weight is torch.complex64")] and not rep.converted


def test_third_party_classes_by_their_forward():
    """nbdnn/torch/third_party.py: a class of a known (module, name) converts where its
    forward is the one the entry replaces (transformers' Conv1D: weight (in, out), the
    reference's numbers, state_dict keys kept, convert of the converted model a no-op),
    and stays native, saying why, where its forward differs or its act is not GELU."""
    transformers = pytest.importorskip("transformers")
    from transformers.activations import GELUActivation
    from transformers.pytorch_utils import Conv1D
    torch.manual_seed(0)
    net = nn.Sequential(Conv1D(6, 4), GELUActivation(), GELUActivation()).double()
    net[2].act = torch.tanh  # (not a GELU)
    model, report = nt.convert(net)
    assert report.converted == [("0", "Conv1D"), ("1", "GELUActivation")]
    assert report.native == [("2", "GELUActivation", f"its act is {torch.tanh!r}, not the "
                                                     "GELU nbdnn replaces")]
    x = torch.randn(3, 5, 4, dtype=torch.float64)
    torch.testing.assert_close(model(x), net(x), rtol=1e-12, atol=1e-12)
    assert model.state_dict().keys() == net.state_dict().keys()
    again, rep = nt.convert(model)
    assert not rep.converted and rep.native == report.native

    class Conv1D(transformers.pytorch_utils.Conv1D):  # (a class of another forward under
        def forward(self, x):                         # the same module and name)
            return super().forward(x) * 2
    Conv1D.__module__ = "transformers.pytorch_utils"
    _, rep = nt.convert(nn.Sequential(Conv1D(6, 4)))
    assert rep.native == [("0", "Conv1D", "its forward is not the one nbdnn's entry for "
                                          "Conv1D replaces")]


def test_register_teaches_convert_a_class():
    """nbdnn.torch.register: modules of exactly the class get the given forward (a
    subclass of it is not taken), the report lists them, a second register replaces
    the first, a registered torch.nn class runs the user's forward over nbdnn's own,
    and what is not a module class or a callable is a BadParamError."""
    from nbdnn.errors import BadParamError
    from nbdnn.torch import third_party
    calls = []

    class Scale(nn.Module):  # (a hand-written layer convert does not know)
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.full((4,), 3.0, dtype=torch.float64))

        def forward(self, x):
            return x * self.w

    class Sub(Scale):
        pass

    def mine(self, x):
        calls.append(type(self).__name__)
        return nt.linear(x, torch.diag(self.w))
    try:
        assert nt.register(Scale, mine) is Scale
        net = nn.Sequential(Scale(), Sub(), nn.LayerNorm(4, dtype=torch.float64))
        model, rep = nt.convert(net)
        assert [t for _, t in rep.converted] == ["Scale", "LayerNorm"], rep
        assert ("1", "Sub", "not a module nbdnn replaces") in rep.native, rep
        x = torch.randn(2, 4, dtype=torch.float64)
        torch.testing.assert_close(model(x), net(x), rtol=1e-12, atol=1e-12)
        assert calls == ["Scale"]
        nt.register(Scale, lambda self, x: 2 * mine(self, x))  # (replaces the first)
        torch.testing.assert_close(nt.convert(nn.Sequential(Scale()))[0](x), 2 * (x * 3))
        nt.register(nn.LayerNorm, lambda self, x: x + 1)  # (the user's word wins)
        torch.testing.assert_close(nt.convert(nn.Sequential(nn.LayerNorm(4)))[0](x.float()),
                                   x.float() + 1)
        for bad in ((Scale(), mine), (int, mine), (Scale, "forward")):
            with pytest.raises(BadParamError, match="nbdnn.torch.register"):
                nt.register(*bad)
    finally:
        for cls in (Scale, nn.LayerNorm):
            third_party.REGISTERED.pop(cls, None)
            third_party._BUILT.pop(cls, None)


def test_state_dict_both_ways():
    net = small_resnet()
    model, _ = nt.convert(net)
    assert list(model.state_dict()) == list(net.state_dict())
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    fresh = small_resnet()
    fresh.load_state_dict(torch.load(buf))
    for k, v in net.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k
    model.load_state_dict(net.state_dict())


def _train_steps(net, x, labels, steps, lr=0.1):
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(x), labels)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses


@pytest.mark.parametrize("device,dtype,tol", [
    ("cpu", torch.float64, 1e-10),
    pytest.param("cuda", torch.float32, 1e-4, marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason="no CUDA device for torch"))])
def test_converted_resnet_trains_like_native(device, dtype, tol):
    """Forward in eval equal; then SGD steps in training mode (batch statistics, running
    statistics advanced, num_batches_tracked counted): the same losses, parameters and
    buffers. float32 on CUDA with TF32 off, against PyTorch's cuDNN."""
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    net = small_resnet().to(device, dtype)
    model, report = nt.convert(net)
    assert len(report.converted) == 19 and all(w == "not a module nbdnn replaces"
                                               for _, _, w in report.native)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 3, 16, 16, generator=g, dtype=torch.float64).to(device, dtype)
    labels = torch.randint(0, 10, (4,), generator=g).to(device)
    torch.testing.assert_close(model.eval()(x), net.eval()(x), rtol=tol, atol=tol)
    ours, theirs = (_train_steps(m.train(), x, labels, 5) for m in (model, net))
    assert max(abs(a - b) / abs(b) for a, b in zip(ours, theirs)) <= tol, (ours, theirs)
    for (k, a), b in zip(model.state_dict().items(), net.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=tol * 10, atol=tol * 10, msg=k)


def test_compare_rows_and_reference_backend():
    """compare prints a row for each converted layer's output and output gradient and
    each parameter's gradient; on the CPU reference in float64 they agree to rounding.
    convert(backend="cpu") gives the same model on the reference."""
    net = small_resnet().double()
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    out = io.StringIO()
    rows = nt.compare(net, x, file=out)
    assert len(rows) == 2 * 19 + len(list(net.parameters()))
    assert max(r[2] for r in rows) < 1e-12, max(rows, key=lambda r: r[2])
    assert "grad of output" in out.getvalue()
    ref, _ = nt.convert(net, backend="cpu")
    torch.testing.assert_close(ref.eval()(x), net.eval()(x), rtol=1e-12, atol=1e-12)


def test_torchvision_resnet18():
    """torchvision's ResNet-18 (random weights), converted: every Conv2d, BatchNorm2d,
    ReLU, MaxPool2d, AdaptiveAvgPool2d and Linear runs on nbdnn; eval forward and two
    training steps match native in float64 (CPU reference). 64 px: at 32 layer 4's batch
    norm sees 2 x 1 x 1 values a channel, and 1/std amplifies each rounding difference
    (3e-9 in float64)."""
    tv = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    net = tv.models.resnet18(num_classes=10).double()
    model, report = nt.convert(net)
    assert {t for _, t, _ in report.native} == set()
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    torch.testing.assert_close(model.eval()(x), net.eval()(x), rtol=1e-10, atol=1e-10)
    labels = torch.tensor([1, 7])
    ours, theirs = (_train_steps(m.train(), x, labels, 2, lr=0.01) for m in (model, net))
    assert max(abs(a - b) / abs(b) for a, b in zip(ours, theirs)) <= 1e-10


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu-module"])
def test_transformer_encoder_fast_path_goes_through_nbdnn(norm_first, activation):
    """nn.TransformerEncoder in eval under no_grad would take PyTorch's fused fast path
    (and nested tensors with a padding mask), reading the converted children's weights
    and running none of them. Converted, every layer's attention, linears, norms and
    activation (F.relu held as a function; or an nn.GELU module) run nbdnn's ops, and
    the valid positions equal native's (PyTorch leaves padded positions unspecified:
    its nested path returns zeros there); the decoder layer's function too."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.add(func._schema.name)
            return func(*args, **(kwargs or {}))
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(
        16, 4, 32, dropout=0.0, batch_first=True, norm_first=norm_first,
        activation=nn.GELU() if activation == "gelu-module" else torch.nn.functional.relu)
    native = nn.TransformerEncoder(layer, 2, enable_nested_tensor=not norm_first).double().eval()
    model, report = nt.convert(native)
    assert ("layers.0", "TransformerEncoderLayer") in report.converted
    x = torch.randn(3, 7, 16, dtype=torch.float64)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[1, 5:] = True
    for mask in (None, pad):
        seen = set()
        with torch.no_grad():
            want = native(x, src_key_padding_mask=mask)
            with Ops():
                got = model(x, src_key_padding_mask=mask)
        valid = ~pad if mask is not None else torch.ones_like(pad)
        torch.testing.assert_close(got[valid], want[valid], rtol=1e-10, atol=1e-10)
        assert {"nbdnn::scaled_dot_product_attention", "nbdnn::linear", "nbdnn::layer_norm",
                "nbdnn::activation"} <= seen, seen
        assert not any("transformer_encoder_layer" in n for n in seen), seen
    dec, _ = nt.convert(nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0))
    assert dec.activation is nt.relu


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("masks", ["none", "padding", "both-float", "bool", "causal"])
def test_multihead_attention(batch_first, masks):
    """Converted nn.MultiheadAttention with need_weights=False: self-attention (the one
    fused projection) and cross-attention, PyTorch's mask meanings (boolean True
    removes), outputs and every gradient equal native in float64; need_weights=True
    runs PyTorch's own forward."""
    torch.manual_seed(0)
    E, H, N, L, S = 16, 4, 3, 5, 7
    native = nn.MultiheadAttention(E, H, batch_first=batch_first).double()
    model, report = nt.convert(native)
    assert ("", "MultiheadAttention") in report.converted

    def seq(n):
        return torch.randn((N, n, E) if batch_first else (n, N, E), dtype=torch.float64)

    def masks_for(Sk):  # the keyword masks of a call against Sk keys
        g = torch.Generator().manual_seed(Sk)
        kw = {}
        if masks in ("padding", "both-float"):
            kw["key_padding_mask"] = torch.rand(N, Sk, generator=g) > 0.6
            kw["key_padding_mask"][:, 0] = False
        if masks == "both-float":
            kw["attn_mask"] = torch.randn(L, Sk, generator=g, dtype=torch.float64)
        if masks == "bool":
            kw["attn_mask"] = torch.rand(N * H, L, Sk, generator=g) > 0.5
            kw["attn_mask"][..., 0] = False
        if masks == "causal":
            kw = {"attn_mask": nn.Transformer.generate_square_subsequent_mask(
                L, dtype=torch.float64), "is_causal": True}
        return kw
    x, y = seq(L), seq(S)
    for cross in (False, True) if masks != "causal" else (False,):
        outs = []
        for net in (model, native):
            a, b = x.clone().requires_grad_(), y.clone().requires_grad_()
            out, w = net(a, b, b, need_weights=False, **masks_for(S)) if cross else \
                net(a, a, a, need_weights=False, **masks_for(L))
            assert w is None
            leaves = [a, b] if cross else [a]
            outs.append((out, torch.autograd.grad(out.square().sum(),
                                                   leaves + list(net.parameters()))))
        torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-10, atol=1e-10)
        for ga, gb in zip(outs[0][1], outs[1][1]):
            torch.testing.assert_close(ga, gb, rtol=1e-10, atol=1e-10)
    out, w = model(x, x, x)  # (need_weights=True: PyTorch's forward, the weights returned)
    assert w is not None and w.shape == (N, L, L)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device for torch"))])
def test_autocast_bfloat16(device):
    """Under torch.autocast(bfloat16) the converted network casts as PyTorch does
    (convolutions and linears in bfloat16, batch norm in x's dtype with float32
    weights and statistics, log_softmax in float32 on CUDA, in bfloat16 on the CPU): its output and the weights' gradients are
    native's within bfloat16's rounding (largest error over largest value: output 2e-2,
    gradients 6e-2: roundings of bfloat16 activations compound through the layers, and
    nbdnn's convolution weight gradients are bfloat16 where PyTorch's are float32)."""
    net = nn.Sequential(small_resnet(), nn.LogSoftmax(dim=1)).to(device)
    model, _ = nt.convert(net)
    x = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(2)).to(device)
    runs = []
    for m in (model, net):
        with torch.autocast(device, dtype=torch.bfloat16):
            y = m.train()(x)
        runs.append((y, torch.autograd.grad(y.float().square().sum(), list(m.parameters()))))
    (y, gs), (y2, gs2) = runs
    assert y.dtype == y2.dtype == (torch.float32 if device == "cuda" else torch.bfloat16)
    for (a, b), tol in [((y, y2), 2e-2)] + [(g, 6e-2) for g in zip(gs, gs2)]:
        assert float((a.float() - b.float()).abs().max() / b.float().abs().max()) <= tol


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device for torch"))])
def test_autocast_batch_norm_keeps_float32_weights(device):
    """Under torch.autocast(bfloat16) a converted BatchNorm2d takes its float32 weight
    and bias beside bfloat16 x as PyTorch's does: no cast node between them and the op
    (their AccumulateGrad feeds it directly, as native's), their gradients float32 sums
    of the same terms as native's (a bfloat16 round trip was 7e-4 off), and dx, bfloat16
    on both, native's within bfloat16's resolution at dx's scale (the GPU's sums run in
    another order than native's; on an H100 either side's dx was up to 0.007 from the
    float64 gradient at a scale of 3, so elements near 0 round apart)."""
    gen = torch.Generator().manual_seed(4)
    bn = nn.BatchNorm2d(3).to(device)
    with torch.no_grad():
        bn.weight.copy_(torch.rand(3, generator=gen) * 1.5 + 0.5)
    model, _ = nt.convert(bn)
    x, dy = (torch.randn(2, 3, 4, 4, generator=gen).to(device) for _ in range(2))
    dy = dy.to(torch.bfloat16)
    runs = []
    for m in (model, bn):
        with torch.autocast(device, dtype=torch.bfloat16):
            xb = x.to(torch.bfloat16).requires_grad_()
            y = m.train()(xb)
        feeds = [type(f).__name__ for f, _ in y.grad_fn.next_functions if f is not None]
        assert feeds == ["AccumulateGrad"] * 3, feeds
        runs.append(torch.autograd.grad(y, [xb, m.weight, m.bias], dy))
    (dx, *params), (dx_native, *params_native) = runs
    assert dx.dtype == dx_native.dtype == torch.bfloat16
    scale = float(dx_native.float().abs().max())
    torch.testing.assert_close(dx.float(), dx_native.float(), rtol=2 ** -7,
                               atol=2 ** -7 * scale)
    for a, b in zip(params, params_native):
        assert a.dtype == b.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_conv_transpose_module_with_output_size():
    """ConvTranspose2d converted: output_size picks output_padding as PyTorch picks it;
    output and gradients equal native's (float64)."""
    torch.manual_seed(3)
    native = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, groups=2).double()
    model, report = nt.convert(native)
    assert report.converted == [("", "ConvTranspose2d")]
    x = torch.randn(2, 4, 5, 5, dtype=torch.float64)
    outs = []
    for m in (model, native):
        xi = x.clone().requires_grad_()
        y = m(xi, output_size=(10, 10))
        outs.append((y, torch.autograd.grad(y.square().sum(), [xi, *m.parameters()])))
    assert outs[0][0].shape == (2, 6, 10, 10)
    for a, b in [(outs[0][0], outs[1][0])] + list(zip(outs[0][1], outs[1][1])):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("training", [True, False])
def test_converted_model_compiles_fullgraph(training):
    """torch.compile(converted model, fullgraph=True), AOT autograd (aot_eager): no graph
    break through the class-swapped modules (batch norm's statistics bookkeeping
    included); output, gradients and buffers equal the eager converted model's."""
    torch._dynamo.reset()
    net = small_resnet().double()
    eager, _ = nt.convert(net)
    compiled_src, _ = nt.convert(net)
    compiled = torch.compile(compiled_src, fullgraph=True, backend="aot_eager")
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    outs = []
    for m, holder in ((eager, eager), (compiled, compiled_src)):
        holder.train(training)
        y = m(x)
        outs.append((y, torch.autograd.grad(y.square().sum(), list(holder.parameters())),
                     [b.clone() for b in holder.buffers()]))
    (y, g, b), (y2, g2, b2) = outs
    torch.testing.assert_close(y2, y, rtol=1e-12, atol=1e-12)
    for a, c in list(zip(g2, g)) + list(zip(b2, b)):
        torch.testing.assert_close(a, c, rtol=1e-12, atol=1e-12)


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device for torch")


@CUDA
def test_converted_training_step_captured_in_cuda_graph():
    """A converted model's training step (forward, loss, backward; batch norm's running
    statistics advancing) captured by torch.cuda.graph: each replay equals an eager step
    on the same data (the kernels run on the capture stream; nbdnn's workspaces are
    PyTorch's allocations, kept by the graph's pool)."""
    torch.backends.cudnn.allow_tf32 = False
    model, _ = nt.convert(small_resnet().cuda())
    twin, _ = nt.convert(small_resnet().cuda())
    x = torch.randn(4, 3, 16, 16, device="cuda")
    labels = torch.randint(0, 10, (4,), device="cuda")

    def step(m):
        for p in m.parameters():
            p.grad = None
        loss = nn.functional.cross_entropy(m(x), labels)
        loss.backward()
        return loss
    g, static_loss = captured_step(step, model, twin)
    for _ in range(2):
        g.replay()
        want = step(twin)
        torch.testing.assert_close(static_loss, want, rtol=1e-5, atol=1e-5)
    for a, b in zip(model.buffers(), twin.buffers()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@CUDA
def test_dropout_draws_fresh_masks_on_every_graph_replay():
    """Dropout captured by torch.cuda.graph draws a new mask on each replay (its offset
    drawn on the device by torch's capture-safe generator), as PyTorch's dropout does:
    the masks differ between replays, each keeps ~1 - p of the elements, and the
    backward in the same graph uses that replay's mask."""
    torch.manual_seed(0)
    x = torch.ones(1 << 16, device="cuda", requires_grad=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            nt.dropout(x, 0.25).sum().backward()
    torch.cuda.current_stream().wait_stream(s)
    x.grad = None
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = nt.dropout(x, 0.25)
        y.sum().backward()
    outs = []
    for _ in range(3):
        g.replay()
        torch.cuda.synchronize()
        outs.append((y.detach().clone(), x.grad.clone()))
    for i, (out, grad) in enumerate(outs):
        assert set(out.unique().tolist()) <= {0.0, float(torch.tensor(1 / 0.75))}
        assert 0.72 < float((out != 0).float().mean()) < 0.78
        torch.testing.assert_close(grad, out)  # (d(sum y)/dx = mask / (1 - p) = y for x 1)
        if i:
            assert not torch.equal(out, outs[i - 1][0]), "a replay repeated the last mask"


@CUDA
def test_converted_model_compiles_with_inductor():
    """torch.compile(fullgraph=True) with the default backend (inductor) on CUDA: nbdnn's
    custom ops stay opaque calls in the compiled graph; the result equals eager's."""
    torch._dynamo.reset()
    torch.backends.cudnn.allow_tf32 = False
    model, _ = nt.convert(small_resnet().cuda().eval())
    x = torch.randn(4, 3, 16, 16, device="cuda")
    compiled = torch.compile(model, fullgraph=True)
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)


@CUDA
def test_converted_model_trains_under_reduce_overhead():
    """torch.compile(mode="reduce-overhead") (inductor with CUDA-graph trees) over a
    converted model in training: each step's loss, gradients and batch-norm statistics
    equal the eager converted model's on the same data, the graph replays (steps past the
    warm-up) included."""
    torch._dynamo.reset()
    torch.backends.cudnn.allow_tf32 = False
    eager, _ = nt.convert(small_resnet().cuda())
    src, _ = nt.convert(small_resnet().cuda())
    compiled = torch.compile(src, mode="reduce-overhead")
    gen = torch.Generator(device="cuda").manual_seed(3)
    for _ in range(5):
        x = torch.randn(4, 3, 16, 16, device="cuda", generator=gen)
        outs = []
        for m, holder in ((eager, eager), (compiled, src)):
            torch.compiler.cudagraph_mark_step_begin()
            loss = m(x).square().mean()
            grads = torch.autograd.grad(loss, list(holder.parameters()))
            outs.append((loss.detach().clone(), [g.clone() for g in grads],
                         [t.clone() for t in holder.buffers()]))
        (l1, g1, b1), (l2, g2, b2) = outs
        torch.testing.assert_close(l2, l1, rtol=1e-5, atol=1e-6)
        for a, c in list(zip(g2, g1)) + list(zip(b2, b1)):
            torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-5)


def test_channels_last_model_stays_channels_last():
    """A channels-last model and input (model.to(memory_format=torch.channels_last)):
    the converted network runs its convolutions, batch norms, activations and pools as
    NHWC (no layout copies), every intermediate stays channels-last as in PyTorch, and
    output and gradients equal native's (float64)."""
    net = small_resnet().double().to(memory_format=torch.channels_last)
    model, _ = nt.convert(net)
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64).contiguous(
        memory_format=torch.channels_last)
    layouts = []
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.BatchNorm2d, nn.ReLU, nn.MaxPool2d)):
            m.register_forward_hook(lambda m, a, y: layouts.append(
                y.is_contiguous(memory_format=torch.channels_last)))
    outs = []
    for m in (model, net):
        xi = x.clone().requires_grad_()
        y = m.train()(xi)
        outs.append((y, torch.autograd.grad(y.square().sum(), [xi, *m.parameters()])))
    assert layouts and all(layouts)
    assert outs[0][1][0].is_contiguous(memory_format=torch.channels_last)  # (dx)
    for a, b in [(outs[0][0], outs[1][0])] + list(zip(outs[0][1], outs[1][1])):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_one_sample_inputs_as_pytorch():
    """Modules called on one sample (no batch axis) give PyTorch's results: the pool's
    rank is its class's, not the input's."""
    x = torch.randn(3, 9, 8, dtype=torch.float64)
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.AvgPool2d(2), nn.AdaptiveAvgPool2d(1)).double()
    model, report = nt.convert(net)
    assert not report.native
    torch.testing.assert_close(model(x), net(x), rtol=1e-12, atol=1e-12)
    pool1d, _ = nt.convert(nn.MaxPool1d(3, 2))
    torch.testing.assert_close(pool1d(x[0]), nn.MaxPool1d(3, 2)(x[0]), rtol=0, atol=0)


def test_channels_last_outputs_take_in_place_adds_under_autograd():
    """A channels-last model's results are tensors of their own, not views made inside
    the op's autograd.Function, so a residual `out += identity` (torchvision's ResNet)
    trains; its gradient equals native's."""
    net = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)).double()
    model, _ = nt.convert(net)
    x = torch.randn(2, 4, 5, 5, dtype=torch.float64).contiguous(
        memory_format=torch.channels_last)
    grads = []
    for m in (net, model):
        xi = x.clone().requires_grad_()
        y = m(xi)
        y += xi
        grads.append(torch.autograd.grad(y.square().sum(), xi)[0])
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-10, atol=1e-10)

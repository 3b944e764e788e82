"""Real models converted by nbdnn.torch.convert against themselves native (random
weights, configurations built in code, no downloads): torchvision's ViT (a small
VisionTransformer: conv patches, MultiheadAttention, LayerNorm, GELU MLP) and a BERT
encoder from transformers (Linear, LayerNorm, Dropout, Tanh on nbdnn; embeddings and its
functional attention native). float64 on the CPU reference (1e-10), float32 on CUDA with
TF32 off (1e-4); 20 training steps (AdamW) track native's loss curve (relative 1e-3 in
float32). Dropout is 0: the two sides draw masks from different random streams.
Skipped where torchvision / transformers are not installed (CI: torch only)."""
import pytest

torch = pytest.importorskip("torch")
nt = pytest.importorskip("nbdnn.torch")

# (device, dtype, forward tolerance, loss-curve tolerance)
DEVICES = [("cpu", torch.float64, 1e-10, 1e-10), pytest.param(
    "cuda", torch.float32, 1e-4, 1e-3, marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason="no CUDA device for torch"))]


def _steps(model, batch, loss_fn, steps=20, sgd=False):
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9) if sgd else \
        torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(model, batch)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses


def _check(native, batch, loss_fn, forward, tol, loss_tol, steps=20, sgd=False):
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    model, report = nt.convert(native)
    with torch.no_grad():
        want, got = forward(native.eval(), batch), forward(model.eval(), batch)
    assert float((got - want).abs().max() / want.abs().max()) <= tol
    ours, theirs = (_steps(m.train(), batch, loss_fn, steps, sgd) for m in (model, native))
    assert max(abs(a - b) / abs(b) for a, b in zip(ours, theirs)) <= loss_tol, (ours, theirs)
    return report


@pytest.mark.parametrize("device,dtype,tol,loss_tol", DEVICES)
def test_vision_transformer(device, dtype, tol, loss_tol):
    tv = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    native = tv.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2,
                                         num_heads=4, hidden_dim=64, mlp_dim=128,
                                         num_classes=10).to(device, dtype)
    _random_head(native)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 3, 32, 32, generator=g, dtype=torch.float64).to(device, dtype)
    labels = torch.randint(0, 10, (4,), generator=g).to(device)
    report = _check(native, (x, labels),
                    lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]),
                    lambda m, b: m(b[0]), tol, loss_tol)
    kinds = {t for _, t in report.converted}
    assert {"Conv2d", "MultiheadAttention", "LayerNorm", "Linear", "GELU", "Dropout"} <= kinds


@pytest.mark.parametrize("device,dtype,tol,loss_tol", DEVICES)
def test_bert_encoder(device, dtype, tol, loss_tol):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=128,
                                     max_position_embeddings=32, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0,
                                     attn_implementation="eager")  # (no dropout: the two
    # sides draw their masks from different streams)
    native = transformers.BertModel(config).to(device, dtype)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 100, (3, 16), generator=g).to(device)
    mask = torch.ones(3, 16, dtype=torch.long, device=device)
    mask[1, 12:] = 0
    target = torch.randn(3, 16, 64, generator=g, dtype=torch.float64).to(device, dtype)
    report = _check(native, (ids, mask),
                    lambda m, b: (m(b[0], attention_mask=b[1]).last_hidden_state - target)
                    .square().mean(),
                    lambda m, b: m(b[0], attention_mask=b[1]).last_hidden_state, tol, loss_tol)
    assert {"Linear", "LayerNorm", "Dropout"} <= {t for _, t in report.converted}


CUDA_ONLY = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device for torch")


def _random_head(vit):
    """torchvision's ViT starts its head at zero (all logits 0: nothing to compare)."""
    if hasattr(vit, "heads"):
        torch.nn.init.normal_(vit.heads.head.weight, std=0.02)


def _rel(a, b):
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


@CUDA_ONLY
@pytest.mark.parametrize("arch", ["resnet50", "vit_b_16"])
def test_torchvision_full_size_on_cuda(arch):
    """torchvision's ResNet-50 and ViT-B/16 as built (224 px, 1000 classes, random
    weights), batch 4, on the GPU: bf16 autocast logits no further from the float32
    answer than twice native bf16's own distance (bf16's tolerance, measured rather than
    guessed); then float32 with TF32 off: logits within 1e-4, and 20 SGD steps (momentum)
    whose losses track native's within 1e-3, or, where native float32's own curve parts
    from the float64 truth's, stay no further from the truth than twice native's
    distance. (A ReLU network's gradients are discontinuous: a training-mode forward
    that differs by 1e-4, batch norm's 1/std amplifying rounding in layer 4, flips a few
    ReLU masks; ResNet-50's float32 curves 1.7e-3 apart after one step.)"""
    import copy
    tv = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    native = getattr(tv.models, arch)().cuda()
    _random_head(native)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 3, 224, 224, generator=g).cuda()
    labels = torch.randint(0, 1000, (4,), generator=g).cuda()
    model, report = nt.convert(native)
    truth = copy.deepcopy(native).double()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    with torch.no_grad():
        exact = native.eval()(x)
        assert _rel(model.eval()(x), exact) <= 1e-4
        with torch.autocast("cuda", dtype=torch.bfloat16):
            theirs, ours = native(x), model(x)
    assert ours.dtype == theirs.dtype
    assert _rel(ours, exact) <= max(2 * _rel(theirs, exact), 1e-2), (_rel(ours, exact),
                                                                       _rel(theirs, exact))

    def loss(m, b):
        return torch.nn.functional.cross_entropy(m(b[0]), b[1])
    ours, theirs = (_steps(m.train(), (x, labels), loss, 20, sgd=True) for m in (model, native))
    exact = _steps(truth.train(), (x.double(), labels), loss, 20, sgd=True)

    def apart(a, b):
        return max(abs(u - v) / abs(v) for u, v in zip(a, b))
    part, drift, own = apart(ours, theirs), apart(ours, exact), apart(theirs, exact)
    print(f"{arch} float32 losses: nbdnn-native {part:.2e}, nbdnn-float64 {drift:.2e}, "
          f"native-float64 {own:.2e}")
    assert part <= 1e-3 or drift <= 2 * own, (part, drift, own, ours, theirs, exact)
    assert not {t for _, t, _ in report.native} - {"Sequential", "Encoder", "EncoderBlock",
                                                    "MLPBlock", "Bottleneck", "ResNet",
                                                    "VisionTransformer", "ModuleList"}, report


# The same checks on architectures built from torch.nn alone, which CI (torch only,
# no torchvision) runs: ResNet-18's (basic blocks, 2-2-2-2, narrow) and a ViT's
def resnet18_layout(width=16, classes=10):
    from torch import nn

    def block(c_in, c_out, stride):
        down = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False),
                             nn.BatchNorm2d(c_out)) if stride != 1 or c_in != c_out else None
        return _Basic(nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out),
                      nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False), nn.BatchNorm2d(c_out), down)
    layers = [nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width),
              nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
    c = width
    for i, n in enumerate((2, 2, 2, 2)):
        out = width * 2 ** i
        for j in range(n):
            layers.append(block(c, out, 2 if j == 0 and i > 0 else 1))
            c = out
    layers += [nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(), nn.Linear(c, classes)]
    return nn.Sequential(*layers)


class _Basic(torch.nn.Module):
    def __init__(self, conv1, bn1, conv2, bn2, down):
        super().__init__()
        self.conv1, self.bn1, self.conv2, self.bn2, self.down = conv1, bn1, conv2, bn2, down
        self.relu = torch.nn.ReLU(inplace=True)

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return self.relu(y + (self.down(x) if self.down is not None else x))


class _ViT(torch.nn.Module):
    """Patches by a strided Conv2d, a class token, learned positions, pre-norm encoder
    blocks (MultiheadAttention with need_weights=False, a GELU MLP), a linear head."""
    def __init__(self, image=16, patch=4, dim=32, heads=4, layers=2, classes=10):
        super().__init__()
        nn = torch.nn
        self.patch = nn.Conv2d(3, dim, patch, patch)
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)
        self.blocks = nn.ModuleList(nn.ModuleDict({
            "ln1": nn.LayerNorm(dim), "attn": nn.MultiheadAttention(dim, heads, batch_first=True),
            "ln2": nn.LayerNorm(dim), "mlp": nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(),
                                                           nn.Dropout(0.0), nn.Linear(2 * dim, dim))})
            for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for b in self.blocks:
            h = b["ln1"](x)
            x = x + b["attn"](h, h, h, need_weights=False)[0]
            x = x + b["mlp"](b["ln2"](x))
        return self.head(self.norm(x)[:, 0])


@pytest.mark.parametrize("device,dtype,tol,loss_tol", DEVICES)
@pytest.mark.parametrize("arch", ["resnet18", "vit"])
def test_architectures_in_torch_nn(arch, device, dtype, tol, loss_tol):
    torch.manual_seed(0)
    native = (resnet18_layout() if arch == "resnet18" else _ViT()).to(device, dtype)
    g = torch.Generator().manual_seed(1)
    size = 64 if arch == "resnet18" else 16  # (64: layer4's batch norm sees 4 x 2 x 2
    # values a channel; at 32, 2 x 1 x 1, and 1/std amplifies each rounding difference)
    x = torch.randn(4, 3, size, size, generator=g, dtype=torch.float64).to(device, dtype)
    labels = torch.randint(0, 10, (4,), generator=g).to(device)
    report = _check(native, (x, labels),
                    lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]),
                    lambda m, b: m(b[0]), tol, loss_tol, steps=5)
    native_kinds = {t for _, t, _ in report.native}
    assert native_kinds <= {"Flatten", "ModuleDict", "Sequential"}, report


def test_bert_sdpa_under_functional_calls():
    """BERT with transformers' "sdpa" attention under nbdnn.torch.functional_calls():
    its attention calls (functional, not modules) join the converted Linear, LayerNorm
    and GELUActivation modules on nbdnn; the hidden states equal native's (float64)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=128,
                                     max_position_embeddings=32, attn_implementation="sdpa")
    native = transformers.BertModel(config).double().eval()
    model, report = nt.convert(native)
    ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = native(ids).last_hidden_state
        with nt.functional_calls() as calls:
            got = model(ids).last_hidden_state
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    assert "scaled_dot_product_attention" in calls.nbdnn, calls.report()
    assert {"Linear", "LayerNorm", "GELUActivation"} <= {t for _, t in report.converted}


def _decoder(name, device, dtype):
    """A small decoder from transformers' configs: GPT-2 (Conv1D projections, the tanh
    GELU, LayerNorm) or Llama (grouped-query heads, RMSNorm, SiLU, rotary)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if name == "gpt2":
        config = transformers.GPT2Config(vocab_size=128, n_positions=32, n_embd=64, n_layer=2,
                                         n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
                                         attn_pdrop=0.0, attn_implementation="sdpa")
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96,
                                          num_hidden_layers=2, num_attention_heads=4,
                                          num_key_value_heads=2, max_position_embeddings=32,
                                          attn_implementation="sdpa")
        model = transformers.LlamaForCausalLM(config)
    return model.to(device, dtype)


@pytest.mark.parametrize("device,dtype,tol,loss_tol", DEVICES)
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_decoders_convert_their_own_layer_classes(name, device, dtype, tol, loss_tol):
    """GPT-2's Conv1D projections and NewGELUActivation, Llama's LlamaRMSNorm and
    SiLUActivation (transformers' own classes, nbdnn/torch/third_party.py) run on nbdnn,
    beside Linear and LayerNorm: every leaf but the embeddings converted, the logits and
    the loss curve native's, attention under functional_calls, every counted FLOP of the
    forward on nbdnn (flop_share; one projection left native: its share and op named).
    LlamaRMSNorm computes in
    float32 whatever the dtype (and so its replacement): float64 Llama agrees to
    float32's precision."""
    if name == "llama" and dtype == torch.float64:
        tol, loss_tol = 1e-6, 1e-6
    native = _decoder(name, device, dtype)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 128, (2, 16), generator=g).to(device)

    def logits(m, b):
        with nt.functional_calls():
            return m(b).logits

    def loss(m, b):
        with nt.functional_calls():
            return m(b, labels=b).loss

    report = _check(native, ids, loss, logits, tol, loss_tol, steps=5)
    model, _ = nt.convert(native)
    assert nt.flop_share(native, model, ids).on_nbdnn == 1.0
    if name == "gpt2":  # (one projection left native: its addmm, named, and its share;
        # under functional_calls, which takes torch.addmm with a bias, on nbdnn again)
        part, _ = nt.convert(native, exclude=["transformer.h.0.mlp.c_fc"])
        assert nt.flop_share(native, part, ids).on_nbdnn == 1.0
        share = nt.flop_share(native, part, ids, functional=False)
        assert "aten.addmm" in share.by_op and 0.5 < share.on_nbdnn < 1.0, share
    kinds = {t for _, t in report.converted}
    want = {"Conv1D", "NewGELUActivation", "LayerNorm"} if name == "gpt2" else \
        {"Linear", "LlamaRMSNorm", "SiLUActivation"}
    assert want <= kinds, report
    assert {t for _, t, _ in report.native} <= {"Embedding", "LlamaRotaryEmbedding"}, report


@pytest.mark.parametrize("arch,grad_tol", [("mobilenetv3_small_050", 2e-8),
                                           ("convnext_atto", 1e-9), ("efficientnet_b0", 1e-9)])
def test_timm_models_convert_their_own_layer_classes(arch, grad_tol):
    """timm's MobileNetV3 (Hardswish, Hardsigmoid, BatchNormAct2d), ConvNeXt
    (LayerNorm2d, its LayerNorm and GELU classes) and EfficientNet (BatchNormAct2d with
    SiLU) convert every layer that computes (nbdnn/torch/third_party.py); the logits
    equal native's in float64, eval and train, and so do the gradients (MobileNetV3's
    to 2e-8 of the largest: PyTorch's hardsigmoid backward multiplies by 1/6 rounded to
    float32, test_torch_functional.LOOSER, through every squeeze-excite gate)."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    native = timm.create_model(arch, pretrained=False, num_classes=10).double()
    model, report = nt.convert(native)
    assert {t for _, t, _ in report.native} <= {"Identity", "Flatten"}, report
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(1))
    for train in (False, True):
        native.train(train), model.train(train)
        want, got = native(x), model(x)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
        if train:
            gw = torch.autograd.grad(want.square().sum(), list(native.parameters()))
            gg = torch.autograd.grad(got.square().sum(), list(model.parameters()))
            scale = max(float(b.abs().max()) for b in gw)  # (a batch norm's bias before
            # another batch norm has a gradient of 0 up to rounding: not relative to itself)
            for a, b in zip(gg, gw):
                torch.testing.assert_close(a, b, rtol=grad_tol, atol=grad_tol * scale)

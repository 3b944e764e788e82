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


def _steps(model, batch, loss_fn, steps=20):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(model, batch)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses


def _check(native, batch, loss_fn, forward, tol, loss_tol):
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    model, report = nt.convert(native)
    with torch.no_grad():
        want, got = forward(native.eval(), batch), forward(model.eval(), batch)
    assert float((got - want).abs().max() / want.abs().max()) <= tol
    ours, theirs = (_steps(m.train(), batch, loss_fn) for m in (model, native))
    assert max(abs(a - b) / abs(b) for a, b in zip(ours, theirs)) <= loss_tol, (ours, theirs)
    return report


@pytest.mark.parametrize("device,dtype,tol,loss_tol", DEVICES)
def test_vision_transformer(device, dtype, tol, loss_tol):
    tv = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    native = tv.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2,
                                         num_heads=4, hidden_dim=64, mlp_dim=128,
                                         num_classes=10).to(device, dtype)
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

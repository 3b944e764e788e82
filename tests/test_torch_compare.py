"""nbdnn.torch.compare on transformer-style models (outputs that are tuples, dicts or
ModelOutputs; keyword inputs such as an attention mask; converted modules that never
run), and convert's report telling the truth about subclasses of the modules it
replaces, parametrized modules and MultiheadAttention's native calls."""
import io
import math

import pytest

torch = pytest.importorskip("torch")
nt = pytest.importorskip("nbdnn.torch")
nn = torch.nn


def rows_by(rows):
    return {(n, w): (a, r) for n, w, a, r in rows}


def check(rows, tol=1e-10):
    """Every row that ran agrees to tol (float64 models)."""
    ran = [r for r in rows if r[1] != "did not run" and not math.isnan(r[2])]
    assert ran
    bad = [r for r in ran if r[3] > tol and r[2] > tol]
    assert not bad, bad


def test_nn_transformer_compares():
    torch.manual_seed(0)
    model = nn.Transformer(d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                           dim_feedforward=32, dropout=0.0, batch_first=True).double()
    src, tgt = torch.randn(2, 5, 16, dtype=torch.float64), torch.randn(2, 3, 16,
                                                                        dtype=torch.float64)
    rows = nt.compare(model, (src, tgt), kwargs={"tgt_mask": nn.Transformer.
                      generate_square_subsequent_mask(3, dtype=torch.float64)},
                      file=io.StringIO())
    check(rows)


class Heads(nn.Module):
    """Returns a dict, a tuple inside it, and has a head that never runs."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 6)
        self.attn = nn.MultiheadAttention(6, 2, batch_first=True)
        self.unused = nn.Linear(6, 2)
        self.drop = nn.Dropout(0.0)

    def forward(self, x, *, scale):
        h = torch.relu(self.body(x)) * scale
        a, w = self.attn(h, h, h)  # (need_weights: a tuple, PyTorch's forward)
        return {"out": (a, w.sum(-1)), "ids": torch.arange(3)}


def test_dict_and_tuple_outputs_keyword_inputs_and_modules_that_never_run():
    torch.manual_seed(1)
    model = Heads().double()
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    rows = nt.compare(model, x, kwargs={"scale": 2.0}, file=io.StringIO())
    by = rows_by(rows)
    assert ("unused", "did not run") in by and ("drop", "did not run") in by
    assert ("attn", "output 0") in by and ("attn", "grad of output 1") in by
    check(rows)


def test_transformers_bert_compares_with_an_attention_mask():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64,
                                     attn_implementation="eager")
    torch.manual_seed(2)
    model = transformers.BertModel(config).double().eval()
    ids = torch.randint(0, 100, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0
    rows = nt.compare(model, ids, kwargs={"attention_mask": mask}, file=io.StringIO())
    check(rows, tol=1e-9)


def test_torchvision_vit_compares():
    tv = pytest.importorskip("torchvision")
    torch.manual_seed(3)
    model = tv.models.VisionTransformer(image_size=32, patch_size=8, num_layers=1,
                                        num_heads=2, hidden_dim=16, mlp_dim=32,
                                        num_classes=5).double().eval()
    nn.init.normal_(model.heads.head.weight)  # (torchvision starts it at zero)
    rows = nt.compare(model, torch.randn(2, 3, 32, 32, dtype=torch.float64), file=io.StringIO())
    check(rows, tol=1e-9)


class BatchNormAct(nn.BatchNorm2d):
    """timm's BatchNormAct2d's shape: a BatchNorm2d subclass with its own forward and a
    child module."""

    def __init__(self, c):
        super().__init__(c)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(super().forward(x))


def test_the_report_names_subclasses_parametrized_modules_and_partly_native_ones():
    conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(2, 3, 3))
    model = nn.Sequential(nn.Conv2d(3, 4, 3), BatchNormAct(4), nn.Flatten(),
                          nn.Unflatten(1, (4, -1)), conv, nn.MultiheadAttention(4, 2))
    _, report = nt.convert(model)
    native = {n: (t, why) for n, t, why in report.native}
    assert "subclass of BatchNorm2d" in native["1"][1]
    assert native["4"][0].startswith("Parametrized") and "parametrized Conv1d" in native["4"][1]
    assert ("1.act", "ReLU") in report.converted and ("0", "Conv2d") in report.converted
    assert [(n, t) for n, t, _ in report.partly] == [("5", "MultiheadAttention")]
    assert "need_weights=True" in str(report)

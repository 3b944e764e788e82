"""A transformer's training step: nbdnn.nn's model graphed (Sequential.plan:
GraphedSteps) and eager against the same architecture in PyTorch eager, same GPU, same
run.

Models (x: (batch, S, F) -> Linear(F, E) -> + positional embedding -> L pre-norm blocks
(attention with E / heads head dims, GELU MLP of 4 E) -> LayerNorm -> mean over the
sequence -> Linear(E, 10); cross entropy, SGD with momentum):
- "demo": `nbdnn demo --model transformer`'s (digits as 8 rows of 8 pixels: S 8, F 8,
  E 32, 4 heads, 1 block), batch 64;
- "gpt": S 512, F 64, E 512, 8 heads (D 64), 4 causal blocks, batch 16 (attention's
  share of the step is large: nbdnn's tensor-core forward and backward).
PyTorch: nn.TransformerEncoderLayer(norm_first=True, activation="gelu", dropout=0,
batch_first=True), the causal mask given with is_causal=True; fp32, or bf16 under
torch.autocast with float32 parameters. nbdnn: fp32, or plan(precision="bf16") (bf16
parameters and activations, float32 masters). GPU time as perf/suites/resnet50.py:
the median of CUDA-event rounds over back-to-back steps.

    PYTHONPATH=. python perf/suites/transformer_step.py [--models demo gpt]
        [--precisions fp32 bf16] [--json F] [--set MODULE.NAME=VALUE ...]
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

from nbdnn import nn
from resnet50 import gpu_ms  # noqa: E402  (perf/suites/resnet50.py, beside this script)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import switches  # noqa: E402  (perf/tools/switches.py)

MODELS = {"demo": dict(S=8, F=8, E=32, heads=4, blocks=1, causal=False, batch=64),
          "gpt": dict(S=512, F=64, E=512, heads=8, blocks=4, causal=True, batch=16)}
CLASSES = 10


def nbdnn_model(S, F, E, heads, blocks, causal, **_):
    return nn.Sequential([nn.Linear(F, E, seed=0), nn.PositionalEmbedding(S, E, seed=1)] +
                         [nn.TransformerBlock(E, heads, causal=causal, seed=2 + 4 * i)
                          for i in range(blocks)] +
                         [nn.LayerNorm(E), nn.SequenceMean(), nn.Linear(E, CLASSES, seed=99)])


class TorchModel(torch.nn.Module):
    def __init__(self, S, F, E, heads, blocks, causal, **_):
        super().__init__()
        self.inp, self.out = torch.nn.Linear(F, E), torch.nn.Linear(E, CLASSES)
        self.pos = torch.nn.Parameter(torch.randn(S, E) * 0.02)
        self.blocks = torch.nn.ModuleList(torch.nn.TransformerEncoderLayer(
            E, heads, 4 * E, dropout=0.0, activation="gelu", batch_first=True,
            norm_first=True) for _ in range(blocks))
        self.norm = torch.nn.LayerNorm(E)
        self.mask = torch.nn.Transformer.generate_square_subsequent_mask(S) if causal else None
        self.causal = causal

    def forward(self, x):
        h = self.inp(x) + self.pos
        mask = None if self.mask is None else self.mask.to(x.device)
        for b in self.blocks:
            h = b(h, src_mask=mask, is_causal=self.causal)
        return self.out(self.norm(h).mean(1))


def rows_for(name, precision, rows):
    cfg = MODELS[name]
    B, S, Fdim = cfg["batch"], cfg["S"], cfg["F"]
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((B, S, Fdim), np.float32)).cuda()
    labels = torch.from_numpy(rng.integers(0, CLASSES, B)).cuda()
    onehot = torch.nn.functional.one_hot(labels, CLASSES).float()
    key = f"{name}_{precision}"
    for graph in (True, False):
        model = nbdnn_model(**cfg)
        model.to("cuda")
        steps = model.plan(B, (S, Fdim), loss=nn.CrossEntropyLoss(),
                           optimizer=nn.SGD(model, 0.01, momentum=0.9),
                           precision=None if precision == "fp32" else precision, graph=graph)
        xb = x if precision == "fp32" else x.bfloat16()
        for _ in range(3):
            loss = steps.step(xb, onehot)
        rows[f"{key}_nbdnn_loss"] = float(torch.as_tensor(loss).float().reshape(-1)[0])
        run = steps._graphs["step"].replay if graph else (lambda: steps.step(xb, onehot))
        rows[f"{key}_nbdnn_{'graph' if graph else 'eager'}_ms"] = gpu_ms(run, reps=5, rounds=9)
    tm = TorchModel(**cfg).cuda()
    opt = torch.optim.SGD(tm.parameters(), 0.01, momentum=0.9)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", torch.bfloat16, enabled=precision == "bf16"):
            loss = F.cross_entropy(tm(x), labels)
        loss.backward()
        opt.step()
    rows[f"{key}_torch_eager_ms"] = gpu_ms(step, reps=5, rounds=9)
    g, e, t = (rows[f"{key}_{k}_ms"] for k in ("nbdnn_graph", "nbdnn_eager", "torch_eager"))
    print(f"{name:5} {precision}: nbdnn graphed {g:.3f} ms, eager {e:.3f} ms | torch eager "
          f"{t:.3f} ms | graphed / torch {g / t:.2f}x, eager / torch {e / t:.2f}x", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    p.add_argument("--json")
    switches.add_argument(p)
    a = p.parse_args()
    switches.apply(a.set)
    rows = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    for name in a.models:
        for precision in a.precisions:
            rows_for(name, precision, rows)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

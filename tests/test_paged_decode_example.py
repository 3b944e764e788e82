"""examples/paged_decode.py on the CPU reference (float64, a tiny model): its paged
decoder (nbdnn.torch's ops, the keys through a shuffled block table, pages of 4) gives
the plain PyTorch loop's logits at every step, prefill (through the pages, and through
the flash path over the prompt) and decode, and so its tokens."""
import importlib.util
import os

import pytest

torch = pytest.importorskip("torch")

PATH = os.path.join(os.path.dirname(__file__), "..", "examples", "paged_decode.py")


def _example():
    spec = importlib.util.spec_from_file_location("paged_decode", PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_paged_steps_give_the_plain_loops_logits():
    ex = _example()
    cfg = ex.Config(tiny=True)
    p = ex.build(cfg, 2, "cpu", torch.float64)
    B, S0, new, P = 3, 9, 5, 4
    prompt = torch.randint(0, cfg.vocab, (B, S0), generator=torch.Generator().manual_seed(3))
    cache = ex.PagedCache(cfg, 2, B, S0 + new, P, "cpu", torch.float64)
    assert sorted(cache.table.flatten().tolist()) == list(range(B * cache.W))
    assert cache.table.flatten().tolist() != list(range(B * cache.W))  # (shuffled)
    kc = [torch.zeros(B, cfg.kv_heads, S0 + new, cfg.head_dim, dtype=torch.float64)
          for _ in range(2)]
    vc = [torch.zeros_like(c) for c in kc]
    filled = torch.zeros(B, S0 + new, dtype=torch.bool)
    with torch.no_grad():
        cache.lens.fill_(S0)
        filled[:, :S0] = True
        pos = torch.arange(S0).expand(B, S0)
        a = ex.paged_step(p, cfg, cache, prompt, pos)  # (the prompt through the pages)
        b = ex.torch_step(p, cfg, kc, vc, filled, prompt, pos)
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(ex.paged_step(p, cfg, cache, prompt, pos, prefill=True), b,
                                   rtol=1e-10, atol=1e-10)
        tok = a.argmax(-1)[:, None]
        for i in range(new):
            cache.lens.add_(1)
            filled[:, S0 + i] = True
            pos = torch.full((B, 1), S0 + i, dtype=torch.int64)
            a = ex.paged_step(p, cfg, cache, tok, pos)
            b = ex.torch_step(p, cfg, kc, vc, filled, tok, pos)
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
            tok = a.argmax(-1)[:, None]


def test_the_script_runs_and_agrees():
    ours, theirs = _example().main(["--device", "cpu", "--tiny", "--batch", "2", "--prompt",
                                    "5", "--new", "4", "--layers", "1", "--page", "2",
                                    "--dtype", "float64"])
    assert ours.shape == (2, 4) and torch.equal(ours, theirs)

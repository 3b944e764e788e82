"""Serve a small Llama-style decoder with a paged KV cache: every decode step one CUDA
graph replay, attention by nbdnn.torch.paged_attention; beside the plain PyTorch loop
(a contiguous cache, torch's SDPA), tokens/s for each and the tokens they agree on.

    python examples/paged_decode.py [--batch 16] [--prompt 512] [--new 128] [--layers 8]
        [--page 16] [--dtype bfloat16] [--device cuda]
    python examples/paged_decode.py --device cpu --tiny      (a check on the CPU reference)

The model (random weights, built in code): token embedding; `layers` blocks of RMSNorm,
grouped-query attention (32 query heads on 8 kv heads of 64 dims at full size) with
rotary positions, RMSNorm, a SwiGLU MLP; a last RMSNorm and the LM head. Greedy
decoding of `new` tokens after a random prompt of `prompt` tokens a sequence.

The paged cache: a pool of pages (P keys of every kv head each, one pool a layer for K
and one for V), a block table (batch, pages a sequence) and the lengths, all device
tensors. A decode step reads the table and the lengths on the device only (the new
token's K and V written to slot table[b, L // P] * P + L % P by an index_put; attention
over keys 0 .. L), so one captured graph serves every step: the host only advances the
static inputs. The plain loop keeps (batch, kv heads, prompt + new, dims) tensors and
runs torch's SDPA over a boolean mask of the filled positions."""
import argparse
import math
import time

import torch
import torch.nn.functional as F

import nbdnn.torch as nt


class Config:
    def __init__(self, tiny):
        self.vocab, self.dim, self.heads, self.kv_heads, self.hidden = \
            (97, 32, 4, 2, 64) if tiny else (32000, 2048, 32, 8, 5632)
        self.head_dim = self.dim // self.heads


def build(cfg, layers, device, dtype, seed=0):
    """The weights: a dict of tensors (random, scaled as an initialiser would)."""
    g = torch.Generator().manual_seed(seed)

    def w(*shape):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) /
                math.sqrt(shape[-1])).to(device, dtype)
    kv = cfg.kv_heads * cfg.head_dim
    p = {"embed": w(cfg.vocab, cfg.dim), "norm": torch.ones(cfg.dim, device=device,
                                                            dtype=dtype),
         "head": w(cfg.vocab, cfg.dim), "layers": []}
    for _ in range(layers):
        p["layers"].append({"n1": torch.ones(cfg.dim, device=device, dtype=dtype),
                            "n2": torch.ones(cfg.dim, device=device, dtype=dtype),
                            "wq": w(cfg.dim, cfg.dim), "wk": w(kv, cfg.dim),
                            "wv": w(kv, cfg.dim), "wo": w(cfg.dim, cfg.dim),
                            "gate": w(cfg.hidden, cfg.dim), "up": w(cfg.hidden, cfg.dim),
                            "down": w(cfg.dim, cfg.hidden)})
    return p


def rotary(x, pos, theta=10000.0):
    """x (B, S, H, D) rotated by positions pos (B, S): the half-split form."""
    D = x.shape[-1]
    freq = theta ** (-torch.arange(0, D, 2, device=x.device, dtype=torch.float32) / D)
    ang = pos.to(torch.float32)[..., None, None] * freq  # (B, S, 1, D/2)
    cos, sin = ang.cos(), ang.sin()
    a, b = x.float().chunk(2, dim=-1)
    return torch.cat((a * cos - b * sin, a * sin + b * cos), -1).to(x.dtype)


def block_mlp(ops, L, h):
    x = ops.rms_norm(h, (h.shape[-1],), L["n2"], 1e-6)
    return h + ops.linear(ops.silu(ops.linear(x, L["gate"])) * ops.linear(x, L["up"]),
                          L["down"])


def qkv(ops, cfg, L, h, pos):
    B, S, _ = h.shape
    x = ops.rms_norm(h, (h.shape[-1],), L["n1"], 1e-6)
    q = ops.linear(x, L["wq"]).view(B, S, cfg.heads, cfg.head_dim)
    k = ops.linear(x, L["wk"]).view(B, S, cfg.kv_heads, cfg.head_dim)
    v = ops.linear(x, L["wv"]).view(B, S, cfg.kv_heads, cfg.head_dim)
    return rotary(q, pos), rotary(k, pos), v


def logits(ops, p, h):
    return ops.linear(ops.rms_norm(h, (h.shape[-1],), p["norm"], 1e-6), p["head"])


class PagedCache:
    """Pools of pages a layer (K and V: (pages, P, kv heads, dims)), the block table
    (B, W) and the lengths (B,): sequence b's key j in page table[b, j // P], row j % P.
    Pages are handed out in a shuffled order (as an allocator's free list would be)."""

    def __init__(self, cfg, layers, B, capacity, P, device, dtype):
        W = -(-capacity // P)
        self.P, self.W = P, W
        shape = (B * W, P, cfg.kv_heads, cfg.head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(layers)]
        order = torch.randperm(B * W, generator=torch.Generator().manual_seed(1))
        self.table = order.reshape(B, W).to(device, torch.int32)
        self.lens = torch.zeros(B, device=device, dtype=torch.int32)

    def slots(self, pos):
        """The flat slots (B, S) of positions pos (B, S): page * P + row."""
        page = self.table.gather(1, (pos // self.P).long())
        return page.long() * self.P + (pos % self.P).long()

    def write(self, i, k, v, pos):
        """k, v (B, S, Hk, D) into layer i's pools at positions pos (B, S)."""
        at = self.slots(pos).reshape(-1)
        self.k[i].view(-1, *k.shape[2:]).index_put_((at,), k.reshape(-1, *k.shape[2:]))
        self.v[i].view(-1, *v.shape[2:]).index_put_((at,), v.reshape(-1, *v.shape[2:]))


def paged_step(p, cfg, cache, tokens, pos, prefill=False):
    """One forward over tokens (B, S) at positions pos (B, S) on nbdnn, the keys through
    the paged cache (the new ones written first; the lengths already advanced past
    them); prefill (the prompt into an empty cache): attention over the prompt itself
    by the flash kernels, as servers prefill. Returns the last position's logits."""
    h = p["embed"][tokens]
    for i, L in enumerate(p["layers"]):
        q, k, v = qkv(nt, cfg, L, h, pos)
        cache.write(i, k, v, pos)
        if prefill:
            o = nt.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                v.transpose(1, 2), is_causal=True,
                                                enable_gqa=True).transpose(1, 2)
        else:
            o = nt.paged_attention(q, cache.k[i], cache.v[i], cache.table, cache.lens,
                                   causal=True)
        h = h + nt.linear(o.reshape(*h.shape[:2], -1), L["wo"])
        h = block_mlp(nt, L, h)
    return logits(nt, p, h[:, -1])


def torch_step(p, cfg, kc, vc, filled, tokens, pos):
    """The plain loop's forward: contiguous caches (B, Hk, capacity, D) a layer, torch's
    SDPA over the filled positions (filled: (B, capacity) bool, already advanced)."""
    h = p["embed"][tokens]
    B, S = tokens.shape
    rows = torch.arange(B, device=tokens.device)[:, None]
    for i, L in enumerate(p["layers"]):
        q, k, v = qkv(F, cfg, L, h, pos)
        kc[i][rows, :, pos] = k
        vc[i][rows, :, pos] = v
        seen = filled[:, None, None, :] & (torch.arange(kc[i].shape[2], device=h.device)
                                           <= pos[:, :, None])[:, None]
        o = F.scaled_dot_product_attention(q.transpose(1, 2), kc[i], vc[i], attn_mask=seen,
                                           enable_gqa=True).transpose(1, 2)
        h = h + F.linear(o.reshape(B, S, -1), L["wo"])
        h = block_mlp(F, L, h)
    return logits(F, p, h[:, -1])


def generate_paged(p, cfg, prompt, new, P, graphed):
    """Greedy tokens (B, new) on nbdnn with the paged cache; the decode steps one CUDA
    graph replay each where graphed. Returns (tokens, seconds of the decode steps)."""
    B, S0 = prompt.shape
    dev = prompt.device
    cache = PagedCache(cfg, len(p["layers"]), B, S0 + new, P, dev, p["embed"].dtype)
    with torch.no_grad():
        cache.lens.fill_(S0)
        pos0 = torch.arange(S0, device=dev).expand(B, S0)
        nxt = paged_step(p, cfg, cache, prompt, pos0, prefill=True).argmax(-1)
        tok = nxt[:, None].clone()  # static inputs of the decode step
        pos = torch.full((B, 1), S0, device=dev, dtype=torch.int64)

        def step():
            cache.lens.add_(1)
            return paged_step(p, cfg, cache, tok, pos).argmax(-1)
        out = [nxt]
        if graphed:  # warm-up on a side stream (JIT, plans), then capture one step
            lens0 = cache.lens.clone()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                step()
            torch.cuda.current_stream().wait_stream(s)
            cache.lens.copy_(lens0)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                result = step()
        sync(dev)
        t = time.perf_counter()
        for i in range(new - 1):
            if graphed:
                graph.replay()
                nxt = result.clone()
            else:
                nxt = step()
            out.append(nxt)
            tok.copy_(nxt[:, None])
            pos.add_(1)
        sync(dev)
        return torch.stack(out, 1), time.perf_counter() - t


def generate_torch(p, cfg, prompt, new):
    """Greedy tokens (B, new) with PyTorch's ops and contiguous caches, eager."""
    B, S0 = prompt.shape
    dev, dt = prompt.device, p["embed"].dtype
    cap = S0 + new
    kc = [torch.zeros(B, cfg.kv_heads, cap, cfg.head_dim, device=dev, dtype=dt)
          for _ in p["layers"]]
    vc = [torch.zeros_like(c) for c in kc]
    filled = torch.zeros(B, cap, device=dev, dtype=torch.bool)
    with torch.no_grad():
        filled[:, :S0] = True
        pos = torch.arange(S0, device=dev).expand(B, S0)
        nxt = torch_step(p, cfg, kc, vc, filled, prompt, pos).argmax(-1)
        out = [nxt]
        sync(dev)
        t = time.perf_counter()
        for i in range(new - 1):
            at = S0 + i
            filled[:, at] = True
            pos = torch.full((B, 1), at, device=dev, dtype=torch.int64)
            nxt = torch_step(p, cfg, kc, vc, filled, nxt[:, None], pos).argmax(-1)
            out.append(nxt)
        sync(dev)
        return torch.stack(out, 1), time.perf_counter() - t


def sync(dev):
    if torch.device(dev).type == "cuda":
        torch.cuda.synchronize()


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a small model (the CPU check)")
    a = ap.parse_args(argv)
    cfg = Config(a.tiny)
    dtype = getattr(torch, a.dtype)
    p = build(cfg, a.layers, a.device, dtype)
    prompt = torch.randint(0, cfg.vocab, (a.batch, a.prompt),
                           generator=torch.Generator().manual_seed(2)).to(a.device)
    graphed = torch.device(a.device).type == "cuda"
    ours, t_ours = generate_paged(p, cfg, prompt, a.new, a.page, graphed)
    if graphed:
        t_eager = generate_paged(p, cfg, prompt, a.new, a.page, False)[1]
    theirs, t_theirs = generate_torch(p, cfg, prompt, a.new)
    steps = a.batch * (a.new - 1)
    agree = float((ours == theirs).float().mean())
    first = int((ours != theirs).any(0).nonzero()[0]) if agree < 1 else a.new
    print(f"{a.batch} sequences x {a.new} new tokens after {a.prompt}, {a.layers} layers, "
          f"{a.dtype}, pages of {a.page}:")
    print(f"  nbdnn, paged cache{', one CUDA graph a step' if graphed else ''}: "
          f"{steps / t_ours:,.0f} tokens/s")
    if graphed:
        print(f"  nbdnn, paged cache, eager: {steps / t_eager:,.0f} tokens/s")
    print(f"  PyTorch, contiguous cache, eager: {steps / t_theirs:,.0f} tokens/s")
    print(f"  tokens the two agree on: {agree:.1%} (the first difference at step {first})")
    return ours, theirs


if __name__ == "__main__":
    main()

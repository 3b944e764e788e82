"""Attention speed against PyTorch in the same run: nbdnn's
scaled_dot_product_attention forward and backward beside torch's SDPA with its default
backend choice (cuDNN's fused attention on the H200) and with the flash backend alone.

FLOPs: 4 B H Sq Sk D forward, 2.5x that backward, halved for causal (the issue's
count); TFLOP/s from GPU time (nbdnn.bench.time_gpu: CUDA events, median after
warm-up, L2 evicted). Each row also gives the max relative error of nbdnn's o against
torch's float32 math (16-bit inputs) or float64 (float32 inputs).

Rows: B S = TOKENS tokens, HEADS heads, D = 64 and 128, S = 512 .. 16k, causal and not,
bf16 (and fp16, float32 with --dtypes); the backward's error against torch's float32
(float64) autograd where B H S^2 <= 2^28. Decode (--decode): Sq = 1 against Sk = 8k ..
128k keys, batch 1 .. 64, and two grouped-query rows (32 query heads on 8 kv heads, batch
8): GB/s over the K/V cache read, beside a device copy's GB/s (read + write) and torch's
default in the same run, eagerly and replayed from captured graphs (nbdnn.cuda.Graph,
torch.cuda.CUDAGraph: the GPU's time without the host's, which a short cache's call is
bound by). Paged (--paged): nbdnn.paged_attention over a shuffled block table (pages of
16 to 256 keys) at the decode rows' sizes and 4 tokens at once, beside nbdnn's and
torch's attention over the same keys stored contiguously (torch has no paged SDPA).

    PYTHONPATH=. python3 perf/suites/attention.py [--json F] [--dtypes bfloat16 float16]
        [--seqs 512 4096] [--dims 64 128] [--no-backward] [--decode] [--paged] [--quick]
        [--masked] [--window W]
        [--variant NAME] [--set MODULE.NAME=VALUE]   (perf/tools/switches.py)

--window W times causal rows with a sliding window of W keys (window=(W, 0)) instead,
torch's SDPA taking the band as a boolean mask (it has no window), FLOPs over the band's
pairs. --masked times non-causal rows with a boolean key-padding mask instead
(B, 1, 1, Sk), its last eighth of keys out. nbdnn's forward runs cuda/attention/flash.py
at 16-bit D 64 and 128 without a mask (decode_split.py / decode.py for few queries), its
backward flash_bwd.py there; float32, masks, and other head dims run gemm.py. --variant runs nbdnn's calls on
one of nbdnn.cuda.attention's variants (FORWARD, BACKWARD: decode_split, decode, flash,
flash_tf32, gemm, simt) wherever it takes them.
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import nbdnn
from nbdnn.bench import time_gpu, time_graph

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import switches  # noqa: E402  (perf/tools/switches.py)
from resnet50 import torch_graphed  # noqa: E402  (perf/suites/resnet50.py, beside this)

TOKENS, HEADS = 16384, 16


def _flops(B, H, Sq, Sk, D, causal):
    return 4 * B * H * Sq * Sk * D / (2 if causal else 1)


def _peer(q, k, v, causal, backend, mask=None):
    """torch's SDPA (BHSD) with one backend, or its default choice (None)."""
    gqa = q.shape[1] != k.shape[1]

    def run():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                              enable_gqa=gqa)
    if backend is None:
        return run
    def forced():  # noqa: E306
        with sdpa_kernel(backend):
            return run()
    return forced


def _copy_gbs(nbytes):
    """A device copy's GB/s (read + write) of min(nbytes, 4 GiB): a copy's rate holds
    past L2, and the largest cache is 68 GB."""
    n = min(nbytes, 2 ** 32) // 2
    src = torch.empty(n, device="cuda", dtype=torch.int16)
    dst = torch.empty_like(src)
    return 4 * n / time_gpu(lambda: dst.copy_(src)) / 1e9


def _row(dtype, S, D, causal, backward, B=None, Sk=None, Hq=HEADS, Hk=HEADS, masked=False,
         window=None):
    B = B or max(1, TOKENS // S)
    Sk = Sk or S
    tdt = getattr(torch, dtype)
    mask = None
    if masked:  # a key-padding mask: each batch entry's last eighth of keys out
        mask = torch.ones(B, 1, 1, Sk, device="cuda", dtype=torch.bool)
        mask[..., Sk - Sk // 8:] = False
    q = torch.randn(B, Hq, S, D, device="cuda", dtype=tdt)
    k = torch.randn(B, Hk, Sk, D, device="cuda", dtype=tdt)
    v = torch.randn(B, Hk, Sk, D, device="cuda", dtype=tdt)
    flops = _flops(B, Hq, S, Sk, D, causal)
    row = {"dtype": dtype, "B": B, "Hq": Hq, "Hk": Hk, "Sq": S, "Sk": Sk, "D": D,
           "causal": causal, "masked": masked, "window": window}
    gqa = dict(is_causal=causal, enable_gqa=Hq != Hk, attn_mask=mask)
    peer = gqa  # (torch's keywords: SDPA has no window, so its band goes as a mask)
    if window is not None:  # causal, key j in i - window .. i: FLOPs over those pairs
        flops = 4 * B * Hq * D * sum(min(i + 1, window + 1) for i in range(S))
        mask = torch.ones(S, Sk, device="cuda", dtype=torch.bool).tril()
        mask &= ~torch.ones_like(mask).tril(-window - 1)
        gqa, peer = dict(gqa, window=(window, 0)), dict(gqa, is_causal=False, attn_mask=mask)
        causal = False
    o, lse = nbdnn.scaled_dot_product_attention(q, k, v, **gqa)
    hi = torch.float64 if dtype == "float32" else torch.float32
    n = 1 if S == 1 else B  # (decoding: batch entry 0's error; a 64 x 128k cache is 68 GB)
    ref = F.scaled_dot_product_attention(q[:n].to(hi), k[:n].to(hi), v[:n].to(hi), **peer)
    row["rel_err"] = float((o[:n].to(hi) - ref).abs().max() / ref.abs().max())
    t = time_gpu(lambda: nbdnn.scaled_dot_product_attention(q, k, v, **gqa, out=o))
    row["nbdnn_tflops"] = flops / t / 1e12
    for name, backend in (("default", None), ("flash", SDPBackend.FLASH_ATTENTION)):
        try:
            tp = time_gpu(_peer(q, k, v, causal, backend, mask))
            row[f"{name}_tflops"], row[f"x_{name}"] = flops / tp / 1e12, tp / t
        except RuntimeError as e:  # (the flash backend takes no float32)
            row[f"{name}_tflops"], row[f"x_{name}"] = None, str(e).split("\n")[0][:60]
    if S == 1:  # decoding: bandwidth over the K/V cache, beside a copy of as many bytes
        kv = 2 * B * Hk * Sk * D * q.element_size()
        row["kv_gbs"] = kv / t / 1e9
        row["copy_gbs"] = _copy_gbs(kv)
        row["default_gbs"] = kv / time_gpu(_peer(q, k, v, causal, None, mask)) / 1e9
        try:  # the GPU's time alone, both captured (a short cache's call is host-bound)
            row["graph_gbs"] = kv / time_graph(
                lambda: nbdnn.scaled_dot_product_attention(q, k, v, **gqa, out=o)) / 1e9
            row["default_graph_gbs"] = kv / time_gpu(torch_graphed(
                _peer(q, k, v, causal, None, mask))) / 1e9
        except Exception as e:  # (report, keep the row)
            row["graph_gbs"] = row["default_graph_gbs"] = None
            print(f"  (graph timing failed: {str(e).splitlines()[0][:80]})", flush=True)
    if backward:
        do = torch.randn_like(o)
        grads = nbdnn.scaled_dot_product_attention_backward(do, q, k, v, o, lse, **gqa)
        tb = time_gpu(lambda: nbdnn.scaled_dot_product_attention_backward(
            do, q, k, v, o, lse, **gqa))
        qr, kr, vr = (x.detach().requires_grad_() for x in (q, k, v))
        out = F.scaled_dot_product_attention(qr, kr, vr, **peer)
        tpb = time_gpu(lambda: torch.autograd.grad(out, (qr, kr, vr), do, retain_graph=True))
        row["bwd_nbdnn_tflops"] = 2.5 * flops / tb / 1e12
        row["bwd_default_tflops"], row["bwd_x_default"] = 2.5 * flops / tpb / 1e12, tpb / tb
        if B * HEADS * S * Sk <= 2 ** 28:  # (the reference's S x S float32 matrices: 1 GB each)
            hr = [x.detach().to(hi).requires_grad_() for x in (q, k, v)]
            want = torch.autograd.grad(F.scaled_dot_product_attention(*hr, **peer), hr,
                                       do.to(hi))
            row["bwd_rel_err"] = max(float((g.to(hi) - w).abs().max() / w.abs().max())
                                     for g, w in zip(grads, want))
    return row


def _paged_row(dtype, B, Sk, Hq, Hk, D, P, Sq=1):
    """paged_attention over a shuffled page order (pages of P keys, every sequence Sk
    long; Sq > 1: that many tokens decoded at once, bottom-right causal): GB/s over the
    K/V pages read, beside a device copy, nbdnn's own decode over the same keys stored
    contiguously, and torch's default SDPA on those (whose causal alignment is top-left:
    it runs non-causal there, the same bytes), eager and graphed."""
    tdt = getattr(torch, dtype)
    W = -(-Sk // P)
    pages = B * W
    table = torch.randperm(pages, device="cuda", dtype=torch.int32).reshape(B, W)
    lens = torch.full((B,), Sk, device="cuda", dtype=torch.int32)
    kc, vc = (torch.randn(pages, P, Hk, D, device="cuda", dtype=tdt) for _ in range(2))
    q = torch.randn(B, Sq, Hq, D, device="cuda", dtype=tdt)
    causal = Sq > 1
    o, _ = nbdnn.paged_attention(q, kc, vc, table, lens, is_causal=causal)
    # the same keys contiguous (B, Hk, Sk, D): each sequence's pages in table order
    k, v = (c[table.long()].reshape(B, W * P, Hk, D)[:, :Sk].transpose(1, 2).contiguous()
            for c in (kc, vc))
    qb = q.transpose(1, 2).contiguous()
    mask = torch.ones(Sq, Sk, device="cuda", dtype=torch.bool).tril(Sk - Sq) if causal else None
    ref = F.scaled_dot_product_attention(qb[:1].float(), k[:1].float(), v[:1].float(),
                                         attn_mask=mask, enable_gqa=Hq != Hk)
    row = {"dtype": dtype, "paged": P, "B": B, "Hq": Hq, "Hk": Hk, "Sq": Sq, "Sk": Sk, "D": D,
           "causal": causal, "rel_err": float((o[:1].transpose(1, 2).float() - ref).abs().max()
                                               / ref.abs().max())}
    kv = 2 * B * Hk * Sk * D * q.element_size()
    row["copy_gbs"] = _copy_gbs(kv)
    calls = {"paged": lambda: nbdnn.paged_attention(q, kc, vc, table, lens, is_causal=causal,
                                                    out=o),
             "nbdnn_contiguous": lambda: nbdnn.scaled_dot_product_attention(
                 qb, k, v, attn_mask=mask, enable_gqa=Hq != Hk),
             "default": _peer(qb, k, v, False, None)}
    for name, fn in calls.items():
        row[f"{name}_gbs"] = kv / time_gpu(fn) / 1e9
        try:
            graphed = time_graph(fn) if name != "default" else time_gpu(torch_graphed(fn))
            row[f"{name}_graph_gbs"] = kv / graphed / 1e9
        except Exception as e:  # (report, keep the row)
            row[f"{name}_graph_gbs"] = None
            print(f"  ({name} graph timing failed: {str(e).splitlines()[0][:80]})", flush=True)
    return row


def _show_paged(r):
    def rate(name):
        g = r.get(f"{name}_graph_gbs")
        return f"{r[f'{name}_gbs']:.0f}" + (f" / {g:.0f} ({g / r['copy_gbs']:.0%})" if g else "")
    print(f"{r['dtype']:8} paged P {r['paged']:3} B {r['B']:3} H {r['Hq']}/{r['Hk']} Sq {r['Sq']} "
          f"Sk {r['Sk']:6} D {r['D']}: K/V GB/s eager / graphed (of a copy's "
          f"{r['copy_gbs']:.0f}): paged {rate('paged')} | nbdnn contiguous "
          f"{rate('nbdnn_contiguous')} | torch default {rate('default')} "
          f"(err {r['rel_err']:.0e})", flush=True)


def _band(r):
    if r.get("window") is not None:
        return f"window {r['window']}"
    return "causal" if r["causal"] else "masked" if r.get("masked") else "      "


def _show(r):
    peer = " | ".join(f"{n} {r[f'{n}_tflops']:.0f} ({r[f'x_{n}']:.2f}x)" if r[f"{n}_tflops"]
                      else f"{n} -" for n in ("default", "flash"))
    berr = f"{r['bwd_rel_err']:.0e}" if "bwd_rel_err" in r else "- (too large to check)"
    bwd = f" | bwd {r['bwd_nbdnn_tflops']:.1f} vs {r['bwd_default_tflops']:.0f} " \
          f"({r['bwd_x_default']:.2f}x, err {berr})" if "bwd_nbdnn_tflops" in r else ""
    if "kv_gbs" in r:
        bwd += f" | K/V {r['kv_gbs']:.0f} GB/s = {r['kv_gbs'] / r['copy_gbs']:.0%} of a copy's " \
               f"{r['copy_gbs']:.0f}, default {r['default_gbs']:.0f}"
        if r.get("graph_gbs"):
            bwd += f" | graphed {r['graph_gbs']:.0f} ({r['graph_gbs'] / r['copy_gbs']:.0%}), " \
                   f"default {r['default_graph_gbs']:.0f}"
    heads = f" H {r['Hq']}/{r['Hk']}" if r["Hq"] != r["Hk"] else ""
    print(f"{r['dtype']:8} B {r['B']:3}{heads} S {r['Sq']:5}x{r['Sk']:<6} D {r['D']:3} "
          f"{_band(r)}: nbdnn {r['nbdnn_tflops']:7.2f} TFLOP/s | "
          f"{peer}{bwd} (err {r['rel_err']:.0e})", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16"])
    ap.add_argument("--seqs", nargs="*", type=int, default=[512, 1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--dims", nargs="+", type=int, default=[64, 128])
    ap.add_argument("--no-backward", action="store_true")
    ap.add_argument("--decode", action="store_true")
    ap.add_argument("--paged", action="store_true",
                    help="paged_attention's rows (a shuffled block table; Sq 4: bottom-right)")
    ap.add_argument("--quick", action="store_true", help="S 512 and 2048, D 128 only")
    ap.add_argument("--masked", action="store_true",
                    help="rows with a key-padding mask instead (non-causal: torch takes no "
                         "mask with is_causal)")
    ap.add_argument("--window", type=int, help="causal rows with a sliding window of this "
                    "many keys left of the diagonal (torch: the band as a boolean mask)")
    ap.add_argument("--variant", help="nbdnn's calls on this variant (attention.forced)")
    switches.add_argument(ap)
    args = ap.parse_args()
    switches.apply(args.set)
    if args.variant:
        from nbdnn.cuda.attention import forced
        with forced(args.variant):
            return _run(args)
    return _run(args)


def _run(args):
    seqs, dims = ([512, 2048], [128]) if args.quick else (args.seqs, args.dims)
    rows = []
    for dtype in args.dtypes:
        for D in dims:
            for S in seqs:
                if args.window is not None:
                    rows.append(_row(dtype, S, D, True, not args.no_backward,
                                     window=args.window))
                    _show(rows[-1])
                    continue
                for causal, masked in ((False, True),) if args.masked else \
                        ((False, False), (True, False)):
                    rows.append(_row(dtype, S, D, causal, not args.no_backward, masked=masked))
                    _show(rows[-1])
        if args.decode:
            for Sk in (8192, 32768, 131072):
                for B in (1, 8, 64):
                    rows.append(_row(dtype, 1, 128, False, False, B=B, Sk=Sk))
                    _show(rows[-1])
            for Sk in (32768, 131072):  # grouped-query heads: 4 query rows a kv head
                rows.append(_row(dtype, 1, 128, False, False, B=8, Sk=Sk, Hq=32, Hk=8))
                _show(rows[-1])
        if args.paged:  # issue's decode rows through a paged cache, and multi-token decode
            for B, Sk, Hq, Hk, P, Sq in ((16, 8192, 32, 32, 16, 1), (16, 32768, 32, 8, 16, 1),
                                         (1, 131072, 32, 8, 256, 1), (64, 4096, 32, 8, 16, 1),
                                         (16, 32768, 32, 8, 128, 1), (16, 8192, 32, 8, 16, 4)):
                rows.append(_paged_row(dtype, B, Sk, Hq, Hk, 128, P, Sq))
                _show_paged(rows[-1])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

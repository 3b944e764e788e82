"""conv2d speed against cuDNN (torch.nn.functional.conv2d, cudnn.benchmark on, TF32
off) in the same run, float32 or (--dtype) float16 / bfloat16: the ResNet-50 layer set (batch 32: the 7x7/2 stem and the 1x1
and 3x3 layers of each stage) and MobileNet's depthwise 3x3 layers; forward for every
nbdnn algorithm, backward data and filter, and conv+bias+relu fused against three
nbdnn calls. fp32, NCHW (--nhwc for channels-last). Prints TFLOP/s (2*N*K*P*Q*C/g*R*S
per pass), the ratio to cuDNN and the geometric means; backward data and filter each
against cuDNN's alone (aten.convolution_backward with one output).

"auto" is what a caller gets by default (depthwise kernels for groups == C, Winograd
for 3x3/1 layers of >= 32 channels, implicit GEMM otherwise); backward passes run
"auto". Geometric means over all layers and over the ResNet and depthwise sets apart.

Every nbdnn time is taken twice: eager (a Python call, as cuDNN's is) and replayed
from a captured nbdnn.cuda.Graph, which is the GPU's time alone. cuDNN's eager call
is one launch whose ~35 us of host time the 256 MiB flush before each run hides, so
its eager time is its GPU time; an nbdnn call of several launches (winograd: four,
channels-first implicit GEMM: two) can take longer on the host than the flush, and
then its eager time carries host time. The ratios and
geometric means are of the graph times; "eager" columns show the other.

    PYTHONPATH=. python perf/suites/conv.py [--nhwc] [--dtype bfloat16] [--json F]
        [--algos auto implicit_gemm direct] [--math tf32 --algos auto]
        [--set conv:gemm]   (a forced variant or a module switch: perf/tools/switches.py)
        [--against conv:as_forward]   (both sides, one run)
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

import nbdnn
from conv_layers import DEPTHWISE, RESNET
from nbdnn.bench import time_gpu, time_graph

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import switches  # noqa: E402  (perf/tools/switches.py)


def _geo(layer, batch=32):
    _, C, K, H, R, s, p, g = layer
    P = (H + 2 * p - R) // s + 1
    return dict(C=C, K=K, H=H, R=R, s=s, p=p, g=g, P=P,
                flops=2 * batch * K * P * P * (C // g) * R * R)


def _case(layer, nhwc, batch=32, dtype="float32"):
    d = _geo(layer, batch)
    dt = getattr(torch, dtype)
    x = torch.randn(batch, d["C"], d["H"], d["H"], device="cuda").to(dt)
    w = (torch.randn(d["K"], d["C"] // d["g"], d["R"], d["R"], device="cuda") * 0.1).to(dt)
    if nhwc:  # nbdnn takes NHWC as (N, H, W, C) / (K, R, S, C); torch as channels_last
        xn, wn = x.permute(0, 2, 3, 1).contiguous(), w.permute(0, 2, 3, 1).contiguous()
        x, w = x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last)
    else:
        xn, wn = x, w
    return d, x, w, xn, wn


def _tiles(xn, wn, kw, flops, t_ref):
    """implicit_gemm TFLOP/s with each tile size forced."""
    from nbdnn.cuda import conv as CV
    out, plan = {}, CV._plan
    try:
        for size in ("large", "small", "tiny"):
            CV._plan = lambda *a, s=size: (s, 1)
            nbdnn.conv2d(xn, wn, algo="implicit_gemm", **kw)
            t = time_gpu(lambda: nbdnn.conv2d(xn, wn, algo="implicit_gemm", **kw))
            out[size] = round(flops / t / 1e12, 2)
    finally:
        CV._plan = plan
    print("   implicit_gemm tiles (TFLOP/s):", out, f"cuDNN {flops / t_ref / 1e12:.1f}",
          flush=True)
    return out


def _timed(fn):
    """(eager seconds, graph-replay seconds) of fn()."""
    return time_gpu(fn), time_graph(fn)


def _against(settings, kw, xn, wn, y_ref, t_fwd, bwd=None):
    """The layer again with `settings` applied (switches.applied): nbdnn's "auto"
    forward and, given bwd = (dy, data reference, filter reference, data s, filter s),
    both gradients, graph-timed; {"fwd_x": old time / new, "data_x", "filter_x", and
    each one's relative error}. Both sides in one process: one JIT, the peer once."""
    def err(a, b):
        return float((a.float() - b.float()).abs().max() / b.float().abs().max())
    out = {}
    with switches.applied(settings):
        y = nbdnn.conv2d(xn, wn, **kw)
        out["fwd_err"] = err(y, y_ref)
        out["fwd_x"] = t_fwd / time_graph(lambda: nbdnn.conv2d(xn, wn, out=y, **kw))
        if bwd is not None:
            dy, gx, gw, td, tf = bwd
            dx, dw = torch.empty_like(xn), torch.empty_like(wn)
            out["data_x"] = td / time_graph(lambda: nbdnn.conv_backward_data(
                dy, wn, tuple(xn.shape), out=dx, **kw))
            out["filter_x"] = tf / time_graph(lambda: nbdnn.conv_backward_filter(
                dy, xn, tuple(wn.shape), out=dw, **kw))
            out["data_err"], out["filter_err"] = err(dx, gx), err(dw, gw)
    print("   with " + " ".join(settings) + ": " + ", ".join(
        f"{k[:-2]} {v:.2f}x" for k, v in out.items() if k.endswith("_x")) +
        " the speed (errors " + ", ".join(f"{v:.0e}" for k, v in out.items()
                                          if k.endswith("_err")) + ")", flush=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nhwc", action="store_true")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                    help="16-bit channels-last runs the tensor cores")
    ap.add_argument("--json")
    ap.add_argument("--algos", nargs="*", default=["auto", "implicit_gemm"])
    ap.add_argument("--layers", nargs="*", default=[],
                    help="only the layers whose name holds one of these substrings")
    ap.add_argument("--no-backward", action="store_true")
    ap.add_argument("--math", default="ieee", choices=["ieee", "tf32", "3xtf32"],
                    help="float32's math mode for nbdnn; cuDNN's TF32 on unless ieee")
    ap.add_argument("--tiles", action="store_true",
                    help="also implicit_gemm with each GEMM tile forced (ResNet layers)")
    switches.add_argument(ap)
    ap.add_argument("--against", action="append", default=[],
                    metavar="FAMILY:VARIANT|MODULE.NAME=VALUE",
                    help="also time each layer's auto forward and gradients with these "
                         "switches, in the same process (repeatable; one set)")
    args = ap.parse_args()
    switches.apply(args.set)
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = args.math != "ieee"
    nbdnn.set_math(args.math)  # (float32 only; algorithms that do not run it are skipped)
    layout = "NHWC" if args.nhwc else "NCHW"
    rows, ratios = [], {a: [] for a in args.algos + ["bwd_data", "bwd_filter"]}
    for layer in RESNET + DEPTHWISE:
        if args.layers and not any(t in layer[0] for t in args.layers):
            continue
        d, x, w, xn, wn = _case(layer, args.nhwc, dtype=args.dtype)
        part = "depthwise" if layer in DEPTHWISE else "resnet"
        kw = dict(stride=d["s"], padding=d["p"], groups=d["g"], layout=layout)
        t_ref = time_gpu(lambda: F.conv2d(x, w, stride=d["s"], padding=d["p"], groups=d["g"]))
        row = {"layer": layer[0], "cudnn_tflops": d["flops"] / t_ref / 1e12}
        ref = F.conv2d(x, w, stride=d["s"], padding=d["p"], groups=d["g"])
        ref_n = ref.permute(0, 2, 3, 1) if args.nhwc else ref
        for algo in args.algos:
            try:
                y = nbdnn.conv2d(xn, wn, algo=algo, **kw)
            except nbdnn.BadParamError:  # e.g. winograd on a 1x1 layer
                row[algo] = None
                continue
            err = float((y - ref_n).abs().max() / ref_n.abs().max())
            te, t = _timed(lambda: nbdnn.conv2d(xn, wn, algo=algo, out=y, **kw))
            row[algo] = {"tflops": d["flops"] / t / 1e12, "vs_cudnn": t_ref / t,
                         "eager_vs_cudnn": t_ref / te, "rel_err": err}
            ratios[algo].append((part, t_ref / t))
        if args.tiles and d["g"] == 1:
            row["tiles"] = _tiles(xn, wn, kw, d["flops"], t_ref)
        line = " | ".join(f"{a} {row[a]['tflops']:6.2f} ({row[a]['vs_cudnn']:.0%}, eager "
                          f"{row[a]['eager_vs_cudnn']:.0%}, err {row[a]['rel_err']:.0e})"
                          for a in args.algos if row[a])
        rows.append(row)
        if args.no_backward:
            print(f"{layer[0]:18} cuDNN {row['cudnn_tflops']:6.1f} TFLOP/s | {line}", flush=True)
            if args.against and row.get("auto"):
                row["against"] = _against(args.against, kw, xn, wn, ref_n,
                                          d["flops"] / row["auto"]["tflops"] / 1e12)
            continue
        dy = torch.randn_like(ref_n)
        xr = x.detach().requires_grad_()
        wr = w.detach().requires_grad_()
        out = F.conv2d(xr, wr, stride=d["s"], padding=d["p"], groups=d["g"])
        g = dy.permute(0, 3, 1, 2) if args.nhwc else dy
        tb_ref = time_gpu(lambda: torch.autograd.grad(out, (xr, wr), g, retain_graph=True))
        # cuDNN's data and filter gradients apart: aten.convolution_backward with one
        # output each (the pair's time split evenly was runs AK-AM's approximation)
        gc = g.contiguous(memory_format=torch.channels_last) if args.nhwc else g.contiguous()
        cb = lambda mask: torch.ops.aten.convolution_backward(  # noqa: E731
            gc, x, w, None, [d["s"]] * 2, [d["p"]] * 2, [1, 1], False, [0, 0], d["g"], mask)
        td_ref = time_gpu(lambda: cb([True, False, False]))
        tf_ref = time_gpu(lambda: cb([False, True, False]))
        dx, dw = torch.empty_like(xn), torch.empty_like(wn)
        tde, td = _timed(lambda: nbdnn.conv_backward_data(dy, wn, tuple(xn.shape), out=dx, **kw))
        tfe, tf = _timed(lambda: nbdnn.conv_backward_filter(dy, xn, tuple(wn.shape), out=dw,
                                                            **kw))
        gx, gw = (t.permute(0, 2, 3, 1) if args.nhwc else t for t in
                  torch.autograd.grad(out, (xr, wr), g, retain_graph=True))
        errs = [float((a.float() - b.float()).abs().max() / b.float().abs().max())
                for a, b in ((dx, gx), (dw, gw))]
        row["bwd"] = {"cudnn_both_ms": tb_ref * 1e3, "cudnn_data_ms": td_ref * 1e3,
                      "cudnn_filter_ms": tf_ref * 1e3, "data_ms": td * 1e3, "filter_ms": tf * 1e3,
                      "data_eager_ms": tde * 1e3, "filter_eager_ms": tfe * 1e3,
                      "data_rel_err": errs[0], "filter_rel_err": errs[1]}
        ratios["bwd_data"].append((part, td_ref / td))
        ratios["bwd_filter"].append((part, tf_ref / tf))
        print(f"{layer[0]:18} cuDNN {row['cudnn_tflops']:6.1f} TFLOP/s | {line} | bwd data "
              f"{td*1e3:.3f} ms (eager {tde*1e3:.3f}; cuDNN {td_ref*1e3:.3f}), filter "
              f"{tf*1e3:.3f} ms (eager {tfe*1e3:.3f}; cuDNN {tf_ref*1e3:.3f}) (cuDNN both "
              f"{tb_ref*1e3:.3f} ms; err {errs[0]:.0e}, {errs[1]:.0e})", flush=True)
        if args.against and row.get("auto"):
            row["against"] = _against(args.against, kw, xn, wn, ref_n,
                                      d["flops"] / row["auto"]["tflops"] / 1e12,
                                      (dy, gx, gw, td, tf))
    geo = {}
    for part in ("all", "resnet", "depthwise"):
        geo[part] = {}
        for k, v in ratios.items():
            vals = [r for p, r in v if part in ("all", p)]
            if vals:
                geo[part][k] = math.exp(sum(map(math.log, vals)) / len(vals))
        print(f"geometric mean vs cuDNN, {part}:",
              {k: f"{v:.0%}" for k, v in geo[part].items()})
    if args.against:
        got = [r["against"] for r in rows if "against" in r]
        geo["against"] = {k: math.exp(sum(math.log(a[k]) for a in got) / len(got))
                          for k in ("fwd_x", "data_x", "filter_x") if got and k in got[0]}
        print("with " + " ".join(args.against) + ", geometric mean speed over without:",
              {k[:-2]: f"{v:.2f}x" for k, v in geo["against"].items()})
    d, x, w, xn, wn = _case(RESNET[2], args.nhwc, dtype=args.dtype)
    bias = torch.randn(d["K"], device="cuda").to(x.dtype)
    kw = dict(padding=1, layout=layout)
    y = nbdnn.conv2d(xn, wn, **kw)
    b = bias.reshape((1, 1, 1, -1) if args.nhwc else (1, -1, 1, 1))
    fused_e, fused = _timed(lambda: nbdnn.conv2d(xn, wn, bias, activation="relu", out=y, **kw))
    three_e, three = _timed(lambda: nbdnn.activation(nbdnn.add_tensor(
        b, nbdnn.conv2d(xn, wn, out=y, **kw), out=y), "relu", out=y))
    print(f"conv+bias+relu (s1 3x3 64): fused {fused*1e3:.3f} ms, three calls {three*1e3:.3f} "
          f"ms (eager {fused_e*1e3:.3f} vs {three_e*1e3:.3f} ms)")
    # a wrong answer is not a speed: every error past 16-bit accumulation's reach (run
    # AO's conv.py printed two relative errors of 1.2 among the speeds, a staging-tile
    # race) is named at the end, and the exit status is 1
    limit = 1e-4 if args.dtype == "float32" and args.math == "ieee" else 3e-2
    bad = [f"{r['layer']} {k} {e:.1e}" for r in rows for k, e in
           [(a, r[a]["rel_err"]) for a in args.algos if r.get(a)] +
           [(k, r["bwd"][k]) for k in ("data_rel_err", "filter_rel_err") if "bwd" in r]
           if not e <= limit] + \
        [f"{r['layer']} {k} with {' '.join(args.against)} {e:.1e}" for r in rows
         for k, e in r.get("against", {}).items() if k.endswith("_err") and not e <= limit]
    print(f"errors over {limit:.0e}: " + (", ".join(bad) if bad else "none"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"dtype": args.dtype, "rows": rows, "geomean": geo, "fused_ms": fused * 1e3,
                       "fused_eager_ms": fused_e * 1e3, "three_calls_eager_ms": three_e * 1e3,
                       "three_calls_ms": three * 1e3, "errors": bad}, f, indent=1)
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()

"""perf/RESULTS.md's measured tables, rendered from the results perf/run.py writes.

A result is OUT/NAME.json, {"machine": {gpu, driver, versions, commit, when}, "rows":
...}, written by `perf/run.py bench` (NAME "bench") or `perf/run.py suite NAME`. The
newest of each is kept as perf/results/NAME.json (copied there from the device call's
files); `python tools/generate.py` rewrites RESULTS.md's generated block from them, one
table a result, each row beside its peer measured in the same process. Renderers below
name the columns each suite's rows carry (a suite without one renders no table and
says so). No torch here: CI renders the block without a GPU."""
import json
import math
import os

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def _num(v, fmt):
    return "–" if v is None or isinstance(v, str) or (isinstance(v, float) and
                                                     not math.isfinite(v)) else fmt.format(v)


def _bench(rows):
    """nbdnn bench: an op's row, bandwidth against the device copy in the same run."""
    rows = rows.get("rows", rows)  # (nbdnn bench writes {"meta", "rows"})
    head = "| op | shape | dtype | timing | GB/s | % copy | TFLOP/s | × PyTorch |"
    out = [head, "|---" * (head.count("|") - 1) + "|"]
    for r in rows:
        out.append(f"| {r['op']} | {r['shape']} | {r['dtype']} | {r.get('timing', 'eager')} | "
                   f"{_num(r.get('gbps'), '{:.0f}')} | {_num(r.get('pct_copy'), '{:.0f}%')} | "
                   f"{_num(r.get('tflops'), '{:.1f}')} | {_num(r.get('vs_torch'), '{:.2f}×')} |")
    return out


def _gemm(rows):
    """perf/suites/gemm.py: TFLOP/s beside cuBLAS (torch.matmul), the error against
    cuBLAS's float32 product."""
    out = ["| M × N × K | row | nbdnn TFLOP/s | cuBLAS TFLOP/s | × cuBLAS | rel. error |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        shape = " × ".join(str(v) for v in r["shape"]) if isinstance(r.get("shape"), list) \
            else str(r.get("shape", "–"))
        out.append(f"| {shape} | {r.get('row', '')} | {_num(r.get('tflops'), '{:.1f}')} | "
                   f"{_num(r.get('cublas_tflops'), '{:.1f}')} | "
                   f"{_num(r.get('ratio'), '{:.2f}×')} | {_num(r.get('rel_err'), '{:.1e}')} |")
    return out


def _conv(result):
    """perf/suites/conv.py: each layer's "auto" forward and gradients beside cuDNN (graph
    replay), the geometric means."""
    out = ["| layer | cuDNN TFLOP/s | auto TFLOP/s | × cuDNN | data × cuDNN | filter × cuDNN |",
           "|---|---|---|---|---|---|"]
    for r in result.get("rows", []):
        auto, bwd = r.get("auto") or {}, r.get("bwd") or {}
        data = bwd["cudnn_data_ms"] / bwd["data_ms"] if bwd.get("data_ms") else None
        filt = bwd["cudnn_filter_ms"] / bwd["filter_ms"] if bwd.get("filter_ms") else None
        out.append(f"| {r['layer']} | {_num(r.get('cudnn_tflops'), '{:.1f}')} | "
                   f"{_num(auto.get('tflops'), '{:.1f}')} | "
                   f"{_num(auto.get('vs_cudnn'), '{:.2f}×')} | {_num(data, '{:.2f}×')} | "
                   f"{_num(filt, '{:.2f}×')} |")
    for part, means in (result.get("geomean") or {}).items():
        cells = ", ".join(f"{k} {v:.2f}×" for k, v in means.items())
        out.append(f"| geomean, {part} | | | {cells} | | |")
    return out


def _attention(rows):
    """perf/suites/attention.py: forward (and backward) TFLOP/s beside torch's default
    SDPA; decoding rows as K/V bandwidth."""
    out = ["| dtype | B × Hq/Hk × Sq × Sk × D | causal | nbdnn TFLOP/s | × torch | "
           "backward × torch | K/V GB/s | rel. error |", "|---|---|---|---|---|---|---|---|"]
    paged = [r for r in rows if "paged" in r]
    for r in rows:
        if "paged" in r:
            continue
        geo = f"{r['B']} × {r['Hq']}/{r['Hk']} × {r['Sq']} × {r['Sk']} × {r['D']}"
        out.append(f"| {r['dtype']} | {geo} | {'yes' if r.get('causal') else 'no'} | "
                   f"{_num(r.get('nbdnn_tflops'), '{:.0f}')} | "
                   f"{_num(r.get('x_default'), '{:.2f}×')} | "
                   f"{_num(r.get('bwd_x_default'), '{:.2f}×')} | "
                   f"{_num(r.get('kv_gbs'), '{:.0f}')} | {_num(r.get('rel_err'), '{:.1e}')} |")
    if paged:  # (--paged: K/V GB/s graphed, beside a copy and the contiguous caches)
        out += ["", "| dtype | page | B × Hq/Hk × Sq × Sk × D | paged GB/s (of copy) | "
                "nbdnn contiguous | torch contiguous | rel. error |",
                "|---|---|---|---|---|---|---|"]
        for r in paged:
            geo = f"{r['B']} × {r['Hq']}/{r['Hk']} × {r['Sq']} × {r['Sk']} × {r['D']}"
            got = r.get("paged_graph_gbs") or r["paged_gbs"]
            out.append(f"| {r['dtype']} | {r['paged']} | {geo} | {got:.0f} "
                       f"({got / r['copy_gbs']:.0%}) | "
                       f"{_num(r.get('nbdnn_contiguous_graph_gbs'), '{:.0f}')} | "
                       f"{_num(r.get('default_graph_gbs'), '{:.0f}')} | "
                       f"{_num(r.get('rel_err'), '{:.1e}')} |")
    return out


def _torch_models(rows):
    """perf/suites/torch_models.py --models: each model native and converted in one
    process, GPU ms by CUDA events (eager: the step's wall time on the GPU's clock), the
    ratio native / nbdnn (>= 1: as fast or faster), peak memory of the training step."""
    out = ["| model | config | mode | native ms | nbdnn ms | × native's speed |",
           "|---|---|---|---|---|---|"]
    notes = []
    for r in rows:
        for config, got in (r.get("configs") or {}).items():
            for mode in ("train", "train-graphed", "train-compiled", "infer", "infer-graphed",
                         "infer-compiled"):
                if mode in got:
                    native, ours = got[mode]
                    out.append(f"| {r['model']} | {config} | {mode} | {native:.2f} | "
                               f"{ours:.2f} | {native / ours:.2f}× |")
            mem = got.get("train_peak_bytes")
            if mem:
                notes.append(f"{r['model']} {config}: training step's peak memory "
                             f"{mem[1] / 2**30:.2f} GiB against native's {mem[0] / 2**30:.2f} "
                             f"({mem[1] / mem[0]:.2f}×)")
            if "first_step_s" in got:  # (the converted model's, after native ran its own)
                notes.append(f"{r['model']} {config}: the converted model's first training "
                             f"step {got['first_step_s']:.1f} s (its kernels' JIT or cache "
                             f"loads)")
        notes.append(f"{r['model']}: {100 * r.get('flops_on_nbdnn', 0):.1f}% of the forward's "
                     f"FLOPs on nbdnn; {r.get('kernels_compiled', '?')} kernels compiled or "
                     f"loaded")
    return out + [""] + [f"- {n}" for n in notes]


RENDERERS = {"bench": _bench, "gemm": _gemm, "conv": _conv, "attention": _attention,
             "torch_models": _torch_models}


def machine_line(m):
    """The machine a result was measured on, as one line."""
    v = m.get("versions") or {}
    ver = ", ".join(f"{k} {v[k]}" for k in sorted(v)) or m.get("note") or "versions ?"
    return f"{m.get('gpu') or '?'}, driver {m.get('driver') or '?'}; {ver}; commit " \
           f"{m.get('commit') or '?'}, {m.get('when') or '?'}"


def render(results=RESULTS):
    """The generated block's lines: a section a result in `results` (sorted by name)."""
    names = sorted(f[:-5] for f in os.listdir(results) if f.endswith(".json")) \
        if os.path.isdir(results) else []
    if not names:
        return ["No results recorded yet: `perf/run.py bench` or `perf/run.py suite NAME` on "
                "the GPU, then its NAME.json into perf/results/ and `python tools/generate.py`."]
    out = []
    for name in names:
        result = json.load(open(os.path.join(results, f"{name}.json")))
        out += [f"### {name}", "", machine_line(result.get("machine") or {}), ""]
        render_rows = RENDERERS.get(name.split("-", 1)[0])  # (NAME-PART: a later run of
        # some of a suite's rows)
        out += render_rows(result.get("rows", [])) if render_rows else \
            [f"(no renderer for {name!r} in perf/report.py)"]
        out.append("")
    return out[:-1]

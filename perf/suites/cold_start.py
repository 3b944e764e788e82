"""Cold start: seconds from a fresh Python process's start to its first result, native
PyTorch beside nbdnn.torch with the kernel cache cold (an empty folder) and warm (the
folder the cold run filled), and cold with nbdnn.torch.precompile before the first
result (its own empty folder: the kernels compiled by forked workers, counted in the
first result's time), each in its own process.

  resnet18-forward    torchvision ResNet-18 (random weights), eval, batch 8, float32:
                      the first forward's logits on the host
  resnet50-bf16-step  torchvision ResNet-50, channels-last, one training step (bf16
                      autocast forward, cross-entropy, backward, SGD), batch 32

A child prints its own phases (imports; model built, converted and moved; the first
result) and the parent the process's whole wall time (interpreter start included).

    PYTHONPATH=. python perf/suites/cold_start.py [--models resnet18-forward ...]
        [--cache DIR]   (default: a fresh temporary folder; removed after)
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import time
t0 = time.perf_counter()
import json, sys
import torch, torchvision
which, mode = sys.argv[1:3]
if mode != "native":
    import nbdnn.torch as nt
t_import = time.perf_counter()
torch.manual_seed(0)
F = torch.nn.functional
if which == "resnet18-forward":
    model = torchvision.models.resnet18().cuda().eval()
    if mode != "native":
        model, _ = nt.convert(model)
    x = torch.randn(8, 3, 224, 224, device="cuda")
    t_built = time.perf_counter()
    if "precompile" in mode:
        print(nt.precompile(model, x), file=sys.stderr)
    with torch.no_grad():
        out = model(x).cpu()
else:
    fmt = torch.channels_last
    model = torchvision.models.resnet50().cuda().to(memory_format=fmt).train()
    if mode != "native":
        model, _ = nt.convert(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    x = torch.randn(32, 3, 224, 224, device="cuda").contiguous(memory_format=fmt)
    labels = torch.randint(0, 1000, (32,), device="cuda")
    t_built = time.perf_counter()
    if "precompile" in mode:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            print(nt.precompile(model, x), file=sys.stderr)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x), labels)
    loss.backward()
    opt.step()
    out = loss.detach().cpu()
t_first = time.perf_counter()
print(json.dumps({"imports_s": t_import - t0, "build_s": t_built - t_import,
                  "first_s": t_first - t_built, "to_first_s": t_first - t0,
                  "finite": bool(torch.isfinite(out).all())}))
"""

MODELS = ("resnet18-forward", "resnet50-bf16-step")


def run(which, mode, cache):
    env = dict(os.environ)
    if mode == "native":
        env["NBDNN_KERNEL_CACHE"] = "0"
    else:  # (precompile: a fresh folder of its own, so cold too)
        env["NBDNN_KERNEL_CACHE"] = cache + "-pre" if "precompile" in mode else cache
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", CHILD, which, mode], env=env,
                       capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode:
        return {"error": p.stderr[-1500:], "wall_s": wall}
    r = json.loads(p.stdout.strip().splitlines()[-1])
    r["wall_s"] = wall
    said = [l for l in p.stderr.splitlines() if l.startswith("nbdnn precompile")]
    if said:
        r["note"] = f"\n    {said[-1]}"
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="*", default=list(MODELS), choices=MODELS)
    ap.add_argument("--cache", help="the kernel cache folder (default: a fresh one)")
    args = ap.parse_args()
    cache = args.cache or tempfile.mkdtemp(prefix="nbdnn-cold-")
    print(f"kernel cache folder {cache}", flush=True)
    rows = []
    try:
        for which in args.models:
            for mode in ("native", "nbdnn cold cache", "nbdnn warm cache", "nbdnn precompile"):
                r = run(which, mode, cache)
                rows.append((which, mode, r))
                if "error" in r:
                    print(f"{which:<20} {mode:<17} FAILED after {r['wall_s']:.1f} s:\n"
                          f"{r['error']}", flush=True)
                    continue
                print(f"{which:<20} {mode:<17} wall {r['wall_s']:7.1f} s | imports "
                      f"{r['imports_s']:5.1f} s, build {r['build_s']:6.1f} s, first result "
                      f"{r['first_s']:7.1f} s, finite {r['finite']}{r.get('note', '')}",
                      flush=True)
    finally:
        if not args.cache:
            shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(cache + "-pre", ignore_errors=True)
    print(json.dumps([{"model": w, "mode": m, **r} for w, m, r in rows]))


if __name__ == "__main__":
    main()

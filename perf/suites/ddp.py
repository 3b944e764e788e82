"""Data-parallel scaling: ResNet-50's bf16 training step at batch B a GPU, on
one GPU and on every GPU of the machine, for nbdnn.nn (GradientAllReduce, graphed),
nbdnn.torch (a converted torchvision ResNet-50 under DDP) and PyTorch's own DDP, each a
`torchrun` of examples/ddp_resnet.py, run in turn on the same machine. The goal:
N GPUs >= 0.9 N times one GPU's images a second (2 GPUs: >= 1.8x).

    PYTHONPATH=. python perf/suites/ddp.py [--engines nbdnn.nn nbdnn.torch torch] [--batch 32]
        [--steps 20] [--json out.json]
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(engine, nproc, args):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", os.path.join(ROOT, "examples", "ddp_resnet.py"),
           "--engine", engine, "--batch", str(args.batch), "--steps", str(args.steps),
           "--model", args.model, "--json"]
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=args.timeout)
    if out.returncode:
        print(f"{engine} x{nproc}: failed\n{out.stderr[-2000:]}", flush=True)
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    import torch
    p = argparse.ArgumentParser()
    p.add_argument("--engines", nargs="+", default=["nbdnn.nn", "nbdnn.torch", "torch"])
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--timeout", type=int, default=400, help="seconds a torchrun")
    p.add_argument("--json")
    args = p.parse_args()
    gpus = torch.cuda.device_count()
    counts = sorted({1, gpus}) if gpus else [1]
    print(f"{torch.cuda.get_device_name(0) if gpus else 'CPU'}, {gpus} GPU(s); "
          f"{args.model} batch {args.batch} a GPU, bf16", flush=True)
    rows = []
    for engine in args.engines:
        got = {n: run(engine, n, args) for n in counts}
        rows += [r for r in got.values() if r]
        rates = {n: r["images_per_s"] for n, r in got.items() if r}
        line = " | ".join(f"{n} GPU: {rates[n]:8.0f} img/s" for n in counts if n in rates)
        if 1 in rates and gpus > 1 and gpus in rates:
            line += f" | {rates[gpus] / rates[1]:.2f}x on {gpus} (goal {0.9 * gpus:.1f}x)"
        print(f"{engine:12} {line}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

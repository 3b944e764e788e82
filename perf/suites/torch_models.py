"""nbdnn inside PyTorch: what nbdnn.torch costs and gives.

--host: host cost of one call on small CUDA tensors: the bare nbdnn op (torch tensors on
PyTorch's default stream, replayed by nbdnn's eager call plans: "planned" lists the
states of its signatures, Plan where replayed), the nbdnn.torch function (its eager
path: a direct call of the custom op's implementation), the same with autograd
recording (inputs requiring grad), and the torch.nn.functional call it replaces; 40
rounds, each timing 50 calls of every one in turn; "added" is the median over rounds of
nbdnn.torch's excess over the bare op in the same round (a loaded host's drift cancels).
The issue's goal: <= 3 us over the bare op. --cpu: the same on CPU tensors (nbdnn's
reference; the wrappers' own cost there, and a dry run of the script without a GPU).
--models [NAME ...]: the models of the issue's table (random weights, built in code):
torchvision ResNet-50 (batch 32; float32 NCHW with PyTorch's default TF32 convolutions,
and bf16 autocast channels-last), torchvision ViT-B/16 (batch 32, bf16), transformers
GPT-2 124M (batch 8 x 1024 tokens, bf16) and a Llama-style decoder from a LlamaConfig
(8 layers, 16 query / 4 key-value heads, RMSNorm, rotary; batch 8 x 2048, bf16), each
native and nbdnn.torch.convert-ed (the language models under functional_calls) in this
process. Per config: the converted model's first training step (its JIT, or loads from
the kernel cache), then training step (forward, cross-entropy, backward, SGD with
momentum) and inference, eager and replayed from a torch.cuda.CUDAGraph, GPU ms by CUDA
events (median of 5 rounds of 3), and the training step's peak memory; per model the
forward's FLOP share on nbdnn (flop_share) and the kernels compiled. --profile: cProfile
of the converted eager step. --compiled: also each step around torch.compile(module,
mode="reduce-overhead") (train-compiled, infer-compiled; their compiles untimed).
--size tiny --batch 2 on a machine without a GPU: a dry run of the script (wall ms, no
graphs).

    PYTHONPATH=. python perf/suites/torch_models.py [--host [--profile] [--cpu]]
        [--models [resnet50 vit_b_16 gpt2 llama] [--profile] [--batch B] [--json F]]
"""
import argparse
import collections
import contextlib
import json
import os
import sys
import time

import torch

import nbdnn
import nbdnn.torch as nt
from nbdnn.bench import host_costs
from nbdnn.ops._plan import plans_of_this_thread

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from resnet50 import gpu_ms, torch_graphed  # noqa: E402  (perf/suites/resnet50.py)

F = torch.nn.functional


def plan_states(op):
    """The eager call plan states of op's signatures on this thread (Plan: replayed)."""
    fn = getattr(op, "unplanned", op)
    return ", ".join(sorted(type(v).__name__ if v.__class__ not in (int, str) else str(v)
                            for k, v in plans_of_this_thread().items() if k[0] is fn))


def host_rows(profile=False, dev="cuda"):
    x = torch.randn(1024, device=dev)  # (small: the host's cost, not the GPU's)
    xg = x.clone().requires_grad_()
    a, w, b = (torch.randn(32, 64, device=dev), torch.randn(64, 64, device=dev),
               torch.randn(64, device=dev))
    img, k = torch.randn(1, 16, 8, 8, device=dev), torch.randn(16, 16, 3, 3, device=dev)
    tf32 = "tf32" if torch.backends.cudnn.allow_tf32 and dev == "cuda" else "ieee"  # (what
    # nt.conv2d runs)
    g = w[0]  # (layer norm's weight, made once: a view costs ~1 us a call)
    if dev == "cpu":  # (the bare op on the tensors' NumPy views)
        xn, an, wn, bn, gn, imgn, kn = (t.numpy() for t in (x, a, w, b, g, img, k))
    else:
        xn, an, wn, bn, gn, imgn, kn = x, a, w, b, g, img, k
    # (the bare calls: the arguments nbdnn.torch's CUDA path gives the op, so "added" is
    # the wrapper's own time, not a difference in the op's plan signature)
    cases = {  # name: (the nbdnn op, bare, wrapped, wrapped with autograd, native)
        "relu 1k": (nbdnn.activation, lambda: nbdnn.activation(xn, "relu", coef=0.0),
                    lambda: nt.relu(x), lambda: nt.relu(xg), lambda: F.relu(x)),
        "linear 32x64x64": (nbdnn.matmul, lambda: nbdnn.matmul(an, wn, trans_b=True, bias=bn),
                            lambda: nt.linear(a, w, b), None, lambda: F.linear(a, w, b)),
        "conv2d 1x16x8x8, 3x3": (nbdnn.conv2d,
                                 lambda: nbdnn.conv2d(imgn, kn, None, padding=1, math=tf32),
                                 lambda: nt.conv2d(img, k, padding=1), None,
                                 lambda: F.conv2d(img, k, padding=1)),
        "layer_norm 32x64": (nbdnn.layer_norm,
                             lambda: nbdnn.layer_norm(an, gn, bn, ndim=1, eps=1e-5),
                             lambda: nt.layer_norm(a, (64,), g, b), None,
                             lambda: F.layer_norm(a, (64,), g, b)),
    }
    print("host us a call (median of 40 rounds of 50 calls each, the four in turn)")
    print("call                   | bare nbdnn | nbdnn.torch | + autograd | torch F | added "
          "| planned")
    for name, (op, bare, wrapped, graded, native) in cases.items():
        fns = [bare, wrapped] + [f for f in (graded, native) if f is not None]
        us, excess = host_costs(fns, sync=torch.cuda.synchronize if dev == "cuda" else
                                lambda: None)
        us, excess = [u * 1e6 for u in us], [e * 1e6 for e in excess]
        if graded is None:
            us.insert(2, float("nan"))
        print(f"{name:22} | {us[0]:10.1f} | {us[1]:11.1f} | {us[2]:10.1f} | {us[3]:7.1f} | "
              f"{excess[0]:5.1f} | {plan_states(op)}", flush=True)
    if profile:  # where a wrapped call's host time goes (the functions of 2000 calls)
        import cProfile
        import pstats
        for name, (_, _, wrapped, graded, _) in cases.items():
            for f in (wrapped, graded):
                if f is not None:
                    p = cProfile.Profile()
                    p.runcall(lambda: [f() for _ in range(2000)])
                    print(f"--- {name}{' + autograd' if f is graded else ''}: 2000 calls")
                    pstats.Stats(p).sort_stats("tottime").print_stats(12)


class Model:
    """A model of the table: build(batch) -> (module on the device, inputs, target);
    loss(output, target); configs: (bf16 autocast, channels-last) pairs by name;
    functional: the converted model runs under nbdnn.torch.functional_calls() (its own
    F.* calls, attention's above all, on nbdnn too)."""

    def __init__(self, build, loss, batch, configs, functional=False, kwargs=None):
        self.build, self.loss, self.batch = build, loss, batch
        self.configs, self.functional, self.kwargs = configs, functional, kwargs or {}


def classify(out, labels):
    return F.cross_entropy(out, labels)


def next_token(out, ids):
    # logits: (B, S, V) -> the next token's cross-entropy, as transformers' own loss
    logits = out.logits[:, :-1]
    return F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())


def resnet50(batch, dev):
    import torchvision
    return (torchvision.models.resnet50().to(dev), torch.randn(batch, 3, 224, 224, device=dev),
            torch.randint(0, 1000, (batch,), device=dev))


def vit_b_16(batch, dev):
    import torchvision
    return (torchvision.models.vit_b_16().to(dev), torch.randn(batch, 3, 224, 224, device=dev),
            torch.randint(0, 1000, (batch,), device=dev))


def language_model(name, config, seq):
    def build(batch, dev):
        import transformers
        cfg = getattr(transformers, name + "Config")(**config)
        cfg._attn_implementation = "sdpa"  # (F.scaled_dot_product_attention: on nbdnn)
        cls = getattr(transformers, name + "ForCausalLM" if name != "GPT2" else
                      "GPT2LMHeadModel")
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=dev)
        return cls(cfg).to(dev), ids, ids
    return build


SHAPES = {"full": {"gpt2": ({}, 1024),
                   "llama": (dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                                  num_hidden_layers=8, num_attention_heads=16,
                                  num_key_value_heads=4, max_position_embeddings=2048), 2048)},
          "tiny": {"gpt2": (dict(vocab_size=96, n_positions=32, n_embd=32, n_layer=2,
                                 n_head=2), 16),
                   "llama": (dict(vocab_size=96, hidden_size=32, intermediate_size=48,
                                  num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, max_position_embeddings=32), 16)}}
CONFIGS = {  # name -> (bf16 autocast, channels-last)
    "fp32": (False, False), "fp32-cl": (False, True), "bf16": (True, False),
    "bf16-cl": (True, True)}


def models(size):
    gpt2, llama = SHAPES[size]["gpt2"], SHAPES[size]["llama"]
    lm = dict(functional=True, kwargs={"use_cache": False})
    return {  # GPT-2 124M is transformers' default GPT2Config; llama: 8 layers, GQA 16/4
        "resnet50": Model(resnet50, classify, 32, ("fp32", "fp32-cl", "bf16-cl")),
        # (fp32-cl: whether float32's channels-first copies are the float32 gap)
        "vit_b_16": Model(vit_b_16, classify, 32, ("bf16",)),
        "gpt2": Model(language_model("GPT2", *gpt2), next_token, 8, ("bf16",), **lm),
        "llama": Model(language_model("Llama", *llama), next_token, 8, ("bf16",), **lm)}


class Runner:
    """One model's forward or training step (forward, loss, backward, SGD with
    momentum), native or converted, under bf16 autocast or not."""

    def __init__(self, spec, module, x, target, bf16, converted, dev):
        self.spec, self.m, self.x, self.target = spec, module, x, target
        self.bf16, self.converted, self.dev = bf16, converted, dev
        self.opt = torch.optim.SGD(module.parameters(), lr=1e-3, momentum=0.9)

    def _scope(self):
        return nt.functional_calls() if self.converted and self.spec.functional else \
            contextlib.nullcontext()

    def forward(self):
        with self._scope(), torch.autocast(self.dev, dtype=torch.bfloat16, enabled=self.bf16,
                                           cache_enabled=False):
            # (no cast cache: a captured graph must redo the weights' casts each replay)
            return self.m(self.x, **self.spec.kwargs)

    def train_step(self):
        self.opt.zero_grad(set_to_none=False)
        with self._scope(), torch.autocast(self.dev, dtype=torch.bfloat16, enabled=self.bf16,
                                           cache_enabled=False):
            loss = self.spec.loss(self.m(self.x, **self.spec.kwargs), self.target)
        loss.backward()
        self.opt.step()
        return loss

    def infer(self):
        with torch.no_grad():
            return self.forward()


def peak_bytes(fn):
    """The most memory PyTorch's allocator held during fn() beyond what it held before
    (a steady-state step: parameters, gradients and optimizer state already there)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def model_rows(names, size, batch, profile, rows, compile_only=False, reps=3, rounds=5,
               workers=0, compiled=False):
    """Each model native and converted in this process, each config, each mode: GPU ms by
    CUDA events (eager: the step's wall time on the GPU's clock, host waits included),
    the ratio native / nbdnn (>= 1: nbdnn as fast or faster), the training step's peak
    memory, the forward's FLOP share on nbdnn and the kernels compiled. compile_only: the
    converted model's first training step and inference in each config, nothing timed
    (fills the kernel cache: several processes at once compile different models);
    workers: nbdnn.torch.precompile first, in that many processes; compiled: also the
    modes train-compiled and infer-compiled, the step around torch.compile(module,
    mode="reduce-overhead") (inductor, CUDA-graph trees), its compile untimed."""
    from nbdnn.cuda.runtime.launch.kernel import loaded
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    reps, rounds = (reps, rounds) if dev == "cuda" else (1, 1)
    zoo = models(size)
    for name in names:
        spec = zoo[name]
        torch.manual_seed(0)
        native, x, target = spec.build(batch or spec.batch, dev)
        before = set(loaded())
        t0 = time.perf_counter()
        ours, report = nt.convert(native)
        if compile_only:
            for config in spec.configs:
                bf16, last = CONFIGS[config]
                fmt = torch.channels_last if last else torch.contiguous_format
                xs = x.contiguous(memory_format=fmt) if x.is_floating_point() else x
                r = Runner(spec, ours.train().to(memory_format=fmt), xs, target, bf16, True, dev)
                if workers:
                    t1 = time.perf_counter()
                    with torch.autocast(dev, dtype=torch.bfloat16, enabled=bf16):
                        said = nt.precompile(ours, xs,
                                             kwargs=spec.kwargs, functional=spec.functional,
                                             workers=workers)
                    print(f"{name} {config}: {said} ({time.perf_counter() - t1:.1f} s with "
                          f"the dry run)", flush=True)
                r.train_step()
                ours.eval()
                r.infer()
            now = loaded()
            families = collections.Counter("_".join(n.lstrip("_").split("_")[:2])
                                           for n, _ in set(now) - before)
            print(f"{name}: {len(set(now) - before)} kernels compiled or loaded in "
                  f"{time.perf_counter() - t0:.1f} s; by family: "
                  f"{families.most_common(15)}", flush=True)
            continue
        native_left = sorted({t for _, t, _ in report.native})
        share = nt.flop_share(native.eval(), ours.eval(), x, kwargs=spec.kwargs,
                              functional=spec.functional)
        print(f"{name}: converted {len(report.converted)} modules, native {native_left}; "
              f"FLOPs on nbdnn {100 * share.on_nbdnn:.2f}% (native ops: "
              f"{share.by_op or 'none'})", flush=True)
        row = {"model": name, "flops_on_nbdnn": share.on_nbdnn, "native_ops": share.by_op,
               "native_modules": native_left, "configs": {}}
        for config in spec.configs:
            bf16, last = CONFIGS[config]
            fmt = torch.channels_last if last else torch.contiguous_format
            xs = x.contiguous(memory_format=fmt) if x.is_floating_point() else x
            runners = [Runner(spec, m.train().to(memory_format=fmt), xs, target, bf16, c, dev)
                       for c, m in ((False, native), (True, ours))]
            t1 = time.perf_counter()
            runners[1].train_step()  # (the first step: its kernels' JIT or cache loads)
            if dev == "cuda":
                torch.cuda.synchronize()
            first_s = time.perf_counter() - t1
            got = {"first_step_s": first_s}
            modes = ("train", "train-graphed", "infer", "infer-graphed") + \
                (("train-compiled", "infer-compiled") if compiled else ())
            for mode in modes:
                ms = []
                for r, m in zip(runners, (native, ours)):
                    m.train(mode.startswith("train"))
                    fn = r.train_step if mode.startswith("train") else r.infer
                    if mode.endswith("graphed"):
                        if dev != "cuda":
                            continue
                        fn = torch_graphed(fn, lambda: nt.fresh_accumulators(m))
                    elif mode.endswith("compiled"):
                        if dev != "cuda":
                            continue
                        fn = reduce_overhead(spec, m, r, mode.startswith("train"))
                    ms.append(gpu_ms(fn, reps, rounds) if dev == "cuda" else wall_ms(fn))
                if len(ms) == 2:
                    got[mode] = ms
                    print(f"  {name} B{batch or spec.batch} {config:7} {mode:13}: native "
                          f"{ms[0]:8.2f} ms | nbdnn {ms[1]:8.2f} ms | {ms[0] / ms[1]:.2f}x",
                          flush=True)
            if dev == "cuda":
                for r, m in zip(runners, (native, ours)):
                    m.train()
                mem = [peak_bytes(r.train_step) for r in runners]
                got["train_peak_bytes"] = mem
                print(f"  {name} {config:7} training step's peak memory: native "
                      f"{mem[0] / 2**30:.2f} GiB | nbdnn {mem[1] / 2**30:.2f} GiB | "
                      f"{mem[1] / mem[0]:.2f}x", flush=True)
            if profile:
                profile_step(runners[1].train_step, f"{name} {config} converted train step")
            row["configs"][config] = got
        row["kernels_compiled"] = len(set(loaded()) - before)
        row["setup_to_last_s"] = time.perf_counter() - t0
        print(f"  {name}: {row['kernels_compiled']} kernels compiled or loaded", flush=True)
        rows.append(row)
        del native, ours, runners
        if dev == "cuda":
            torch.cuda.empty_cache()


def reduce_overhead(spec, module, runner, train):
    """A step of runner's kind over torch.compile(module, mode="reduce-overhead"), its
    compile and CUDA-graph recording done here (three warm-up steps)."""
    torch._dynamo.reset()
    r = Runner(spec, torch.compile(module, mode="reduce-overhead"), runner.x, runner.target,
               runner.bf16, runner.converted, runner.dev)
    r.opt = runner.opt  # (the module's own optimizer state)
    step = r.train_step if train else r.infer

    def fn():
        torch.compiler.cudagraph_mark_step_begin()
        return step()
    t = time.perf_counter()
    for _ in range(3):
        fn()
    print(f"    torch.compile (reduce-overhead) of the {'converted' if runner.converted else 'native'}"
          f" model and its first steps: {time.perf_counter() - t:.1f} s", flush=True)
    return fn


def wall_ms(fn, n=2):
    fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e3


def profile_step(fn, what, n=3):
    """Where an eager step's host time goes: cProfile over n steps, the functions by
    their own time and by time under them."""
    import cProfile
    import pstats
    fn()
    p = cProfile.Profile()
    p.runcall(lambda: [fn() for _ in range(n)])
    print(f"--- {what}: {n} steps")
    st = pstats.Stats(p)
    st.sort_stats("tottime").print_stats(25)
    st.sort_stats("cumulative").print_stats(30)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--host", action="store_true")
    p.add_argument("--models", nargs="*", choices=sorted(models("tiny")),
                   help="the models' rows (none named: all four)")
    p.add_argument("--profile", action="store_true",
                   help="cProfile each wrapped call (--host) or converted step (--models)")
    p.add_argument("--cpu", action="store_true", help="--host on CPU tensors (the reference)")
    p.add_argument("--batch", type=int, help="every model's batch (default: its own)")
    p.add_argument("--size", choices=sorted(SHAPES), default="full",
                   help="tiny: the language models shrunk (a dry run on the CPU)")
    p.add_argument("--json", help="write the model rows here")
    p.add_argument("--compile-only", action="store_true",
                   help="--models: only the converted models' first steps (the kernel cache)")
    p.add_argument("--precompile", type=int, default=0, metavar="WORKERS",
                   help="--compile-only: nbdnn.torch.precompile first, in WORKERS processes")
    p.add_argument("--reps", type=int, default=3, help="steps a timed round")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds (the median)")
    p.add_argument("--compiled", action="store_true",
                   help="--models: also under torch.compile(mode=\"reduce-overhead\")")
    args = p.parse_args()
    if args.host or args.models is None:
        host_rows(args.profile, "cpu" if args.cpu else "cuda")
    if args.models is not None:
        rows = []
        try:
            model_rows(args.models or list(models("tiny")), args.size, args.batch,
                       args.profile, rows, args.compile_only, args.reps, args.rounds,
                       args.precompile, args.compiled)
        finally:
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

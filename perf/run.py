"""The GPU machine's runner: every device call is one of these named jobs, run from the
repository root (no install: the checkout is imported). Each job writes its logs and
JSON under --out (default $OUT, else /tmp/nbdnn-out) and prints a summary to stdout (a
device call returns only the last lines of output and a few files). Every JSON result
carries the machine: GPU, driver, package versions and the commit (`machine()`).

    python3 perf/run.py tests [rest [I/N]|PYTEST ARGS]
                                                 the GPU test suite in three calls: `tests`
                                                 (the cross-check and test_gpu.py, split by
                                                 kernel family, and nbdnn check), `tests rest
                                                 1/2` and `tests rest 2/2` (every other file
                                                 but the PTX and tensor-core tests, in halves:
                                                 all at once ran past a call's 10 minutes on
                                                 an H100); or the tests PYTEST ARGS select
    python3 perf/run.py sanitize SCRIPT|-- PYTEST ARGS
                                                 compute-sanitizer memcheck, then racecheck
    python3 perf/run.py warm                     nbdnn cache warm: every registered kernel
                                                 compiled into .kcache by parallel workers
                                                 (before `tests`: the shards then load them)
    python3 perf/run.py check                    nbdnn check, every op and dtype
    python3 perf/run.py bench [BENCH ARGS]       nbdnn bench: every row against PyTorch
    python3 perf/run.py suite NAME [ARGS]        perf/suites/NAME.py --json OUT/NAME.json
    python3 perf/run.py sass                     the shipped tensor-core kernels' SASS:
                                                 HGMMA/HMMA count, local memory (LDL/STL)

Several jobs in one call: `perf/run.py tests -k attention ... && perf/run.py suite gemm`.
The kernel cache (NBDNN_KERNEL_CACHE, default .kcache/ here) carries compiled kernels
between the processes of a call and, carried back, between calls.
"""
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.environ.get("OUT") or "/tmp/nbdnn-out"
SHARDS = int(os.environ.get("SHARDS", "14"))  # JIT is CPU-bound: the machine has 16 cores
LIMIT_S = int(os.environ.get("LIMIT_S", "540"))  # each process's wall-clock limit
# the suite's processes, by test selection: the kernels' JIT dominates, so each holds
# kernel families apart (a process compiles only its own) and the slow ones are split
# (test_gpu's spill tests compile ~200 kernels, each family's at once by worker processes;
# the tensor-core tests ~270 variants)
SUITE = (
    ("crosscheck-rows", ["tests/test_crosscheck.py", "-k", "softmax or reduce or activation"]),
    ("crosscheck-mm", ["tests/test_crosscheck.py", "-k", "(matmul or conv) and not bfloat16"]),
    ("crosscheck-mm16", ["tests/test_crosscheck.py", "-k", "(matmul or conv) and bfloat16"]),
    ("crosscheck-pool", ["tests/test_crosscheck.py", "-k", "pool or batch_norm"]),
    ("crosscheck-norm", ["tests/test_crosscheck.py", "-k",
                         "(norm or lrn) and not (batch_norm or pool)"]),
    ("crosscheck-rest", ["tests/test_crosscheck.py", "-k",
                         "not (softmax or reduce or activation or matmul or conv or pool or "
                         "norm or lrn)"]),
    ("gpu-bits", ["tests/test_gpu.py", "-k", "bit_identical"]),
    ("gpu-spill", ["tests/test_gpu.py", "-k", "spill_at_most and not igemm and not dw_tile"]),
    ("gpu-spill-dw", ["tests/test_gpu.py", "-k", "spill_at_most and dw_tile"]),
    ("gpu-spill-ct", ["tests/test_gpu.py", "-k", "spill_at_most and igemm_chunked_t"]),
    ("gpu-spill-c", ["tests/test_gpu.py", "-k",
                     "spill_at_most and igemm_chunked and not igemm_chunked_t"]),
    ("gpu-spill-i", ["tests/test_gpu.py", "-k", "spill_at_most and igemm and not igemm_chunked"]),
    ("gpu-spill-rows", ["tests/test_gpu.py", "-k", "do_not_spill"]),
    ("gpu-rest", ["tests/test_gpu.py", "-k",
                  "not (bit_identical or spill_at_most or do_not_spill)"]),
)
# apart from the suite: test_ptx (CI compiles for sm_80/90), the tensor-core tests (~270
# kernel variants, ~30 min of JIT: `tests tests/test_tensorcore*.py` in their own call)
APART = ("test_crosscheck.py", "test_gpu.py", "test_ptx.py", "test_tensorcore.py",
         "test_tensorcore_variants.py")
SASS = (  # (module, kernel, first argument type): the shipped tensor-core kernels
    ("nbdnn.cuda.matmul.tensor_core_gemm.wgmma_gemm", "wgmma_gemm_bf16_km_om_ts_ls", "uint64"),
    ("nbdnn.cuda.matmul.tensor_core_gemm.wgmma_gemm", "wgmma_gemm_tf32_kk_b_om_ts_ls", "uint64"),
    ("nbdnn.cuda.matmul.tensor_core_gemm.mma_gemm", "mma_gemm_bf16_kk", "uint16"),
)


def machine():
    """The GPU, driver, package versions and commit a result was measured with."""
    def out(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                                  timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None
    versions = {}
    for name in ("numba", "numba_cuda", "numpy", "torch", "cupy"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            pass
    gpu = out(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    return {"gpu": gpu.split(", ")[0] if gpu else None,
            "driver": gpu.split(", ")[1] if gpu else None,
            "versions": versions,  # (a device copy of the tree has no .git: NBDNN_COMMIT)
            "commit": os.environ.get("NBDNN_COMMIT") or out(["git", "rev-parse", "--short",
                                                             "HEAD"]),
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def _env():
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONUNBUFFERED="1",
               NBDNN_HYPOTHESIS_PROFILE=os.environ.get("NBDNN_HYPOTHESIS_PROFILE", "dev"))
    cache = env.setdefault("NBDNN_KERNEL_CACHE", os.path.join(ROOT, ".kcache"))
    if cache != "0":
        os.makedirs(cache, mode=0o700, exist_ok=True)
    return env


def _last(path, pattern=("passed", "failed", "error", "op/dtype pairs", "SUMMARY")):
    """The log's last line naming a result, else its last line."""
    lines = open(path, errors="replace").read().splitlines() or ["(empty)"]
    hits = [l for l in lines if any(p in l for p in pattern)]
    return (hits or lines)[-1].strip()


def _parallel(jobs):
    """Run {name: argv} at once, each to OUT/name.log under LIMIT_S; print each one's
    result line and first failures; return whether all exited 0."""
    procs = {}
    for name, argv in jobs.items():
        log = open(os.path.join(OUT, f"{name}.log"), "w")
        procs[name] = subprocess.Popen(["timeout", str(LIMIT_S)] + argv, stdout=log,
                                       stderr=subprocess.STDOUT, cwd=ROOT, env=_env())
    ok = True
    for name, p in procs.items():
        rc = p.wait()
        ok &= rc == 0
        path = os.path.join(OUT, f"{name}.log")
        print(f"{name}: rc {rc}{' (timed out)' if rc in (124, 137) else ''}: {_last(path)}")
        for line in open(path, errors="replace"):
            if line.startswith(("FAILED", "ERROR")):
                print("   ", line.rstrip()[:200])
    return ok


def _pytest(*args):
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]


def tests(args):
    """No args: SUITE's selections and `nbdnn check` beside them (a call's worth: ~7 min
    of JIT and tests on 16 cores). "rest": the other test files (the second call). Else
    the tests the pytest arguments select. Those two in SHARDS processes of consecutive
    tests (a file's kernels JIT in one)."""
    if not args:
        jobs = {name: _pytest(*sel) for name, sel in SUITE}
        jobs["check"] = [sys.executable, "-m", "nbdnn", "check", "--examples", "2"]
        return _parallel(jobs)
    part, parts = 1, 1
    if args[:1] == ["rest"]:
        if args[1:]:  # "rest 2/3": the second of three consecutive thirds of the tests
            part, parts = (int(v) for v in args[1].split("/"))
        args = sorted(f"tests/{f}" for f in os.listdir(os.path.join(ROOT, "tests"))
                      if f.startswith("test_") and f.endswith(".py") and f not in APART)
    ids = [i for i in subprocess.run(_pytest("--collect-only", *args), capture_output=True,
                                     text=True, cwd=ROOT, env=_env()).stdout.splitlines()
           if "::" in i]
    ids = ids[(part - 1) * len(ids) // parts:part * len(ids) // parts]
    n = min(SHARDS, len(ids))
    if not n:
        print("no tests collected:", " ".join(args))
        return False
    return _parallel({f"tests-{i}": _pytest(*ids[i * len(ids) // n:(i + 1) * len(ids) // n])
                      for i in range(n)})


def sanitize(args):
    """compute-sanitizer memcheck, then racecheck, over a script or (after --) pytest."""
    argv = _pytest(*args[1:]) if args[:1] == ["--"] else [sys.executable, *args]
    ok = True
    for tool in ("memcheck", "racecheck"):
        ok &= _parallel({f"sanitize-{tool}": ["compute-sanitizer", "--report-api-errors", "no",
                                              "--print-limit", "10", "--tool", tool, *argv]})
    return ok


def warm(args):
    return _parallel({"warm": [sys.executable, "-m", "nbdnn", "cache", "warm", *args]})


def check(args):
    return _parallel({"check": [sys.executable, "-m", "nbdnn", "check", "--examples", "2",
                                *args]})


def _with_machine(path):
    """Wrap the JSON result at path as {"machine": machine(), "rows": ...}."""
    if os.path.exists(path):
        rows = json.load(open(path))
        json.dump({"machine": machine(), "rows": rows}, open(path, "w"), indent=1)


def bench(args):
    path = os.path.join(OUT, "bench.json")
    ok = _parallel({"bench": [sys.executable, "-m", "nbdnn", "bench", "--no-cpu", "--json",
                              path, *args]})
    _with_machine(path)
    return ok


def suite(args):
    name, rest = args[0], args[1:]
    path = os.path.join(OUT, f"{name}.json")
    ok = _parallel({name: [sys.executable, f"perf/suites/{name}.py", "--json", path, *rest]})
    _with_machine(path)
    print(open(os.path.join(OUT, f"{name}.log")).read()[-6000:])
    return ok


def sass(args):
    jobs = {k: [sys.executable, "perf/tools/sass_dump.py", mod, k, t] for mod, k, t in SASS}
    ok = _parallel(jobs)
    for k in jobs:  # sass_dump's counts, one "OP n" line each
        counts = [l.strip() for l in open(os.path.join(OUT, f"{k}.log"))
                  if l.split()[:1] and l.split()[0] in ("LDL", "STL", "HGMMA", "HMMA")]
        print(f"{k}: {', '.join(counts)}")
    return ok


JOBS = {"tests": tests, "sanitize": sanitize, "warm": warm, "check": check, "bench": bench,
        "suite": suite, "sass": sass}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in JOBS:
        sys.exit(__doc__)
    os.makedirs(OUT, exist_ok=True)
    json.dump(machine(), open(os.path.join(OUT, "machine.json"), "w"), indent=1)
    sys.exit(0 if JOBS[sys.argv[1]](sys.argv[2:]) else 1)

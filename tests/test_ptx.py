"""Registered kernel signatures compile to PTX with no GPU (the GPU suite JIT-compiles
what it runs): every float32 signature for sm_90 and sm_80, every tensor-core kernel
for sm_90a (wgmma) or sm_80 (mma.sync), and in float16, bfloat16 and float64 one
signature of each kernel family. "Registered": every Kernel of
every module under nbdnn/cuda (sub-packages included), plus one kernel of each code
path of the generators that build on demand (their ptx_examples(): pool's
geometry-compiled forward for every dtype, layout and mode, depthwise rows for every
dtype, the tensor-core GEMM's variants).

numba.cuda.compile_ptx is None under the simulator, so the compile runs in a separate
process with NUMBA_ENABLE_CUDASIM=0. Device functions ask numba for the current
device's compute capability when they compile; with no GPU that process substitutes
a stand-in device (cc 9.0) for that one question. The (kernel, signature, ccs) jobs are
dealt round-robin to one process per core (at most 4), started when collection ends
(conftest.py) so that they run beside the other tests, at a lower priority than
pytest's own process (conftest.py runs this test last: it only waits), the slow ones
last so that each process gets its share of them (CI's two cores sat one idle for
minutes).

What is left out is CI's time (two cores: compiling everything took 2600 s of
CPU, 983 compiles, beside ~1150 s for the rest of the suite, 44 minutes of CI):
- numba's typing and lowering are ~85% of a compile and NVVM the rest, so a signature
  built for sm_80 and sm_90 is lowered once;
- sm_80 checks that a kernel uses nothing past Ampere, which its float32 signature
  shows as well as the others; the 64x64 tiles (10 s each) compile for sm_90 only;
- the largest unrolled tiles (the 128x128 GEMM and implicit-GEMM tiles, the 3x3/2 and
  5x5 depthwise tiles: 20-85 s a signature) compile in float32 only; their generators
  compile in every dtype through the smaller tiles (32x32, 64x64, 3x3/1);
- float16, bfloat16 and float64 (412 s, 513 s and ~260 s of the rest) compile one
  signature a family: a family's kernels differ from each other in what their float32
  signatures check, and from those in the dtype's loads, stores and arithmetic, which
  the sampled one checks (the first cuts left 31 minutes of CI on two cores).
The GPU suite compiles the rest as it runs them (every op and dtype's crosscheck rows,
and tests/test_gpu.py's spill tests JIT every GEMM, implicit-GEMM and depthwise tile in
every dtype)."""
import json
import os
import subprocess
import sys
import tempfile
import time

SCRIPT = r"""
import json, os, sys, types
if hasattr(os, "nice"):
    os.nice(10)  # pytest's own process first: the PTX test runs last, waiting for this
import numba.cuda.dispatcher as d
from numba import cuda
if not cuda.is_available():
    d.get_current_device = lambda: types.SimpleNamespace(compute_capability=(9, 0))
import nbdnn, nbdnn.testing
from nbdnn.cuda.runtime.launch import kernel as _launch
import importlib, pkgutil, nbdnn.cuda as pkg
for m in pkgutil.walk_packages(pkg.__path__, "nbdnn.cuda."):  # sub-packages too
    mod = importlib.import_module(m.name)
    if hasattr(mod, "ptx_examples"):  # kernels built on demand: one of each code path
        mod.ptx_examples()
shard, nshards = int(sys.argv[1]), int(sys.argv[2])
# the largest unrolled tiles (30-85 s of typing and lowering a signature) compile
# in float32 only; their generators' other dtypes compile through the smaller tiles
LARGEST = ("128x128", "dw_tile_3x3s2", "dw_tile_5x5", "dw_fwd_3x3s2", "dw_fwd_5x5",
           "dw_filter_5x5")
def ccs(k, sig):
    name = k.name
    if k.arch == "sm_90a":  # wgmma, TMA, setmaxnreg
        return ((9, 0, "a"),)
    if name.startswith("mma_gemm"):  # the tensor-core GEMM for sm_80-89
        return ((8, 0),)
    bf16 = "uint16[" in sig and not name.startswith("mma_")  # (bfloat16's bits: the
    # float32 kernels with other loads; the mma.sync tiles' f16/bf16 operands are sm_80's)
    f32 = not bf16 and not any(t in sig for t in ("float16", "float64"))
    if any(h in name for h in LARGEST):
        return ((9, 0),) if f32 else ()
    if "64x64" in name or not f32:
        return ((9, 0),)
    return ((8, 0), (9, 0))
# float16, bfloat16 (uint16 bits) and float64: the first signature of each kernel family
# (the name's first two words: its generator) in that dtype; float32 and the
# tensor-core kernels: all
seen = set()
def sampled(k, sig):
    dt = next((t for t in ("uint16[", "float16[", "float64[") if t in sig), None)
    if dt is None or k.arch == "sm_90a" or k.name.startswith("mma_"):
        return True
    family = (dt, "_".join(k.name.lstrip("_").split("_")[:2]))
    if family in seen:
        return False
    seen.add(family)
    return True
# the slow compiles (10-85 s each) last, so that round-robin deals them out evenly; a
# signature's ccs in one shard (they share a lowering)
jobs = [(k, sig, ccs(k, sig)) for k in _launch.REGISTRY for sig in k.sigs
        if ccs(k, sig) and sampled(k, sig)]
jobs.sort(key=lambda j: any(h in j[0].name for h in ("128x128", "dw_", "64x64")))
import inspect
from numba.cuda import compiler as C
LOWER = getattr(C, "_compile_pyfunc_with_fixup", None)
KW = dict(debug=None, lineinfo=False, device=False, fastmath=False, opt=None, abi="numba",
          abi_info=None, forceinline=False, launch_bounds=None, lto=False)
if LOWER is None or set(KW) - set(inspect.signature(LOWER).parameters):
    LOWER = None  # (another numba-cuda: compile_ptx per cc)
def compile_all(k, sig, ccs):
    # PTX of one signature for every cc in ccs. Typing and lowering are ~85% of a
    # compile and NVVM the rest, so one lowering at the lowest cc feeds NVVM
    # for each: numba-cuda's lowering reads the cc only for choices made alike from
    # sm_75 up (tanh's fast path, float64 atomics); the sm_80 PTX is compile_ptx's.
    if LOWER is None or len(ccs) == 1:
        for cc in ccs:
            cuda.compile_ptx(k.pyfunc, sig, cc=cc)
        return
    lib, _ = LOWER(k.pyfunc, sig, cc=min(ccs), **KW)
    for cc in ccs:
        assert len(lib.get_asm_strs(cc=cc)) == 1
bad, n = [], 0
mine = jobs[shard::nshards]
for i, (k, sig, cc_list) in enumerate(mine):
    n += len(cc_list)
    try:
        compile_all(k, sig, cc_list)
    except Exception as e:
        sms = ",".join("sm_" + "".join(map(str, cc)) for cc in cc_list)
        bad.append(f"{k.name} {sig} {sms}: {type(e).__name__}: {str(e)[:400]}")
    print(f"compiled {i + 1}/{len(mine)}", file=sys.stderr, flush=True)  # (the heartbeat)
clashes = []  # NBDNN_KERNEL_CACHE's file names: one signature of different code each
if shard == 0:
    from nbdnn.cuda.runtime.launch import kernel_cache
    named = {}
    for k in _launch.REGISTRY:
        for sig in k.sigs:
            try:
                name = kernel_cache.key(k.pyfunc, sig, k.arch, k.jit_options, (9, 0))
            except kernel_cache.Uncachable:
                continue  # (compiled each process, as without the cache)
            other = named.setdefault(name, k)
            if other.pyfunc is not k.pyfunc:
                clashes.append(f"{other.name} and {k.name} {sig}")
print(json.dumps({"compiled": n, "failed": bad, "clashes": clashes}))
"""


_started = []  # [(process, stdout file, stderr file)], once a session


def start():
    """Start the compile processes (conftest calls this when collection ends, so the
    compiles run beside the other tests: pytest itself keeps one core busy, and CI has
    two). Output goes to temporary files: a full pipe would stall a process nobody
    reads yet."""
    if _started:
        return _started
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    nshards = max(1, min(4, os.cpu_count() or 1))
    for i in range(nshards):
        out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        _started.append((subprocess.Popen([sys.executable, "-c", SCRIPT, str(i), str(nshards)],
                                          env=env, stdout=out, stderr=err, text=True), out, err))
    return _started


def stop():
    """Kill compile processes still running (an interrupted session)."""
    for p, _, _ in _started:
        if p.poll() is None:
            p.kill()


STALL = 1200  # seconds without one compile finishing: a hung process, not a slow one


def wait(p, err):
    """Wait for compile process p however long it takes while it makes progress (each
    compile writes a line to err): a loaded machine makes the test slower, never red;
    only a process that finishes no compile in STALL seconds fails it."""
    seen, last = -1, time.monotonic()
    while p.poll() is None:
        size = os.fstat(err.fileno()).st_size
        if size != seen:
            seen, last = size, time.monotonic()
        elif time.monotonic() - last > STALL:
            p.kill()
            raise AssertionError(f"a PTX compile process finished no compile in {STALL} s")
        time.sleep(2)


def test_every_kernel_compiles_to_ptx():
    compiled, failed, clashes = 0, [], []
    for p, out, err in start():
        wait(p, err)
        out.seek(0), err.seek(0)
        assert p.returncode == 0, err.read()[-3000:]
        res = json.loads(out.read().strip().splitlines()[-1])
        compiled += res["compiled"]
        failed += res["failed"]
        clashes += res["clashes"]
    assert compiled > 0
    assert not failed, "\n".join(failed)
    # every kernel signature's kernel-cache file name (kernel_cache.key) is its own:
    # two kernels of different code sharing one would load each other's cubin
    assert not clashes, "\n".join(clashes)

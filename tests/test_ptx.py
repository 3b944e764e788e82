"""Every registered kernel signature compiles to PTX for sm_90, and its float32 and
integer signatures for sm_80 too (but the slowest tiles'), with no GPU. "Registered":
every Kernel of every module under nbdnn/cuda (sub-packages included), plus one kernel
of each code path of the generators that build on demand (their ptx_examples(): pool's
geometry-compiled forward for every dtype, layout and mode, depthwise rows for every
dtype). Kernel.launch refuses a signature that is not registered, so what runs is what
this test compiled.

numba.cuda.compile_ptx is None under the simulator, so the compile runs in a separate
process with NUMBA_ENABLE_CUDASIM=0. Device functions ask numba for the current
device's compute capability when they compile; with no GPU that process substitutes
a stand-in device (cc 9.0) for that one question. The (kernel, signature, cc) jobs are
dealt round-robin to one process per core (at most 4), started when collection ends
(conftest.py) so that they run beside the other tests, the slow ones last so that
each process gets its share of them (CI's two cores sat one idle for minutes). The
128x128- and 64x64-tile GEMM and implicit-GEMM kernels and the larger depthwise tiles
take 10-35 s each to compile: they compile for sm_90 only (their generators are the
ones the smaller tiles and the 3x3/1 depthwise tile use, which also compile for sm_80;
this test was 578 s of CI's 19 minutes). sm_80 checks that the kernels use nothing past
Ampere, which the float32 signature of a kernel shows as well as its float16,
bfloat16 and float64 ones: both limits keep CI's two cores under its time limit. The
slowest tiles' bfloat16 signatures are not compiled here (their generators' smaller
tiles are, in bfloat16, and these tiles in the other dtypes; a GPU run compiles all)."""
import json
import os
import subprocess
import sys
import tempfile

SCRIPT = r"""
import json, sys, types
import numba.cuda.dispatcher as d
from numba import cuda
if not cuda.is_available():
    d.get_current_device = lambda: types.SimpleNamespace(compute_capability=(9, 0))
import nbdnn, nbdnn.testing
from nbdnn.cuda.runtime import launch as _launch
import importlib, pkgutil, nbdnn.cuda as pkg
for m in pkgutil.walk_packages(pkg.__path__, "nbdnn.cuda."):  # sub-packages too
    mod = importlib.import_module(m.name)
    if hasattr(mod, "ptx_examples"):  # kernels built on demand: one of each code path
        mod.ptx_examples()
shard, nshards = int(sys.argv[1]), int(sys.argv[2])
def ccs(k, sig):
    name = k.name
    if k.arch == "sm_90a":  # wgmma, TMA, setmaxnreg
        return ((9, 0, "a"),)
    if name.startswith("mma_gemm"):  # the tensor-core GEMM for sm_80-89
        return ((8, 0),)
    sm90_only = any(h in name for h in ("128x128", "64x64", "dw_tile_3x3s2", "dw_tile_5x5"))
    bf16 = "uint16[" in sig and not name.startswith("mma_")  # (bfloat16's bits: the
    # float32 kernels with other loads; the mma.sync tiles' f16/bf16 operands are sm_80's)
    if sm90_only and bf16:  # (the slowest tiles: their generators' smaller tiles compile
        return ()           # in bfloat16, these in the other dtypes; CI's time)
    if sm90_only or bf16 or any(t in sig for t in ("float16", "float64")):
        return ((9, 0),)
    return ((8, 0), (9, 0))
# the slow compiles (10-35 s each) last, so that round-robin deals them out evenly; a
# signature's ccs in one shard (they share a lowering)
jobs = [(k, sig, ccs(k, sig)) for k in _launch.REGISTRY for sig in k.sigs if ccs(k, sig)]
jobs.sort(key=lambda j: any(h in j[0].name for h in ("128x128", "dw_tile", "64x64")))
import inspect
from numba.cuda import compiler as C
LOWER = getattr(C, "_compile_pyfunc_with_fixup", None)
KW = dict(debug=None, lineinfo=False, device=False, fastmath=False, opt=None, abi="numba",
          abi_info=None, forceinline=False, launch_bounds=None, lto=False)
if LOWER is None or set(KW) - set(inspect.signature(LOWER).parameters):
    LOWER = None  # (another numba-cuda: compile_ptx per cc)
def compile_all(k, sig, ccs):
    # PTX of one signature for every cc in ccs. Typing and lowering are ~85% of a
    # compile and NVVM the rest (run AG), so one lowering at the lowest cc feeds NVVM
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
for k, sig, cc_list in jobs[shard::nshards]:
    n += len(cc_list)
    try:
        compile_all(k, sig, cc_list)
    except Exception as e:
        sms = ",".join("sm_" + "".join(map(str, cc)) for cc in cc_list)
        bad.append(f"{k.name} {sig} {sms}: {type(e).__name__}: {str(e)[:400]}")
print(json.dumps({"compiled": n, "failed": bad}))
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


def test_every_kernel_compiles_to_ptx():
    compiled, failed = 0, []
    for p, out, err in start():
        p.wait(timeout=1500)
        out.seek(0), err.seek(0)
        assert p.returncode == 0, err.read()[-3000:]
        res = json.loads(out.read().strip().splitlines()[-1])
        compiled += res["compiled"]
        failed += res["failed"]
    assert compiled > 0
    assert not failed, "\n".join(failed)

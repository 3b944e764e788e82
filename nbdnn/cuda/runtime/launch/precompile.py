"""A workload's kernels compiled in parallel before it first runs, into the kernel cache.

A first run compiles each kernel signature the moment it is first launched, one after
another on one core: typing, lowering and NVVM (CPU work, most of a compile), then the
PTX assembler (the driver's linker). Here the workload runs once as a dry run
(kernel.dry_run: nothing compiled or launched, every launch noted), and what it needs
and the cache folder lacks is compiled at once:

1. forked worker processes (they inherit the noted Kernel objects, generated source
   included) each turn a share of the signatures into PTX as numba's dispatcher does
   (its _Kernel, its options), the compute capability given, so no worker touches the
   driver (a process forked from one holding a CUDA context must not); where numba
   links by LTO (nvJitLink, a library) the worker links the cubin itself;
2. this process links each PTX into a cubin on threads (the driver's linker, as
   numba's code library links it) and stores every cubin in the cache folder
   (kernel_cache.write: the same entry as Kernel.compile stores).

The workload's real first run then loads every kernel from the folder. Signatures the
cache cannot hold (kernel_cache.Uncachable; linked files, LTO) are left to compile on
first launch, as without precompile. With the cache off (NBDNN_KERNEL_CACHE=0), or
under the simulator, nothing is compiled ahead.
"""
import concurrent.futures
import dataclasses
import multiprocessing
import os
import time

from . import kernel_cache
from .kernel import is_loaded
from ..simulator import SIMULATOR

_JOBS = []  # (Kernel, signature): what forked workers compile, by index


@dataclasses.dataclass
class Summary:
    """noted: distinct signatures the dry run launched; loaded: already in this process;
    cached: already in the cache folder; compiled: compiled and stored now; left: to
    compile on first launch (not cachable, or failed: failures, name -> why);
    seconds: wall time of the compile; workers: processes used; stopped: the error that
    ended the dry run early (its garbage met a check: what was noted still compiles)."""
    noted: int = 0
    loaded: int = 0
    cached: int = 0
    compiled: int = 0
    left: int = 0
    failures: dict = dataclasses.field(default_factory=dict)
    seconds: float = 0.0
    workers: int = 0
    stopped: str = ""

    def __str__(self):
        return (f"nbdnn precompile: {self.noted} kernel signatures: {self.loaded} loaded, "
                f"{self.cached} cached, {self.compiled} compiled in {self.seconds:.1f} s "
                f"by {self.workers} processes, {self.left} left to compile on first launch"
                + (f" ({len(self.failures)} failed; the first: "
                   f"{next(iter(self.failures.items()))})" if self.failures else "")
                + (f"; the dry run stopped early: {self.stopped}" if self.stopped else ""))


def compile_noted(noted, workers=None):
    """Compile the (Kernel, signature) pairs of a dry run that neither this process nor
    the cache folder holds, `workers` processes at once (default: the cores this
    process may use, less one). Returns a Summary."""
    s = Summary()
    jobs, seen = [], set()
    folder = kernel_cache.directory()
    folder = folder and kernel_cache.usable(folder)
    cc = None if SIMULATOR else _cc()
    for k, sig in noted:
        if (id(k), sig) in seen:
            continue
        seen.add((id(k), sig))
        s.noted += 1
        if SIMULATOR:  # (nothing compiles ahead: every kernel as on its first launch)
            s.left += 1
            continue
        if is_loaded(k, sig):
            s.loaded += 1
            continue
        path, full = kernel_cache.entry(folder, k, sig, cc) if folder else (None, None)
        if path is None:
            s.left += 1
        elif os.path.exists(path):
            s.cached += 1
        else:
            jobs.append((k, sig, path, full))
    if not jobs:
        return s
    t0 = time.perf_counter()
    s.workers = max(1, min(len(jobs), workers or max(1, len(os.sched_getaffinity(0)) - 1)))
    _JOBS[:] = [(k, sig) for k, sig, _, _ in jobs]
    ptxs = {}
    try:
        fork = multiprocessing.get_context("fork")
        with fork.Pool(s.workers, initializer=_worker_init, initargs=(cc,)) as pool:
            for i, result in pool.imap_unordered(_to_ptx, range(len(jobs))):
                ptxs[i] = result
    finally:
        _JOBS.clear()
    with concurrent.futures.ThreadPoolExecutor(s.workers) as threads:
        done = threads.map(lambda i: (i, _link_and_store(folder, jobs[i], ptxs[i], cc)),
                           range(len(jobs)))
        for i, why in done:
            if why is None:
                s.compiled += 1
            else:
                s.left += 1
                s.failures[f"{jobs[i][0].name} {jobs[i][1]}"] = why
    s.seconds = time.perf_counter() - t0
    return s


def _cc():
    from numba import cuda
    return cuda.get_current_device().compute_capability


def _arch(cc):
    """cc with numba's arch-specific suffix ("a" from sm_90 on, as its code library adds
    on the GPU)."""
    return (cc[0], cc[1], "a" if tuple(cc[:2]) >= (9, 0) else "")


def _worker_init(cc):
    """A forked worker's numba asks no device for the compute capability (the
    dispatcher's and the code library's queries answer cc; numba's code library adds
    "a", the arch-specific features, from sm_90 on, as it does on the GPU)."""
    import types
    import numba.cuda.dispatcher as dispatcher
    from numba.cuda import codegen
    full = _arch(cc)
    dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=cc)
    codegen.CUDACodeLibrary._ensure_cc = lambda self, c: c if c is not None else full


def _to_ptx(i):
    """(i, (PTX texts, entry name, max registers), or (cubin bytes, entry name, None)
    where the code library links without the driver (LTO: nvJitLink), or the reason it
    cannot be stored)."""
    kernel, sig = _JOBS[i]
    try:
        from numba.core import sigutils
        from numba.cuda.dispatcher import _Kernel
        argtypes, _ = sigutils.normalize_signature(sig)
        kern = _Kernel(kernel.pyfunc, argtypes, **kernel.dispatcher.targetoptions)
        lib = kern._codelibrary
        if not kernel_cache.storable(lib):
            return i, "not storable alone (linked files or module set-up)"
        if lib._lto:  # (LTO-IR, linked by nvJitLink: a library, no context needed)
            obj = lib.get_cubin()
            return i, (bytes(getattr(obj, "code", obj)), lib._entry_name, None)
        return i, (list(lib.get_asm_strs()), lib._entry_name, lib._max_registers)
    except Exception as e:  # (the first launch compiles it again and raises there)
        return i, f"{type(e).__name__}: {str(e)[:300]}"


def _link_and_store(folder, job, ptx, cc):
    """Link one worker's PTX as numba's code library does and store the cubin; None, or
    why not."""
    if isinstance(ptx, str):
        return ptx
    from numba.cuda.cudadrv import driver
    kernel, sig, path, full = job
    texts, entry, max_registers = ptx
    try:
        if isinstance(texts, bytes):  # (linked in the worker)
            cubin = texts
        else:
            linker = driver._Linker(max_registers=max_registers,
                                    cc=_arch(cc),
                                    lto=False)
            for text in texts:
                linker.add_ptx(text.encode())
            cubin = linker.complete()
        kernel_cache.write(folder, path, dict(kernel_cache.header(kernel, sig, cc, full),
                                              entry=entry),
                           bytes(getattr(cubin, "code", cubin)))
    except Exception as e:
        return f"link: {type(e).__name__}: {str(e)[:300]}"
    return None


def precompile(fn, *args, workers=None, **kwargs):
    """Run fn(*args, **kwargs) as a dry run (its nbdnn launches noted, nothing computed:
    its results are garbage) and compile what it needs into the kernel cache in
    parallel (compile_noted); returns the Summary. An error the garbage causes (a check
    of a value, a shape read from one) ends the dry run there and is reported in the
    Summary (`stopped`), not raised: what was noted compiles. Run the workload for real
    after."""
    from .kernel import dry_run
    stopped = ""
    with dry_run() as noted:
        try:
            fn(*args, **kwargs)
        except Exception as e:  # (garbage met a check: compile what was noted so far)
            stopped = f"{type(e).__name__}: {str(e)[:200]}"
    s = compile_noted(noted, workers)
    s.stopped = stopped
    return s


def compile_registered(workers=None):
    """Every nbdnn.cuda module imported and each one's ptx_examples() built (one kernel of
    each generated variant: what tests/test_ptx.py compiles), then every registered
    signature compiled into the kernel cache in parallel (compile_noted): a test suite's
    or a machine's kernels ahead of their first launches. Returns the Summary."""
    import importlib
    import pkgutil
    from .kernel import REGISTRY
    cuda_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for m in pkgutil.walk_packages([cuda_dir], "nbdnn.cuda."):
        mod = importlib.import_module(m.name)
        if hasattr(mod, "ptx_examples") and not SIMULATOR:  # (the simulator builds
            mod.ptx_examples()                                 # no inline PTX)
    return compile_noted([(k, sig) for k in list(REGISTRY) for sig in k.sigs], workers)

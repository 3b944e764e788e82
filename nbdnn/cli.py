"""`nbdnn info | check | bench | demo | cache`: versions and the driver/toolkit match; a
cross-check of every op on random inputs; the benchmark table; a small CNN trained on
the digits (nbdnn/demo.py); the compiled-kernel cache's folder (info, clear)."""
import argparse
import os
import sys
import time
import zlib

import numpy as np

from ._vocab import BF16_DTYPES


def _versions():
    import nbdnn
    from nbdnn.cuda.runtime.device import numba_version
    v = {"nbdnn": nbdnn.__version__, "numba": numba_version(), "numpy": np.__version__}
    try:
        from importlib.metadata import version
        v["numba-cuda"] = version("numba-cuda")
    except Exception:
        v["numba-cuda"] = "?"
    return v


def _header():
    from nbdnn.cuda import SIMULATOR, DRIVER_STATUS
    v = _versions()
    line = " ".join(f"{k} {x}" for k, x in v.items())
    if SIMULATOR:
        return (f"{line}\nCUDA backend: numba's CUDA SIMULATOR ({DRIVER_STATUS}): kernels run "
                "as Python threads; shapes are tiny and times say nothing about a GPU")
    from nbdnn.cuda.runtime.device import describe
    name, cc, _ = describe()
    return f"{line}\nCUDA backend: {name} (sm_{cc[0]}{cc[1]}), hardware"


# CUDA release -> newest PTX ISA its driver JIT-compiles (PTX ISA release notes)
_PTX_ISA = {(12, 0): (8, 0), (12, 1): (8, 1), (12, 2): (8, 2), (12, 3): (8, 3), (12, 4): (8, 4),
            (12, 5): (8, 5), (12, 6): (8, 5), (12, 8): (8, 7), (12, 9): (8, 8), (13, 0): (9, 0),
            (13, 1): (9, 1), (13, 2): (9, 2)}


def _driver_ptx_isa(driver):
    if driver in _PTX_ISA:
        return _PTX_ISA[driver]
    older = [k for k in _PTX_ISA if k <= driver]
    return _PTX_ISA[max(older)] if older else None


def info(args):
    from nbdnn.cuda import SIMULATOR, DRIVER_STATUS
    import ctypes
    for k, x in _versions().items():
        print(f"{k:<12} {x}")
    driver = None
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        ver = ctypes.c_int()
        lib.cuDriverGetVersion(ctypes.byref(ver))
        driver = (ver.value // 1000, ver.value % 1000 // 10)
        print(f"{'CUDA driver':<12} {driver[0]}.{driver[1]}")
    except OSError:
        print(f"{'CUDA driver':<12} none ({DRIVER_STATUS})")
    nvvm_version, emitted = _toolkit()
    if nvvm_version:
        print(f"{'NVVM':<12} {nvvm_version}")
        print(f"{'PTX emitted':<12} ISA {emitted[0]}.{emitted[1]} (what numba's toolkit writes)")
    else:
        print(f"{'NVVM':<12} not found: install nbdnn[cu13] (or [cu12]) to compile kernels")
    if SIMULATOR:
        print("mode         SIMULATOR: numba's CUDA simulator runs the kernels (no usable GPU)")
        print("tensor cores none: the simulator runs no inline PTX (every op's SIMT path runs)")
    else:
        from nbdnn.cuda.runtime.device import describe
        name, cc, sms = describe()
        print(f"{'GPU':<12} {name}, compute capability {cc[0]}.{cc[1]}, {sms} SMs")
        print("mode         hardware")
        print("tensor cores " + (
            "matmul / matmul_backward in float16, bfloat16 and float32 math tf32 / 3xtf32 "
            "(wgmma + TMA, sm_90a); conv forward in float16 / bfloat16 channels-last (the "
            "same kernel with TMA im2col loads, within nbdnn/cuda/conv/wgmma_conv.py's "
            "limits)" if tuple(cc) >= (9, 0) else
            "matmul / matmul_backward in float16 and bfloat16 (mma.sync + ldmatrix + "
            "cp.async, sm_80-89); everything else runs its SIMT path" if tuple(cc) >= (8, 0)
            else "none on this GPU (before sm_80): every op runs its SIMT path"))
    import nbdnn
    print(f"{'math':<12} {nbdnn.get_math()} (float32 matmul; nbdnn.set_math)")
    if driver and emitted and not SIMULATOR:
        can = _driver_ptx_isa(driver)
        if can is None or emitted > can:
            print(f"MISMATCH     the driver (CUDA {driver[0]}.{driver[1]}) JIT-compiles PTX ISA up to "
                  f"{can[0]}.{can[1] if can else '?'}, but the installed CUDA toolkit emits ISA "
                  f"{emitted[0]}.{emitted[1]}: kernels will fail to load "
                  "(CUDA_ERROR_UNSUPPORTED_PTX_VERSION). Fix: install the toolkit wheels that match "
                  f"the driver, e.g. pip install 'cuda-toolkit[nvvm,nvrtc]=={driver[0]}.{driver[1]}.*', "
                  "or upgrade the NVIDIA driver.")
        else:
            print(f"match        the driver runs what this toolkit emits (ISA {emitted[0]}."
                  f"{emitted[1]} <= {can[0]}.{can[1]})")
    return 0


def _toolkit():
    """(NVVM version, PTX ISA version numba emits), asked of a non-simulator process."""
    import os
    import subprocess
    code = ("import nbdnn.cuda\n"  # numpy 2.5's missing np.row_stack, shimmed first
            "from numba import cuda\n"
            "from numba.cuda.cudadrv import nvvm\n"
            "def k(a):\n    a[0] = 1\n"
            "ptx, _ = cuda.compile_ptx(k, 'void(float32[::1])', cc=(8, 0))\n"
            "print('.'.join(map(str, nvvm.NVVM().get_version())))\n"
            "print([l for l in ptx.splitlines() if l.startswith('.version')][0])")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if p.returncode:
        return None, None
    lines = p.stdout.split("\n")
    major, minor = lines[1].split()[-1].split(".")
    return lines[0], (int(major), int(minor))


def _progress(i, n, label):
    """A progress bar on a terminal; nothing when stderr goes to a file or a pipe (its
    carriage returns would fill a log)."""
    if not sys.stderr.isatty():
        if "left out" in label:
            sys.stderr.write(f"{label}\n")
        return
    if "left out" in label:  # (bench: a row the dtype rules out, on a line of its own)
        sys.stderr.write(f"\n{label}\n")
        return
    w = 30
    done = int(w * i / max(n, 1))
    sys.stderr.write(f"\r[{'#' * done}{'.' * (w - done)}] {i}/{n} {label[:40]:<40}")
    sys.stderr.flush()
    if i == n:
        sys.stderr.write("\n")


def _pick(items, names, what):
    from nbdnn.errors import BadParamError
    from nbdnn.ops.registry import select
    try:
        return select(items, names)
    except BadParamError as e:
        sys.exit(f"nbdnn {what}: {e}")


def _case_seed(seed, spec, dtype, rep):
    """The seed of one drawn case: from the run's --seed, the row, the dtype and the
    example's number only, so `nbdnn check --ops ROW --dtype D --seed S` draws the
    same case whatever else the run checks."""
    return [seed, zlib.crc32(spec.name.encode()), BF16_DTYPES.index(dtype), rep]


def _describe(case):
    """A drawn case's arrays (shape, dtype) and other arguments, for a failure's line."""
    def one(v):
        if isinstance(v, np.ndarray):
            return f"array{tuple(v.shape)} {v.dtype}"
        return repr(v)
    args = ", ".join(one(a) for a in case.args)
    kw = ", ".join(f"{k}={one(v)}" for k, v in case.kwargs.items())
    return f"({args}{', ' if args and kw else ''}{kw})"


def check(args):
    from nbdnn import testing
    from nbdnn.cuda import SIMULATOR
    print(_header())
    specs = _pick(testing.SPECS, args.ops, "check")
    dtypes = args.dtype or list(testing.DTYPES)
    jobs = [(s, d) for s in specs for d in dtypes if d in s.dtypes]
    if not jobs:
        sys.exit(f"nbdnn check: {', '.join(s.name for s in specs)} take none of "
                 f"{', '.join(dtypes)}: nothing to check")
    rows, failures = [], []
    for i, (spec, dtype) in enumerate(jobs):
        _progress(i, len(jobs), spec.name)
        for rep in range(args.examples):
            rng = np.random.default_rng(_case_seed(args.seed, spec, dtype, rep))
            draw = lambda lo, hi: int(rng.integers(lo, hi + 1))  # noqa: E731
            case = spec.make(draw, dtype, not SIMULATOR)
            blend = [None, (0.5, 0.75, rep), (1.0, 0.0, rep)][rep % 3] if spec.blend else None
            strided = {0} if rep % 2 else set()
            try:
                r = testing.crosscheck(spec, case, dtype, strided=strided, blend=blend)
            except Exception as e:  # noqa: BLE001 - a crash is a failed check, reported
                r = {"ok": False, "max_abs": float("nan"), "used": float("nan"),
                     "tol": spec.tolerance(dtype, case), "msg": f"{type(e).__name__}: {e}",
                     "shapes": []}
            if not r["ok"] or rep == args.examples - 1:
                rows.append((spec.name, dtype, r))
            if not r["ok"]:
                failures.append(
                    f"FAILED {spec.name} {dtype}, example {rep + 1}: {r['msg']}\n"
                    f"  call: {spec.name}{_describe(case)}"
                    f"{', strided first input' if strided and spec.strided_ok else ''}"
                    f"{f', blend alpha/beta {blend[:2]}' if blend else ''}\n"
                    f"  again: nbdnn check --ops {spec.name} --dtype {dtype} --seed {args.seed}"
                    f" --examples {rep + 1}")
                break
    _progress(len(jobs), len(jobs), "done")
    print(f"{'op':<34} {'dtype':<8} {'shapes':<28} {'max abs':>9} {'err/tol':>8} "
          f"{'atol/rtol':>17}  result")
    for name, dtype, r in rows:
        shapes = ",".join("x".join(map(str, s)) for s in r["shapes"])[:28]
        tol = f"{r['tol'][0]:.0e}/{r['tol'][1]:.0e}"
        print(f"{name:<34} {dtype:<8} {shapes:<28} {r['max_abs']:9.2e} {r['used']:8.2f} "
              f"{tol:>17}  {'pass' if r['ok'] else 'FAIL'}")
    print("err/tol: the worst element's error over what its tolerance allows, "
          "|gpu - ref| / (atol + rtol |ref|); a row passes at <= 1")
    for f in failures:
        print(f)
    print(f"{len(jobs)} op/dtype pairs, {len(failures)} failed")
    return 1 if failures else 0


def bench(args):
    from nbdnn import bench as B
    from nbdnn.cuda import DRIVER_STATUS, SIMULATOR
    if SIMULATOR:
        sys.exit(f"nbdnn bench times kernels on a GPU, and there is none ({DRIVER_STATUS}): "
                 "`nbdnn check` cross-checks the kernels in the simulator, and "
                 "perf/suites/cpu_conv.py times the CPU reference")
    print(_header())
    from nbdnn.errors import BadParamError
    try:
        rows = B.run_suite(args.ops, cpu=not args.no_cpu, size_mb=args.size_mb,
                           progress=_progress, graph=args.graph, dtype=args.dtype)
    except BadParamError as e:
        sys.exit(f"nbdnn bench: {e}")
    print(B.format_table(rows))
    if args.json:  # (written atomically: nbdnn/_files.py)
        B.save_json(rows, args.json, {"versions": _versions(), "header": _header(),
                                      "date": time.strftime("%Y-%m-%d")})
    if args.plot:
        B.plot(rows, args.plot)
    return 0


def cache(args):
    """`nbdnn cache info`: the compiled-kernel cache's folder, state and size;
    `nbdnn cache clear`: remove its entries; `nbdnn cache warm`: compile every
    registered signature (and one of each generated variant) into it in parallel."""
    from nbdnn.cuda.runtime.launch import kernel_cache as kc
    folder = kc.directory()
    if folder is None:
        print("kernel cache off (NBDNN_KERNEL_CACHE=0): every process compiles its kernels")
        return 0
    if args.action == "clear":
        n = kc.clear(folder) if os.path.isdir(folder) else 0
        print(f"removed {n} entries from {folder}")
        return 0
    if args.action == "warm":
        from nbdnn.cuda.runtime.launch.precompile import compile_registered
        print(compile_registered(args.workers))
        return 0
    where = "NBDNN_KERNEL_CACHE" if os.environ.get("NBDNN_KERNEL_CACHE") else \
        "the default; NBDNN_KERNEL_CACHE=DIR moves it, =0 turns it off"
    print(f"{'folder':<8} {folder} ({where})")
    if not os.path.isdir(folder):
        print(f"{'state':<8} on, empty (the folder is made on the first compile)")
        return 0
    ok = kc.usable(folder)  # (warns why not)
    print(f"{'state':<8} {'on' if ok else 'NOT USED: see the warning above'}")
    found = kc.entries(folder)
    total = sum(n for _, n, _ in found)
    print(f"{'entries':<8} {len(found)}, {total / 1e6:.1f} MB of {kc.max_bytes() / 1e6:.0f} MB "
          "(NBDNN_KERNEL_CACHE_MAX_MB; the least recently used go first)")
    return 0


def _whole(low):
    """argparse type: an int >= low."""
    def parse(text):
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}")
        if v < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {v}")
        return v
    return parse


def _positive_float(text):
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not 0 < v < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return v


def _parser():
    import nbdnn
    p = argparse.ArgumentParser(prog="nbdnn", description=__doc__)
    p.add_argument("--version", action="version", version=f"nbdnn {nbdnn.__version__}")
    sub = p.add_subparsers(dest="cmd")
    sub.add_parser("info", help="versions, GPU, driver/toolkit match, simulator or hardware")
    c = sub.add_parser("check", help="cross-check every op, CUDA against the CPU reference")
    c.add_argument("--ops", nargs="*", help="op names or families (default: all)")
    c.add_argument("--dtype", nargs="*", choices=BF16_DTYPES)
    c.add_argument("--examples", type=_whole(1), default=3,
                   help="random cases per op and dtype")
    c.add_argument("--seed", type=_whole(0), default=0)
    b = sub.add_parser("bench", help="time every op: GPU, CPU, PyTorch, %% of copy bandwidth")
    b.add_argument("--ops", nargs="*", help="op names, rows or families (default: all)")
    b.add_argument("--json", help="write the rows to this JSON file")
    b.add_argument("--plot", help="draw the rows to this image (needs matplotlib)")
    b.add_argument("--no-cpu", action="store_true", help="skip the (slow) CPU timings")
    b.add_argument("--size-mb", type=_positive_float, default=None,
                   help="tensor size for the elementwise rows (default 1024 MiB on a GPU)")
    b.add_argument("--graph", action="store_true",
                   help="time nbdnn's calls as CUDA graph replays: GPU time, no host time")
    b.add_argument("--dtype", default="float32", choices=BF16_DTYPES,
                   help="the tensors' dtype (rows whose op does not take it are left out)")
    sub.add_parser("demo", add_help=False,
                   help="train a small CNN on the digits dataset (nbdnn demo --help)")
    k = sub.add_parser("cache", help="the compiled-kernel cache: where it is, how big; clear it; "
                                     "warm it (every registered kernel signature and one of "
                                     "each generated variant, compiled by parallel workers)")
    k.add_argument("action", choices=("info", "clear", "warm"))
    k.add_argument("--workers", type=_whole(1), default=None,
                   help="warm: processes compiling at once (default: the cores less one)")
    return p


def main(argv=None):
    try:
        status = _main(sys.argv[1:] if argv is None else list(argv))
        sys.stdout.flush()  # (here, where a closed pipe is caught, not at exit)
        return status
    except BrokenPipeError:  # (`nbdnn info | head`: the reader left; no traceback)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


def _main(argv):
    p = _parser()
    if argv[:1] == ["demo"]:
        from .demo import main as demo
        demo(argv[1:])
        return 0
    a = p.parse_args(argv)
    if a.cmd is None:
        p.print_help()
        return 0
    if a.cmd == "bench" and a.plot:
        _need_matplotlib(p, "bench --plot")
    return {"info": info, "check": check, "bench": bench, "cache": cache}[a.cmd](a)


def _need_matplotlib(parser, what):
    """A usage error now, not after the work: --plot without matplotlib."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        parser.error(f"{what} needs matplotlib (pip install 'nbdnn[bench]')")


if __name__ == "__main__":
    sys.exit(main())

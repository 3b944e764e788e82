"""Assemble a module's example kernels with ptxas, without a GPU: inline PTX that NVVM
passes through unread (numba.cuda.compile_ptx checks none of it) is checked by the
assembler, with each kernel's registers, barriers and spills (`ptxas -v`). Needs ptxas
on PATH (this development machine has CUDA 13.0's; CI has none). The PTX's `.version`
(NVVM's, newer than this ptxas may read) is lowered to the assembler's own.

    PYTHONPATH=. python perf/tools/ptxas_check.py nbdnn.cuda.matmul.tensor_core_gemm.wgmma_gemm [NAME...]

The kernels the module's ptx_examples() builds (or those named), one line each (sm_90a
kernels for sm_90a, the others for sm_90): ok or the assembler's first error,
registers (capped as the kernel's max_registers caps them), spill bytes. Exits 1 on an
error or a spill.
"""
import importlib
import re
import subprocess
import sys
import tempfile
import types

import numba.cuda.dispatcher as _dispatcher

_dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=(9, 0))
from numba import cuda  # noqa: E402  (after the stand-in device: no GPU here)

from nbdnn.cuda.runtime.launch.kernel import REGISTRY  # noqa: E402


def ptxas_version():
    out = subprocess.run(["ptxas", "--version"], capture_output=True, text=True).stdout
    major, minor = re.search(r"release (\d+)\.(\d+)", out).groups()
    return f"{int(major) - 4}.{minor}"  # (CUDA 12.x reads PTX 8.x, 13.0 reads 9.0)


def check(kernel, sig, version):
    arch = "sm_90a" if kernel.arch == "sm_90a" else "sm_90"
    ptx, _ = cuda.compile_ptx(kernel.pyfunc, sig, cc=(9, 0, "a") if arch == "sm_90a" else (9, 0))
    ptx = re.sub(r"^\.version \S+", f".version {version}", ptx, count=1, flags=re.M)
    with tempfile.TemporaryDirectory() as tmp:
        src = f"{tmp}/k.ptx"
        open(src, "w").write(ptx)
        cap = kernel.jit_options.get("max_registers")  # (numba gives it to the linker)
        r = subprocess.run(["ptxas", f"-arch={arch}", "-v", src, "-o", f"{tmp}/k.cubin"] +
                           ([f"-maxrregcount={cap}"] if cap else []), capture_output=True, text=True)
    regs = re.search(r"Used (\d+) registers", r.stderr)
    spill = sum(int(n) for n in re.findall(r"(\d+) bytes spill", r.stderr))
    ok = r.returncode == 0 and spill == 0
    detail = (f"{regs.group(1) if regs else '?'} registers, {spill} B spilled" if r.returncode == 0
              else r.stderr.strip().splitlines()[0])
    print(f"{'ok ' if ok else 'BAD'} {kernel.name:56} {detail}", flush=True)
    for line in r.stderr.splitlines():  # (advisories: e.g. wgmma serialized, and why)
        if any(w in line.lower() for w in ("warning", "advisory", "performance")):
            print(f"    {line.strip()}", flush=True)
    return ok


def main():
    mod = importlib.import_module(sys.argv[1])
    names = set(sys.argv[2:])
    before = len(REGISTRY)
    if hasattr(mod, "ptx_examples"):
        mod.ptx_examples()
    version = ptxas_version()
    kernels = [k for k in REGISTRY if k.name in names] if names else REGISTRY[before:]
    oks = [check(k, k.sigs[0], version) for k in kernels]
    sys.exit(0 if oks and all(oks) else 1)


if __name__ == "__main__":
    main()

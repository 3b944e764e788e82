"""nbdnn's replacements of two numba compiler steps (nbdnn/cuda/runtime/launch/
compile_passes.py) give numba's results exactly: the SSA IR statement for statement,
names and phi nodes included, and the lowering's set of singly assigned variables;
over small functions that put the passes' cases at their edges (a variable assigned in
one block and used in another, in a loop, in a branch, in one block alone, a variable
no block reassigns, one read before any assignment) and over the kernels whose compile
they speed up (generated ones with the most reassigned variables, and one kernel of
each family). numba's frontend runs in the simulator too, so this runs in CI."""
import copy
import json
import os
import subprocess
import sys
import types

import pytest

passes = pytest.importorskip("nbdnn.cuda.runtime.launch.compile_passes")
if not (passes.SSA_OK and passes.LOWERING_OK):
    pytest.skip("this numba-cuda's passes differ from those nbdnn's were written against: "
                "nbdnn leaves them in place", allow_module_level=True)
NUMBA_SSA = passes.NUMBAS["ssa._run_ssa"]
NUMBA_SAV = passes.NUMBAS["lowering.Lower._find_singly_assigned_variable"]

from numba.cuda.core import bytecode, postproc  # noqa: E402
from numba.cuda.core.interpreter import Interpreter  # noqa: E402


def frontend(fn):
    """fn's canonical numba IR, before SSA (numba-cuda's run_frontend, which the
    simulator replaces)."""
    fid = bytecode.FunctionIdentity.from_function(fn)
    func_ir = Interpreter(fid).interpret(bytecode.ByteCode(func_id=fid))
    postproc.PostProcessor(func_ir).run(False)
    return func_ir


def dump(blocks):
    return [(label, [str(stmt) for stmt in blk.body]) for label, blk in blocks.items()]


def singly_assigned(find, func_ir):
    """What the lowering's scan (find: numba's or nbdnn's) keeps in registers."""
    lower = types.SimpleNamespace(func_ir=func_ir, blocks=dict(sorted(func_ir.blocks.items())))
    find(lower)
    return sorted(lower._singly_assigned_vars)


def both(fn):
    """(numba's, nbdnn's) results for fn: each SSA pass's IR from its own copy of the
    frontend's IR, then each lowering scan's variables over numba's SSA form."""
    func_ir = frontend(fn)
    theirs = NUMBA_SSA(copy.deepcopy(func_ir.blocks))
    ours = passes.run_ssa(copy.deepcopy(func_ir.blocks))
    func_ir.blocks = theirs
    return ((dump(theirs), singly_assigned(NUMBA_SAV, func_ir)),
            (dump(ours), singly_assigned(passes.find_singly_assigned_variable, func_ir)))


def loop_carried(a, n):
    s = 0
    for i in range(n):
        if a[i] > 0:
            s = s + a[i]
        else:
            s = s - 1
    return s


def straight_line(a):
    x = a[0]
    x = x + 1
    y = x * 2
    x = y - x
    return x + y


def nested(a, n, m):
    t = 0
    u = 1
    for i in range(n):
        u = u * 2
        for j in range(m):
            t = t + a[i] * j
            if t > 10:
                break
        else:
            u = u + 1
    while t > 0:
        t = t - u
    return t, u


def used_before_assigned(a, flag):
    if flag:
        z = a[0]
    return z  # noqa: F821  (numba's UndefinedVariable path)


def single_assignments(a):
    p = a[0]
    q = p + 1
    return q


def in_one_block_only(a, n):
    r = 0
    for i in range(n):
        w = a[i]
        w = w * w  # (reassigned inside the loop body's block alone)
        r = r + w
    return r


@pytest.mark.parametrize("fn", [loop_carried, straight_line, nested, used_before_assigned,
                                single_assignments, in_one_block_only],
                         ids=lambda f: f.__name__)
def test_small_functions_get_numbas_ir(fn):
    theirs, ours = both(fn)
    assert ours == theirs


SCRIPT = r"""
import copy, importlib, json, pkgutil, sys
from numba import cuda
import nbdnn
sim_jit = cuda.jit
def jit(*args, **kw):  # (the simulator's jit takes none of these compile options)
    for name in ("forceinline", "max_registers", "launch_bounds", "lto"):
        kw.pop(name, None)
    return sim_jit(*args, **kw)
cuda.jit = jit
import nbdnn.cuda as pkg
for m in pkgutil.walk_packages(pkg.__path__, "nbdnn.cuda."):
    mod = importlib.import_module(m.name)
    if hasattr(mod, "ptx_examples"):  # (the generated kernels: flash attention's IR is
        mod.ptx_examples()            # the largest)
from nbdnn.cuda.runtime.launch import kernel as launch
sys.path.insert(0, sys.argv[1])
import test_compile_passes as t
picked = {}
for k in launch.REGISTRY:  # each family's first kernel, and the named ones
    family = "_".join(k.name.lstrip("_").split("_")[:2])
    picked.setdefault(family, k)
    if k.name in t.KERNELS:
        picked[k.name] = k
print(json.dumps({"compared": sorted(k.name for k in picked.values()),
                  "differ": [k.name for k in picked.values()
                             if (lambda a, b: a != b)(*t.both(k.pyfunc))]}))
"""
# the generated kernels with the most reassigned variables (flash attention: 199 over
# 6,561 statements), the GEMM's, and a pool and a columns kernel
KERNELS = ("attention_flash_fwd_bf16_d128_n128s2", "attention_flash_dkv_bf16_d128_m32s3",
           "wgmma_gemm_bf16_kk_om_ts_ls", "pool_fwd_fast", "conv_im2col_t")


def test_kernels_get_numbas_ir():
    """Every kernel family's first kernel and KERNELS, in a process of its own (the
    generated kernels are built there with the simulator's jit taking their compile
    options: nothing registered here changes)."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM=os.environ.get("NUMBA_ENABLE_CUDASIM", "1"),
               PYTHONPATH=os.path.dirname(here) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", SCRIPT, here], capture_output=True, text=True,
                       env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(KERNELS) <= set(got["compared"]) and len(got["compared"]) > 50
    assert not got["differ"]

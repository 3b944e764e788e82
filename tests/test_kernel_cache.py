"""NBDNN_KERNEL_CACHE (nbdnn/cuda/runtime/kernel_cache.py): a kernel's file name follows
everything its compiled code depends on, a stored kernel is loaded instead of compiled,
a bad file is compiled over; on a GPU a second process launches from the cache with no
compile and the same results. (tests/test_ptx.py checks that no two kernels of
different code share a name.)"""
import ast
import os
import subprocess
import sys

import numpy as np
import pytest

import nbdnn

from nbdnn.cuda.conv import im2col_rows
from nbdnn.cuda.runtime import kernel_cache
from nbdnn.cuda.runtime.codegen import compile_source
from nbdnn.cuda.runtime.simulator import SIMULATOR

SIG = "void(float32[::1])"


def built(helper="return v * 2", scale=1.0, lam=None):
    """A generated 'kernel' calling a generated helper and reading a global (plain
    functions: key() reads code, it compiles nothing)."""
    ns = {"SCALE": scale, "LAM": lam}
    compile_source("helper", f"def helper(v):\n    {helper}\n", ns)
    return compile_source("kern", "def kern(x):\n    x[0] = helper(x[0]) * SCALE + "
                          "(LAM(x[0]) if LAM is not None else 0)\n", ns)


def key(fn, sig=SIG, arch=None, options=None, cc=(9, 0)):
    return kernel_cache.key(fn, sig, arch, options or {}, cc)


def test_key_follows_the_code_and_values_a_kernel_depends_on():
    base = key(built())
    assert key(built()) == base  # (built again: another codegen file name, same text)
    assert key(built(helper="return v * 3")) != base  # a helper it calls
    assert key(built(scale=2.0)) != base  # a global it reads
    assert key(built(), sig="void(float64[::1])") != base
    assert key(built(), arch="sm_90a") != base
    assert key(built(), options={"max_registers": 64}) != base
    assert key(built(), cc=(9, 1)) != base


def test_key_follows_a_helpers_default_arguments():
    keys = set()
    for default in (1, 2):
        ns = {}
        compile_source("helper", f"def helper(v, k={default}):\n    return v * k\n", ns)
        keys.add(key(compile_source("kern", "def kern(x):\n    x[0] = helper(x[0])\n", ns)))
    assert len(keys) == 2


def test_lambdas_of_one_line_are_told_apart():
    """A factory's lambdas share file, name and line (reduce.py's pre-maps): their
    bytecode tells them apart, in a closure cell or a global."""
    pre = {"id": lambda v: v, "sq": lambda v: v * v, "abs": lambda v: abs(v)}

    def factory(f):
        def kern(x):
            x[0] = f(x[0])
        return kern
    keys = {key(factory(f)) for f in pre.values()}
    assert len(keys) == 3
    assert len({key(built(lam=f)) for f in pre.values()}) == 3


def test_key_follows_an_nbdnn_module_switch(monkeypatch):
    """A kernel reading an nbdnn module's attribute sees its value at compile time."""
    ns = {"im2col_rows": im2col_rows}
    kern = compile_source("kern", "def kern(x):\n    x[0] = 1 if im2col_rows.ON else 0\n", ns)
    before = key(kern)
    monkeypatch.setattr(im2col_rows, "ON", not im2col_rows.ON)
    assert key(kern) != before


def test_an_object_without_a_stable_description_is_uncachable(monkeypatch, tmp_path):
    class Opaque:
        pass
    kern = compile_source("kern", "def kern(x):\n    x[0] = THING\n", {"THING": Opaque()})
    with pytest.raises(kernel_cache.Uncachable):
        key(kern)
    monkeypatch.setenv("NBDNN_KERNEL_CACHE", str(tmp_path))
    assert kernel_cache.path_for(FakeKernel(kern), SIG, (9, 0)) is None


def nbdnn_imports(path, root):
    """The nbdnn modules a source file imports (dotted, absolute), relative ones resolved."""
    rel = os.path.relpath(path, os.path.dirname(root))[:-3].split(os.sep)
    package = rel[:-1]  # (what a relative import starts from, for x.py and __init__.py)
    found = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "nbdnn"}
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            mod = base + (node.module.split(".") if node.module else [])
            if mod and mod[0] == "nbdnn":
                found.add(".".join(mod))
                found |= {".".join(mod + [a.name]) for a in node.names}
    return found


def test_nothing_a_kernel_imports_reaches_the_packages_left_out_of_the_tree_hash():
    """tree_hash() skips nbdnn.torch, nn, bench and testing, so that a change to the
    front ends keeps the compiled kernels; that is safe only while no module under
    nbdnn/cuda or nbdnn/cpu (where kernels and what they call live) imports them,
    directly or through the modules it imports."""
    root = os.path.dirname(os.path.abspath(nbdnn.__file__))
    files = {}
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            if n.endswith(".py"):
                path = os.path.join(dirpath, n)
                parts = os.path.relpath(path, os.path.dirname(root))[:-3].split(os.sep)
                files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    todo = [m for m in files if m.split(".")[1:2] in (["cuda"], ["cpu"])]
    assert len(todo) > 20
    reached = set(todo)
    while todo:
        for imp in nbdnn_imports(files[todo.pop()], root):
            parts = imp.split(".")  # (the module itself and each package above it)
            for k in range(1, len(parts) + 1):
                m = ".".join(parts[:k])
                if m in files and m not in reached:
                    reached.add(m)
                    todo.append(m)
    outside = {m for m in reached if m.split(".")[1:2] and
               m.split(".")[1] in kernel_cache.OUTSIDE_KERNELS}
    assert not outside, outside
    assert "nbdnn.cuda.runtime.launch" in reached and "nbdnn.errors" in reached


class FakeLibrary:
    def get_cufunc(self):
        return "loaded"


class FakeCompiled:
    """Stands in for numba's _Kernel: picklable, with a code library."""

    def __init__(self, tag):
        self.tag, self._codelibrary = tag, FakeLibrary()


class FakeDispatcher:
    def __init__(self):
        self.compiles = 0

    def compile(self, sig):
        self.compiles += 1
        return FakeCompiled(f"compiled {sig}")


class FakeKernel:
    """What kernel_cache reads of launch.Kernel."""

    def __init__(self, pyfunc):
        self.pyfunc, self.name, self.arch, self.jit_options = pyfunc, "kern", None, {}
        self.dispatcher = FakeDispatcher()


def test_compiled_stores_then_loads_and_compiles_over_a_bad_file(monkeypatch, tmp_path,
                                                                capsys):
    monkeypatch.setattr(kernel_cache, "_cc", lambda: (9, 0))
    k = FakeKernel(built())
    monkeypatch.delenv("NBDNN_KERNEL_CACHE", raising=False)
    kernel_cache.compiled(k, SIG)  # (no folder: compiled, nothing written)
    assert k.dispatcher.compiles == 1 and not os.listdir(tmp_path)
    monkeypatch.setenv("NBDNN_KERNEL_CACHE", str(tmp_path))
    first = kernel_cache.compiled(k, SIG)
    assert k.dispatcher.compiles == 2 and len(os.listdir(tmp_path)) == 1
    again = kernel_cache.compiled(k, SIG)
    assert k.dispatcher.compiles == 2 and again.tag == first.tag == f"compiled {SIG}"
    (path,) = [os.path.join(tmp_path, f) for f in os.listdir(tmp_path)]
    with open(path, "wb") as f:
        f.write(b"not a kernel")
    assert kernel_cache.compiled(k, SIG).tag == first.tag
    assert k.dispatcher.compiles == 3 and "ignored" in capsys.readouterr().err
    assert kernel_cache.load(path) is not None  # (written over)
    os.remove(path)

    def full(path, kern):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(kernel_cache, "store", full)  # (a write that fails: compiled and
    assert kernel_cache.compiled(k, SIG).tag == first.tag  # used, a warning, no error)
    assert "not written" in capsys.readouterr().err


CHILD = r"""
import sys, numpy as np
import numba.cuda.dispatcher as d
from numba import cuda
import nbdnn
count = [0]
real = d.CUDADispatcher.compile
def counting(self, sig):
    count[0] += 1
    return real(self, sig)
d.CUDADispatcher.compile = counting
x = cuda.to_device(np.linspace(-3, 3, 4099, dtype=np.float32))
y = nbdnn.activation(nbdnn.softmax(x, axis=0), "gelu")
print(count[0], float(np.asarray(y.copy_to_host(), np.float64).sum()))
"""


@pytest.mark.skipif(SIMULATOR, reason="compiles and loads cubins: a GPU")
def test_a_second_process_launches_from_the_cache(tmp_path):
    env = dict(os.environ, NBDNN_KERNEL_CACHE=str(tmp_path),
               PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(
                   os.path.abspath(__file__))), os.environ.get("PYTHONPATH", "")]))
    runs = [subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                           text=True, timeout=600) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr[-2000:]
    (c1, s1), (c2, s2) = (r.stdout.split()[-2:] for r in runs)
    assert int(c1) > 0 and int(c2) == 0 and os.listdir(tmp_path)
    np.testing.assert_equal(float(s1), float(s2))

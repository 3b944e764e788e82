"""The kernel cache (nbdnn/cuda/runtime/launch/kernel_cache/): a kernel's entry name follows
everything its compiled code depends on; a stored kernel is loaded instead of compiled;
entries are data (a JSON header and a cubin), in a 0700 folder, never read through a
symlink, from a FIFO or from a file others can write; a bad entry is compiled over; the
size cap evicts the least recently used; on a GPU a second process launches from the
cache with no compile and the same results. (tests/test_ptx.py checks that no two kernels of
different code share a name.)"""
import json
import os
import stat
import subprocess
import sys
import types

import numpy as np
import pytest

import nbdnn

from nbdnn.cuda.conv import im2col_rows
from nbdnn.cuda.runtime.launch import kernel_cache
from nbdnn.cuda.runtime.launch.kernel_cache import store
from nbdnn.cuda.runtime.launch.codegen import compile_source
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
    kern = compile_source("kern", "def kern(x):\n    x[0] = im2col_rows.MAX_SHARED\n", ns)
    before = key(kern)
    monkeypatch.setattr(im2col_rows, "MAX_SHARED", im2col_rows.MAX_SHARED + 1)
    assert key(kern) != before


def test_an_object_without_a_stable_description_is_uncachable(monkeypatch, tmp_path):
    class Opaque:
        pass
    kern = compile_source("kern", "def kern(x):\n    x[0] = THING\n", {"THING": Opaque()})
    with pytest.raises(kernel_cache.Uncachable):
        key(kern)
    monkeypatch.setenv("NBDNN_KERNEL_CACHE", str(tmp_path))
    assert kernel_cache.path_for(FakeKernel(kern), SIG, (9, 0)) is None


def _nbdnn_path(rel):
    return os.path.join(os.path.dirname(os.path.abspath(nbdnn.__file__)), *rel.split("/"))


def test_a_kernels_name_covers_the_files_its_code_can_reach(monkeypatch):
    """A kernel's name hashes every nbdnn file its code's modules import, transitively:
    an edit to its own file, to a helper it calls or to a module only imported on the
    way changes the name; one to another family's kernels, an op's checks or
    nbdnn.torch keeps it (their compiled kernels stay valid)."""
    key_module = sys.modules["nbdnn.cuda.runtime.launch.kernel_cache.key"]
    k = next(k for k in _launch_registry() if k.name == "conv_im2col_t")
    sig = k.sigs[0]

    def name():
        return kernel_cache.key(k.pyfunc, sig, k.arch, k.jit_options, (9, 0))
    base = name()
    own = _nbdnn_path("cuda/conv/gemm.py")
    reach = key_module.closure({own})
    assert _nbdnn_path("errors.py") in reach  # (through the modules gemm.py imports)
    for rel, changes in (("cuda/conv/gemm.py", True), ("cuda/runtime/launch/grid.py", True),
                         ("errors.py", True), ("cuda/attention/flash_source.py", False),
                         ("ops/conv.py", False), ("torch/functional.py", False)):
        path = _nbdnn_path(rel)
        assert (path in reach) == changes, rel
        with monkeypatch.context() as m:
            m.setitem(key_module._files, path, b"an edited file's digest")
            m.setattr(key_module, "_digests", {})
            assert (name() != base) == changes, rel
    assert name() == base


def test_a_module_read_by_attribute_brings_its_imports(monkeypatch):
    """Code that reads a function through an nbdnn module object (module.f) depends on
    that module's file and what it imports, though no name links the function."""
    from nbdnn.cuda.runtime.launch import grid
    key_module = sys.modules["nbdnn.cuda.runtime.launch.kernel_cache.key"]

    def kernel_reading_a_module(x):
        return grid.split(x, 1, 1, 1, 1, False)
    path = _nbdnn_path("cuda/runtime/launch/grid.py")
    base = kernel_cache.key(kernel_reading_a_module, "void(int64)", "", {}, (9, 0))
    monkeypatch.setitem(key_module._files, path, b"an edited file's digest")
    monkeypatch.setattr(key_module, "_digests", {})
    assert kernel_cache.key(kernel_reading_a_module, "void(int64)", "", {}, (9, 0)) != base


def _launch_registry():
    from nbdnn.cuda import conv
    from nbdnn.cuda.runtime.launch import kernel as launch_kernel
    assert conv.FORWARD  # (the conv kernels registered)
    return launch_kernel.REGISTRY


class FakeLibrary:
    """Stands in for numba's code library: a cubin, its entry symbol, a handle."""
    _setup_functions = _teardown_functions = _linking_files = ()
    referenced_objects = {}

    def __init__(self, sig):
        self.cubin = f"cubin of {sig}".encode() * 50
        self._entry_name = "_ZN5nbdnn4kern"

    def get_cufunc(self):
        return types.SimpleNamespace(handle=1234)

    def get_cubin(self):
        return types.SimpleNamespace(code=self.cubin)


class FakeDispatcher:
    def __init__(self):
        self.compiles = 0

    def compile(self, sig):
        self.compiles += 1
        return types.SimpleNamespace(_codelibrary=FakeLibrary(sig),
                                     argument_types=kernel_cache.argument_types(sig))


class FakeKernel:
    """What kernel_cache reads of launch.Kernel."""

    def __init__(self, pyfunc):
        self.pyfunc, self.name, self.arch, self.jit_options = pyfunc, "kern", None, {}
        self.dispatcher = FakeDispatcher()


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """A fresh cache folder (NBDNN_KERNEL_CACHE), the GPU's cc and the driver's loading
    stood in for: _load records what it was given and returns a handle."""
    folder = tmp_path / "kc"
    monkeypatch.setenv("NBDNN_KERNEL_CACHE", str(folder))
    monkeypatch.delenv("NBDNN_KERNEL_CACHE_MAX_MB", raising=False)
    monkeypatch.setattr(kernel_cache, "_cc", lambda: (9, 0))
    loads = []
    monkeypatch.setattr(kernel_cache, "_load",
                        lambda entry, cubin: loads.append((entry, cubin)) or 99)
    monkeypatch.setattr(store, "_folders", {})
    return types.SimpleNamespace(folder=folder, loads=loads, kernel=FakeKernel(built()))


def the_entry(folder):
    (name,) = [n for n in os.listdir(folder) if not n.startswith(".")]
    return os.path.join(folder, name)


def test_a_compiled_kernel_is_stored_then_loaded(cache):
    k = cache.kernel
    assert kernel_cache.compiled(k, SIG) == (1234, kernel_cache.argument_types(SIG))
    assert k.dispatcher.compiles == 1 and not cache.loads
    handle, argtypes = kernel_cache.compiled(k, SIG)
    assert k.dispatcher.compiles == 1 and handle == 99
    assert argtypes == k.dispatcher.compile(SIG).argument_types
    assert cache.loads == [("_ZN5nbdnn4kern", FakeLibrary(SIG).cubin)]
    # the folder is the user's alone; the entry is data, not a pickle
    assert stat.S_IMODE(os.stat(cache.folder).st_mode) == 0o700
    with open(the_entry(cache.folder), "rb") as f:
        data = f.read()
    assert data.startswith(store.FORMAT) and b"pickle" not in data
    header = json.loads(data[len(store.FORMAT):data.index(b"\n", len(store.FORMAT))])
    assert header["sig"] == SIG and header["cc"] == [9, 0] and header["kernel"] == "kern"
    assert stat.S_IMODE(os.stat(the_entry(cache.folder)).st_mode) == 0o600


def test_the_cache_is_on_by_default_in_the_users_cache_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("NBDNN_KERNEL_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert kernel_cache.directory() == str(tmp_path / "nbdnn" / "kernels")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")  # (ignored, as XDG says)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert kernel_cache.directory() == str(tmp_path / "home" / ".cache" / "nbdnn" / "kernels")
    monkeypatch.setenv("NBDNN_KERNEL_CACHE", "0")
    assert kernel_cache.directory() is None


def test_cache_off_compiles_and_writes_nothing(cache, monkeypatch):
    monkeypatch.setenv("NBDNN_KERNEL_CACHE", "0")
    for _ in range(2):
        assert kernel_cache.compiled(cache.kernel, SIG)[0] == 1234
    assert cache.kernel.dispatcher.compiles == 2 and not cache.folder.exists()


def damage(path, how):
    with open(path, "rb") as f:
        data = f.read()
    end = data.index(b"\n", len(store.FORMAT))
    header = json.loads(data[len(store.FORMAT):end])
    if how == "truncated":
        data = data[:len(data) - 7]
    elif how == "flipped":  # one bit of the compressed cubin
        data = data[:end + 20] + bytes([data[end + 20] ^ 1]) + data[end + 21:]
    elif how == "foreign":
        data = b"\x80\x04\x95 a pickle, say"
    elif how == "empty":
        data = b""
    elif how in ("sig", "cc", "key", "bytes"):
        header[how] = {"sig": "void(float64[::1])", "cc": [8, 0], "key": "0" * 64,
                       "bytes": header["bytes"] + 1}[how]
        data = store.FORMAT + json.dumps(header).encode() + data[end:]
    elif how == "huge_header":
        data = store.FORMAT + b"{" + b" " * 10000 + data[end:]
    with open(path, "wb") as f:
        f.write(data)


@pytest.mark.parametrize("how", ["truncated", "flipped", "foreign", "empty", "sig", "cc",
                                 "key", "bytes", "huge_header"])
def test_a_bad_entry_is_compiled_over_with_a_warning(cache, how):
    k = cache.kernel
    kernel_cache.compiled(k, SIG)
    path = the_entry(cache.folder)
    damage(path, how)
    with pytest.warns(kernel_cache.KernelCacheWarning, match="ignored"):
        assert kernel_cache.compiled(k, SIG)[0] == 1234
    assert k.dispatcher.compiles == 2 and not cache.loads
    kernel_cache.compiled(k, SIG)  # (written over: sound again)
    assert k.dispatcher.compiles == 2 and len(cache.loads) == 1


def test_an_entry_someone_else_could_write_is_not_loaded(cache):
    k = cache.kernel
    kernel_cache.compiled(k, SIG)
    path = the_entry(cache.folder)
    os.chmod(path, 0o666)
    with pytest.warns(kernel_cache.KernelCacheWarning, match="writable by group or others"):
        kernel_cache.compiled(k, SIG)
    assert k.dispatcher.compiles == 2 and not cache.loads
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600  # (replaced by a private one)


def test_a_planted_symlink_is_neither_followed_nor_written_through(cache, tmp_path):
    """A symlink at an entry's (predictable) name: reading refuses it, and the store
    replaces the link itself; its target is untouched."""
    k = cache.kernel
    kernel_cache.compiled(k, SIG)
    path = the_entry(cache.folder)
    target = tmp_path / "victim"
    target.write_bytes(open(path, "rb").read())  # (even a sound entry, elsewhere)
    os.remove(path)
    os.symlink(target, path)
    with pytest.warns(kernel_cache.KernelCacheWarning, match="cannot be opened safely"):
        kernel_cache.compiled(k, SIG)
    assert k.dispatcher.compiles == 2 and not cache.loads
    assert not os.path.islink(path) and target.read_bytes().startswith(store.FORMAT)
    before = target.read_bytes()
    kernel_cache.compiled(k, SIG)
    assert target.read_bytes() == before and len(cache.loads) == 1


def test_a_fifo_at_an_entrys_name_is_refused_without_blocking(cache):
    k = cache.kernel
    kernel_cache.compiled(k, SIG)
    path = the_entry(cache.folder)
    os.remove(path)
    os.mkfifo(path)
    with pytest.warns(kernel_cache.KernelCacheWarning, match="not a regular file"):
        kernel_cache.compiled(k, SIG)
    assert k.dispatcher.compiles == 2


def test_a_folder_others_can_write_is_not_used(cache):
    os.makedirs(cache.folder)
    os.chmod(cache.folder, 0o777)
    with pytest.warns(kernel_cache.KernelCacheWarning, match="folder .* not used"):
        assert kernel_cache.compiled(cache.kernel, SIG)[0] == 1234
    assert not os.listdir(cache.folder)
    kernel_cache.compiled(cache.kernel, SIG)  # (one warning a process; still unused)
    assert cache.kernel.dispatcher.compiles == 2 and not os.listdir(cache.folder)


def test_a_folder_of_another_user_is_not_used(cache, monkeypatch):
    os.makedirs(cache.folder, mode=0o700)
    monkeypatch.setattr(os, "geteuid", lambda: os.stat(cache.folder).st_uid + 1)
    with pytest.warns(kernel_cache.KernelCacheWarning, match="belongs to user"):
        kernel_cache.compiled(cache.kernel, SIG)
    assert not os.listdir(cache.folder)


def test_a_failed_write_warns_and_runs_uncached(cache, monkeypatch):
    def full(*args):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(kernel_cache, "write", full)
    with pytest.warns(kernel_cache.KernelCacheWarning, match="not written"):
        assert kernel_cache.compiled(cache.kernel, SIG)[0] == 1234


def test_the_size_cap_evicts_the_least_recently_used(cache, monkeypatch):
    """Entries past NBDNN_KERNEL_CACHE_MAX_MB go, oldest use first; a load counts as a
    use."""
    sigs = [f"void(float32[::1], int64, {'int64, ' * i}int64)" for i in range(6)]
    for i, sig in enumerate(sigs):
        kernel_cache.compiled(cache.kernel, sig)
        path = kernel_cache.path_for(cache.kernel, sig, (9, 0))
        os.utime(path, (1000 + i, 1000 + i))  # (distinct ages: sig 0 the oldest)
    kernel_cache.compiled(cache.kernel, sigs[0])  # (a load: sig 0 now the newest)
    assert len(cache.loads) == 1
    sizes = {sig: os.path.getsize(kernel_cache.path_for(cache.kernel, sig, (9, 0)))
             for sig in sigs}
    limit = sum(sizes.values()) - 1  # (one byte too many: 90% of it kept)
    removed = kernel_cache.evict(str(cache.folder), limit)
    left = {sig for sig in sigs if os.path.exists(kernel_cache.path_for(cache.kernel, sig,
                                                                        (9, 0)))}
    assert removed >= 1 and sigs[0] in left and sigs[1] not in left
    assert sum(sizes[s] for s in left) <= 0.9 * limit
    monkeypatch.setenv("NBDNN_KERNEL_CACHE_MAX_MB", "-3")
    with pytest.warns(kernel_cache.KernelCacheWarning, match="not a positive number"):
        assert kernel_cache.max_bytes() == store.DEFAULT_MAX_MB << 20


def test_clear_removes_entries_and_stale_temporary_files(cache):
    kernel_cache.compiled(cache.kernel, SIG)
    (cache.folder / ".tmp-abc.nbk").write_bytes(b"half written")
    assert kernel_cache.clear(str(cache.folder)) == 2
    assert not os.listdir(cache.folder)


COUNTING = r"""
import numba.cuda.dispatcher as d
count = [0]  # numba's compiles in this process (a kernel cache hit makes none)
real = d.CUDADispatcher.compile
def counting(self, sig):
    count[0] += 1
    return real(self, sig)
d.CUDADispatcher.compile = counting
"""
CHILD = COUNTING + r"""
import sys, numpy as np
from numba import cuda
import nbdnn
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

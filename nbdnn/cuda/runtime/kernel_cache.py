"""Compiled kernels kept on disk between processes: `NBDNN_KERNEL_CACHE=DIR`.

numba compiles each kernel signature when it is first launched: typing, lowering,
NVVM, then the driver's PTX assembler. A bf16 ResNet-50 step meets a few hundred such
signatures and spends over 300 s compiling them on an H100's host before its first
step (run AZ); a second process pays it all again. With the variable set, `Kernel.compile`
looks in DIR first and stores what it compiled there: numba's own serialised kernel
(its `_Kernel` with the cubin for this GPU's architecture; the PTX and LLVM IR it came
from are left out), zlib-compressed, one file a kernel signature, written atomically (several
processes may share DIR). Unset (the default), nothing is read or written. The files
are unpickled: DIR must be a folder only you write to, like any cache of code.

A file is named by a hash of everything the compiled code can depend on (key()):
- the versions of numba, numba-cuda and nbdnn's own source: every .py file under
  nbdnn/ but the front ends no kernel can import (OUTSIDE_KERNELS: nbdnn.torch, nn,
  bench, testing; tests/test_kernel_cache.py checks that nothing under cuda/ or cpu/
  reaches them), hashed once a process (an edit to any other starts a fresh set of
  names; an edit to nbdnn.torch's wrappers keeps the compiled kernels);
- the kernel's code: its bytecode, and a generated kernel's text
  (cuda/runtime/codegen.py) or its file's bytes; the same for every function, device
  function and generated helper it refers to by a global name or a closure cell,
  recursively (one factory's lambdas differ only in their bytecode);
- the values it reads as globals, closure cells or default arguments at compile time
  (numba freezes them into the code): numbers, strings, tuples, NumPy arrays, and the numbers and strings
  of an nbdnn module it reads attributes from (a switch flipped at run time changes
  the name);
- the signature, the Kernel's architecture and jit options, the GPU's compute
  capability.
A value it cannot describe stably (an object printed with its address) makes the
kernel uncachable: it compiles as usual. A file that cannot be read is ignored and
compiled over.
"""
import hashlib
import os
import pickle
import re
import sys
import threading
import types
import zlib

import numpy as np

_SCALARS = (int, float, bool, str, bytes, complex, type(None))
_NBDNN = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_tree = []  # [hash of nbdnn's .py files], computed on first use
# nbdnn's packages above the kernels: they call ops, nothing below them imports them
OUTSIDE_KERNELS = ("torch", "nn", "bench", "testing")
_files = {}  # path -> hash of the file's bytes


class Uncachable(Exception):
    pass


def directory():
    """The cache's folder (NBDNN_KERNEL_CACHE, read on each compile), or None."""
    return os.environ.get("NBDNN_KERNEL_CACHE") or None


def key(pyfunc, sig, arch, jit_options, cc):
    """The file name (hex) for pyfunc compiled with signature `sig`; Uncachable where
    something it depends on cannot be described."""
    import numba
    import numba_cuda
    h = hashlib.sha256()
    for part in (numba.__version__, getattr(numba_cuda, "__version__", "?"), tree_hash(),
                 sig, arch, sorted((k, repr(v)) for k, v in jit_options.items()), cc):
        h.update(repr(part).encode())
        h.update(b"\0")
    _code_identity(pyfunc, h, set())
    return h.hexdigest()


def tree_hash():
    """One hash of the .py files under nbdnn/ outside OUTSIDE_KERNELS (names and
    bytes), once a process."""
    if not _tree:
        h = hashlib.sha256()
        for root, dirs, names in os.walk(_NBDNN):
            if root == _NBDNN:
                dirs[:] = [d for d in dirs if d not in OUTSIDE_KERNELS]
            dirs.sort()
            for n in sorted(names):
                if n.endswith(".py"):
                    path = os.path.join(root, n)
                    h.update(os.path.relpath(path, _NBDNN).encode())
                    with open(path, "rb") as f:
                        h.update(hashlib.sha256(f.read()).digest())
        _tree.append(h.hexdigest())
    return _tree[0]


def _code_identity(fn, h, seen):
    """Add fn's code (and what it refers to, recursively) to hash h."""
    if id(fn) in seen:
        return
    seen.add(id(fn))
    code = fn.__code__
    h.update(fn.__qualname__.encode())
    h.update(_source_hash(code.co_filename))
    h.update(str(code.co_firstlineno).encode())
    _bytecode(code, h)  # (lambdas of one line share file, name and line)
    names = set()
    _names(code, names)
    globs = fn.__globals__
    for name in sorted(names):
        if name in globs:
            h.update(name.encode())
            _value(globs[name], h, seen)
    for v in (fn.__defaults__ or ()) + tuple(sorted((fn.__kwdefaults__ or {}).items())):
        _value(v, h, seen)  # (a device function's default arguments)
    for cell in fn.__closure__ or ():
        try:
            _value(cell.cell_contents, h, seen)
        except ValueError:  # (an empty cell)
            h.update(b"<empty cell>")


def _bytecode(code, h):
    """Add a code object's instructions, constants and names (nested ones too)."""
    h.update(code.co_code)
    h.update(repr((code.co_names, code.co_varnames, code.co_freevars)).encode())
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            _bytecode(c, h)
        else:
            h.update(repr(c).encode())


def _names(code, names):
    """The global names code and its nested functions (comprehensions) read."""
    names.update(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            _names(c, names)


def _source_hash(filename):
    """A generated source's text (codegen keeps it) or a file's bytes, hashed."""
    if filename.startswith("<nbdnn:"):
        from .codegen import _BUILT
        text = _BUILT.get(filename)
        if text is None:
            raise Uncachable(filename)
        return hashlib.sha256(text.encode()).digest()
    digest = _files.get(filename)
    if digest is None:
        try:
            with open(filename, "rb") as f:
                digest = _files[filename] = hashlib.sha256(f.read()).digest()
        except OSError:
            raise Uncachable(filename) from None
    return digest


def _value(v, h, seen):
    """Add a global's or closure cell's value to hash h."""
    if isinstance(v, _SCALARS):
        h.update(repr((type(v).__name__, v)).encode())
    elif isinstance(v, (tuple, list, frozenset)):
        h.update(f"{type(v).__name__}{len(v)}".encode())
        for e in (sorted(v, key=repr) if isinstance(v, frozenset) else v):
            _value(e, h, seen)
    elif isinstance(v, np.ndarray):
        h.update(repr((v.dtype.str, v.shape)).encode())
        h.update(np.ascontiguousarray(v).tobytes())
    elif isinstance(v, (np.generic, np.dtype)):
        h.update(repr(v).encode())
    elif isinstance(v, types.FunctionType):
        _code_identity(v, h, seen)
    elif hasattr(v, "py_func"):  # a numba dispatcher (a device function, a kernel)
        _code_identity(v.py_func, h, seen)
    elif isinstance(v, types.ModuleType):
        _module(v, h)
    else:
        _object(v, h, seen)


def _module(m, h):
    """A module a kernel reads attributes from: its name, and for nbdnn's own modules
    their scalar attributes now (numba freezes what the kernel reads)."""
    h.update(m.__name__.encode())
    if m.__name__.startswith("nbdnn."):
        for k in sorted(vars(m)):
            v = vars(m)[k]
            if isinstance(v, _SCALARS) and not k.startswith("__"):
                h.update(repr((k, v)).encode())


def _object(v, h, seen):
    """Anything else: an intrinsic or overload (its definition's code), a class or numba
    type (its name and, for types, its stable printed form); Uncachable otherwise."""
    defn = getattr(v, "_defn", None)  # numba's @intrinsic
    if isinstance(defn, types.FunctionType):
        h.update(b"intrinsic")
        _code_identity(defn, h, seen)
        return
    if isinstance(v, type):
        h.update(f"{v.__module__}.{v.__qualname__}".encode())
        return
    text = repr(v)
    if " at 0x" in text or "object at" in text:
        raise Uncachable(text[:80])
    h.update(f"{type(v).__module__}.{type(v).__qualname__}:{text}".encode())


def load(path):
    """The numba kernel stored at path, or None (absent, unreadable, or from another
    numba)."""
    try:
        with open(path, "rb") as f:
            return pickle.loads(zlib.decompress(f.read()))
    except FileNotFoundError:
        return None
    except Exception as e:  # (a truncated or foreign file: compiled over)
        print(f"nbdnn: kernel cache file {path} ignored ({type(e).__name__}: {e})",
              file=sys.stderr)
        return None


def store(path, kern):
    """Write numba kernel kern to path (a temporary file, then an atomic rename): its
    cubins only, without the LLVM IR and PTX they came from (a loaded kernel launches
    from its cubin; the IR is most of the bytes)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    lib = getattr(kern, "_codelibrary", None)
    kept = (lib._llvm_strs, lib._ptx_cache) if hasattr(lib, "_llvm_strs") else None
    if kept:
        lib._llvm_strs, lib._ptx_cache = [], {}
    try:
        blob = zlib.compress(pickle.dumps(kern, protocol=pickle.HIGHEST_PROTOCOL), 6)
    finally:
        if kept:
            lib._llvm_strs, lib._ptx_cache = kept
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "wb") as f:
        f.write(blob)
    os.replace(tmp, path)


def compiled(kernel, sig):
    """numba's compiled kernel for Kernel kernel's signature sig: from the cache folder
    where one is set and holds it, else compiled (and stored there)."""
    path = path_for(kernel, sig, _cc()) if directory() else None
    kern = load(path) if path else None
    if kern is None:
        kern = kernel.dispatcher.compile(sig)
        if path:
            kern._codelibrary.get_cufunc()  # (the cubin, made now, is stored too)
            try:
                store(path, kern)
            except OSError as e:  # (a full disk or a read-only folder: run uncached)
                print(f"nbdnn: kernel cache file {path} not written ({e})", file=sys.stderr)
    return kern


def _cc():
    from numba import cuda
    return cuda.get_current_device().compute_capability


def path_for(kernel, sig, cc):
    """Where kernel's signature sig lives in the cache folder, or None (no folder, or
    uncachable)."""
    where = directory()
    if where is None:
        return None
    try:
        name = key(kernel.pyfunc, sig, kernel.arch, kernel.jit_options, cc)
    except Uncachable:
        return None
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", kernel.name)
    return os.path.join(where, f"{stem}-{name[:32]}.nbk")

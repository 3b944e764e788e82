"""A compiled kernel's cache key: a hash of everything its code can depend on (the
list is in the package's docstring)."""
import hashlib
import os
import types

import numpy as np

_SCALARS = (int, float, bool, str, bytes, complex, type(None))
_NBDNN = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
_tree = []  # [hash of nbdnn's .py files], computed on first use
# nbdnn's packages above the kernels: the ops' front ends and what calls them; no module
# under cuda/ or cpu/ imports them (tests/test_kernel_cache.py), so an edit there keeps
# every compiled kernel
OUTSIDE_KERNELS = ("ops", "torch", "nn", "bench", "testing")
_files = {}  # path -> hash of the file's bytes


class Uncachable(Exception):
    pass


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
        from ..codegen import built_text
        text = built_text(filename)
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

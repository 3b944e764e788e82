"""A compiled kernel's cache key: a hash of everything its code can depend on (the
list is in the package's docstring)."""
import ast
import hashlib
import os
import types

import numpy as np

_SCALARS = (int, float, bool, str, bytes, complex, type(None))
_NBDNN = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))  # the nbdnn package's folder
_ROOT = os.path.dirname(_NBDNN)
_files = {}  # path -> hash of the file's bytes
_imported = {}  # path -> the nbdnn source files that module imports
_digests = {}  # frozenset of files -> _closure_digest


class Uncachable(Exception):
    pass


def key(pyfunc, sig, arch, jit_options, cc):
    """The file name (hex) for pyfunc compiled with signature `sig`; Uncachable where
    something it depends on cannot be described."""
    import numba
    import numba_cuda
    h = hashlib.sha256()
    for part in (numba.__version__, getattr(numba_cuda, "__version__", "?"), sig, arch,
                 sorted((k, repr(v)) for k, v in jit_options.items()), cc):
        h.update(repr(part).encode())
        h.update(b"\0")
    files = set()
    _code_identity(pyfunc, h, set(), files)
    h.update(_closure_digest(frozenset(files)))
    return h.hexdigest()


def _closure_digest(files):
    """One digest of closure(files)'s names and bytes (a module's kernels share it)."""
    got = _digests.get(files)
    if got is None:
        h = hashlib.sha256()
        for path in sorted(closure(files)):
            h.update(os.path.relpath(path, _ROOT).encode())
            h.update(_source_hash(path))
        got = _digests[files] = h.digest()
    return got


def closure(files):
    """The nbdnn source files `files` import, directly or through the modules they
    import (a function's code can reach no other module's objects), files included."""
    seen, todo = set(files), list(files)
    while todo:
        for f in imports(todo.pop()):
            if f not in seen:
                seen.add(f)
                todo.append(f)
    return seen


def imports(path):
    """The nbdnn source files the module at `path` imports anywhere in it (relative
    imports resolved; a package's __init__ where an import names the package, not for
    each submodule below it: Python runs it, but the module reads none of its names)."""
    got = _imported.get(path)
    if got is None:
        parts = os.path.relpath(path, _ROOT)[:-3].split(os.sep)
        package = parts[:-1]  # (what a relative import starts from, x.py and __init__.py)
        names = set()
        with open(path, "rb") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                mod = base + (node.module.split(".") if node.module else [])
                names.add(".".join(mod))
                names |= {".".join(mod + [a.name]) for a in node.names}
        got = _imported[path] = frozenset(
            f for f in map(_module_file, names) if f is not None)
    return got


def _module_file(name):
    """The source file of nbdnn module `name` ("nbdnn.cuda.conv.gemm"), else None."""
    if name.split(".")[0] != "nbdnn":
        return None
    stem = os.path.join(_ROOT, *name.split("."))
    for path in (stem + ".py", os.path.join(stem, "__init__.py")):
        if os.path.isfile(path):
            return path
    return None


def _nbdnn_file(path, files):
    """Note an nbdnn source file a kernel's code came from (files: key()'s set)."""
    path = os.path.abspath(path)
    if path.startswith(_NBDNN + os.sep) and path.endswith(".py"):
        files.add(path)


def _code_identity(fn, h, seen, files):
    """Add fn's code (and what it refers to, recursively) to hash h; the nbdnn files it
    came from to `files`."""
    if id(fn) in seen:
        return
    seen.add(id(fn))
    code = fn.__code__
    h.update(fn.__qualname__.encode())
    h.update(_source_hash(code.co_filename))
    _nbdnn_file(code.co_filename, files)
    h.update(str(code.co_firstlineno).encode())
    _bytecode(code, h)  # (lambdas of one line share file, name and line)
    names = set()
    _names(code, names)
    globs = fn.__globals__
    for name in sorted(names):
        if name in globs:
            h.update(name.encode())
            _value(globs[name], h, seen, files)
    for v in (fn.__defaults__ or ()) + tuple(sorted((fn.__kwdefaults__ or {}).items())):
        _value(v, h, seen, files)  # (a device function's default arguments)
    for cell in fn.__closure__ or ():
        try:
            _value(cell.cell_contents, h, seen, files)
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
    filename = os.path.abspath(filename)
    digest = _files.get(filename)
    if digest is None:
        try:
            with open(filename, "rb") as f:
                digest = _files[filename] = hashlib.sha256(f.read()).digest()
        except OSError:
            raise Uncachable(filename) from None
    return digest


def _value(v, h, seen, files):
    """Add a global's or closure cell's value to hash h."""
    if isinstance(v, _SCALARS):
        h.update(repr((type(v).__name__, v)).encode())
    elif isinstance(v, (tuple, list, frozenset)):
        h.update(f"{type(v).__name__}{len(v)}".encode())
        for e in (sorted(v, key=repr) if isinstance(v, frozenset) else v):
            _value(e, h, seen, files)
    elif isinstance(v, np.ndarray):
        h.update(repr((v.dtype.str, v.shape)).encode())
        h.update(np.ascontiguousarray(v).tobytes())
    elif isinstance(v, (np.generic, np.dtype)):
        h.update(repr(v).encode())
    elif isinstance(v, types.FunctionType):
        _code_identity(v, h, seen, files)
    elif hasattr(v, "py_func"):  # a numba dispatcher (a device function, a kernel)
        _code_identity(v.py_func, h, seen, files)
    elif isinstance(v, types.ModuleType):
        _module(v, h, files)
    else:
        _object(v, h, seen, files)


def _module(m, h, files):
    """A module a kernel reads attributes from: its name, and for nbdnn's own modules
    their scalar attributes now (numba freezes what the kernel reads) and their file
    (whose import closure key() hashes: the functions it reads there)."""
    h.update(m.__name__.encode())
    if m.__name__.startswith("nbdnn."):
        _nbdnn_file(getattr(m, "__file__", None) or "", files)
        for k in sorted(vars(m)):
            v = vars(m)[k]
            if isinstance(v, _SCALARS) and not k.startswith("__"):
                h.update(repr((k, v)).encode())


def _object(v, h, seen, files):
    """Anything else: an intrinsic or overload (its definition's code), a class or numba
    type (its name and, for types, its stable printed form); Uncachable otherwise."""
    defn = getattr(v, "_defn", None)  # numba's @intrinsic
    if isinstance(defn, types.FunctionType):
        h.update(b"intrinsic")
        _code_identity(defn, h, seen, files)
        return
    if isinstance(v, type):
        h.update(f"{v.__module__}.{v.__qualname__}".encode())
        return
    text = repr(v)
    if " at 0x" in text or "object at" in text:
        raise Uncachable(text[:80])
    h.update(f"{type(v).__module__}.{type(v).__qualname__}:{text}".encode())

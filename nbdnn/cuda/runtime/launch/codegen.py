"""One way in for generated source: every kernel (and host helper) nbdnn builds from
text goes through `compile_source`, so none is invisible.

- The text is registered with linecache under its own file name
  (`<nbdnn:NAME#n>`): tracebacks, pdb and `inspect.getsource` show the generated
  lines, and numba's error messages point into them.
- `NBDNN_DUMP_SOURCE=DIR` writes each source to DIR/NAME.py (NAME#n.py when a name
  is built again with other parameters), under a header that says what it is: its
  configuration (tile, stages, dtype ...), the bytes and flops one tile or thread
  moves, and why the variant exists.
- `sources(pattern)` returns what was built in this process, for a look from Python:
  `print(codegen.sources("igemm_chunked_small")[0])`.
"""
import itertools
import linecache
import os
import re
import weakref

_counter = itertools.count()
_BUILT = {}  # file name -> header + source


def header(name, about):
    """The comment block above a generated source: its name, then one line per entry
    of `about` (configuration, traffic, why)."""
    lines = [f"# nbdnn generated source: {name}"]
    for k, v in (about or {}).items():
        text = str(v).strip().replace("\n", "\n#   ")
        lines.append(f"# {k}: {text}")
    return "\n".join(lines) + "\n"


def compile_source(name, source, namespace, about=None, label=None, transient=False):
    """Execute generated `source`, which defines `name` (and maybe helpers), in
    `namespace` (a dict: the names the source uses; it receives the definitions) and
    return namespace[name]. about: {label: text} for the header; label: the name it is
    shown and dumped under when `name` alone does not tell it apart (module docstring).
    transient: the source is kept (linecache, sources()) only while the returned
    function lives, and the namespace does not hold the function (an eager call plan's
    replay: one a signature, dropped with its plan; kernels and packers live as long as
    the process and keep theirs)."""
    label = label or name
    text = header(label, about) + source
    n = next(_counter)
    filename = f"<nbdnn:{label}#{n}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    _BUILT[filename] = text
    exec(compile(text, filename, "exec"), namespace)
    where = os.environ.get("NBDNN_DUMP_SOURCE")
    if where:
        _dump(where, label, text)
    fn = namespace[name]
    if transient:
        del namespace[name]  # (fn.__globals__ is namespace: no cycle, freed with fn)
        weakref.finalize(fn, _forget, filename)
    return fn


def _forget(filename):
    linecache.cache.pop(filename, None)
    _BUILT.pop(filename, None)


def _dump(where, name, text):
    os.makedirs(where, exist_ok=True)
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    path = os.path.join(where, stem + ".py")
    k = 1
    while os.path.exists(path):
        with open(path) as f:
            if f.read() == text:
                return
        path = os.path.join(where, f"{stem}#{k}.py")
        k += 1
    with open(path, "w") as f:
        f.write(text)


def built_text(filename):
    """The text (header and source) built under `filename` (a code object's
    co_filename), or None when it is not one of ours or was freed."""
    return _BUILT.get(filename)


def sources(pattern=""):
    """The generated sources built so far in this process whose name contains
    `pattern` (each with its header), oldest first."""
    return [t for f, t in _BUILT.items() if pattern in f[len("<nbdnn:"):f.rindex("#")]]

"""The house rules, read from the code (an AST walk over nbdnn/; imports inside
functions count, and so does a module importing its own package's __init__):
no import circles; cpu/ and cuda/ never import ops/, ops/ reaches the backends only
through nbdnn.backend (their dispatch tables); numba only under cuda/; no import from a
lower layer up; no private name (a leading underscore) used outside its module
(docs/DESIGN.md); every global a function reads exists once its module is imported. Files and folders are sized by their ideas, not by counts."""
import ast
import os

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "nbdnn")
# layers, lowest first: an import from a module to one of a higher layer is "up"
LAYERS = [("nbdnn.errors", "nbdnn._vocab", "nbdnn._shapes", "nbdnn._gpu_check", "nbdnn._math_mode",
           "nbdnn._files", "nbdnn._philox"),
          ("nbdnn.arrays",),
          ("nbdnn.cpu", "nbdnn.cuda"), ("nbdnn.backend",), ("nbdnn.ops",), ("nbdnn",),
          ("nbdnn.testing", "nbdnn.bench", "nbdnn.nn"), ("nbdnn.cli", "nbdnn.demo",
                                                         "nbdnn.__main__")]


def _modules():
    mods = {}  # dotted name -> (path, is_package)
    for d, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(d, f)
                rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
                pkg = rel.endswith(".__init__")
                mods[rel[:-9] if pkg else rel] = (path, pkg)
    return mods


MODS = _modules()


def _imports(mod):
    """[(imported nbdnn module, line, top-level package imported)] of module mod."""
    path, pkg = MODS[mod]
    tree = ast.parse(open(path).read(), path)
    base = mod.split(".") if pkg else mod.split(".")[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                up = base[:len(base) - node.level + 1]
                prefix = ".".join(up + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            names = [f"{prefix}.{a.name}" for a in node.names] + [prefix]
        else:
            continue
        found = set()
        for n in names:
            top = n.split(".")[0]
            while n and n not in MODS:
                n = n.rpartition(".")[0]
            if n:
                found.add(n)
            elif top != "nbdnn":
                out.append((None, node.lineno, top))
        # "from .x import y" names x and maybe the submodule x.y: keep the most specific
        for n in found:
            if n != mod and not any(o != n and o.startswith(n + ".") for o in found):
                out.append((n, node.lineno, "nbdnn"))
    return out


EDGES = {m: _imports(m) for m in MODS}


def _layer(mod):
    best = None
    for i, names in enumerate(LAYERS):
        for n in names:
            if mod == n or mod.startswith(n + "."):
                if best is None or len(n) > best[1]:
                    best = (i, len(n))
    return best[0] if best else len(LAYERS)


def test_no_import_circles():
    graph = {m: {t for t, _, _ in e if t} for m, e in EDGES.items()}
    index, low, stack, on, circles = {}, {}, [], set(), []

    def visit(v, counter=[0]):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert not circles, circles


def test_backends_below_the_front_end():
    bad = []
    for m, edges in EDGES.items():
        for t, line, top in edges:
            where = f"{m}:{line} imports {t or top}"
            if top == "numba" and not (m == "nbdnn.cuda" or m.startswith("nbdnn.cuda.")):
                bad.append(where + " (numba outside cuda/)")
            if t is None:
                continue
            if (m.startswith("nbdnn.cpu") or m.startswith("nbdnn.cuda")) and \
                    t.startswith("nbdnn.ops"):
                bad.append(where + " (a backend reaching up into ops/)")
            if m.startswith("nbdnn.ops") and (t.startswith("nbdnn.cpu") or
                                              t.startswith("nbdnn.cuda")):
                bad.append(where + " (ops/ around nbdnn.backend)")
    assert not bad, "\n".join(bad)


def test_no_import_from_a_lower_layer_up():
    up = [f"{m}:{line} -> {t}" for m, edges in EDGES.items() for t, line, _ in edges
          if t and _layer(t) > _layer(m)]
    assert not up, "\n".join(up)


def _resolved(mod, pkg, node):
    base = mod.split(".") if pkg else mod.split(".")[:-1]
    if node.level:
        return ".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module else []))
    return node.module or ""


def test_no_private_name_crosses_a_module():
    """A name with a leading underscore is its module's own: no other module imports it
    (`from .conv import _pads`) or reaches for it (`_launch._driver`). A helper two
    modules need belongs, public, to the room that owns its idea."""
    bad = []
    for mod, (path, pkg) in sorted(MODS.items()):
        tree = ast.parse(open(path).read(), path)
        aliases = {}  # local name -> the nbdnn module it is
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                src = _resolved(mod, pkg, node)
                if src.split(".")[0] != "nbdnn":
                    continue
                for a in node.names:
                    if f"{src}.{a.name}" in MODS:  # (a module: imported under any name)
                        aliases[a.asname or a.name] = f"{src}.{a.name}"
                    elif a.name.startswith("_") and not a.name.startswith("__"):
                        bad.append(f"{mod}:{node.lineno} from {src} import {a.name}")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == "nbdnn" and a.asname:
                        aliases[a.asname] = a.name
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                    node.value.id in aliases and node.attr.startswith("_") and \
                    not node.attr.startswith("__") and aliases[node.value.id] != mod:
                bad.append(f"{mod}:{node.lineno} {node.value.id}.{node.attr} "
                           f"({aliases[node.value.id]})")
    assert not bad, "\n".join(bad)


def test_no_run_names_in_library_code():
    """Comments say why, not when: a measurement is cited by what was measured (GPU,
    shapes, numbers), never by the name of the run that took it, nor a feature by the
    issue that asked for it (history lives in git)."""
    import re
    run = re.compile(r"\b[Rr]uns? [A-Z]{1,2}\b(?![a-z/])|perf/history|\b[Ii]ssue #?[0-9]+\b(?!-)")
    bad = [f"{os.path.relpath(path, ROOT)}:{i}: {line.strip()}"
           for path, _ in MODS.values()
           for i, line in enumerate(open(path), 1) if run.search(line)]
    assert not bad, "\n".join(bad)


# functions whose globals are bound elsewhere: (module, function) -> why
BOUND_ELSEWHERE = {
    ("nbdnn.cuda.matmul.tensor_core_gemm.split_k", "_splitk_sum"):
        "compiled from its source into a namespace that binds act_fn (splitk_sum)",
}


def test_every_global_a_function_reads_exists():
    """Each name a function of nbdnn reads as a global (LOAD_GLOBAL) is its module's or a
    builtin once the module is imported: a helper deleted or renamed while a caller
    still names it fails here, not at its first call. (The simulator never runs the
    GPU's launch path: a refactor that dropped kernel.py's launcher passed every CPU
    test and failed every GPU launch.) The functions checked are the module's own, as
    imported (functions, classes' methods, and the functions inside them), so a branch
    the simulator did not define is not read."""
    import builtins
    import dis
    import importlib
    import inspect
    import types

    def codes(co):
        yield co
        for c in co.co_consts:
            if isinstance(c, types.CodeType):
                yield from codes(c)

    def functions(mod):
        for obj in vars(mod).values():
            if getattr(obj, "__module__", None) != mod.__name__:
                continue
            if inspect.isfunction(obj):
                yield obj
            elif inspect.isclass(obj):
                for attr in vars(obj).values():
                    f = getattr(attr, "__func__", attr)
                    f = getattr(f, "fget", f)
                    if inspect.isfunction(f):
                        yield f
    missing = []
    for name in sorted(_modules()):
        if name.endswith("__main__"):
            continue
        try:
            mod = importlib.import_module(name)
        except ImportError as e:  # (an optional peer: torch, matplotlib)
            if "torch" in str(e) or "matplotlib" in str(e):
                continue
            raise
        known = set(vars(mod)) | set(dir(builtins))
        for fn in functions(mod):
            if fn.__code__.co_filename != mod.__file__ or \
                    (name, fn.__qualname__.split(".")[0]) in BOUND_ELSEWHERE:
                continue  # (a wrapper's code from elsewhere: contextlib's, namedtuple's)
            for co in codes(fn.__code__):
                for ins in dis.get_instructions(co):
                    if ins.opname == "LOAD_GLOBAL" and ins.argval not in known:
                        missing.append(f"{name}.{co.co_qualname}: {ins.argval}")
    assert not missing, missing

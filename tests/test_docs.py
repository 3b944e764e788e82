"""The docs match the tree: the generated blocks are current (tools/generate.py), every
family has its page, DESIGN.md's layout names every module and no module that is gone,
every link and quoted path resolves, and the README stays short."""
import importlib.util
import os
import re

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
EXAMPLE_OP = "clamp"  # DESIGN.md's worked example: its files are to be written, not read
DOCS = [os.path.join(ROOT, "README.md")] + [
    os.path.join(d, f) for d, _, fs in os.walk(os.path.join(ROOT, "docs")) for f in fs
    if f.endswith(".md")]


def _generator():
    spec = importlib.util.spec_from_file_location(
        "nbdnn_generate", os.path.join(ROOT, "tools", "generate.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_generated_blocks_are_current():
    stale = [os.path.relpath(p, ROOT) for p, _ in _generator().stale()]
    assert not stale, f"stale generated blocks in {stale}: run python tools/generate.py"


def test_every_family_has_a_page_stating_its_cuda_paths_and_headline():
    from nbdnn.ops.registry import OPS
    gen = _generator()
    for family in {r.family for r in OPS.values()}:
        assert os.path.exists(gen.page(family)), f"docs/ops/{family}.md is missing"
        for label in ("CUDA paths", "Headline"):
            assert gen.stated(family, label)


def _layout():
    text = open(os.path.join(ROOT, "docs", "DESIGN.md")).read()
    return text.split("## Layout", 1)[1].split("```", 2)[1]


def test_the_layout_names_every_module():
    """Each module under nbdnn/ is named in DESIGN.md's layout (its file name or its
    stem), each package as `name/`."""
    layout = _layout()
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", layout))
    missing = []
    for d, dirs, files in os.walk(os.path.join(ROOT, "nbdnn")):
        dirs[:] = [x for x in dirs if x != "__pycache__"]
        rel = os.path.relpath(d, os.path.join(ROOT, "nbdnn"))
        if rel != "." and f"{os.path.basename(d)}/" not in layout:
            missing.append(rel + "/")
        missing += [os.path.join(rel, f) for f in files
                    if f.endswith(".py") and f != "__init__.py" and f[:-3] not in words]
    assert not missing, f"DESIGN.md's layout does not name {sorted(missing)}"


def test_the_layout_names_no_module_that_is_gone():
    names = {f[:-3] for _, _, fs in os.walk(os.path.join(ROOT, "nbdnn")) for f in fs
             if f.endswith(".py")}
    gone = [n for n in re.findall(r"\b([a-z_0-9]+)\.py\b", _layout()) if n not in names
            and not os.path.exists(os.path.join(ROOT, "perf", n + ".py"))
            and not os.path.exists(os.path.join(ROOT, "tools", n + ".py"))
            and not os.path.exists(os.path.join(ROOT, "tests", n + ".py"))]
    assert not gone, gone


@pytest.mark.parametrize("path", DOCS, ids=lambda p: os.path.relpath(p, ROOT))
def test_links_and_quoted_paths_resolve(path):
    """Every relative markdown link, and every `path` in backticks that names a file
    or folder of the tree (nbdnn/, perf/, tests/, docs/, tools/, examples/), exists."""
    text = open(path).read()
    here = os.path.dirname(path)
    bad = [t for t in re.findall(r"\]\(([^)#\s]+)\)", text)
           if "://" not in t and not os.path.exists(os.path.join(here, t))]
    for t in re.findall(r"`((?:nbdnn|perf|tests|docs|tools|examples)/[^`\s]*)`", text):
        t = t.split("::")[0].rstrip(".,;:")
        if "*" not in t and "<" not in t and EXAMPLE_OP not in t and \
                not os.path.exists(os.path.join(ROOT, t)):
            bad.append(t)
    assert not bad, bad


def test_the_readme_is_short():
    assert len(open(os.path.join(ROOT, "README.md")).read().splitlines()) <= 120

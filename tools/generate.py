"""Rewrite every generated block in the tree from its source of truth; tests/test_docs.py
fails until this has run after a change to what a block quotes.
- nbdnn/__init__.py's exports, from the op registry (registry.exports_source).
- docs/ops/<family>.md's API section: each op's signature and docstring.
- README.md's family table: each family's ops (the registry) and the CUDA paths and
  headline its page states (the page's "**CUDA paths:**" and "**Headline:**" lines).
- perf/RESULTS.md's measured tables, from the results in perf/results/ (perf/report.py).

    python tools/generate.py
"""
import inspect
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from nbdnn.ops import registry  # noqa: E402  (the checkout's nbdnn, not an installed one)
sys.path.insert(0, os.path.join(ROOT, "perf"))
import report  # noqa: E402  (perf/report.py)

END = "<!-- end generated -->"


def page(family):
    return os.path.join(ROOT, "docs", "ops", f"{family}.md")


def api_block(family, records):
    """docs/ops/<family>.md's API section: each op's signature and docstring."""
    out = ["<!-- generated: api (tools/generate.py from the op registry) -->", "## API", ""]
    for r in records.values():
        if r.family != family:
            continue
        out += [f"### `nbdnn.{r.name}{inspect.signature(r.fn)}`", "",
                inspect.cleandoc(r.fn.__doc__ or "(no docstring)"), ""]
    return "\n".join(out + [END]) + "\n"


def stated(family, label):
    """The text after `**label:**` on the family's page, its lines joined."""
    text = open(page(family)).read()
    m = re.search(rf"^\*\*{label}:\*\* (.*?)(?=\n\*\*|\n\n)", text, re.M | re.S)
    if m is None:
        raise SystemExit(f"docs/ops/{family}.md states no **{label}:** line")
    return " ".join(m.group(1).split())


def family_table(records):
    """README.md's table: a row a family."""
    out = ["<!-- generated: families (tools/generate.py from the op registry and docs/ops/) -->",
           "| family | ops | CUDA paths | headline |", "|---|---|---|---|"]
    for family in sorted({r.family for r in records.values()}):
        ops = ", ".join(f"`{r.name}`" for r in records.values() if r.family == family)
        out.append(f"| [{family}](docs/ops/{family}.md) | {ops} | "
                   f"{stated(family, 'CUDA paths')} | {stated(family, 'Headline')} |")
    return "\n".join(out + [END]) + "\n"


def results_block():
    """perf/RESULTS.md's measured tables (perf/report.py)."""
    return "\n".join(["<!-- generated: results (tools/generate.py from perf/results/) -->",
                      *report.render(), END]) + "\n"


def blocks():
    """{path: [block, ...]} of every generated block, as it should read now."""
    records = registry.load()
    out = {os.path.join(ROOT, "nbdnn", "__init__.py"): [registry.exports_source(records)],
           os.path.join(ROOT, "README.md"): [family_table(records)],
           os.path.join(ROOT, "perf", "RESULTS.md"): [results_block()]}
    for family in sorted({r.family for r in records.values()}):
        out[page(family)] = [api_block(family, records)]
    return out


def current(text, block):
    """The block of `text` that starts with block's first line (through its last
    line), or None."""
    first, last = block.split("\n", 1)[0], block.rstrip("\n").rsplit("\n", 1)[1]
    key = first[:30]
    if key not in text:
        return None
    rest = key + text.split(key, 1)[1]
    if last not in rest:
        return None
    return rest.split(last, 1)[0] + last + "\n"


def stale():
    """[(path, block)] of the blocks that differ from the tree's."""
    bad = []
    for path, bs in blocks().items():
        text = open(path).read() if os.path.exists(path) else ""
        bad += [(path, b) for b in bs if current(text, b) != b]
    return bad


def main():
    for path, block in stale():
        text = open(path).read()
        old = current(text, block)
        if old is None:
            raise SystemExit(f"{os.path.relpath(path, ROOT)}: no block starting "
                             f"{block.split(chr(10), 1)[0]!r} to rewrite")
        with open(path, "w") as f:
            f.write(text.replace(old, block, 1))
        print("rewrote", os.path.relpath(path, ROOT))


if __name__ == "__main__":
    main()

"""Rewrite every generated block in the tree from its source of truth; the tests that
check each block (named beside it) fail until this has run.
- nbdnn/__init__.py's exports, from the op registry (nbdnn/ops/registry.exports_source;
  tests/test_backends.py).

    python tools/generate.py
"""
import os

from nbdnn.ops import registry

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def replace_block(path, block):
    """The file at path with its block (from its first line up to and including its
    last) replaced by `block`."""
    text = open(path).read()
    first, last = block.split("\n", 1)[0][:20], block.rstrip("\n").rsplit("\n", 1)[1]
    head, rest = text.split(first, 1)
    tail = rest.split(last, 1)[1].split("\n", 1)[1]
    new = head + block + tail
    if new != text:
        with open(path, "w") as f:
            f.write(new)
        print("rewrote", os.path.relpath(path, ROOT))


if __name__ == "__main__":
    replace_block(os.path.join(ROOT, "nbdnn", "__init__.py"), registry.exports_source(registry.load()))

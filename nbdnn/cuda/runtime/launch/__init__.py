"""Launching kernels: kernel.py (Kernel: compile, load, launch through the driver with
a packed argument record; `launched()` records what ran), grid.py (grid-stride launch,
index splits, strides), codegen.py (the one door for generated source), kernel_cache/
(compiled kernels on disk, keyed by everything their code depends on), precompile.py
(a workload's kernels compiled in parallel ahead of it: dry run, forked workers)."""

"""Code that runs inside kernels: intrinsics.py (vector loads and stores, bf16, and
other PTX the simulator lacks, with fallbacks), block_reduce.py (deterministic block
and warp reductions), stencil.py (magic-number division, rows a thread, clamped window
loads)."""

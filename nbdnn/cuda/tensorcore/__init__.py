"""Tensor cores from numba: inline-PTX intrinsics for the H200 (sm_90a) and sm_80+.

- asm.py: how an intrinsic emits PTX (constraints, shared and global addresses).
- mma.py: warp-level mma.sync (f16, bf16, tf32), ldmatrix / stmatrix, conversions,
  with the fragment layouts.
- copy.py: cp.async (16 bytes, zero-fill), commit and wait groups.
- wgmma.py: warpgroup wgmma m64nNk16/k8 from shared-memory descriptors (swizzle modes),
  fence / commit / wait, the accumulator layout.
- tma.py: mbarriers, TMA tensor loads and stores, the async-proxy fences, setmaxnreg.
- tensormap.py: TMA tensor maps built on the host (cuda-bindings), cached on the device.
- cluster.py: thread-block clusters: the compile-time cluster shape, the cluster
  barrier, distributed shared memory (mapa, ld.shared::cluster).
- tiles.py: one-tile kernels using each piece (PTX test, GPU tests).

numba's simulator runs no inline PTX: an op with a tensor-core kernel keeps a SIMT path
that the simulator and CI run; these kernels are tested by PTX compilation in CI and
on the GPU (tests/test_tensorcore.py).
"""

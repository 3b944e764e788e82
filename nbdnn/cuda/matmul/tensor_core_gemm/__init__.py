"""The tensor-core GEMM: the kernels matmul's variants wgmma and mma_sync run, and the
pieces their generated source is made of.

- wgmma_gemm.py: the sm_90 kernel (TMA loads, wgmma, a producer warpgroup and two
  consumers, persistent blocks) and its host side; wgmma_source.py writes its source
  from wgmma_stage.py (a stage's shared-memory layout, loads and descriptors),
  tile_order.py (the persistent blocks' tile schedule), wgmma_params.py (signatures,
  the blocks' own tensor maps) and wgmma_im2col.py (a convolution's operands through
  TMA im2col boxes: conv/wgmma_conv.py).
- split_k.py: tile width and split-K chunks for a grid, and the ordered sum of the
  chunks (deterministic).
- mma_gemm.py: the sm_80-89 kernel (mma.sync, ldmatrix, cp.async).
- epilogue/: act(alpha acc + beta z + bias) as both kernels and the convolutions write
  it: pairs.py (a thread's register pairs stored straight to C), staged_store.py
  (through shared memory and TMA stores).
"""

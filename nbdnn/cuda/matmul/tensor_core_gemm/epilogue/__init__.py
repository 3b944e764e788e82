"""The tensor-core GEMM's fused epilogue, c = alpha * act(acc + bias) + beta * c (the
GEMM's order) or act(alpha * acc + beta * z + bias) (a convolution's, z a residual or
y): pairs.py writes it for a thread's accumulator pairs stored straight to C (wgmma and
mma.sync fragments: rows r and r + 8, two columns each); staged_store.py for C through
swizzled shared-memory tiles and TMA stores."""

"""The CUDA backend: numba.cuda kernels. Families with several kernels are packages
(conv, matmul, norm, batch_norm, softmax, tensor, pool: one module per algorithm), the
others single modules (activation, dropout, lrn); `runtime/` holds what every kernel
shares: arrays, launch, codegen, intrinsics, device facts, plan recording, graphs.

Importing this package prepares numba.cuda first (runtime/simulator.py: the numpy 2.5
shim, and numba's CUDA simulator where there is no GPU). `SIMULATOR` says which.
"""
from .runtime.simulator import DRIVER_STATUS, SIMULATOR, cuda  # noqa: F401
from .runtime.capture.graph import Graph  # noqa: F401  (nbdnn.cuda.Graph)
from .runtime.launch.precompile import precompile  # noqa: F401  (nbdnn.cuda.precompile)

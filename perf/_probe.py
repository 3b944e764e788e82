import numpy as np, time, sys
import nbdnn
from nbdnn.bench import time_gpu, copy_bandwidth, _torch
from numba import cuda
import numba, numba_cuda
print("numba", numba.__version__, "numba-cuda", numba_cuda.__version__, "numpy", np.__version__)
dev = cuda.get_current_device(); print(dev.name, dev.compute_capability)
from numba.cuda.cudadrv import nvvm, runtime
try: print("nvvm", nvvm.NVVM().get_version(), "runtime", runtime.get_version())
except Exception as e: print("ver err", e)
from numba.cuda.cudadrv.driver import driver; print("driver", driver.get_version())
torch = _torch()
n = 1 << 28  # 1 GiB float32
bw = copy_bandwidth(4 * n); print(f"copy bw 1GiB: {bw/1e12:.3f} TB/s")
tx = torch.randn(n, device="cuda"); ty = torch.empty_like(tx); tdy = torch.randn(n, device="cuda")
for mode in ["relu", "gelu", "sigmoid"]:
    t = time_gpu(lambda: nbdnn.activation(tx, mode, out=ty))
    tb = time_gpu(lambda: nbdnn.activation_backward(tdy, tx, mode=mode, out=ty))
    print(f"{mode}: fwd {8*n/t/1e12:.3f} TB/s ({100*8*n/t/bw:.1f}%), bwd {12*n/tb/1e12:.3f} TB/s ({100*12*n/tb/bw:.1f}%)")
tt = time_gpu(lambda: torch.relu(tx, out=ty) if False else torch.nn.functional.relu(tx))
print(f"torch relu: {8*n/tt/1e12:.3f} TB/s")
k, sig = nbdnn.cuda.activation._FORWARD["gelu", "float32"]
print("gelu fwd resources", k.resources(sig))
k, sig = nbdnn.cuda.activation._BACKWARD["gelu_tanh", "float32"]
print("gelu_tanh bwd resources", k.resources(sig))

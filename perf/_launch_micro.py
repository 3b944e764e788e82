import time, statistics, ctypes, numpy as np, torch, nbdnn
from numba import cuda
from nbdnn.cuda import activation as A, _launch
kern, sig = A._FORWARD["relu", "float32"]
L = kern.compile(sig)
tx = torch.randn(1024, device="cuda"); ty = torch.empty_like(tx)
args = ((tx.data_ptr(), 1024), (ty.data_ptr(), 1024), 1024, 1.0, 0.0, 0.0, 1)
def med(f, n=3000):
    for _ in range(200): f()
    torch.cuda.synchronize(); s = []
    for i in range(n):
        t = time.perf_counter(); f(); s.append(time.perf_counter() - t)
        if i % 100 == 99: torch.cuda.synchronize()
    return statistics.median(s) * 1e6
vals = [0, 0, 1024, 4, tx.data_ptr(), 1024, 4, 0, 0, 1024, 4, ty.data_ptr(), 1024, 4, 1024, 1.0, 0.0, 0.0, 1]
print("pack_into", med(lambda: L.packer.pack_into(L.buf, 0, *vals)))
from cuda.bindings import driver as drv
addr = L.params_address
print("cuda.bindings cuLaunchKernel", med(lambda: drv.cuLaunchKernel(L.function, 1, 1, 1, 256, 1, 1, 0, 0, addr, 0)))
print("rc", drv.cuLaunchKernel(L.function, 1, 1, 1, 256, 1, 1, 0, 0, addr, 0))
print("launcher __call__", med(lambda: L(1, 256, 0, args, 0)))
print("Kernel.launch", med(lambda: kern.launch(sig, 1, 256, 0, *args)))
print("nbdnn.activation torch out=", med(lambda: nbdnn.activation(tx, "relu", out=ty)))
print("torch.relu", med(lambda: torch.relu(tx)))

import cProfile, pstats, numpy as np, nbdnn, torch
from numba import cuda
tx = torch.randn(1024, device="cuda"); ty = torch.empty_like(tx)
x = cuda.to_device(np.random.randn(1024).astype(np.float32)); y = cuda.device_array_like(x)
for _ in range(100): nbdnn.activation(tx, "relu", out=ty); nbdnn.activation(x, "relu", out=y)
for label, f in [("torch out", lambda: nbdnn.activation(tx, "relu", out=ty)), ("numba new", lambda: nbdnn.activation(x, "relu"))]:
    pr = cProfile.Profile(); pr.enable()
    for _ in range(3000): f()
    pr.disable(); cuda.synchronize()
    print("==", label); pstats.Stats(pr).sort_stats("tottime").print_stats(14)

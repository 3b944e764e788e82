"""The reference backend's dispatch table: each op family's module, whose functions the front
end's calls run by name (ops/conv's `c.run("conv_forward", ...)` runs
nbdnn.cpu.conv.conv_forward; nbdnn.backend.module looks the family up here)."""
from . import (activation, attention, batch_norm, conv, dropout, lrn, matmul, norm, optim,
               pool, softmax, tensor)

FAMILIES = {
    "activation": activation,
    "attention": attention,
    "batch_norm": batch_norm,
    "conv": conv,
    "dropout": dropout,
    "lrn": lrn,
    "matmul": matmul,
    "norm": norm,
    "optim": optim,
    "pool": pool,
    "softmax": softmax,
    "tensor": tensor,
}

"""nbdnn.sgd_update on the GPU: one element-wise kernel a parameter tensor (the formulas
and their order: nbdnn/cpu/optim.py). One thread an element, grid-stride; absent
buffers are switched off by flags (the kernel then never touches them: their slots
hold w or grad as stand-ins of the right type).

Traffic an element: grad (2 or 4 B), w read and written (4 B each), velocity read and
written (4 B each), param written (2 B): 22 B for a bf16 model with momentum, in one
launch, where the unfused step (cast grad, momentum, update, cast back) made four
launches and moved ~36 B. ResNet-50's step has 161 parameter tensors: a profile
had the unfused optimizer's casts alone at 1.76 ms over 324 launches.
"""
import math

from numba import cuda, float32, float64

from .runtime.memory.arrays import dtype_name, size
from .runtime.device_code.intrinsics import array_type, narrow, widen
from .runtime.launch.kernel import Kernel
from .runtime.simulator import SIMULATOR

BLOCK = 32 if SIMULATOR else 256  # (the simulator runs a thread an OS thread)
MAX_BLOCKS = 65535 * 8


def _kernel(CT):
    ZERO = CT(0)

    def sgd_update_kernel(w, g, v, p, inv, keep, n, has_v, has_p, has_inv, has_keep, lr,
                          momentum, wd):
        if has_keep != 0 and keep[0] == ZERO:
            return  # a skipped step: nothing changes
        s = inv[0] if has_inv != 0 else CT(1)
        i = cuda.grid(1)
        while i < n:
            d = widen(g[i]) * s
            if has_keep != 0 and not math.isfinite(d):
                d = ZERO
            x = w[i]
            if wd != ZERO:
                d += wd * x
            if has_v != 0:
                d = momentum * v[i] + d
                v[i] = d
            x -= lr * d
            w[i] = x
            if has_p != 0:
                p[i] = narrow(x, p)
            i += cuda.gridDim.x * cuda.blockDim.x

    return sgd_update_kernel


def _build():
    table = {}
    # (grad, param) dtypes: the same, or float32 gradients behind a 16-bit parameter
    pairs = [("float16",) * 2, ("bfloat16",) * 2, ("float32",) * 2, ("float32", "float16"),
             ("float32", "bfloat16"), ("float64",) * 2]
    kernels = {ct: _kernel(CT) for ct, CT in (("float32", float32), ("float64", float64))}
    for gt, pt in pairs:
        wt = "float64" if gt == "float64" else "float32"
        a, b, c = (f"{array_type(t)}[::1]" for t in (wt, gt, pt))
        sig = f"void({a}, {b}, {a}, {c}, {a}, {a}, int64, {', '.join(['int64'] * 4)}, " \
              f"{wt}, {wt}, {wt})"
        table[gt, pt] = (Kernel(kernels[wt], [sig]), sig)
    return table


_KERNELS = _build()


def sgd_update(w, grad, velocity, param, inv_scale, keep, lr, momentum, weight_decay, *,
               out=None, stream):
    n = size(w)
    if n:
        k, sig = _KERNELS[dtype_name(grad), dtype_name(grad if param is None else param)]
        k.launch(sig, max(1, min(-(-n // BLOCK), MAX_BLOCKS)), BLOCK, stream, w, grad,
                 w if velocity is None else velocity, grad if param is None else param,
                 w if inv_scale is None else inv_scale, w if keep is None else keep, n,
                 int(velocity is not None), int(param is not None),
                 int(inv_scale is not None), int(keep is not None), lr, momentum, weight_decay)
    return w, velocity, param

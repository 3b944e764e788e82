"""sgd_update: one fused SGD step on one parameter tensor, in place (PyTorch's fused
SGD, with the master-weight and loss-scaling parts of mixed precision folded in). The
formulas are in nbdnn/cpu/optim.py. nbdnn.nn's SGD makes one call a parameter where the
unfused step took four or five element-wise ops (cast, momentum, update, cast back)."""
import numpy as np

from ..errors import DtypeError, ShapeError, fail
from .registry import op
from ._common import Call, same_shape, scalar
from .._vocab import BF16_DTYPES

LOW = (np.dtype("float16"), np.dtype("bfloat16"))


@op("optim")
def sgd_update(w, grad, velocity=None, param=None, inv_scale=None, keep=None, *, lr,
               momentum=0.0, weight_decay=0.0, backend=None, stream=None):
    """One SGD step, in place: g = grad * inv_scale (+ weight_decay * w); with a velocity
    buffer v = momentum * v + g, g = v; w -= lr * g; param = w rounded to param's dtype.
    Returns the updated (w, velocity, param), those given.

    w: float32 or float64 weights (a 16-bit model's float32 masters); grad: w's dtype,
    or float16/bfloat16 when w is float32; velocity: w's dtype and shape (start it at
    zeros: the first step then sets v = g, as PyTorch's momentum buffer); param: the
    16-bit parameter the masters stand behind (grad's dtype, or float16/bfloat16 behind
    float32 gradients, as a loss scaler's unscaled ones). inv_scale, keep: 1-element
    arrays of w's dtype on w's side (an fp16 loss scaler's 1/scale, and its verdict):
    with keep, non-finite gradient elements count as 0 and where keep[0] == 0 nothing
    changes (a skipped step). Every array must be C-contiguous: they are updated in
    place (or read) where they are."""
    name = "sgd_update"
    c = Call(name, backend, stream, w=w, grad=grad, velocity=velocity, param=param,
             inv_scale=inv_scale, keep=keep)
    shape, wdt = c.array("w", w, ("float32", "float64"))
    gshape, gdt = c.array("grad", grad, BF16_DTYPES)
    same_shape(name, ["w", "grad"], [shape, gshape])
    if gdt != wdt and not (gdt in LOW and wdt == np.dtype("float32")):
        fail(DtypeError, name, "grad.dtype", f"{wdt.name} (w's), or float16/bfloat16 with "
             "float32 w", gdt.name)
    w = c.out(w, shape, wdt, "w")
    velocity = c.out(velocity, shape, wdt, "velocity")
    if param is not None:  # (grad's dtype; or 16-bit behind float32 gradients: unscaled)
        pdt = c.array("param", param, BF16_DTYPES)[1]
        param = c.out(param, shape, pdt if pdt in LOW and gdt == wdt else gdt, "param")
    for a, n in ((inv_scale, "inv_scale"), (keep, "keep")):  # (read: may be read-only)
        if a is not None:
            ashape, adt = c.array(n, a, (wdt.name,))
            if tuple(ashape) != (1,):
                fail(ShapeError, name, f"{n}.shape", (1,), tuple(ashape))
    lr = scalar(name, "lr", lr)
    momentum = scalar(name, "momentum", momentum)
    weight_decay = scalar(name, "weight_decay", weight_decay)
    done = c.run("sgd_update", w, grad, velocity, param, inv_scale, keep, lr, momentum,
                 weight_decay, inplace=(0, 2, 3))
    return tuple(a for a in done if a is not None)

"""The reference of nbdnn.sgd_update: one SGD step on one tensor, in place, computed in
w's dtype (float32, or float64) in this order:

    g = grad * inv_scale[0]                  (grad widened to w's dtype; no inv_scale: 1)
    g = 0 where g is not finite              (only with keep)
    g = g + weight_decay * w                 (only when weight_decay != 0)
    v = momentum * v + g;  g = v             (only with a velocity buffer)
    w = w - lr * g
    param = w rounded to param's dtype       (only with param)

and with keep, where keep[0] == 0 none of w, v, param changes (a select: a skipped
step leaves them bit for bit). PyTorch's SGD (no dampening, no Nesterov) with
foreach/fused kernels computes the same, its momentum buffer starting at g.
"""
import numpy as np


def sgd_update(w, grad, velocity, param, inv_scale, keep, lr, momentum, weight_decay, *,
               out=None):
    t = w.dtype.type
    g = grad.astype(w.dtype)
    if inv_scale is not None:
        g = g * t(inv_scale[0])
    if keep is not None:
        g = np.where(np.isfinite(g), g, t(0))
        if keep[0] == 0:
            return w, velocity, param
    if weight_decay != 0:
        g = g + t(weight_decay) * w
    if velocity is not None:
        velocity[...] = t(momentum) * velocity + g
        g = velocity
    w[...] = w - t(lr) * g
    if param is not None:
        param[...] = w.astype(param.dtype)
    return w, velocity, param

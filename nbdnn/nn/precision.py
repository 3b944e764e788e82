"""Mixed precision for nbdnn.nn (re-exported there): float32 master weights behind
16-bit parameters, and fp16's dynamic loss scaling, both as nbdnn ops on the
parameters' device, so a captured training step (GraphedSteps) replays them: nothing
leaves the device, not even the decision to skip a step.

A layer made with dtype=bfloat16 or float16 computes in that dtype (its parameters,
activations and gradients; batch norm's running statistics stay float32, as its ops
keep them). The loss is computed in float32 (CrossEntropyLoss casts the logits). The
optimizers keep, for each 16-bit parameter p, a float32 master copy m:

    g32 = cast(g, float32) * (1 / scale)          the gradient, unscaled
    m  <- update(m, g32)                          SGD / Adam in float32
    p  <- cast(m, p.dtype)                        rounded once

Loss scaling (LossScaler, for float16, whose gradients underflow below 6e-8): the
loss's gradient is multiplied by `scale` before it is cast to 16 bits; the optimizer
unscales. keep = 1 when every unscaled gradient is finite, else 0 (a 1-element array);
every update is multiplied by keep and its inputs zeroed where non-finite
(op_tensor's finite), so a skipped step changes no parameter and no optimizer state.
Then, on the device (torch.amp.GradScaler's rule):

    keep:     good += 1; after growth_interval good steps in a row, scale *= growth
    not keep: scale *= backoff, good = 0

with grow = max(good + 2 - interval, 0) (1 exactly on the interval's last step, as
good counts whole steps) so that no comparison is needed:
    good  <- keep (good + 1) (1 - grow)
    scale <- scale (keep (1 + (growth - 1) grow) + (1 - keep) backoff)
"""
import numpy as np

import nbdnn

from .layers import device_of, move

LOW = ("float16", "bfloat16")


def is_low(a):
    """Whether array a holds a 16-bit float type (a parameter with a master copy)."""
    return np.dtype(a.dtype).name in LOW if not hasattr(a, "is_cuda") else \
        str(a.dtype).rpartition(".")[2] in LOW


def _const(value, like):
    return move(np.full(1, value, np.float32), device_of_any(like))


def device_of_any(a):
    """"cpu" for NumPy arrays and CPU tensors, else device_of's "cuda" or "cuda:N"."""
    return "cpu" if hasattr(a, "is_cuda") and not a.is_cuda else device_of(a)


class LossScaler:
    """fp16 dynamic loss scaling (module docstring). `scale` is a 1-element float32
    array on the model's device; `good` counts finite steps; `keep` is the last step's
    verdict (1: applied, 0: skipped). Give it to the optimizer (SGD(..., scaler=s))
    and to train_step / GraphedSteps, which scale the loss's gradient."""

    def __init__(self, init_scale=2.0 ** 16, *, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000):
        if not (growth_factor > 1 and 0 < backoff_factor < 1 and growth_interval >= 1
                and init_scale > 0):
            raise nbdnn.BadParamError(
                "LossScaler: init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 and "
                f"growth_interval >= 1; got {init_scale}, {growth_factor}, {backoff_factor}, "
                f"{growth_interval}")
        self.growth, self.backoff, self.interval = growth_factor, backoff_factor, \
            int(growth_interval)
        self.init_scale = float(init_scale)
        self.state = None

    def arrays(self, like):
        """(scale, inv_scale, good, keep, one, zero) on like's device, made once."""
        if self.state is None:
            self.state = [_const(v, like) for v in (self.init_scale, 1.0 / self.init_scale,
                                                    0.0, 1.0, 1.0, 0.0)]
        return self.state

    @property
    def scale(self):
        return self.state[0] if self.state else None

    def scaled(self, g32):
        """g32 * scale (the loss's float32 gradient, before its cast to 16 bits)."""
        return nbdnn.op_tensor("mul", g32, self.arrays(g32)[0])

    def update(self, keep):
        """The scale and the good-step count after a step whose verdict is keep."""
        scale, inv, good, last, one, zero = self.state
        nbdnn.scale_tensor(keep, 1.0, out=last)
        grow = nbdnn.op_tensor("max", nbdnn.add_tensor(one, good, alpha=2.0 - self.interval),
                               zero)
        kept = nbdnn.op_tensor("mul", keep, nbdnn.add_tensor(one, good))  # keep (good + 1)
        nbdnn.op_tensor("mul", kept, nbdnn.op_tensor("not", grow), out=good)
        factor = nbdnn.add_tensor(  # keep (1 + (growth - 1) grow) + (1 - keep) backoff
            nbdnn.op_tensor("mul", keep, nbdnn.add_tensor(one, grow, alpha=1.0,
                                                          beta=self.growth - 1.0)),
            nbdnn.op_tensor("not", keep), alpha=1.0, beta=self.backoff)
        nbdnn.op_tensor("mul", scale, factor, out=scale)
        nbdnn.op_tensor("div", one, scale, out=inv)


class Masters:
    """The float32 master copies of a model's 16-bit parameters, and each step's
    unscaled float32 gradients and keep (module docstring)."""

    def __init__(self, scaler=None):
        self.scaler, self.master = scaler, {}

    def weights(self, params):
        """[(key, parameter, weights to update, gradient as it is)] for [(layer, name)]:
        a 16-bit parameter's weights are its float32 master copy (made on first use)."""
        out = []
        for layer, name in params:
            p, key = layer.params[name], (id(layer), name)
            out.append((key, p, self._master(key, p) if is_low(p) else p, layer.grads[name]))
        return out

    def _master(self, key, p):
        m = self.master.get(key)
        if m is None:
            m = self.master[key] = nbdnn.cast_tensor(p, "float32")
        return m

    def gradients(self, params):
        """[(key, parameter, float32 weights to update, float32 gradient)] for
        [(layer, name)], and keep (None without a scaler): 16-bit parameters get their
        master copy and an unscaled float32 gradient, zeroed where non-finite."""
        out, keep = [], None
        for layer, name in params:
            p, g = layer.params[name], layer.grads[name]
            key = (id(layer), name)
            low = is_low(p)
            if not low and self.scaler is None:
                out.append((key, p, p, g))
                continue
            m = self._master(key, p) if low else p
            g32 = nbdnn.cast_tensor(g, "float32")  # (a copy for a float32 g)
            if self.scaler is not None:
                _, inv, _, _, one, _ = self.scaler.arrays(p)
                nbdnn.op_tensor("mul", g32, inv, out=g32)
                finite = nbdnn.op_tensor("finite", nbdnn.op_tensor(  # 1 finite, 0 not:
                    "add", g32, one, alpha1=0.0))                    # finite(0 g + 1)
                ok = nbdnn.reduce_tensor(finite, "min", None).reshape((1,))
                keep = ok if keep is None else nbdnn.op_tensor("min", keep, ok)
                g32 = nbdnn.op_tensor("finite", g32)
            out.append((key, p, m, g32))
        if self.scaler is not None and keep is None and params:  # (no 16-bit parameter)
            keep = self.scaler.arrays(params[0][0].params[params[0][1]])[4]
        return out, keep

    def write_back(self, p, m):
        """The 16-bit parameter from its updated master (in place)."""
        if m is not p:
            nbdnn.cast_tensor(m, p.dtype if isinstance(p, np.ndarray) else _name(p), out=p)


def _name(a):
    return str(a.dtype).rpartition(".")[2]

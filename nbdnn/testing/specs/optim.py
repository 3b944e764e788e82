"""OpSpec rows for sgd_update (imported by nbdnn.testing): any shape, every optional
buffer present or not (velocity, param, inv_scale, keep), momentum and weight decay 0
or not, a skipped step (keep 0) and non-finite gradient elements under keep. The row's
dtype is grad's; w (and velocity, inv_scale, keep) are float32 behind 16-bit and
float32 gradients, float64 behind float64 ones."""
import numpy as np

import nbdnn
from nbdnn._vocab import BF16_DTYPES
from nbdnn.testing.harness import Case, OpSpec, rand, shape_nd


def _master(dtype):
    return np.float64 if dtype == "float64" else np.float32


def _make(draw, dtype, big):
    rng = np.random.default_rng(draw(0, 2 ** 31))
    shape, wt = shape_nd(draw, big), _master(dtype)
    w, grad = rand(rng, shape, wt), rand(rng, shape, dtype)
    velocity = rand(rng, shape, wt) if draw(0, 1) else None
    param = w.astype(dtype) if draw(0, 1) else None
    inv_scale = np.array([2.0 ** -draw(0, 16)], wt) if draw(0, 1) else None
    keep = (None, np.array([1], wt), np.array([0], wt))[draw(0, 2)]
    if keep is not None and grad.size > 1 and draw(0, 1):  # (counted as 0 under keep)
        grad.reshape(-1)[rng.integers(0, grad.size, 2)] = (np.inf, np.nan)
    kw = {"lr": (0.1, 0.01, 1.5)[draw(0, 2)], "momentum": (0.0, 0.9)[draw(0, 1)],
          "weight_decay": (0.0, 1e-4)[draw(0, 1)]}
    return Case((w, grad, velocity, param, inv_scale, keep), kw)


SPECS = [OpSpec("sgd_update", nbdnn.sgd_update, _make, family="optim", blend=False,
                strided_ok=False, dtypes=BF16_DTYPES,
                out_dtype=lambda d: "float64" if d == "float64" else "float32")]

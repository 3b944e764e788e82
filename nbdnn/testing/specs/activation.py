"""OpSpec rows for activation / activation_backward: every mode, shapes of rank 1-4,
inputs kept a little away from the kinks."""
import numpy as np

import nbdnn
from nbdnn._vocab import ACTIVATION_DEFAULT_COEF, ACTIVATION_MODES, BF16_DTYPES
from nbdnn.testing.harness import Case, OpSpec, rand, shape_nd


def _activation_maker(mode, backward):
    def make(draw, dtype, big):
        rng = np.random.default_rng(draw(0, 2 ** 31))
        shape = shape_nd(draw, big)
        # modes with kinks: keep inputs a little away from the kink, where the float32
        # input rounding could flip a branch relative to the float64 oracle
        x = rand(rng, shape, dtype, -6, 6)
        coef = None
        if mode in ("leaky_relu", "elu", "swish"):
            coef = [None, 0.2, 1.5][draw(0, 2)]
        elif mode in ("clipped_relu", "clamp"):
            coef = [None, 1.0, 2.5][draw(0, 2)]
        elif mode == "softplus":
            coef = [None, 0.5, 3.0][draw(0, 2)]
        if mode in ("clipped_relu", "clamp"):
            c = coef if coef is not None else ACTIVATION_DEFAULT_COEF[mode]
            x[np.abs(np.abs(x) - c) < 1e-2] += np.asarray(0.05, dtype)  # (the kinks at +-c)
        if mode in ("hardswish", "hardsigmoid"):
            x[np.abs(np.abs(x) - 3) < 1e-2] += np.asarray(0.05, dtype)  # (the kinks at +-3)
        if backward:
            dy = rand(rng, shape, dtype)
            return Case((dy, x), {"mode": mode, "coef": coef})
        return Case((x, mode), {"coef": coef})
    return make


SPECS = []
for _m in ACTIVATION_MODES:
    SPECS.append(OpSpec(f"activation/{_m}", nbdnn.activation, _activation_maker(_m, False),
                        family="activation", dtypes=BF16_DTYPES))
    SPECS.append(OpSpec(f"activation_backward/{_m}", nbdnn.activation_backward,
                        _activation_maker(_m, True), family="activation", dtypes=BF16_DTYPES))

"""OpSpec rows for cross-channel LRN (imported by nbdnn.testing): rank 3-5, both
layouts, window sizes 1-7 (odd and even), alpha/beta/k around cuDNN's defaults and
large enough alpha that the normalisation matters."""
import numpy as np

import nbdnn
from nbdnn._vocab import BF16_DTYPES
from nbdnn.testing.harness import Case, OpSpec, rand, shape_nd


def _make(backward):
    def make(draw, dtype, big):
        rng = np.random.default_rng(draw(0, 2 ** 31))
        shape = shape_nd(draw, big, 3, 5)
        kw = dict(n=draw(1, 7), alpha=(1e-4, 0.5, 2.0)[draw(0, 2)],
                  beta=(0.75, 0.5, 1.5)[draw(0, 2)], k=(2.0, 1.0, 0.5)[draw(0, 2)],
                  layout=("NCHW", "NHWC")[draw(0, 1)])
        x = rand(rng, shape, dtype)
        if backward:
            return Case((rand(rng, shape, dtype), x), kw)
        return Case((x,), kw)
    return make


SPECS = [OpSpec("lrn", nbdnn.lrn, _make(False), family="norm", blend=False, dtypes=BF16_DTYPES),
         OpSpec("lrn_backward", nbdnn.lrn_backward, _make(True), family="norm", blend=False,
                dtypes=BF16_DTYPES)]

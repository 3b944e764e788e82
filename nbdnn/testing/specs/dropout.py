"""OpSpec rows for dropout (imported by nbdnn.testing): any shape, p drawn from the
edges (0, 1) and between, seeds and offsets over the whole 64-bit range. The mask must
match the CPU's exactly (integer outputs are compared bit for bit)."""
import numpy as np

import nbdnn
from nbdnn._vocab import BF16_DTYPES
from nbdnn.testing.harness import Case, OpSpec, rand, shape_nd

P = (0.0, 0.1, 0.5, 0.9, 1.0)


def _draw(draw):
    seed = draw(0, 2 ** 31) * (1 if draw(0, 1) else 2 ** 32 + 1) % 2 ** 64
    return P[draw(0, len(P) - 1)], seed, draw(0, 2 ** 31) << draw(0, 32)


def _make_forward(draw, dtype, big):
    rng = np.random.default_rng(draw(0, 2 ** 31))
    p, seed, offset = _draw(draw)
    return Case((rand(rng, shape_nd(draw, big), dtype), p), {"seed": seed, "offset": offset})


def _make_backward(draw, dtype, big):
    rng = np.random.default_rng(draw(0, 2 ** 31))
    shape = shape_nd(draw, big)
    p, seed, offset = _draw(draw)
    mask = nbdnn.dropout(np.zeros(shape, np.float32), p, seed=seed, offset=offset)[1]
    return Case((rand(rng, shape, dtype), mask, p), {})


SPECS = [OpSpec("dropout", nbdnn.dropout, _make_forward, family="dropout", blend=False,
                dtypes=BF16_DTYPES),
         OpSpec("dropout_backward", nbdnn.dropout_backward, _make_backward, family="dropout",
                blend=False, dtypes=BF16_DTYPES)]

"""OpSpec rows for batch normalisation (imported by nbdnn.testing): random rank (2-5),
both modes and layouts, optional scale/bias (float32 or x's dtype beside 16-bit x)/residual/activation; training compares y
and the saved statistics, inference blends with alpha/beta/out, backward compares dx,
dscale, dbias (and dresidual). Inputs sit at an offset of up to 100 (the two-pass
variance must not lose it)."""
import numpy as np

import nbdnn
from nbdnn._vocab import BF16_DTYPES
from nbdnn.testing.harness import Case, OpSpec, rand, shape_nd

ACTS = (None, None, "relu", "gelu", "sigmoid")


def _problem(draw, dtype, big):
    rng = np.random.default_rng(draw(0, 2 ** 31))
    shape = shape_nd(draw, big, 2, 5)
    mode = ("spatial", "per_activation")[draw(0, 1)]
    layout = ("NCHW", "NHWC")[draw(0, 1)]
    C = shape[-1] if layout == "NHWC" else shape[1]
    ps = tuple(shape[1:]) if mode == "per_activation" else (C,)
    x = rand(rng, shape, dtype) + np.asarray((0, 1, 100)[draw(0, 2)], dtype)
    pdt = np.float32 if dtype in ("float16", "bfloat16") and draw(0, 1) else dtype
    scale = rand(rng, ps, pdt) if draw(0, 3) else None  # (float32 beside 16-bit x: cuDNN's)
    bias = rand(rng, ps, pdt) if draw(0, 3) else None
    residual = rand(rng, shape, dtype) if draw(0, 2) == 0 else None
    kw = dict(mode=mode, layout=layout, activation=ACTS[draw(0, len(ACTS) - 1)])
    return rng, x, scale, bias, residual, ps, kw


def _tol(dtype, x):
    """Sums over up to N*L elements and an offset of 100: looser than elementwise."""
    return {"float16": (3e-2, 3e-2), "bfloat16": (6e-2, 6e-2), "float32": (2e-4, 2e-4),
            "float64": (1e-10, 1e-10)}[dtype]


# the cross-check casts positional arrays to float64 for the reference: pass them so
def _train(x, scale, bias, residual, **kw):
    return nbdnn.batch_norm_train(x, scale, bias, residual=residual, **kw)


def _infer(x, scale, bias, mean, var, residual, **kw):
    return nbdnn.batch_norm_infer(x, scale, bias, mean, var, residual=residual, **kw)


def _backward(dy, x, scale, mean, invstd, bias, residual, **kw):
    return nbdnn.batch_norm_backward(dy, x, scale, mean, invstd, bias=bias, residual=residual,
                                     **kw)


def _make_train(draw, dtype, big):
    _, x, scale, bias, residual, _, kw = _problem(draw, dtype, big)
    return Case((x, scale, bias, residual), kw, tol=_tol(dtype, x))


def _make_infer(draw, dtype, big):
    rng, x, scale, bias, residual, ps, kw = _problem(draw, dtype, big)
    ct = np.float64 if dtype == "float64" else np.float32
    mean, var = rand(rng, ps, ct), rand(rng, ps, ct, 0.1, 3)
    return Case((x, scale, bias, mean, var, residual), kw, tol=_tol(dtype, x))


def _make_backward(draw, dtype, big):
    rng, x, scale, bias, residual, ps, kw = _problem(draw, dtype, big)
    _, mean, invstd = nbdnn.batch_norm_train(x, scale, bias, mode=kw["mode"],
                                             layout=kw["layout"])
    dy = rand(rng, x.shape, dtype)
    return Case((dy, x, scale, mean, invstd, bias, residual), kw, tol=_tol(dtype, x))


ROW = {"family": "norm", "dtypes": BF16_DTYPES}  # every batch norm op takes bfloat16
SPECS = [OpSpec("batch_norm_train", _train, _make_train, **ROW, blend=False,
                ops=("batch_norm_train",)),
         OpSpec("batch_norm_infer", _infer, _make_infer, **ROW,
                ops=("batch_norm_infer",)),
         OpSpec("batch_norm_backward", _backward, _make_backward, **ROW,
                ops=("batch_norm_backward",),
                blend=False)]

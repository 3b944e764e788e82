"""OpSpec rows of the tensor ops family (imported into nbdnn.testing.SPECS).

Reductions get case-specific tolerances: a float32 (float64) accumulation of L terms
of magnitude <= m errs by about eps * m * L in the worst case, eps * m * sqrt(L)
typically; products by about L * eps relative."""
import math

import numpy as np

import nbdnn
from nbdnn._vocab import BF16_DTYPES
from nbdnn.ops import tensor as _t
from nbdnn.testing.harness import ELEMENTWISE_TOL, EPS, Case, OpSpec, rand, reduction_tol, shape_nd

FAMILY = "tensor"


def _rng(draw):
    return np.random.default_rng(draw(0, 2 ** 31))


def _bcast_shape(draw, shape):
    """A shape that broadcasts to `shape`: each dim 1 or equal, maybe fewer dims."""
    small = tuple(n if draw(0, 2) else 1 for n in shape)
    drop = draw(0, len(shape))
    return small[drop:] if draw(0, 1) else small


def _add_tensor_make(draw, dtype, big):
    rng = _rng(draw)
    shape = shape_nd(draw, big, 1, 5)
    a = rand(rng, _bcast_shape(draw, shape), dtype)
    return Case((a, rand(rng, shape, dtype)), {})


def _op_tensor_row(op, a, b=None, *, alpha1=1.0, alpha2=1.0, alpha=1.0, beta=0.0,
                   out=None, **kw):
    """op_tensor with the harness's alpha folded into alpha1 (to exercise beta/out); a
    bad alpha1 (the error fuzz's) reaches op_tensor as it is, to be named there; other
    keywords (backend, stream) pass through."""
    if alpha != 1.0:
        alpha1 = alpha1 * alpha
    return nbdnn.op_tensor(op, a, b, alpha1=alpha1, alpha2=alpha2, beta=beta, out=out, **kw)


def _op_tensor_maker(op):
    def make(draw, dtype, big):
        rng = _rng(draw)
        shape = shape_nd(draw, big, 1, 5)
        lo = 0.0 if op == "sqrt" else -3.0
        a = rand(rng, shape, dtype, lo, 3.0)
        if op == "sqrt" and a.size > 2:
            a.flat[draw(0, a.size - 1)] = -1  # NaN out
        b = None if op in _t.UNARY_OPS else rand(rng, _bcast_shape(draw, shape), dtype)
        if op == "div":  # divisors in +-[0.5, 3] (zero divisors: test_reference_tensor)
            b = np.asarray((np.sign(b) + (b == 0)) * (0.5 + np.abs(b) * 2.5 / 3),
                           dtype).reshape(b.shape)
        if op in ("min", "max") and b is not None and a.size > 1:
            a.flat[draw(0, a.size - 1)] = np.nan
        if op == "finite":  # an inf, a -inf and a NaN to zero (where there is room)
            for v in (np.inf, -np.inf, np.nan)[:a.size]:
                a.flat[draw(0, a.size - 1)] = v
        kw = {"alpha1": [1.0, -0.5, 2.0][draw(0, 2)], "alpha2": [1.0, 0.75][draw(0, 1)]}
        if op == "sqrt":
            kw["alpha1"] = abs(kw["alpha1"])
        return Case((op, a, b), kw)
    return make


def _axes(draw, ndim):
    k = draw(0, 3)
    if k == 0:
        return None
    if k == 1:
        return draw(-ndim, ndim - 1)
    return tuple(ax for ax in range(ndim) if draw(0, 1))


def _reduce_maker(op):
    def make(draw, dtype, big):
        rng = _rng(draw)
        prod = op in ("mul", "mul_no_zeros")
        shape = shape_nd(draw, big, 1, 5, total_big=4096 if prod else 1 << 16)
        axes = _axes(draw, len(shape))
        kw = {"axes": axes, "keepdims": bool(draw(0, 1))}
        if prod:
            x = (rng.uniform(0.9, 1.1, shape) * rng.choice([-1, 1], shape)).astype(dtype)
            if op == "mul_no_zeros":
                x[rng.uniform(size=shape) < 0.2] = 0
        elif draw(0, 1) and op in _t.INDEX_OPS:
            x = (rng.integers(-6, 7, shape) / 2).astype(dtype)  # ties
        else:
            x = rand(rng, shape, dtype)
        if op in _t.INDEX_OPS:
            kw["return_indices"] = bool(draw(0, 1))
            if x.size > 3 and draw(0, 3) == 0:
                x.flat[draw(0, x.size - 1)] = np.nan
        ax = range(len(shape)) if axes is None else \
            ((axes,) if isinstance(axes, int) else axes)
        n = math.prod(shape[a] for a in ax)
        return Case((x, op), kw, tol=_reduce_tol(op, dtype, n))
    return make


def _reduce_tol(op, dtype, n):
    acc = "float64" if dtype == "float64" else "float32"
    atol, rtol = reduction_tol(dtype, n)
    if op in ("min", "max", "amax"):
        return ELEMENTWISE_TOL[dtype]
    if op in ("mul", "mul_no_zeros"):
        # products stay within ~[1e-5, 1e5]; blending with out (|out| <= 2) can cancel
        r = 4 * n * EPS[acc] + 2 * EPS[dtype]
        return 2 * r, r
    if op == "avg":
        return 3 * atol, rtol
    return 3 * atol * math.sqrt(n), rtol  # add, norm1, norm2: terms up to 3 (9)


def _scale_make(draw, dtype, big):
    rng = _rng(draw)
    return Case((rand(rng, shape_nd(draw, big, 0, 4), dtype), [0.5, -3.0, 0.0][draw(0, 2)]),
                {})


def _set_make(draw, dtype, big):
    rng = _rng(draw)
    x = rand(rng, shape_nd(draw, big, 0, 4), dtype)
    return Case((x, [1.5, -2.25, 0.0, np.inf, np.nan][draw(0, 4)]), {})


def _transform_layout_make(draw, dtype, big):
    rng = _rng(draw)
    nd = draw(3, 5)
    shape = shape_nd(draw, big, nd, nd)
    frm = {3: "NCW", 4: "NCHW", 5: "NCDHW"}[nd]
    lf, lt = (frm, _t.LAYOUTS[frm]) if draw(0, 1) else (_t.LAYOUTS[frm], frm)
    return Case((rand(rng, shape, dtype), lf, lt), {})


def _transform_perm_make(draw, dtype, big):
    rng = _rng(draw)
    shape = shape_nd(draw, big, 1, 6)
    perm = tuple(int(p) for p in rng.permutation(len(shape)))
    return Case((rand(rng, shape, dtype),), {"perm": perm})


ROW = {"family": FAMILY, "dtypes": BF16_DTYPES}  # every tensor op takes bfloat16
SPECS = [OpSpec("add_tensor", nbdnn.add_tensor, _add_tensor_make, **ROW)]
SPECS += [OpSpec(f"op_tensor/{op}", _op_tensor_row, _op_tensor_maker(op), **ROW,
                 ops=("op_tensor",))
          for op in _t.OP_TENSOR_OPS]
SPECS += [OpSpec(f"reduce_tensor/{op}", nbdnn.reduce_tensor, _reduce_maker(op),
                 **ROW) for op in _t.REDUCE_OPS]
def _cast_row(to):
    def cast(x, *, alpha=1.0, beta=0.0, out=None, **kw):
        return nbdnn.cast_tensor(x, to, alpha=alpha, beta=beta, out=out, **kw)
    return cast


def _cast_make(draw, dtype, big):
    rng = _rng(draw)
    x = rand(rng, shape_nd(draw, big, 1, 4), dtype, -300.0, 300.0)
    if x.size > 1:  # values at float16's edges: rounding to the largest finite, overflow
        x.flat[draw(0, x.size - 1)] = 65519.0 if dtype != "float16" else 65504.0
    return Case((x,), {})


# (blend=False: the harness's out= has the input's dtype; tests/test_reference_tensor.py
# checks cast_tensor's alpha, beta and out)
SPECS += [OpSpec(f"cast_tensor/to_{to}", _cast_row(to), _cast_make, **ROW, blend=False,
                 ops=("cast_tensor",), out_dtype=lambda dt, to=to: to) for to in BF16_DTYPES]
SPECS += [OpSpec("scale_tensor", nbdnn.scale_tensor, _scale_make, blend=False,
                 **ROW),
          OpSpec("set_tensor", nbdnn.set_tensor, _set_make, blend=False, **ROW,
                 strided_ok=False),
          OpSpec("transform_tensor/layout", nbdnn.transform_tensor, _transform_layout_make,
                 **ROW),
          OpSpec("transform_tensor/perm", nbdnn.transform_tensor, _transform_perm_make,
                 **ROW)]

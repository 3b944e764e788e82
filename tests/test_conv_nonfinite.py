"""NaN and ±Inf through every convolution algorithm, against the reference's rule
(nbdnn/cpu/conv.py): forward and backward filter read x_pad, whose padding is zeros
that take part in the products (a non-finite weight or gradient meeting padding gives
nan, as 0 * inf does), while backward data sums only the terms that exist (a dy
position outside the output is no term, so a non-finite weight does not reach the
inputs it never touches). Each case puts one non-finite value at a corner (where the
padding matters) or inside, in each input, and wants the same nan / +inf / -inf
pattern and the same finite values from the GPU kernel (the simulator in CI)."""
import contextlib

import numpy as np
import pytest

import nbdnn
from nbdnn.cuda import conv as CV
from nbdnn.cuda.runtime.memory.arrays import to_device, to_host

# (where, value): a corner's value meets the padding (0 * -inf = nan); inside, a nan
# must reach exactly the outputs whose windows hold it
POISON = (("corner", -np.inf), ("inside", np.nan))
# (name, algo, the conv variant forced (None: the choice), layout, C, K, groups, H,
# filter, stride, padding)
FORWARD = [("direct", "direct", None, "NCHW", 2, 2, 1, 5, 3, 1, 1),
           ("direct strided", "direct", None, "NHWC", 2, 3, 1, 6, 3, 2, 2),
           ("implicit gemm", "implicit_gemm", None, "NCHW", 2, 2, 1, 5, 3, 1, 1),
           ("gemm", "gemm", None, "NCHW", 2, 2, 1, 5, 3, 2, 1),
           ("winograd", "winograd", None, "NCHW", 2, 2, 1, 6, 3, 1, 1),
           ("winograd4", "winograd4", None, "NHWC", 2, 2, 1, 6, 3, 1, 1),
           ("depthwise rows", "depthwise", None, "NCHW", 2, 2, 2, 6, 3, 1, 1),
           ("depthwise tiles", "depthwise", "depthwise_tiles", "NCHW", 2, 2, 2, 6, 3, 1, 1),
           ("depthwise columns", "depthwise", "depthwise_strips", "NCHW", 2, 2, 2, 6, 3, (1, 2),
            2),
           ("depthwise tiles nhwc", "depthwise", None, "NHWC", 2, 2, 2, 4, 5, 1, 2)]
BACKWARD = [("direct", "direct", None, "NCHW", 2, 2, 1, 5, 3, 1, 1),
            ("direct strided", "direct", None, "NHWC", 2, 3, 1, 6, 3, 2, 2),
            ("gemm", "gemm", None, "NCHW", 2, 2, 1, 5, 3, 2, 1),
            ("depthwise rows", "depthwise", None, "NCHW", 2, 2, 2, 6, 3, 1, 1),
            ("depthwise tiles nhwc", "depthwise", None, "NHWC", 2, 2, 2, 4, 5, 1, 2)]
# backward data through the forward tile kernel on channels-first maps (the filter
# gradient has one kernel whatever the forward variant: not repeated)
BACKWARD_DATA = BACKWARD + [("depthwise tiles", "depthwise", "depthwise_tiles", "NCHW", 2, 2, 2, 6,
                             3, 1, 2)]


def _arrays(case, rng):
    _, _, _, layout, C, K, G, H, R, stride, pad = case
    last = layout == "NHWC"
    s = stride if isinstance(stride, tuple) else (stride, stride)
    P = [(H + 2 * pad - R) // si + 1 for si in s]
    x = rng.standard_normal((1, H, H, C) if last else (1, C, H, H)).astype(np.float32)
    w = rng.standard_normal((K, R, R, C // G) if last else (K, C // G, R, R)).astype(np.float32)
    dy = rng.standard_normal((1, *P, K) if last else (1, K, *P)).astype(np.float32)
    kw = dict(stride=stride, padding=pad, groups=G, layout=layout, algo=case[1])
    return x, w, dy, kw


def _poison(a, where, value):
    a = a.copy()
    a.reshape(-1)[0 if where == "corner" else a.size // 2] = value
    return a


def _same(got, want):
    got = np.asarray(got, np.float64)
    assert np.array_equal(np.isnan(got), np.isnan(want)), "nan where the reference has none"
    for sign in (1, -1):
        assert np.array_equal(got == sign * np.inf, want == sign * np.inf)
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-4, atol=1e-4)


def _check(case, op, poisoned, make_args):
    with (CV.forced(case[2]) if case[2] else contextlib.nullcontext()):
        _check_forced(case, op, poisoned, make_args)


def _check_forced(case, op, poisoned, make_args):
    rng = np.random.default_rng(len(case[0]))
    x, w, dy, kw = _arrays(case, rng)
    named = {"x": x, "w": w, "dy": dy}
    for where, value in POISON:
        arrays = dict(named, **{poisoned: _poison(named[poisoned], where, value)})
        args = make_args(arrays)
        want = op(*args, backend="cpu", **kw)
        dev = [to_device(a) if isinstance(a, np.ndarray) else a for a in args]
        _same(to_host(op(*dev, backend="cuda", **kw)), want)


# pass: (op, its arguments from the named arrays, the inputs poisoned, the cases)
PASSES = {"forward": (nbdnn.conv2d, lambda a: (a["x"], a["w"]), ("x", "w"), FORWARD),
          "backward data": (nbdnn.conv_backward_data, lambda a: (a["dy"], a["w"], a["x"].shape),
                            ("dy", "w"), BACKWARD_DATA),
          "backward filter": (nbdnn.conv_backward_filter,
                              lambda a: (a["dy"], a["x"], a["w"].shape), ("dy", "x"), BACKWARD)}
CASES = [(p, c, x) for p, (_, _, inputs, cases) in PASSES.items() for c in cases for x in inputs]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name,case,poisoned", CASES,
                         ids=[f"{p}-{c[0]}-{x}" for p, c, x in CASES])
def test_nonfinite_like_the_reference(name, case, poisoned):
    op, make_args, _, _ = PASSES[name]
    _check(case, op, poisoned, make_args)

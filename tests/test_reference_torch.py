"""The CPU reference against PyTorch on the CPU, in float64: an implementation written
by others, so a rule both nbdnn backends share (an output size, a padding, a flip, a
gradient formula) cannot hide behind their agreement. Gradients come from
torch.autograd. Skipped where PyTorch is not installed (the test extra installs it)."""
import numpy as np
import pytest

import nbdnn

torch = pytest.importorskip("torch")
F = torch.nn.functional


def _t(a):
    return torch.tensor(np.ascontiguousarray(a), dtype=torch.float64, requires_grad=True)


def _close(got, want, tol=1e-10):
    want = want.detach().numpy() if isinstance(want, torch.Tensor) else want
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


# (x shape, w shape, stride, padding (per side), dilation, groups, mode)
CONVS = [((2, 4, 9, 8), (6, 2, 3, 3), 1, ((1, 1), (1, 1)), 1, 2, "cross_correlation"),
         ((1, 3, 11, 7), (4, 3, 3, 2), (2, 1), ((2, 0), (1, 3)), (2, 3), 1, "convolution"),
         ((2, 3, 6, 6), (6, 1, 5, 5), 2, ((2, 2), (2, 2)), 1, 3, "cross_correlation"),
         ((2, 2, 13), (3, 2, 3), 3, ((3, 1),), 4, 1, "cross_correlation"),
         ((1, 4, 5, 6, 4), (2, 2, 2, 3, 2), (1, 2, 1), ((1, 0), (1, 1), (0, 1)), 1, 2,
          "convolution")]


@pytest.mark.parametrize("last", [False, True])
@pytest.mark.parametrize("case", CONVS, ids=lambda c: f"{len(c[0]) - 2}d-{c[6][:5]}")
def test_conv_and_gradients(case, last):
    xs, ws, stride, pads, dil, groups, mode = case
    nd = len(xs) - 2
    rng = np.random.default_rng(nd)
    x, w, b = rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[0])
    tx, tw, tb = _t(x), _t(w), _t(b)
    tww = torch.flip(tw, tuple(range(2, 2 + nd))) if mode == "convolution" else tw
    flat = tuple(p for a, b_ in reversed(pads) for p in (a, b_))  # F.pad: last axis first
    conv = (F.conv1d, F.conv2d, F.conv3d)[nd - 1]
    ty = conv(F.pad(tx, flat), tww, tb, stride=stride, dilation=dil, groups=groups)
    dy = rng.standard_normal(tuple(ty.shape))
    gx, gw = torch.autograd.grad(ty, (tx, tw), torch.tensor(dy))

    def lay(a):  # channels first -> channels last
        return np.moveaxis(a, 1, -1) if last else a

    kw = dict(stride=stride, padding=pads, dilation=dil, groups=groups, mode=mode,
              layout="NHWC" if last else "NCHW", backend="cpu")
    y = (nbdnn.conv1d, nbdnn.conv2d, nbdnn.conv3d)[nd - 1](lay(x), lay(w), b, **kw)
    _close(y, lay(ty.detach().numpy()))
    _close(nbdnn.conv_backward_data(lay(dy), lay(w), lay(x).shape, **kw), lay(gx.numpy()))
    _close(nbdnn.conv_backward_filter(lay(dy), lay(x), lay(w).shape, **kw), lay(gw.numpy()))
    _close(nbdnn.conv_backward_bias(lay(dy), layout=kw["layout"], backend="cpu"),
           dy.sum(axis=(0,) + tuple(range(2, dy.ndim))))


ACTS = {"relu": lambda t, c: F.relu(t), "leaky_relu": lambda t, c: F.leaky_relu(t, c),
        "clipped_relu": lambda t, c: F.hardtanh(t, 0.0, c), "elu": lambda t, c: F.elu(t, c),
        "sigmoid": lambda t, c: torch.sigmoid(t), "tanh": lambda t, c: torch.tanh(t),
        "swish": lambda t, c: t * torch.sigmoid(c * t), "gelu": lambda t, c: F.gelu(t),
        "gelu_tanh": lambda t, c: F.gelu(t, approximate="tanh"),
        "softplus": lambda t, c: F.softplus(t, beta=c), "identity": lambda t, c: t}


@pytest.mark.parametrize("coef", [None, 0.7])
@pytest.mark.parametrize("mode", sorted(ACTS))
def test_activation_and_gradient(mode, coef):
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.uniform(-8, 8, 200), [0.0, -0.0, 1e-300, 40.0, -40.0, 6.0]])
    c = coef if coef is not None else nbdnn._vocab.ACTIVATION_DEFAULT_COEF.get(mode, 1.0)
    tx = _t(x)
    ty = ACTS[mode](tx, c)
    dy = rng.standard_normal(x.shape)
    (gx,) = torch.autograd.grad(ty, tx, torch.tensor(dy))
    y = nbdnn.activation(x, mode, coef=coef, backend="cpu")
    _close(y, ty)
    _close(nbdnn.activation_backward(dy, x, y, mode, coef=coef, backend="cpu"), gx)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("algo", ["accurate", "log"])
def test_softmax_and_gradient(algo, axis):
    rng = np.random.default_rng(4)
    x = rng.uniform(-20, 20, (3, 5, 4))
    tx = _t(x)
    ty = (F.log_softmax if algo == "log" else F.softmax)(tx, axis)
    dy = rng.standard_normal(x.shape)
    (gx,) = torch.autograd.grad(ty, tx, torch.tensor(dy))
    y = nbdnn.softmax(x, axis, algo=algo, backend="cpu")
    _close(y, ty)
    _close(nbdnn.softmax_backward(dy, y, axis, algo=algo, backend="cpu"), gx)


NORMS = {"layer_norm": lambda t, s, b: F.layer_norm(t, t.shape[-2:], s, b, 1e-5),
         "rms_norm": lambda t, s, b: F.rms_norm(t, t.shape[-2:], s, 1e-6) + b,
         "group_norm": lambda t, s, b: F.group_norm(t, 2, s[:, 0], b[:, 0], 1e-5),
         "instance_norm": lambda t, s, b: F.instance_norm(t, weight=s[:, 0], bias=b[:, 0],
                                                          eps=1e-5)}


@pytest.mark.parametrize("name", sorted(NORMS))
def test_norm_and_gradients(name):
    """Forward and the gradients of x and scale (the norm backwards' results)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4, 5)) * 3 + 1
    s, b = rng.standard_normal((4, 5)), rng.standard_normal((4, 5))
    tx, ts, tb = _t(x), _t(s), _t(b)
    ty = NORMS[name](tx, ts, tb)
    dy = rng.standard_normal(x.shape)
    gx, gs = torch.autograd.grad(ty, (tx, ts), torch.tensor(dy))
    fn, back = getattr(nbdnn, name), getattr(nbdnn, name + "_backward")
    if name in ("layer_norm", "rms_norm"):
        y, *stats = fn(x, s, b, ndim=2, backend="cpu")
        grads = back(dy, x, *stats, s, ndim=2, backend="cpu")
    elif name == "group_norm":
        y, *stats = fn(x, 2, s[:, 0], b[:, 0], backend="cpu")
        grads = back(dy, x, *stats, s[:, 0], groups=2, backend="cpu")
        gs = gs.sum(axis=1)
    else:
        y, *stats = fn(x, s[:, 0], b[:, 0], backend="cpu")
        grads = back(dy, x, *stats, s[:, 0], backend="cpu")
        gs = gs.sum(axis=1)
    _close(y, ty)
    _close(grads[0], gx)
    _close(grads[1], gs)


@pytest.mark.parametrize("shapes", [((5, 3), (3, 4)), ((2, 1, 5, 3), (4, 3, 2)),
                                    ((6, 1, 4), (1, 4, 7))])
def test_matmul_and_gradients(shapes):
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal(shapes[0]), rng.standard_normal(shapes[1])
    bias = rng.standard_normal(shapes[1][-1])
    ta, tb, tbias = _t(a), _t(b), _t(bias)
    tc = ta @ tb + tbias
    dc = rng.standard_normal(tuple(tc.shape))
    ga, gb, gbias = torch.autograd.grad(tc, (ta, tb, tbias), torch.tensor(dc))
    _close(nbdnn.matmul(a, b, bias=bias, backend="cpu"), tc)
    got = nbdnn.matmul_backward(dc, a, b, bias=True, backend="cpu")
    for g, want in zip(got, (ga, gb, gbias)):
        _close(g, want)

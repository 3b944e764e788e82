"""Second and third-order gradients through nbdnn.torch (nbdnn/torch/_second_order.py).
For every case of test_torch_functional's table (float64, CPU reference): the gradient
of <v, first gradients> by every input and by dy (a Hessian-vector product and the
double backward's dy term), against torch.nn.functional's (1e-9); finite differences
(torch.autograd.gradgradcheck) on a few, so the formulas are checked against the
numbers and not only against PyTorch's; a third order; the first backward still nbdnn's;
attention's dropout refused at the second order."""
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional
nt = pytest.importorskip("nbdnn.torch")
import nbdnn  # noqa: E402
from nbdnn.errors import NotSupportedError  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from test_torch_functional import CASES, R, _t  # noqa: E402

CONSTANT = ("running_mean", "running_var")  # (no gradient, as in the table)
# PyTorch's hardsigmoid has no double backward (aten::hardsigmoid_backward's derivative
# is not implemented): its equal, relu6(x + 3) / 6, stands in
THEIRS = {"hardsigmoid": lambda x: F.relu6(x + 3) / 6}


def _double_backward(fn, args, kw, device="cpu", dtype=torch.float64):
    """fn on copies on device in dtype; (y, the gradients of <v, dL/dinputs> by the
    inputs and dy) where dL/dinputs = autograd.grad(y, inputs, dy, create_graph=True);
    v and dy drawn from R (both calls of a comparison draw alike)."""
    def leaf(v, grad):
        if not isinstance(v, torch.Tensor):
            return v
        v = v.detach().to(device, dtype if v.is_floating_point() else v.dtype)
        return v.requires_grad_(grad and v.is_floating_point())

    def draw(shape):
        return torch.tensor(R.standard_normal(tuple(shape))).to(device, dtype)
    args = [leaf(a, True) for a in args]
    kw = {k: leaf(v, k not in CONSTANT) for k, v in kw.items()}
    inputs = [a for a in args + list(kw.values()) if isinstance(a, torch.Tensor) and
              a.requires_grad]
    y = fn(*args, **kw)
    dy = draw(y.shape).requires_grad_()
    grads = torch.autograd.grad(y, inputs, dy, create_graph=True)
    s = sum((g * draw(g.shape)).sum() for g in grads)
    second = torch.autograd.grad(s, inputs + [dy], allow_unused=True)
    return y, [torch.zeros_like(t) if g is None else g for g, t in zip(second, inputs + [dy])]


def _compare(case, device, dtype, tol):
    name = case.split("-")[0]
    args, kw = CASES[case]
    state = R.bit_generator.state
    _, ours = _double_backward(getattr(nt, name), args, kw, device, dtype)
    R.bit_generator.state = state
    with sdpa_kernel(SDPBackend.MATH):  # (PyTorch's flash attention has no double
        # backward)
        _, theirs = _double_backward(THEIRS.get(name, getattr(F, name)), args, kw, device,
                                     dtype)
    for g, g2 in zip(ours, theirs):
        torch.testing.assert_close(g, g2, rtol=tol, atol=tol * max(1.0, float(g2.abs().max())))


@pytest.mark.parametrize("case", sorted(CASES))
def test_second_order_matches_torch_functional(case):
    _compare(case, "cpu", torch.float64, 1e-9)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device for torch")
@pytest.mark.parametrize("case", sorted(CASES))
def test_second_order_matches_torch_functional_on_cuda(case):
    """CUDA tensors in float32: nbdnn's kernels for the forward and first backward."""
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    _compare(case, "cuda", torch.float32, 1e-3)


@pytest.mark.parametrize("case", ["conv2d", "conv_transpose2d", "avg_pool2d", "layer_norm",
                                  "group_norm", "batch_norm-train", "linear", "softmax",
                                  "scaled_dot_product_attention-mask",
                                  "scaled_dot_product_attention-float_mask"])
def test_second_order_against_finite_differences(case):
    """gradgradcheck: the double backward against finite differences of the first
    backward (nbdnn's own backward ops). Shapes cut to keep it cheap."""
    name = case.split("-")[0]
    small = {"conv2d": ([_t(1, 2, 5, 4), _t(2, 2, 3, 2), _t(2)], {"padding": "same",
                                                                  "stride": 1}),
             "conv_transpose2d": ([_t(1, 2, 3, 3), _t(2, 2, 2, 3)], {"stride": (2, 1),
                                                                     "padding": (1, 0)}),
             "avg_pool2d": ([_t(1, 2, 5, 4)], {"kernel_size": 3, "stride": 2, "padding": 1,
                                               "count_include_pad": False}),
             "layer_norm": ([_t(2, 3, 4)], {"normalized_shape": (4,), "weight": _t(4),
                                            "bias": _t(4)}),
             "group_norm": ([_t(2, 4, 3)], {"num_groups": 2, "weight": _t(4)}),
             "batch_norm": ([_t(4, 2, 3)], {"running_mean": None, "running_var": None,
                                            "weight": _t(2), "training": True}),
             "linear": ([_t(3, 4), _t(2, 4), _t(2)], {}),
             "softmax": ([_t(2, 5)], {"dim": 1}),
             "scaled_dot_product_attention": ([_t(1, 1, 3, 4), _t(1, 1, 4, 4), _t(1, 1, 4, 2)],
                                              {"attn_mask": torch.tensor(
                                                  [[1, 0, 1, 1], [1, 1, 0, 0], [0, 0, 1, 0]],
                                                  dtype=torch.bool)}),
             "scaled_dot_product_attention-float_mask": (
                 [_t(1, 2, 3, 4), _t(1, 2, 4, 4), _t(1, 2, 4, 2)], {"attn_mask": _t(3, 4)})}
    args, kw = small[case if case in small else name]
    names = [k for k, v in kw.items() if isinstance(v, torch.Tensor) and k not in CONSTANT
             and v.is_floating_point()]
    tensors = [a.clone().requires_grad_() for a in args] + \
        [kw[k].clone().requires_grad_() for k in names]

    def f(*ts):
        return getattr(nt, name)(*ts[:len(args)], **{**kw, **dict(zip(names, ts[len(args):]))})
    assert torch.autograd.gradgradcheck(f, tensors)


def test_third_order():
    """tanh's third derivative through two registered backwards: -2 (1 - t^2)(1 - 3 t^2)."""
    x = _t(7).requires_grad_()
    g1, = torch.autograd.grad(nt.tanh(x).sum(), x, create_graph=True)
    g2, = torch.autograd.grad(g1.sum(), x, create_graph=True)
    g3, = torch.autograd.grad(g2.sum(), x)
    t = torch.tanh(x.detach())
    torch.testing.assert_close(g3, -2 * (1 - t ** 2) * (1 - 3 * t ** 2), rtol=1e-10,
                               atol=1e-10)


def test_first_backward_stays_nbdnn_under_create_graph(monkeypatch):
    """With create_graph=True the first backward is still nbdnn's op (run once), only
    its own derivative is PyTorch's formula."""
    calls = []
    real = nbdnn.conv_backward_data
    monkeypatch.setattr(nbdnn, "conv_backward_data",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    x, w, c = _t(1, 2, 5, 5).requires_grad_(), _t(3, 2, 3, 3).requires_grad_(), _t(1, 3, 3, 3)
    dx, = torch.autograd.grad((nt.conv2d(x, w) * c).sum(), x, create_graph=True)  # (dy = c:
    # no path back into the forward's own backward)
    assert calls == [1] and dx.requires_grad
    torch.autograd.grad(dx.square().sum(), (x, w))
    assert calls == [1]


def test_attention_dropout_has_no_second_order():
    q = _t(1, 1, 3, 4).requires_grad_()
    g, = torch.autograd.grad(nt.scaled_dot_product_attention(q, q, q, dropout_p=0.5).sum(), q,
                             create_graph=True)
    with pytest.raises(NotSupportedError, match="second-order gradients with dropout_p"):
        torch.autograd.grad(g.sum(), q)


def test_dropout_second_order_is_its_mask():
    """Dropout is linear: the gradient of <v, dx> by dy is v masked and scaled alike."""
    x = _t(50).requires_grad_()
    y = nt.dropout(x, 0.4)
    dy = torch.ones_like(y).requires_grad_()
    dx, = torch.autograd.grad(y, x, dy, create_graph=True)
    v = _t(50)
    ddy, = torch.autograd.grad((dx * v).sum(), dy)
    torch.testing.assert_close(ddy, v * (y.detach() != 0) / 0.6, rtol=1e-12, atol=1e-12)


def test_gradient_penalty_on_a_converted_model():
    """A WGAN-GP step: the penalty (|d out / d x| - 1)^2 backpropagated to the weights
    of a converted residual network (conv, batch norm in training, relu, max and average
    pool, linear) equals the native network's, float64."""
    from test_torch_convert import small_resnet
    native = small_resnet(1).double()
    model, _ = nt.convert(native)
    x = _t(3, 3, 12, 12)
    grads = []
    for net in (native, model):
        xi = x.clone().requires_grad_()
        gx, = torch.autograd.grad(net(xi).sum(), xi, create_graph=True)
        penalty = (gx.flatten(1).norm(dim=1) - 1).square().mean()
        params = list(net.parameters())  # (the last bias takes no part: None)
        grads.append([torch.zeros_like(p) if g is None else g for g, p in zip(
            torch.autograd.grad(penalty, params, allow_unused=True), params)])
    for g, g2 in zip(*grads):
        torch.testing.assert_close(g, g2, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("p", [0.25, 0.6])
def test_dropout_forward_mode_is_its_mask_scaled(p):
    """Dropout's jvp (nbdnn/torch/_forward_mode.py): the tangent t masked by the same
    draw as the primal and scaled by 1 / (1 - p), t * mask / (1 - p); the mask read off
    the primal (y == x * mask / (1 - p), x nonzero)."""
    x, t = _t(64) + 3.0, _t(64)  # (x away from 0: y != 0 exactly where kept)
    y, jt = torch.func.jvp(lambda x: nt.dropout(x, p), (x,), (t,))
    mask = (y != 0).to(x.dtype)
    assert 0 < mask.sum() < 64
    torch.testing.assert_close(y, x * mask / (1 - p), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(jt, t * mask / (1 - p), rtol=1e-12, atol=1e-12)

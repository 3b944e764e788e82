"""nbdnn.torch's functions against torch.nn.functional: forward and every gradient
(autograd through the custom ops) in float64 on the CPU (nbdnn's reference; tolerance
1e-10), the same on CUDA tensors in float32 where a GPU is present; torch.library.opcheck
over each custom op (schema, fake implementation, autograd registration, AOT dispatch);
and a small model under torch.compile(fullgraph=True, backend="aot_eager")."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional
nt = pytest.importorskip("nbdnn.torch")
import nbdnn  # noqa: E402

R = np.random.default_rng(0)


def _t(*shape, lo=-2.0, hi=2.0):
    return torch.tensor(R.uniform(lo, hi, shape))


# name: (inputs (x first, then weights), keyword arguments); nbdnn.torch.<name> against
# F.<name> with the same call
CASES = {
    "relu": ([_t(3, 40)], {}),
    "leaky_relu": ([_t(3, 40)], {"negative_slope": 0.2}),
    "elu": ([_t(3, 40)], {"alpha": 0.7}),
    "gelu": ([_t(3, 40)], {}),
    "gelu-tanh": ([_t(3, 40)], {"approximate": "tanh"}),
    "silu": ([_t(3, 40)], {}),
    "sigmoid": ([_t(3, 40)], {}),
    "tanh": ([_t(3, 40)], {}),
    "softplus": ([_t(3, 40, lo=-30, hi=13)], {"beta": 1.5}),  # (beta x <= 20: the
    # threshold past which PyTorch returns x, nbdnn the exact value; 1e-10 apart there)
    "hardtanh": ([_t(3, 40, lo=-3, hi=9)], {"min_val": 0.0, "max_val": 4.0}),
    "relu6": ([_t(3, 40, lo=-3, hi=9)], {}),
    "softmax": ([_t(2, 5, 7, lo=-9, hi=9)], {"dim": 1}),
    "log_softmax": ([_t(2, 5, 7, lo=-9, hi=9)], {"dim": -1}),
    "linear": ([_t(2, 3, 6), _t(5, 6), _t(5)], {}),
    "linear-nobias": ([_t(6), _t(5, 6)], {}),
    "local_response_norm": ([_t(2, 7, 4, 3)], {"size": 3, "alpha": 0.3, "beta": 0.6,
                                               "k": 1.5}),
    "conv1d": ([_t(2, 4, 11), _t(6, 2, 3), _t(6)], {"stride": 2, "padding": 1, "groups": 2}),
    "conv2d": ([_t(2, 3, 9, 8), _t(4, 3, 3, 2), _t(4)], {"padding": "same",
                                                          "dilation": (2, 1)}),
    "conv2d-valid": ([_t(1, 3, 7, 7), _t(2, 3, 3, 3)], {"stride": (2, 1), "padding": "valid"}),
    "conv3d": ([_t(1, 2, 5, 4, 6), _t(3, 2, 2, 3, 2), _t(3)], {"padding": (1, 0, 1)}),
    "max_pool1d": ([_t(2, 3, 11)], {"kernel_size": 3, "stride": 2, "padding": 1,
                                    "ceil_mode": True}),
    "max_pool2d": ([_t(2, 3, 9, 8)], {"kernel_size": (3, 2), "dilation": (1, 2)}),
    "max_pool3d": ([_t(1, 2, 5, 6, 4)], {"kernel_size": 2}),
    "avg_pool1d": ([_t(2, 3, 11)], {"kernel_size": 4, "stride": 3, "padding": 2,
                                    "count_include_pad": False}),
    "avg_pool2d": ([_t(2, 3, 9, 8)], {"kernel_size": 3, "stride": 2, "padding": 1,
                                      "ceil_mode": True}),
    "avg_pool3d": ([_t(1, 2, 5, 6, 4)], {"kernel_size": (2, 3, 2)}),
    "adaptive_avg_pool2d": ([_t(2, 5, 7, 6)], {"output_size": 1}),
    "layer_norm": ([_t(3, 4, 5)], {"normalized_shape": (4, 5), "weight": _t(4, 5),
                                   "bias": _t(4, 5)}),
    "layer_norm-noaffine": ([_t(3, 4, 5)], {"normalized_shape": (5,)}),
    "rms_norm": ([_t(3, 4, 5)], {"normalized_shape": (5,), "weight": _t(5), "eps": 1e-6}),
    "group_norm": ([_t(2, 6, 3, 4)], {"num_groups": 3, "weight": _t(6), "bias": _t(6)}),
    "instance_norm": ([_t(2, 3, 5, 4)], {"weight": _t(3), "bias": _t(3)}),
    "batch_norm-train": ([_t(4, 3, 5, 2)], {"running_mean": _t(3), "running_var": _t(3, lo=1),
                                            "weight": _t(3), "bias": _t(3), "training": True,
                                            "momentum": 0.3}),
    "batch_norm-2d": ([_t(6, 3)], {"running_mean": None, "running_var": None,
                                   "training": True}),
    "batch_norm-eval": ([_t(4, 3, 5)], {"running_mean": _t(3), "running_var": _t(3, lo=0.5),
                                        "weight": _t(3), "bias": _t(3)}),
}

def _call(fn, args, kw, device, dtype):
    """fn on copies of args and kw's tensors on device in dtype, the floating ones but
    running statistics requiring grad; (output, grads of those inputs, the copies)."""
    def conv(v, grad):
        if not isinstance(v, torch.Tensor):
            return v
        return v.detach().to(device, dtype).requires_grad_(grad)
    args = [conv(a, True) for a in args]
    kw = {k: conv(v, not k.startswith("running")) for k, v in kw.items()}
    y = fn(*args, **kw)
    leaves = [a for a in args + list(kw.values()) if isinstance(a, torch.Tensor) and
              a.requires_grad]
    dy = torch.tensor(R.standard_normal(tuple(y.shape))).to(device, dtype)
    return y, torch.autograd.grad(y, leaves, dy), (args, kw), dy


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_torch_functional(case):
    name = case.split("-")[0]
    args, kw = CASES[case]
    _compare(getattr(nt, name), getattr(F, name), args, kw, "cpu", torch.float64, 1e-10)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device for torch")
@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_torch_functional_on_cuda(case):
    name = case.split("-")[0]
    args, kw = CASES[case]
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    _compare(getattr(nt, name), getattr(F, name), args, kw, "cuda", torch.float32, 2e-4)


def _compare(ours, theirs, args, kw, device, dtype, tol):
    state = R.bit_generator.state  # (both calls draw the same dy)
    y, grads, (a1, k1), _ = _call(ours, args, kw, device, dtype)
    R.bit_generator.state = state
    y2, grads2, (a2, k2), _ = _call(theirs, args, kw, device, dtype)
    scale = max(1.0, float(y2.detach().abs().max()))
    torch.testing.assert_close(y, y2, rtol=tol, atol=tol * scale)
    for g, g2 in zip(grads, grads2):
        torch.testing.assert_close(g, g2, rtol=tol, atol=tol * max(1.0, float(g2.abs().max())))
    for k in ("running_mean", "running_var"):  # (advanced in place alike)
        if k in k1:
            torch.testing.assert_close(k1[k], k2[k], rtol=tol, atol=tol)


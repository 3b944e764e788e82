"""nbdnn.torch refuses what torch.nn.functional refuses and takes what it takes: each
call below goes to F and to nbdnn.torch.functional; both raise (nbdnn.torch a named
NbdnnError: the function and the argument), or both answer alike. Then inplace=True
under autograd, torch.softmax's positional dtype through functional_calls(), its report
of the functions it left native, and conv_transpose's channels-last result."""
import pytest

torch = pytest.importorskip("torch")

import nbdnn  # noqa: E402
import nbdnn.torch as nt  # noqa: E402
import nbdnn.torch.functional as NF  # noqa: E402

F = torch.nn.functional


def _x():
    return torch.randn(2, 3, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))


def _w(*shape):
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


CASES = {  # name -> (call(f), whether F raises)
    "conv2d float stride": (lambda f: f.conv2d(_x(), _w(4, 3, 3, 3), stride=(1.5, 2.7)), True),
    "conv2d 3 strides": (lambda f: f.conv2d(_x(), _w(4, 3, 3, 3), stride=(1, 1, 1)), True),
    "conv2d one stride in a tuple": (lambda f: f.conv2d(_x(), _w(4, 3, 3, 3), stride=(2,)),
                                     False),
    "conv2d empty stride": (lambda f: f.conv2d(_x(), _w(4, 3, 3, 3), stride=()), True),
    "conv2d float padding": (lambda f: f.conv2d(_x(), _w(4, 3, 3, 3), padding=1.0), True),
    "conv2d same, stride 2": (lambda f: f.conv2d(_x(), _w(4, 3, 3, 3), padding="same",
                                                 stride=2), True),
    "conv3d same, stride 2": (lambda f: f.conv3d(_w(1, 3, 4, 4, 4), _w(2, 3, 3, 3, 3),
                                                 padding="same", stride=2), True),
    "conv2d padding 'bogus'": (lambda f: f.conv2d(_x(), _w(4, 3, 3, 3), padding="bogus"),
                               True),
    "conv2d dilation 0": (lambda f: f.conv2d(_x(), _w(4, 3, 3, 3), dilation=0), True),
    "linear 3-d weight": (lambda f: f.linear(_w(2, 3), _w(4, 3, 1)), True),
    "linear 0-d input": (lambda f: f.linear(torch.tensor(1.0, dtype=torch.float64),
                                            _w(4, 1)), True),
    "linear no input features": (lambda f: f.linear(_w(3, 4, 0), _w(5, 0), _w(5)), False),
    "linear 1-d weight": (lambda f: f.linear(_w(3, 4), _w(4)), False),
    "max pool padding past half": (lambda f: f.max_pool2d(_x(), 3, 1, 2), True),
    "avg pool padding past half": (lambda f: f.avg_pool2d(_x(), 3, 1, 2), True),
    "max pool 1-tuple padding": (lambda f: f.max_pool2d(_x(), 3, 1, (1,)), False),
    "max pool 1-tuple kernel": (lambda f: f.max_pool2d(_x(), (2,)), False),
    "avg pool 1-tuples": (lambda f: f.avg_pool2d(_x(), (4, 4), (2, 2), (2,), True, True),
                          False),
    "max pool float stride": (lambda f: f.max_pool2d(_x(), 2, 1.5), True),
    "max pool empty stride": (lambda f: f.max_pool2d(_x(), 2, ()), False),
    "unbatched pool of 0 channels": (lambda f: f.max_pool2d(_w(0, 4, 4), 2), True),
    "batch_norm momentum None": (lambda f: f.batch_norm(_x(), torch.zeros(3, dtype=torch.float64),
                                                        torch.ones(3, dtype=torch.float64),
                                                        training=True, momentum=None), True),
    "batch_norm 1-d empty": (lambda f: f.batch_norm(_w(0), _w(0), _w(0).abs()), False),
    "batch_norm empty batch, training": (lambda f: f.batch_norm(
        _w(0, 5, 2, 2), torch.zeros(5, dtype=torch.float64), torch.ones(5, dtype=torch.float64),
        _w(5), _w(5), training=True), False),
    "batch_norm one value a channel": (lambda f: f.batch_norm(
        _w(1, 5, 1, 1), torch.zeros(5, dtype=torch.float64), torch.ones(5, dtype=torch.float64),
        training=True), True),
    "group_norm 1-d": (lambda f: f.group_norm(_w(4), 2), True),
    "group_norm empty batch": (lambda f: f.group_norm(_w(0, 4, 2), 2), False),
    "attention, a 3-d query against 4-d keys and values": (
        lambda f: f.scaled_dot_product_attention(_w(4, 3, 8), _w(4, 4, 6, 8), _w(4, 4, 6, 8),
                                                 is_causal=True), False),
    "conv_transpose2d 1-tuple padding": (lambda f: f.conv_transpose2d(_x(), _w(3, 2, 3, 3),
                                                                      padding=(1,)), False),
    "conv_transpose2d output_padding past stride": (lambda f: f.conv_transpose2d(
        _x(), _w(3, 2, 3, 3), stride=2, output_padding=2), True),
}


@pytest.mark.parametrize("name", list(CASES))
def test_nbdnn_torch_refuses_what_f_refuses(name):
    call, raises = CASES[name]
    try:
        want = call(F)
    except Exception:  # noqa: BLE001 - PyTorch's own classes vary (RuntimeError, TypeError)
        want = None
    assert (want is None) == raises, "the case's expectation of PyTorch is wrong"
    if raises:
        with pytest.raises(nbdnn.NbdnnError) as e:
            call(NF)
        assert str(e.value).startswith("nbdnn.torch."), e.value
        return
    got = call(NF)
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fn,args", [("relu", ()), ("leaky_relu", (0.2,)), ("elu", (0.5,)),
                                      ("hardtanh", (0.0, 2.0)), ("relu6", ()), ("silu", ())])
def test_inplace_activations_write_in_place_under_autograd(fn, args):
    """skip = y; z = f(y, inplace=True); skip + z: skip sees the new values (y itself),
    the version counter moves, and the gradient is PyTorch's."""
    results = []
    for f in (F, NF):
        a = torch.linspace(-3, 3, 13, dtype=torch.float64, requires_grad=True)
        y = a * 2
        skip, version = y, y._version
        z = getattr(f, fn)(y, *args, inplace=True)
        out = skip + z
        out.sum().backward()
        assert z is y and y._version > version
        results.append((out.detach(), a.grad))
    torch.testing.assert_close(results[1], results[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("last", [False, True])
def test_relu_keeps_what_pytorchs_relu_keeps(last):
    """relu saves its output for the backward, as PyTorch's (its input, a batch norm's
    output in a ResNet, is then free); inplace=True writes x once, keeps x itself and
    nothing else, bumps the version once, and writing the saved output later is
    refused as by PyTorch; channels-last alike; under no_grad the write bumps the
    version too."""
    for f in (F, NF):
        for inplace in (False, True):
            a = torch.randn(2, 3, 4, 5, dtype=torch.float64, requires_grad=True)
            x = a * 2
            if last:
                x = x.contiguous(memory_format=torch.channels_last)
            saved, version = [], x._version
            with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t,
                                                          lambda t: t):
                y = f.relu(x, inplace=inplace)
            assert [t.data_ptr() for t in saved] == [y.data_ptr()], (f, inplace)
            assert (y is x) == inplace and x._version - version == int(inplace)
            (g,) = torch.autograd.grad((y * torch.arange(y.numel()).view(y.shape)).sum(), a,
                                       retain_graph=True)
            torch.testing.assert_close(g, 2 * (x > 0).double() *
                                       torch.arange(y.numel()).view(y.shape), rtol=0, atol=0)
            y = f.relu(x * 1, inplace=inplace)  # (no hooks: they turn the check off)
            y.add_(1)
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                y.sum().backward()
    with torch.no_grad():
        x = torch.randn(7)
        version = x._version
        assert NF.relu(x, inplace=True) is x and x._version == version + 1 and (x >= 0).all()


def test_inplace_on_a_leaf_that_requires_grad_is_refused_as_by_pytorch():
    for f in (F, NF):
        with pytest.raises(RuntimeError, match="leaf Variable"):
            f.relu(torch.ones(3, requires_grad=True), inplace=True)


def test_functional_calls_take_products_with_a_weight():
    """Under functional_calls: x @ W, torch.matmul, Tensor.matmul, torch.addmm(b, x, W)
    and Tensor.addmm run on nbdnn (one GEMM, W read as stored) with PyTorch's values and
    gradients; a batched or 1-d other, addmm with beta or alpha, and mixed dtypes run
    PyTorch's own call, counted native (mixed dtypes raise PyTorch's error)."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 6, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, generator=g, dtype=torch.float64, requires_grad=True)
    cases = [lambda: torch.matmul(x, w), lambda: x @ w, lambda: x.matmul(w),
             lambda: torch.addmm(b, x[0], w), lambda: b.addmm(x[0], w),
             lambda: torch.addmm(b[:1], x[0], w),  # (a one-element bias, broadcast)
             lambda: torch.matmul(x[0, 0], w),  # (a vector times the weight)
             lambda: torch.matmul(x, x.transpose(1, 2)), lambda: torch.matmul(x, w[:, 0]),
             lambda: torch.addmm(b, x[0], w, beta=2.0)]
    for i, case in enumerate(cases):
        with nt.functional_calls() as calls:
            got = case()
        want = case()
        on_nbdnn = i < 7
        assert sum(calls.nbdnn.values()) == int(on_nbdnn), (i, calls.report())
        assert sum(calls.native.values()) == int(not on_nbdnn), (i, calls.report())
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        grads = [torch.autograd.grad(y.square().sum(), (x, w, b), allow_unused=True)
                 for y in (got, want)]
        for a, c in zip(*grads):
            assert (a is None) == (c is None)
            if a is not None:
                torch.testing.assert_close(a, c, rtol=1e-12, atol=1e-12)
    with nt.functional_calls() as calls, pytest.raises(RuntimeError):
        torch.matmul(x, w.float())
    assert sum(calls.native.values()) == 1


def test_functional_calls_keep_a_positional_dtype_and_report_what_stayed_native():
    x = torch.randn(2, 5)
    with nt.functional_calls() as calls:
        s = torch.softmax(x, -1, torch.float64)
        ls = torch.log_softmax(x, -1, torch.float64)
        t = x.softmax(-1, torch.float64)
        F.embedding(torch.tensor([1]), torch.randn(3, 2))
    for got, want in ((s, torch.softmax(x, -1, torch.float64)),
                      (ls, torch.log_softmax(x, -1, torch.float64)),
                      (t, x.softmax(-1, torch.float64))):
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, want)
    report = calls.report()
    assert "nbdnn softmax: 2" in report and "nbdnn log_softmax: 1" in report
    assert "native embedding (nbdnn.torch has no such function): 1" in report


@pytest.mark.parametrize("layout", ["jagged", "strided"])
def test_functional_calls_leave_nested_tensors_to_pytorch(layout):
    """A call with a nested tensor (either layout) runs natively under functional_calls
    and the report says why; a dense call beside it still runs on nbdnn."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (PyTorch's prototype warning for nested tensors)
        x = torch.nested.nested_tensor([torch.randn(3, 8, dtype=torch.float64),
                                        torch.randn(5, 8, dtype=torch.float64)],
                                       layout=getattr(torch, layout))
        w = torch.randn(4, 8, dtype=torch.float64)
        want = [F.linear(x, w), F.relu(x)]
        with nt.functional_calls() as calls:
            got = [F.linear(x, w), F.relu(x)]
            dense = F.relu(w)
    for g, r in zip(got, want):
        for a, b in zip(g.unbind(), r.unbind()):
            torch.testing.assert_close(a, b)
    torch.testing.assert_close(dense, w.relu())
    report = calls.report()
    assert "native linear (nested tensors): 1" in report, report
    assert "native relu (nested tensors): 1" in report and "nbdnn relu: 1" in report, report


@pytest.mark.parametrize("nd", [2, 3])
def test_conv_transpose_keeps_the_inputs_memory_format_as_pytorch_does(nd):
    """2-d: a channels-last input gives a channels-last result; 3-d (PyTorch's CPU
    kernel gives a contiguous one): the same format as F's."""
    fmt = torch.channels_last if nd == 2 else torch.channels_last_3d
    x = torch.randn(2, 3, *([5] * nd), dtype=torch.float64).contiguous(memory_format=fmt)
    w = torch.randn(3, 4, *([3] * nd), dtype=torch.float64)
    fn = f"conv_transpose{nd}d"
    want, got = getattr(F, fn)(x, w, stride=2), getattr(NF, fn)(x, w, stride=2)
    assert got.stride() == want.stride()
    assert nd == 3 or got.is_contiguous(memory_format=fmt)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_instance_norm_advances_running_statistics_as_pytorch(dtype):
    """track_running_stats in training: the result and both running statistics as F's
    (the batch's average of the instances' means and unbiased variances), functional
    and converted module alike; eval then reads them."""
    x = torch.randn(3, 4, 5, 6, dtype=dtype)
    stats = [[torch.zeros(4, dtype=dtype), torch.ones(4, dtype=dtype)] for _ in range(2)]
    ys = [f.instance_norm(x, *s, use_input_stats=True, momentum=0.3)
          for f, s in zip((F, NF), stats)]
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(ys[1], ys[0], rtol=tol, atol=tol)
    for a, b in zip(*stats):
        torch.testing.assert_close(b, a, rtol=tol, atol=tol)
    native = torch.nn.InstanceNorm2d(4, affine=True, track_running_stats=True).to(dtype)
    ours, report = nt.convert(native)
    assert [t for _, t in report.converted] == ["InstanceNorm2d"]
    for mode in ("train", "eval"):
        native.train(mode == "train"), ours.train(mode == "train")
        torch.testing.assert_close(ours(x), native(x), rtol=tol, atol=tol)
        torch.testing.assert_close(ours.running_var, native.running_var, rtol=tol, atol=tol)


@pytest.mark.parametrize("threshold", [0.2, 5.0, 20.0])
def test_softplus_takes_any_threshold_as_pytorch(threshold):
    """Past beta x > threshold PyTorch returns x (and a gradient of 1): nbdnn.torch too
    for a threshold other than the default; at the default, nbdnn's exact form is within
    log1p(exp(-20)) / beta of it."""
    x = torch.linspace(-8, 30, 77, dtype=torch.float64, requires_grad=True)
    outs = []
    for f in (F, NF):
        y = f.softplus(x, beta=1.5, threshold=threshold)
        g, = torch.autograd.grad(y.sum(), x)
        outs.append((y.detach(), g))
    tol = 1e-12 if threshold != 20.0 else 3e-9
    torch.testing.assert_close(outs[1], outs[0], rtol=tol, atol=tol)

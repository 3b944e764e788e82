"""Mixed precision in nbdnn.nn (nbdnn/nn/precision.py): 16-bit layers with float32
master weights, the float32 loss, and fp16's dynamic loss scaling with the skip and
the scale's growth decided by array arithmetic (so a captured step replays them). On
the CPU backend, float16 also under the simulator's CUDA backend (bfloat16 has no
simulator path)."""
import ml_dtypes
import numpy as np
import pytest

import nbdnn
from nbdnn import nn
from nbdnn.cuda.runtime.memory.arrays import to_host

BF16 = ml_dtypes.bfloat16


def _net(dtype, seed=0):
    return nn.Sequential([nn.Conv2d(1, 4, 3, padding=1, seed=seed, dtype=dtype),
                          nn.BatchNorm2d(4, dtype=dtype), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(4 * 2 * 2, 3, seed=seed + 1, dtype=dtype)])


def _data(n=8, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 1, 4, 4)).astype(np.float32)
    labels = rng.integers(0, 3, n)
    return x, np.eye(3, dtype=np.float32)[labels]


def _host(a):
    return np.asarray(a if isinstance(a, np.ndarray) else to_host(a)).astype(np.float64)


@pytest.mark.parametrize("dtype", [BF16, np.float16])
@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_low_precision_training_follows_float32(dtype, opt):
    """A 16-bit network and its float32 twin (same seeds) trained 6 steps on one batch:
    both losses fall, the 16-bit one stays within a few 16-bit roundings of the
    float32 one; each parameter is its float32 master rounded once; batch norm's
    running statistics are float32; the loss is float32."""
    x, y = _data()
    nets = {d: _net(d) for d in (np.float32, dtype)}
    make = (lambda m: nn.SGD(m, 0.1, momentum=0.9)) if opt == "sgd" else \
        (lambda m: nn.Adam(m, 0.01))
    opts = {d: make(m) for d, m in nets.items()}
    losses = {d: [] for d in nets}
    for _ in range(6):
        for d, m in nets.items():
            v = nn.train_step(m, nn.CrossEntropyLoss(), opts[d], x.astype(d), y)
            assert np.asarray(v).dtype == np.float32
            losses[d].append(float(np.asarray(v)))
    for d in nets:
        assert losses[d][-1] < 0.8 * losses[d][0], (d, losses[d])
    np.testing.assert_allclose(losses[dtype], losses[np.float32], rtol=0.05, atol=0.02)
    masters = opts[dtype].masters.master
    low = nets[dtype]
    for layer, name in low.parameters():
        m = masters[(id(layer), name)]
        assert m.dtype == np.float32
        np.testing.assert_array_equal(layer.params[name], m.astype(dtype))
    bn = low.seq[1]
    assert bn.buffers["mean"].dtype == np.float32 and bn.buffers["var"].dtype == np.float32


def _scaled_setup(interval=2, init=2.0 ** 10, dtype=np.float16, opt="sgd"):
    x, y = _data()
    net = _net(dtype)
    scaler = nn.LossScaler(init, growth_interval=interval)
    o = nn.SGD(net, 0.05, momentum=0.9, scaler=scaler) if opt == "sgd" else \
        nn.Adam(net, 0.01, scaler=scaler)
    return net, o, scaler, x.astype(dtype), y


@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_loss_scaler_skips_a_non_finite_step_and_backs_off(opt):
    """fp16 with a LossScaler: a step whose gradients hold an inf (a weight of the last
    layer pushed to inf mid-backward, as an overflow would) changes no parameter, no
    master and no optimizer state, halves the scale and restarts the good count; the
    next finite step applies."""
    net, o, scaler, x, y = _scaled_setup(interval=100, opt=opt)
    loss = nn.CrossEntropyLoss()
    nn.train_step(net, loss, o, x, y)  # one good step: state exists
    before = {k: v.copy() for k, v in net.state().items()}
    masters = {k: v.copy() for k, v in o.masters.master.items()}
    state = [a.copy() for a in (o.velocity.values() if opt == "sgd" else
                                [t for pair in o.state.values() for t in pair])]
    value = loss.forward(net.forward(x, train=True), y)
    net.backward(loss.backward(scaler), need_dx=False)
    net.seq[-1].grads["w"][0, 0] = np.inf
    o.step()
    assert np.isfinite(float(np.asarray(value)))
    assert float(scaler.state[3][0]) == 0.0  # keep
    assert float(scaler.scale[0]) == 2.0 ** 9 and float(scaler.state[2][0]) == 0.0
    after = net.state()
    for k, v in before.items():
        if ".p." in k:  # (batch norm's running statistics moved in the forward pass)
            np.testing.assert_array_equal(after[k], v, err_msg=k)
    for k, v in masters.items():
        np.testing.assert_array_equal(o.masters.master[k], v)
    now = [a for a in (o.velocity.values() if opt == "sgd" else
                       [t for pair in o.state.values() for t in pair])]
    for a, b in zip(now, state):
        np.testing.assert_array_equal(a, b)
    nn.train_step(net, loss, o, x, y)
    assert float(scaler.state[3][0]) == 1.0
    assert any(not np.array_equal(net.state()[k], v) for k, v in before.items() if ".p." in k)


def test_loss_scaler_grows_after_its_interval():
    """growth_interval finite steps in a row double the scale (then the count
    restarts): interval 3 from 2^10 gives 2^10, 2^10, 2^11 after steps 1-3, 2^12 after
    step 6; good counts 1, 2, 0, 1, 2, 0."""
    net, o, scaler, x, y = _scaled_setup(interval=3)
    scales, goods = [], []
    for _ in range(6):
        nn.train_step(net, nn.CrossEntropyLoss(), o, x, y)
        scales.append(float(scaler.scale[0]))
        goods.append(float(scaler.state[2][0]))
    assert scales == [2.0 ** 10, 2.0 ** 10, 2.0 ** 11, 2.0 ** 11, 2.0 ** 11, 2.0 ** 12]
    assert goods == [1, 2, 0, 1, 2, 0]


def test_float16_gradients_underflow_without_scaling():
    """Why fp16 scales its loss: a tiny loss gradient (a batch of 4096 rows, each
    dlogit ~ 1e-4 / 4096 ~ 2e-8, under fp16's smallest subnormal 6e-8) flushes to
    zero in float16 unless scaled; with the default 2^16 it survives."""
    g = np.full((4096, 3), 2e-8, np.float32)
    assert not np.any(nbdnn.cast_tensor(g, "float16").astype(np.float32))
    s = nn.LossScaler()
    scaled = nbdnn.cast_tensor(s.scaled(g), "float16").astype(np.float32)
    np.testing.assert_allclose(scaled * 2.0 ** -16, g, rtol=1e-3)


def test_loss_scaler_rejects_bad_settings():
    with pytest.raises(nbdnn.BadParamError):
        nn.LossScaler(growth_factor=1.0)
    with pytest.raises(nbdnn.BadParamError):
        nn.LossScaler(backoff_factor=1.5)


def test_float16_step_on_the_cuda_backend_matches_the_cpu():
    """Two fp16 scaled SGD steps (the second grows the scale) of a linear model on the
    CUDA backend (the simulator here, the H200 in the GPU suite) and the CPU: losses,
    scale and parameters agree to fp16 rounding."""
    x, y = _data(n=4)
    runs = {}
    for dev in ("cpu", "cuda"):
        net = nn.Sequential([nn.Flatten(), nn.Linear(16, 3, seed=2, dtype=np.float16)]).to(dev)
        scaler = nn.LossScaler(2.0 ** 8, growth_interval=2)
        o = nn.SGD(net, 0.05, momentum=0.9, scaler=scaler)
        xs = x.astype(np.float16)
        losses = [float(_host(nn.train_step(net, nn.CrossEntropyLoss(), o,
                                            nn.move(xs, dev), nn.move(y, dev))).reshape(-1)[0])
                  for _ in range(2)]
        runs[dev] = (losses, float(_host(scaler.scale).reshape(-1)[0]),
                     {k: v.astype(np.float64) for k, v in net.state().items()})
    assert runs["cpu"][1] == runs["cuda"][1] == 2.0 ** 9
    np.testing.assert_allclose(runs["cuda"][0], runs["cpu"][0], rtol=1e-2, atol=1e-3)
    for k, v in runs["cpu"][2].items():
        np.testing.assert_allclose(runs["cuda"][2][k], v, rtol=2e-2, atol=2e-2, err_msg=k)


def test_resnet50_shapes_and_parameter_count():
    """ResNet-50's 25.6 M parameters (torchvision's count: 25,557,032) and its
    bottleneck blocks; a narrow ResNet-50 (widths 4-32, one block a stage) runs a
    bfloat16 forward and backward on the CPU backend with float32 master weights and
    keeps its output's shape and dtype."""
    net = nn.resnet50()
    count = sum(int(np.prod(m.params[k].shape)) for m, k in net.parameters())
    assert count == 25_557_032
    small = nn.resnet50(10, widths=(4, 8, 16, 32), blocks=(1, 1, 1, 1), dtype=BF16)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 32, 32)).astype(BF16)
    y = small.forward(x, train=True)
    assert y.shape == (2, 10) and y.dtype == BF16
    opt = nn.SGD(small, 0.01, momentum=0.9)
    v = nn.train_step(small, nn.CrossEntropyLoss(), opt, x, np.eye(10, dtype=np.float32)[[1, 7]])
    assert np.isfinite(float(np.asarray(v))) and len(opt.masters.master) == len(small.parameters())


def test_channels_last_resnet_equals_channels_first():
    """layout="NHWC" builds the same network channels-last (filters transposed from the
    same seeds): a narrow ResNet-50's training-mode forward and backward on the CPU
    backend give the NCHW model's logits and input gradient, transposed."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, 32, 32))
    nets = {lay: nn.resnet50(10, widths=(4, 8, 8, 8), blocks=(1, 2, 1, 1), layout=lay,
                             dtype=np.float64) for lay in ("NCHW", "NHWC")}
    y1 = nets["NCHW"].forward(x, train=True)
    y2 = nets["NHWC"].forward(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), train=True)
    np.testing.assert_allclose(y2, y1, rtol=1e-10, atol=1e-12)
    dy = rng.standard_normal(y1.shape)
    d1, d2 = nets["NCHW"].backward(dy), nets["NHWC"].backward(dy)
    # (float64 sums in another order: 1e-12 absolute on gradients of ~1e-4)
    np.testing.assert_allclose(d2.transpose(0, 3, 1, 2), d1, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_fold_batch_norm_matches_eval(layout):
    """nn.fold_batch_norm: a narrow ResNet-50 with running statistics moved off their
    start (three training forwards) gives, folded, its eval-mode logits (float64, CPU
    backend): every Conv2d - BatchNorm2d [- ReLU] one convolution, every block's last
    convolution adding the shortcut and applying the ReLU."""
    rng = np.random.default_rng(6)
    net = nn.resnet50(10, widths=(4, 8, 8, 8), blocks=(1, 2, 1, 1), layout=layout,
                      dtype=np.float64)
    shape = (2, 3, 32, 32) if layout == "NCHW" else (2, 32, 32, 3)
    for _ in range(3):
        net.forward(rng.standard_normal(shape) * 2 + 0.5, train=True)
    x = rng.standard_normal(shape)
    folded = nn.fold_batch_norm(net)
    kinds = [type(m).__name__ for m in folded.seq]
    assert kinds[:2] == ["FoldedConv", "MaxPool2d"] and kinds.count("FoldedBlock") == 5
    np.testing.assert_allclose(folded.forward(x), net.forward(x), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_sequential_plan_in_a_precision(precision):
    """Sequential.plan(..., precision=): the float32 model cast to 16 bits (batch norm's
    statistics stay float32), a LossScaler attached for fp16, and the planned steps
    (eager on the CPU backend; graphs on CUDA) train: the loss falls over 8 steps."""
    x, y = _data()
    net = _net(np.float32)
    opt = nn.SGD(net, 0.1, momentum=0.9)
    steps = net.plan(8, (1, 4, 4), loss=nn.CrossEntropyLoss(), optimizer=opt,
                     precision=precision)
    want = {"bf16": "bfloat16", "fp16": "float16"}[precision]
    assert all(str(m.params[k].dtype) == want for m, k in net.parameters())
    assert net.seq[1].buffers["mean"].dtype == np.float32
    assert (opt.scaler is not None) == (precision == "fp16")
    losses = [float(np.asarray(steps.step(x, y))) for _ in range(8)]
    assert losses[-1] < 0.7 * losses[0], losses
    with pytest.raises(nbdnn.BadParamError):
        net.to_precision("fp8")


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_planned_mixed_precision_steps_replay_as_graphs(precision):
    """On a GPU: the mixed-precision step captured as CUDA graphs (masters, the loss
    scaler's skip and growth inside) gives the eager step's losses and parameters
    bit for bit, a skipped step included (fp16: an init scale of 2^40 overflows the
    first steps, which back off on the device)."""
    from nbdnn.cuda import SIMULATOR
    if SIMULATOR:
        pytest.skip("CUDA graphs need a GPU")
    pytest.importorskip("torch")
    x, y = _data()
    runs = {}
    for graph in (False, True):
        net = _net(np.float32).to("cuda")
        opt = nn.SGD(net, 0.1, momentum=0.9,
                     scaler=nn.LossScaler(2.0 ** 40, growth_interval=3)
                     if precision == "fp16" else None)
        steps = net.plan(8, (1, 4, 4), loss=nn.CrossEntropyLoss(), optimizer=opt,
                         precision=precision, graph=graph)
        losses = [float(_host(steps.step(x, y)).reshape(-1)[0]) for _ in range(6)]
        runs[graph] = (losses, {k: v for k, v in net.state().items()},
                       None if opt.scaler is None else float(_host(opt.scaler.scale)[0]))
    assert runs[True][0] == runs[False][0] and runs[True][2] == runs[False][2]
    for k, v in runs[False][1].items():
        np.testing.assert_array_equal(runs[True][1][k], v, err_msg=k)
    if precision == "fp16":
        assert runs[True][2] < 2.0 ** 40  # (backed off)


@pytest.mark.parametrize("dev", ["cpu", "cuda"])
def test_fused_sgd_step_equals_the_element_wise_one(dev, monkeypatch):
    """nn.SGD through nbdnn.sgd_update (train.FUSED_SGD, one call a parameter) and
    through element-wise ops: four fp16 steps with momentum and weight decay (a loss
    scaler starting at 2**19, where the loss's gradient overflows: two skipped steps,
    then two applied; the GPU suite runs the CUDA case on the H200) leave the same
    parameters, to the float32 roundings in which the two orders differ."""
    from nbdnn.nn import train
    x, y, dtype = *_data(n=4), np.float16
    runs = {}
    for fused in (False, True):
        monkeypatch.setattr(train, "FUSED_SGD", fused)
        net = nn.Sequential([nn.Flatten(), nn.Linear(16, 3, seed=2, dtype=dtype)]).to(dev)
        scaler = nn.LossScaler(2.0 ** 19, growth_interval=100)
        o = nn.SGD(net, 0.05, momentum=0.9, weight_decay=1e-2, scaler=scaler)
        start = {k: v.astype(np.float64) for k, v in net.state().items()}
        for _ in range(4):
            nn.train_step(net, nn.CrossEntropyLoss(), o, nn.move(x.astype(dtype), dev),
                          nn.move(y, dev))
        runs[fused] = {k: v.astype(np.float64) for k, v in net.state().items()}
        assert not np.array_equal(runs[fused]["2.p.w"], start["2.p.w"])  # (some step applied)
        assert float(_host(scaler.scale).reshape(-1)[0]) < 2.0 ** 19  # (and some skipped)
    for k, v in runs[False].items():
        np.testing.assert_allclose(runs[True][k], v, rtol=2e-3, atol=2e-3, err_msg=k)

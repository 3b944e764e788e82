"""nbdnn.nn: every layer's backward and the loss against central finite differences
(float64, CPU backend), the CUDA backend (simulator or GPU) against the CPU on a
small network, SGD's update rule, and save/load."""
import numpy as np
import pytest

import nbdnn
from nbdnn import nn

RNG = np.random.default_rng(0)


def _numeric(f, a, idx, h=1e-6):
    old = a[idx]
    a[idx] = old + h
    up = f()
    a[idx] = old - h
    down = f()
    a[idx] = old
    return (up - down) / (2 * h)


def _check_layer(layer, x, train=True, picks=8):
    """d(sum(y * r))/dx and /dp (every parameter of the layer and the layers inside
    it) from backward against finite differences."""
    r = RNG.standard_normal(layer.forward(x.copy(), train).shape)

    def value():
        return float(np.sum(np.asarray(layer.forward(x, train)) * r))
    if isinstance(layer, nn.Dropout):  # a fixed mask: rewind the counter each call
        base = layer.buffers["offset"].copy()
        f = value

        def value():
            layer.buffers["offset"][...] = base
            return f()
    value()
    dx = np.asarray(layer.backward(r))
    pairs = [(m.params[k], np.asarray(m.grads[k])) for m in layer.layers() for k in m.params]
    for arr, g in [(x, dx)] + pairs:
        for _ in range(picks):
            idx = tuple(int(RNG.integers(n)) for n in arr.shape)
            np.testing.assert_allclose(g[idx], _numeric(value, arr, idx), rtol=1e-5,
                                       atol=1e-7)


def _img(*shape):
    return RNG.standard_normal(shape)


@pytest.mark.parametrize("make, x", [
    (lambda: nn.Conv2d(3, 4, 3, padding=1, stride=2, seed=1, dtype=np.float64), _img(2, 3, 5, 5)),
    (lambda: nn.Conv2d(4, 4, 3, padding=1, groups=4, seed=2, dtype=np.float64), _img(2, 4, 4, 4)),
    (lambda: nn.Conv2d(3, 4, 3, padding=1, stride=2, seed=1, dtype=np.float64,
                       layout="NHWC"), _img(2, 5, 6, 3)),  # (the bias's gradient per channel)
    (lambda: nn.BatchNorm2d(3, dtype=np.float64), _img(4, 3, 3, 3)),
    (lambda: nn.BatchNorm2d(3, dtype=np.float64, layout="NHWC"), _img(4, 3, 2, 3)),
    (lambda: nn.Activation("tanh"), _img(2, 3, 4)),
    (lambda: nn.MaxPool2d(2), _img(2, 2, 4, 4)),
    (lambda: nn.AvgPool2d(3, stride=2, padding=1), _img(2, 2, 5, 5)),
    (lambda: nn.GlobalAvgPool2d(), _img(2, 3, 3, 4)),
    (lambda: nn.Flatten(), _img(2, 3, 2, 2)),
    (lambda: nn.Linear(6, 4, seed=3, dtype=np.float64), _img(5, 6)),
    (lambda: nn.Dropout(0.3, seed=5), _img(4, 8)),
    (lambda: nn.BasicBlock(2, 3, stride=2, seed=4, dtype=np.float64), _img(2, 2, 4, 4)),
    (lambda: nn.BasicBlock(3, 3, seed=6, dtype=np.float64), _img(2, 3, 4, 4))])
def test_layer_backward_matches_finite_differences(make, x):
    _check_layer(make(), x)


def test_batch_norm_infer_uses_running_statistics():
    bn = nn.BatchNorm2d(2, momentum=0.5, dtype=np.float64)
    x = _img(8, 2, 3, 3) * 2 + 1
    bn.forward(x, train=True)
    m, v = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3), ddof=1)
    np.testing.assert_allclose(bn.buffers["mean"], 0.5 * m, rtol=1e-12)
    np.testing.assert_allclose(bn.buffers["var"], 0.5 + 0.5 * v, rtol=1e-12)
    y = bn.forward(x, train=False)
    want = (x - bn.buffers["mean"][:, None, None]) / np.sqrt(
        bn.buffers["var"][:, None, None] + 1e-5)
    np.testing.assert_allclose(y, want, rtol=1e-10)


def test_cross_entropy_value_and_gradient():
    logits, labels = _img(5, 4), RNG.integers(0, 4, 5)
    onehot = np.eye(4)[labels]
    loss = nn.CrossEntropyLoss()
    value = float(np.asarray(loss.forward(logits, onehot)).reshape(()))
    logp = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) \
        - logits.max(1, keepdims=True)
    assert value == pytest.approx(-logp[np.arange(5), labels].mean(), rel=1e-12)
    g = np.asarray(loss.backward())
    for idx in [(0, 0), (2, 3), (4, 1)]:
        num = _numeric(lambda: float(np.asarray(loss.forward(logits, onehot)).reshape(())),
                       logits, idx)
        assert g[idx] == pytest.approx(num, rel=1e-5, abs=1e-8)


def _net(seed=0, dtype=np.float32):
    return nn.Sequential([nn.Conv2d(1, 4, 3, padding=1, seed=seed, dtype=dtype),
                          nn.BatchNorm2d(4, dtype=dtype), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Dropout(0.25, seed=seed), nn.Flatten(),
                          nn.Linear(4 * 2 * 2, 3, seed=seed + 1, dtype=dtype)])


def test_sgd_momentum_update_rule():
    net, loss = _net(), nn.CrossEntropyLoss()
    x, onehot = _img(4, 1, 4, 4).astype(np.float32), np.eye(3, dtype=np.float32)[[0, 1, 2, 0]]
    opt = nn.SGD(net, 0.1, momentum=0.9, weight_decay=0.01)
    fc = net.seq[-1]
    v = np.zeros_like(fc.params["w"])
    for _ in range(2):
        loss.forward(net.forward(x, train=True), onehot)
        net.backward(loss.backward(), need_dx=False)
        w, g = fc.params["w"].copy(), fc.grads["w"] + 0.01 * fc.params["w"]
        v = 0.9 * v + g
        opt.step()
        np.testing.assert_allclose(fc.params["w"], w - 0.1 * v, rtol=1e-5, atol=1e-7)


def test_cuda_backend_matches_cpu_and_save_load(tmp_path):
    """The same seeds give the same weights and dropout masks on both backends, so a
    training step's loss and updated weights agree; save on one, load on the other."""
    x, onehot = _img(4, 1, 4, 4).astype(np.float32), np.eye(3, dtype=np.float32)[[0, 1, 2, 1]]
    results = []
    for device in ("cpu", "cuda"):
        net = _net().to(device)
        loss, opt = nn.CrossEntropyLoss(), nn.SGD(net, 0.05, momentum=0.9)
        xs, ts = nn.move(x, device), nn.move(onehot, device)
        values = []
        for _ in range(2):
            values.append(float(nn.move(loss.forward(net.forward(xs, True), ts),
                                       "cpu").reshape(())))
            net.backward(loss.backward(), need_dx=False)
            opt.step()
        results.append((values, net.state()))
        net.save(tmp_path / f"{device}.npz")
    (v_cpu, s_cpu), (v_gpu, s_gpu) = results
    np.testing.assert_allclose(v_gpu, v_cpu, rtol=1e-4)
    for k in s_cpu:
        np.testing.assert_allclose(s_gpu[k], s_cpu[k], rtol=1e-3, atol=1e-5)
    other = _net().to("cuda").load(tmp_path / "cpu.npz")
    for k, v in other.state().items():
        np.testing.assert_array_equal(v, s_cpu[k])
    with pytest.raises(nbdnn.ShapeError):
        nn.Sequential([nn.Linear(3, 2)]).load(tmp_path / "cpu.npz")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_adam_update_rule(device):
    """Three Adam steps on given gradients against the formula in float64 NumPy."""
    lin = nn.Linear(3, 2, seed=7, dtype=np.float64)
    net = nn.Sequential([lin]).to(device)
    opt = nn.Adam(net, 0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)
    p = lin.params["w"] if device == "cpu" else nn.move(lin.params["w"], "cpu")
    p, m, v = p.copy(), np.zeros_like(p), np.zeros_like(p)
    for t in range(1, 4):
        g = RNG.standard_normal(p.shape)
        lin.grads = {"w": nn.move(g, device), "b": nn.move(np.zeros(2), device)}
        opt.step()
        g = g + 0.1 * p
        m, v = 0.8 * m + 0.2 * g, 0.99 * v + 0.01 * g * g
        p = p - 0.01 * (m / (1 - 0.8 ** t)) / (np.sqrt(v / (1 - 0.99 ** t)) + 1e-6)
        np.testing.assert_allclose(nn.move(lin.params["w"], "cpu"), p, rtol=1e-12)


def test_resnet18_shapes_and_parameter_count():
    """ResNet-18's 11.7 M parameters (torchvision's count: 11,689,512) and its output
    shape; a forward and backward pass on a small image run on the CPU backend."""
    net = nn.resnet18()
    count = sum(int(np.prod(m.params[k].shape)) for m, k in net.parameters())
    assert count == 11_689_512
    x = _img(1, 3, 32, 32).astype(np.float32)
    y = net.forward(x, train=True)
    assert y.shape == (1, 1000)
    assert net.backward(np.ones_like(y)).shape == x.shape


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_graphed_steps_equal_plain_steps_and_load_keeps_them(device, tmp_path):
    """GraphedSteps.step (eager on the CPU, graphs on CUDA: the first step eager, the second
    captured, then replays) gives the losses and weights of plain calls; forward
    sees the updated weights; load() writes into the arrays the steps captured."""
    rng = np.random.default_rng(8)
    xs = rng.standard_normal((3, 2, 2, 4, 4)).astype(np.float32)
    ts = np.eye(3, dtype=np.float32)[rng.integers(0, 3, (3, 2))]

    def make():
        m = nn.Sequential([nn.Conv2d(2, 2, 3, padding=1, seed=3), nn.ReLU(),
                           nn.Dropout(0.25, seed=4), nn.Flatten(),
                           nn.Linear(32, 3, seed=5)]).to(device)
        return m, nn.CrossEntropyLoss(), nn.SGD(m, 0.1, momentum=0.9)
    ref, rl, ro = make()
    want = []
    for x, t in zip(xs, ts):
        loss = rl.forward(ref.forward(nn.move(x, device), train=True), nn.move(t, device))
        ref.backward(rl.backward(), need_dx=False)
        ro.step()
        want.append(float(nn.move(loss, "cpu").reshape(())))
    model, loss_fn, opt = make()
    steps = nn.GraphedSteps(model, 2, (2, 4, 4), loss=loss_fn, optimizer=opt)
    got = [float(nn.move(steps.step(x, t), "cpu").reshape(())) for x, t in zip(xs, ts)]
    assert got == want
    expect = nn.move(ref.forward(nn.move(xs[0], device)), "cpu")
    np.testing.assert_array_equal(nn.move(steps.forward(xs[0]), "cpu"), expect)
    fresh, _, _ = make()
    fresh.save(tmp_path / "w.npz")
    model.load(tmp_path / "w.npz")
    np.testing.assert_array_equal(nn.move(steps.forward(xs[0]), "cpu"),
                                  nn.move(fresh.forward(nn.move(xs[0], device)), "cpu"))
    with pytest.raises(nbdnn.ShapeError):
        steps.step(xs[0][:1], ts[0][:1])


def test_load_takes_the_saved_name_and_refuses_bad_files_atomically(tmp_path):
    """save("m") writes m.npz and load("m") finds it; a file with a key missing, an
    extra key, a wrong shape, a complex dtype, truncated or foreign bytes is an
    NbdnnError naming the file, and the model is left untouched (atomic)."""
    model = nn.Sequential([nn.Linear(4, 3, seed=0), nn.ReLU(), nn.Linear(3, 2, seed=1)])
    other = nn.Sequential([nn.Linear(4, 3, seed=5), nn.ReLU(), nn.Linear(3, 2, seed=6)])
    model.save(str(tmp_path / "m"))
    other.load(str(tmp_path / "m"))
    for (m1, k1), (m2, k2) in zip(model.parameters(), other.parameters()):
        np.testing.assert_array_equal(m1.params[k1], m2.params[k2])
    good = dict(np.load(tmp_path / "m.npz"))
    keys = sorted(good)
    before = {k: v.copy() for k, v in other.state().items()}
    bad_files = {
        "missing": {k: v for k, v in good.items() if k != keys[-1]},
        "extra": dict(good, **{"9.p.w": np.zeros(2)}),
        "shape": dict(good, **{keys[-1]: np.zeros(7)}),
        "complex": dict(good, **{keys[-1]: good[keys[-1]].astype(np.complex64)}),
    }
    for name, entries in bad_files.items():
        path = tmp_path / f"{name}.npz"
        np.savez(path, **entries)
        with pytest.raises(nbdnn.NbdnnError, match=name + ".npz"):
            other.load(str(path))
    raw = (tmp_path / "m.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(raw[: len(raw) // 2])
    (tmp_path / "junk.npz").write_bytes(b"not a zip file at all")
    for name in ("cut", "junk"):
        with pytest.raises(nbdnn.NbdnnError, match=name):
            other.load(str(tmp_path / name))
    with pytest.raises(nbdnn.NbdnnError, match="nosuch"):
        other.load(str(tmp_path / "nosuch"))
    for k, v in other.state().items():
        np.testing.assert_array_equal(v, before[k])

"""nbdnn.nn's transformer layers (issue 25): LayerNorm, MultiheadAttention (fused QKV
projection, causal or not), TransformerBlock, PositionalEmbedding, SequenceMean: backward against central
differences in float64 on the CPU; the CUDA backend (the simulator without a GPU)
against the CPU; the training step under GraphedSteps equal to plain steps."""
import numpy as np
import pytest

import nbdnn
from nbdnn import nn

B, S, E, H = 2, 3, 8, 2


def _classifier(device, dtype=np.float32, causal=False):
    return nn.Sequential([nn.PositionalEmbedding(S, E, seed=0, dtype=dtype),
                          nn.TransformerBlock(E, H, causal=causal, seed=1, dtype=dtype),
                          nn.LayerNorm(E, dtype=dtype), nn.SequenceMean(),
                          nn.Linear(E, 3, seed=9, dtype=dtype)]).to(device)


@pytest.mark.parametrize("causal", [False, True])
def test_block_backward_matches_central_differences(causal):
    rng = np.random.default_rng(0)
    blk = nn.TransformerBlock(E, H, causal=causal, seed=1, dtype=np.float64)
    x, dy = rng.standard_normal((B, S, E)), rng.standard_normal((B, S, E))
    blk.forward(x, True)
    dx = blk.backward(dy)

    def f():
        return float(np.sum(blk.forward(x, True) * dy))
    pairs = [("x", x, dx)] + [(f"{type(m).__name__}.{k}", p, m.grads[k])
                              for m in blk.layers() for k, p in m.params.items()]
    for name, a, g in pairs:
        for j in [tuple(rng.integers(0, n) for n in a.shape) for _ in range(3)]:
            a[j] += 1e-6
            hi = f()
            a[j] -= 2e-6
            lo = f()
            a[j] += 1e-6
            assert abs((hi - lo) / 2e-6 - g[j]) < 1e-6 * (1 + abs(g[j])), (name, j)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cuda_matches_cpu(dtype):
    """Logits and every gradient of a block + mean + linear classifier, causal."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((B, S, E)).astype(dtype)
    dy = rng.standard_normal((B, 3)).astype(dtype)
    got = {}
    for device in ("cpu", "cuda"):
        m = _classifier(device, dtype, causal=True)
        y = m.forward(nn.move(x, device), True)
        m.backward(nn.move(dy, device))
        got[device] = [nn.move(y, "cpu")] + [nn.move(layer.grads[k], "cpu")
                                             for layer in m.layers() for k in layer.params]
    tol = 1e-12 if dtype == np.float64 else 2e-5
    for a, b in zip(got["cpu"], got["cuda"]):
        np.testing.assert_allclose(b, a, rtol=tol, atol=tol)


def test_heads_must_divide_the_width():
    with pytest.raises(nbdnn.BadParamError, match="multiple of heads"):
        nn.MultiheadAttention(10, 3)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_graphed_steps_equal_plain_steps(device):
    """A transformer classifier's training step under GraphedSteps (captured on CUDA)
    gives the plain steps' losses."""
    rng = np.random.default_rng(8)
    xs = rng.standard_normal((3, B, S, E)).astype(np.float32)
    ts = np.eye(3, dtype=np.float32)[rng.integers(0, 3, (3, B))]
    ref = _classifier(device)
    rl, ro = nn.CrossEntropyLoss(), nn.SGD(ref, 0.1, momentum=0.9)
    want = []
    for x, t in zip(xs, ts):
        loss = rl.forward(ref.forward(nn.move(x, device), train=True), nn.move(t, device))
        ref.backward(rl.backward())
        ro.step()
        want.append(float(nn.move(loss, "cpu").reshape(())))
    model = _classifier(device)
    steps = nn.GraphedSteps(model, B, (S, E), loss=nn.CrossEntropyLoss(),
                            optimizer=nn.SGD(model, 0.1, momentum=0.9))
    got = [float(nn.move(steps.step(x, t), "cpu").reshape(())) for x, t in zip(xs, ts)]
    np.testing.assert_allclose(got, want, rtol=1e-6)

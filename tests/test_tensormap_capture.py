"""TMA tensor maps at new addresses (nbdnn/cuda/tensorcore/tensormap.py): where a map's
128 bytes live for a launch, eagerly and on a capturing stream; on the H200, the
tensor-core convolution (forward, filter gradient) and flash attention replaying eager
call plans at new addresses (a replay makes its own maps: plan_record's derived
numbers), and those with the GEMM captured by torch.cuda.graph at the graph pool's new
addresses, replaying to the eager result. A captured step failed: the maps
were uploaded with cuMemAlloc and a synchronous copy, which a capture forbids."""
import numpy as np
import pytest

from nbdnn.cuda import SIMULATOR
from nbdnn.cuda.tensorcore import tensormap as tm
from nbdnn.errors import NotSupportedError

WORDS = [tuple(range(16 * i, 16 * i + 16)) for i in range(4)]


@pytest.fixture
def fresh_cache(monkeypatch):
    """Empty device caches of two entries for the test, the module's own restored."""
    monkeypatch.setattr(tm, "_uploads", type(tm._uploads)())
    monkeypatch.setattr(tm, "_kept", {})
    monkeypatch.setattr(tm, "UPLOADS", 2)


def _held(entry):
    """The 16 words a (device address, device array) entry holds, read back."""
    from nbdnn.cuda.runtime.memory.arrays import ptr
    address, dev = entry
    assert address == ptr(dev)
    return tuple(int(v) for v in dev.copy_to_host())


def test_eager_maps_upload_once_by_content_and_drop_the_least_recent(fresh_cache):
    first = tm._placed(WORDS[0], 0, None)
    assert _held(first) == WORDS[0] and tm._placed(WORDS[0], 0, None) is first
    tm._placed(WORDS[1], 0, None)
    tm._placed(WORDS[0], 0, None)  # (0 now the most recent)
    tm._placed(WORDS[2], 0, None)  # (drops 1)
    assert list(tm._uploads) == [WORDS[0], WORDS[2]]


def test_a_capture_keeps_the_maps_it_uses_and_refuses_new_ones_without_an_allocator(
        fresh_cache, monkeypatch):
    """A map on the device that a capture uses is never dropped (the graph holds its
    address); a new one needs an allocator that works inside a capture."""
    used = tm._placed(WORDS[0], 0, None)
    monkeypatch.setattr(tm, "capturing", lambda stream: stream == 7)
    monkeypatch.setattr(tm, "stream_handle", lambda stream: stream)  # (simulator: 0)
    assert tm._placed(WORDS[0], 7, None) is used and WORDS[0] in tm._kept
    with pytest.raises(NotSupportedError, match="PyTorch or CuPy"):
        tm._placed(WORDS[3], 7, used[1])  # (a numba array: numba's allocator)
    for w in WORDS[1:]:
        tm._placed(w, 0, None)  # (eager: fills and cycles the cache)
    assert tm._placed(WORDS[0], 0, None) is used and WORDS[0] not in tm._uploads
    assert WORDS[3] in tm._uploads  # (eager calls upload as ever)


def test_the_writer_kernel_stores_all_16_words():
    from numba import cuda
    words = tuple(range(1, 16)) + (2 ** 64 - 3,)
    dst = cuda.device_array(16, np.uint64)
    tm.WRITER.launch(tm.WRITE_SIG, 1, 32, 0, dst, *words)
    assert tuple(int(v) for v in dst.copy_to_host()) == words


try:
    import torch
    import nbdnn.torch as nt
except ImportError:  # (the tests above need no PyTorch)
    torch = None
CUDA = pytest.mark.skipif(SIMULATOR or torch is None or not torch.cuda.is_available(),
                          reason="tensor cores and torch.cuda.graph need a GPU")


@CUDA
@pytest.mark.parametrize("case", ["conv2d", "conv_backward_filter", "attention"])
def test_tensor_core_calls_replay_plans_at_new_addresses(case):
    """Six calls of one signature on new bf16 tensors each (all kept alive: new
    addresses): every result equals the full path's on the same tensors (the same
    kernels, bit for bit), and the signature gets a plan (calls 4-6 replay it)."""
    import nbdnn
    from nbdnn.cuda.runtime.launch.kernel import launched
    from nbdnn.ops import _plan
    g = torch.Generator(device="cuda").manual_seed(1)

    def rand(*shape):
        return torch.randn(*shape, device="cuda", generator=g, dtype=torch.bfloat16)
    op, kernel = {"conv2d": (nbdnn.conv2d, "wgmma_conv"),
                  "conv_backward_filter": (nbdnn.conv_backward_filter, "wgmma"),
                  "attention": (nbdnn.scaled_dot_product_attention, "attention_flash_fwd")}[case]
    calls = {"conv2d": lambda: ((rand(4, 8, 8, 64), rand(64, 3, 3, 64)),
                                dict(padding=(1, 1), layout="NHWC")),
             "conv_backward_filter": lambda: ((rand(4, 8, 8, 64), rand(4, 8, 8, 64),
                                               (64, 3, 3, 64)),
                                              dict(padding=(1, 1), layout="NHWC")),
             "attention": lambda: ((rand(2, 4, 32, 64), rand(2, 4, 32, 64),
                                    rand(2, 4, 32, 64)), {})}[case]
    kept = [calls() for _ in range(6)]
    with launched() as names:
        op.unplanned(*kept[0][0], **kept[0][1])
    assert any(n.startswith(kernel) for n in names), names
    _plan.clear()
    for args, kw in kept:
        got = op(*args, **kw)
        want = op.unplanned(*args, **kw)
        for a, b in zip(*(r if isinstance(r, tuple) else (r,) for r in (got, want))):
            assert torch.equal(a, b), case
    assert _plan.Plan in [type(p) for p in _plan.plans_of_this_thread().values()]


@CUDA
def test_cold_calls_on_a_side_stream_read_landed_maps_and_tables(monkeypatch):
    """Calls whose maps and geometry tables are not on the device yet, made on a PyTorch
    side stream (non-blocking: no ordering with the legacy stream, where they are
    copied) right after a busy default stream: each equals the same call made later on
    the default stream. (A probe: a converted ResNet-50 whose first steps ran on
    a side stream hit an illegal instruction; the copies now wait until they land.)"""
    import nbdnn
    from nbdnn.cuda.conv import wgmma_conv
    monkeypatch.setattr(tm, "_uploads", type(tm._uploads)())
    monkeypatch.setattr(wgmma_conv, "_geometry_cache", {})
    g = torch.Generator(device="cuda").manual_seed(2)
    side = torch.cuda.Stream()
    for size in (8, 12, 16, 20):  # (new geometries: new tables; new tensors: new maps)
        x = torch.randn(4, size, size, 64, device="cuda", generator=g, dtype=torch.bfloat16)
        w = torch.randn(64, 3, 3, 64, device="cuda", generator=g, dtype=torch.bfloat16)
        tm._encoded.cache_clear(), tm._encoded_im2col.cache_clear()
        torch.cuda.synchronize()  # (x and w written; the side stream waits for nothing)
        torch.cuda._sleep(2_000_000)  # (the legacy stream busy for ~1 ms: a copy there
        # starts after it, while the side stream's kernel could start at once)
        with torch.cuda.stream(side):
            got = nbdnn.conv2d(x, w, padding=(1, 1), layout="NHWC", stream=side.cuda_stream)
        side.synchronize()
        want = nbdnn.conv2d.unplanned(x, w, padding=(1, 1), layout="NHWC")
        assert torch.equal(got, want), size


def _step(x, w, wl, q, k):
    """A bf16 step on the tensor cores: channels-last convolution (its filter gradient
    too: 64 channels), a linear layer (the wgmma GEMM) and attention (the flash
    kernels, 32 queries of 64), then backward."""
    y = nt.relu(nt.conv2d(x, w, padding=1))
    h = nt.linear(y.permute(0, 2, 3, 1).reshape(-1, 64), wl)
    a = nt.scaled_dot_product_attention(q, k, k)
    loss = h.float().square().mean() + a.float().square().mean()
    loss.backward()
    return loss


@CUDA
def test_tensor_core_step_captured_at_new_addresses_replays_the_eager_step():
    """torch.cuda.graph captures the step with its inputs and gradients in the graph
    pool (addresses the warm-up never saw): the maps for them are written inside the
    graph (the writer kernel runs), and each replay on new data equals an eager step on
    that data; a stale map would read the warm-up's buffers."""
    from nbdnn.cuda.runtime.launch.kernel import launched
    g = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, device="cuda", generator=g, dtype=torch.bfloat16)
    w = rand(64, 64, 3, 3).to(memory_format=torch.channels_last).requires_grad_()
    wl = (rand(128, 64) / 8).requires_grad_()
    params = (w, wl)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # (warm-up: JIT, tables; its buffers are freed after)
        _step(rand(4, 64, 8, 8).to(memory_format=torch.channels_last), w, wl,
              rand(2, 4, 32, 64).requires_grad_(), rand(2, 4, 32, 64).requires_grad_())
    torch.cuda.current_stream().wait_stream(s)
    for p in params:
        p.grad = None
    graph = torch.cuda.CUDAGraph()
    with launched() as names, torch.cuda.graph(graph):
        x = torch.empty(4, 64, 8, 8, device="cuda", dtype=torch.bfloat16,
                        memory_format=torch.channels_last)
        q = torch.empty(2, 4, 32, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.empty_like(q, requires_grad=True)
        loss = _step(x, w, wl, q, k)
    for kernel in ("_write_words", "wgmma_conv", "wgmma_gemm", "attention_flash_fwd"):
        assert any(n.startswith(kernel) for n in names), (kernel, names)  # (backward runs
        # on autograd's device thread: launched() sees this thread's launches)
    for _ in range(2):
        data = (rand(4, 64, 8, 8).to(memory_format=torch.channels_last),
                rand(2, 4, 32, 64), rand(2, 4, 32, 64))
        for static, new in zip((x, q, k), data):
            static.detach().copy_(new)
        graph.replay()
        got = [loss.clone()] + [t.grad.clone() for t in params + (q, k)]
        twins = [p.detach().clone().requires_grad_() for p in params]
        xs, qs, ks = data[0], data[1].requires_grad_(), data[2].requires_grad_()
        want = [_step(xs, *twins, qs, ks)] + [t.grad for t in twins + [qs, ks]]
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)

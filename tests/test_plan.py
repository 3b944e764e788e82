"""Eager call plans (nbdnn/ops/_plan.py): a signature's 4th and later calls replay a
recording of its 2nd and 3rd at the new call's addresses. Every op row, fresh arrays
each call (new addresses), against the CPU reference; aliasing, hidden host state,
graphs and strided views."""
import itertools

import numpy as np
import pytest

import nbdnn
from nbdnn.cuda import SIMULATOR, Graph, cuda
from nbdnn.ops import _plan
from nbdnn.ops._plan import Plan, planned
from nbdnn.testing import SPECS, crosscheck


def _states():
    return list(_plan.plans_of_this_thread().values())


def _draws(call):
    """The smallest shapes and parameters every call; the data's seed, every maker's
    first draw, changes."""
    first = [True]

    def draw(lo, hi):
        if first[0]:
            first[0] = False
            return lo + call % (hi - lo + 1)
        return lo
    return draw


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_every_op_replays_a_plan_right(spec):
    """Five calls of one signature, each on new device arrays with new data: the last
    two replay the plan (checked), and all five match the reference."""
    dtype = "float32" if "float32" in spec.dtypes else spec.dtypes[0]
    blend = (0.5, 0.75, 7) if spec.blend else None
    for call in range(5):
        if call == 3:
            assert any(type(s) is Plan for s in _states()), "no plan after three calls"
        case = spec.make(_draws(call), dtype, False)
        r = crosscheck(spec, case, dtype, blend=blend)
        assert r["ok"], f"call {call + 1}: {r['msg']}"
    assert _plan._NEVER not in _states()


def test_in_place_add_accumulates_through_the_plan():
    """add_tensor(g, v, beta=0.9, out=v) (momentum), the same arrays six times: the plan
    keeps out aliasing c."""
    g = np.arange(12, dtype=np.float32).reshape(3, 4)
    v = np.ones((3, 4), np.float32)
    dg, dv = cuda.to_device(g), cuda.to_device(v)
    for _ in range(6):
        nbdnn.add_tensor(dg, dv, beta=0.9, out=dv)
        v = g + 0.9 * v
    np.testing.assert_allclose(dv.copy_to_host(), v, rtol=1e-6)
    assert any(type(s) is Plan for s in _states())


def test_aliasing_is_part_of_the_signature():
    a = cuda.to_device(np.full(8, 2.0, np.float32))
    c = cuda.to_device(np.ones(8, np.float32))
    other = cuda.device_array(8, np.float32)
    for _ in range(4):  # learns the out=other signature
        nbdnn.add_tensor(a, c, out=other)
    nbdnn.add_tensor(a, c, out=c)  # out aliases c: another signature
    np.testing.assert_array_equal(c.copy_to_host(), np.full(8, 3.0, np.float32))
    np.testing.assert_array_equal(other.copy_to_host(), np.full(8, 3.0, np.float32))


def test_signatures_tell_nested_scalars_apart():
    """Tuples and lists are walked element by element: a value, a type (int, float,
    bool), the nesting and tuple against list each make another signature; a device
    array inside a tuple is an array of the call."""
    x = cuda.to_device(np.ones((1, 1, 4, 4), np.float32))
    key = lambda **kw: _plan._signature(nbdnn.conv2d, (x, x), kw)[0]  # noqa: E731
    keys = [key(padding=((1, 1), (1, 1))), key(padding=((1, 1), (1, 0))),
            key(padding=((1, 1), (1.0, 1))), key(padding=((1, 1), (True, 1))),
            key(padding=((1, 1), [1, 1])), key(padding=(1, 1)), key(padding=(((1, 1),), 1)),
            key(stride=(1, 1)), key(stride=(1, 1), padding=((1, 1), (1, 1)))]
    assert len(set(keys)) == len(keys)
    assert key(padding=((1, 1), (1, 1))) == keys[0]
    k, arrays = _plan._signature(nbdnn.add_tensor, ((x, 2.0),), {})
    assert [a for a, _ in arrays] == [x] and k == _plan._signature(
        nbdnn.add_tensor, ((cuda.to_device(np.zeros((1, 1, 4, 4), np.float32)), 2.0),), {})[0]
    with pytest.raises(_plan._NoPlan):  # (an object of no known kind, inside a tuple)
        _plan._signature(nbdnn.conv2d, (x, x), {"padding": ((1, 1), object())})


def test_host_state_that_changes_is_never_planned():
    """An op whose launches take a value that changes between calls (here a counter,
    the way a hidden seed would): its 2nd and 3rd recordings differ, so it always runs
    in full and every call is right."""
    counter = itertools.count(1)

    def scaled(x, out=None):
        return nbdnn.scale_tensor.unplanned(x, float(next(counter)), out=out)

    op = planned(scaled)
    x = cuda.to_device(np.ones(4, np.float32))
    got = [op(x).copy_to_host()[0] for _ in range(6)]
    assert got == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert _plan._NEVER in _states()


def _tag(address, k):
    """A number derived from an address (as a TMA map's device address is)."""
    return address % 1000003 + k


def _store(out, v):
    out[0] = v


STORE_SIG = "void(int64[::1], int64)"


def test_numbers_derived_from_addresses_are_derived_again_on_replay():
    """A launch argument computed from an input's address: the call tells its recording
    (derive), the 2nd and 3rd recordings agree, and each replay computes it again at
    its own input's address. (Before such a number was a constant: a replay
    passed the recorded one, as the flash attention kernels' maps could have been.)"""
    from nbdnn.cuda.runtime.memory.arrays import capture_state, empty, ptr
    from nbdnn.cuda.runtime.launch.kernel import Kernel
    store = Kernel(_store, [STORE_SIG])

    def tagged(x, out=None):
        out = empty(x, (1,), "int64")
        value = _tag(ptr(x) + 8, 5)
        rec = capture_state.__dict__.get("plan")
        if rec is not None:
            rec.derive(value, ptr(x) + 8, (_tag, 5))
        store.launch(STORE_SIG, 1, 1, 0, out, value)
        return out
    op = planned(tagged)
    xs = [cuda.to_device(np.zeros(4, np.float32)) for _ in range(6)]  # (all alive: six
    # addresses)
    got = [int(op(x).copy_to_host()[0]) for x in xs]
    assert got == [_tag(ptr(x) + 8, 5) for x in xs]
    assert Plan in [type(s) for s in _states()]


def test_strided_views_and_numpy_take_the_full_path():
    x = cuda.to_device(np.arange(16, dtype=np.float32))[::2]
    for _ in range(5):
        y = nbdnn.activation(x, "relu")
        z = nbdnn.activation(np.arange(8, dtype=np.float32), "relu")
    np.testing.assert_array_equal(y.copy_to_host(), np.arange(0, 16, 2, dtype=np.float32))
    np.testing.assert_array_equal(z, np.arange(8, dtype=np.float32))
    assert _states() == []


def test_a_graph_captures_a_planned_signature():
    """Capture runs the full path (plans are off while a graph records), so the graph
    holds the call's launches and replays see new data."""
    x = cuda.to_device(np.linspace(-1, 1, 32).astype(np.float32).reshape(1, 2, 4, 4))
    y = cuda.device_array((1, 2, 2, 2), np.float32)
    for _ in range(5):
        nbdnn.pool2d(x, 2, out=y)
    g = Graph()
    with g.capture():
        nbdnn.pool2d(x, 2, out=y)
    assert len(g) >= 1
    host = np.random.default_rng(1).standard_normal((1, 2, 4, 4)).astype(np.float32)
    x.copy_to_device(host)
    g.replay()
    cuda.synchronize()
    np.testing.assert_array_equal(y.copy_to_host(), nbdnn.pool2d(host, 2))


def test_nbdnn_plans_0_turns_plans_off(monkeypatch):
    def op(x):
        return x
    monkeypatch.setenv("NBDNN_PLANS", "0")
    assert planned(op) is op
    monkeypatch.setenv("NBDNN_PLANS", "1")
    assert planned(op).unplanned is op


def test_a_failing_call_leaves_no_plan():
    x = cuda.to_device(np.ones((2, 3), np.float32))
    for _ in range(4):
        with pytest.raises(nbdnn.BadParamError):
            nbdnn.activation(x, "not-a-mode")
    assert not any(type(s) is Plan for s in _states())


def test_overlapping_inputs_are_not_planned():
    """out= a shifted view of x is refused on every call (tests/test_aliasing.py), and
    no plan is learned from the refusals."""
    buf = cuda.to_device(np.arange(10, dtype=np.float32))
    for _ in range(5):
        with pytest.raises(nbdnn.BadParamError, match="overlaps x"):
            nbdnn.scale_tensor(buf[:8], 1.0, out=buf[2:])
    assert not any(type(s) is Plan for s in _states())



def _bn_calls(n):
    """n batch_norm_infer calls on the same device arrays, new statistics each time;
    yields (result, reference)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 4, 4)).astype(np.float32)
    s, b = rng.random(3).astype(np.float32) + 0.5, rng.standard_normal(3).astype(np.float32)
    dx, ds, db = cuda.to_device(x), cuda.to_device(s), cuda.to_device(b)
    dm, dv = cuda.device_array(3, np.float32), cuda.device_array(3, np.float32)
    for _ in range(n):
        m, v = rng.standard_normal(3).astype(np.float32), rng.random(3).astype(np.float32) + .1
        dm.copy_to_device(m)
        dv.copy_to_device(v)
        yield nbdnn.batch_norm_infer(dx, ds, db, dm, dv), nbdnn.batch_norm_infer(x, s, b, m, v)


def test_a_plan_reuses_its_workspaces_but_not_its_outputs():
    """batch_norm_infer's channel coefficients (a 3C workspace) are rewritten every call
    into a workspace the plan does not allocate; each call's result is a new array."""
    results = []
    for got, want in _bn_calls(6):
        np.testing.assert_allclose(got.copy_to_host(), want, rtol=1e-5, atol=1e-5)
        results.append(got)
    plan = next(s for s in _states() if type(s) is Plan)
    assert len(plan.recording.workspaces) == 1
    assert len({id(r) for r in results}) == 6


@pytest.mark.skipif(SIMULATOR, reason="the simulator's plans keep their own workspaces")
def test_plans_share_the_threads_workspace_and_survive_its_growth():
    """Two signatures' workspaces at the same addresses (the thread's buffer), then a
    larger one: the buffer grows, and the first plans still replay right (they keep
    the buffer they were built with)."""
    from nbdnn.cuda.runtime.capture import plan_record as _plan_record
    _plan.clear()
    for got, want in _bn_calls(5):
        np.testing.assert_allclose(got.copy_to_host(), want, rtol=1e-5, atol=1e-5)
    small = _plan_record.workspace.nbytes
    assert small > 0
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 64, 9, 9)).astype(np.float32)
    w = rng.standard_normal((64, 64, 3, 3)).astype(np.float32)
    dx, dw = cuda.to_device(x), cuda.to_device(w)
    for _ in range(5):  # winograd's transforms: workspaces far larger than 3C floats
        got = nbdnn.conv2d(dx, dw, padding=1, algo="winograd")
    np.testing.assert_allclose(got.copy_to_host(), nbdnn.conv2d(x, w, padding=1),
                               rtol=1e-3, atol=1e-3)
    assert _plan_record.workspace.nbytes >= 2 * small
    for got, want in _bn_calls(3):
        np.testing.assert_allclose(got.copy_to_host(), want, rtol=1e-5, atol=1e-5)
    assert sum(type(s) is Plan for s in _states()) == 2


def test_a_call_whose_workspaces_are_empty_replays():
    """A zero-row rms_norm allocates zero-byte workspaces: its plan still gets a buffer
    (an address to bake in) and replays the full call's empty answer."""
    from nbdnn.cuda.runtime.capture import plan_record as _plan_record
    _plan.clear()
    x = np.zeros((0, 8), np.float32)
    scale = np.ones(8, np.float32)
    want = nbdnn.rms_norm(x, scale)[0]  # (y, the rows' inverse rms)
    for _ in range(5):
        got = nbdnn.rms_norm(cuda.to_device(x), cuda.to_device(scale))[0]
        assert got.copy_to_host().shape == want.shape == (0, 8)
    assert sum(type(s) is Plan for s in _states()) == 1
    assert _plan_record.workspace.get(cuda.to_device(x), 0) is not None


def test_torch_tensors_replay_with_new_outputs():
    """torch tensors in: a plan allocates each new output with new_empty (x's dtype)
    or torch.empty (another dtype: dropout's uint8 mask), on x's device."""
    torch = pytest.importorskip("torch")
    if SIMULATOR or not torch.cuda.is_available():
        pytest.skip("needs PyTorch with CUDA and a GPU")
    rng = np.random.default_rng(5)
    outs = []
    for _ in range(5):
        h = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
        x = torch.from_numpy(h).cuda()
        y = nbdnn.activation(x, "relu")
        assert (y.dtype, y.device, y.shape) == (x.dtype, x.device, x.shape)
        np.testing.assert_array_equal(y.cpu().numpy(), np.maximum(h, 0))
        d, mask = nbdnn.dropout(x, 0.5, seed=7, offset=0)
        want_d, want_mask = nbdnn.dropout(h, 0.5, seed=7, offset=0)
        assert mask.dtype == torch.uint8 and mask.device == x.device
        np.testing.assert_array_equal(mask.cpu().numpy(), want_mask)
        np.testing.assert_allclose(d.cpu().numpy(), want_d, rtol=1e-6, atol=0)
        outs.append(y)
    assert len({o.data_ptr() for o in outs}) == 5
    assert sum(type(s) is Plan for s in _states()) == 2


def test_plan_workspaces_share_bytes_when_their_uses_do_not_overlap():
    """_packed: workspaces 0 and 1 live in launches 0-1 and 2 (apart: one place), 2 in
    launches 1-2 (beside both), 3 in none (its own bytes, after every other)."""
    from types import SimpleNamespace
    from nbdnn.cuda.runtime.capture.plan_record import _ALIGN, _packed
    f4 = np.dtype(np.float32)
    allocs = [(("i", 0), (1000,), f4, False), (("i", 0), (300,), f4, False),
              (("i", 0), (10,), f4, False), (("i", 0), (5,), f4, False)]
    launch = [("a", 0, 0, 4000)], [("a", 0, 0, 4), ("a", 2, 0, 40)], \
        [("a", 1, 0, 1200), ("a", 2, 0, 40), ("c", int, 7)]
    rec = SimpleNamespace(allocs=allocs, workspaces=dict.fromkeys(range(4)),
                          launches=[(None, "", 1, 1, 0, args) for args in launch])
    offsets, end = _packed(rec)
    size0 = -(-4000 // _ALIGN) * _ALIGN
    assert offsets[0] == offsets[1] == 0
    assert offsets[2] == size0 and offsets[3] == size0 + _ALIGN
    assert end == size0 + 2 * _ALIGN

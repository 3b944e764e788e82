"""layer_norm / rms_norm kernel paths on the CUDA backend (in the simulator without a
GPU): the register rows (lane groups inside a warp, a warp a row, a block a row;
16-byte and scalar accesses) and the block-a-row fallback past the register cache,
forward and backward, against the CPU reference. Shapes are chosen by length, so that
every path runs whatever random shapes the crosscheck draws."""
import contextlib

import ml_dtypes
import numpy as np
import pytest

import nbdnn
from nbdnn.cuda.runtime.memory import arrays as _arrays
from nbdnn.cuda import norm as NM
from nbdnn.cuda.runtime.launch.kernel import launched
from nbdnn.cuda.softmax import rows_config

# lengths: 4-lane groups (L=12), a warp a row (300), a block a row (1030: scalar;
# 1032: 16-byte vectors); "fallback": the block-a-row kernels past the register cache,
# forced at L = 300 (the simulator runs a real 40000-element row for minutes)


def test_paths_by_length():
    assert rows_config(12, False, False)[1] == 4
    assert rows_config(300, False, False)[1] == 32
    assert rows_config(1032, True, False)[1] >= 64
    assert rows_config(32768, False, False) is not None
    assert rows_config(40000, False, False) is None
    assert rows_config(20000, True, False) is None


CASES = [(op, L, offset) for op in ("layer_norm", "rms_norm") for L in (12, 300, "fallback")
         for offset in (0, 1)]  # offset 1: every view misaligned for 16-byte access
# a block a row costs ~15 s a case in the simulator (dscale/dbias over 1030 columns):
# layer_norm only (rms norm runs the same kernels with centred = 0)
CASES += [("layer_norm", 1030, 0), ("layer_norm", 1032, 0), ("layer_norm", 1032, 1)]


@pytest.mark.parametrize("op, L, offset", CASES)
def test_forward_and_backward_match_reference(op, L, offset):
    """"fallback": the variant block_a_row forced (a row of 300 the registers would
    hold)."""
    with (NM.forced("block_a_row") if L == "fallback" else contextlib.nullcontext()), \
            launched() as names:
        _forward_and_backward(op, 300 if L == "fallback" else L, offset)
    assert any(n.startswith("norm_rows") for n in names) == (L != "fallback"), names


def _forward_and_backward(op, L, offset):
    rng = np.random.default_rng(L + offset)
    rows = 8 if L < 100 else 2
    flat = (rng.standard_normal(rows * L + offset) * 2 + 50).astype(np.float32)
    x = flat[offset:].reshape(rows, L)
    dy = rng.standard_normal((rows, L)).astype(np.float32)
    scale = rng.standard_normal(L).astype(np.float32)
    bias = rng.standard_normal(L).astype(np.float32)
    params = (scale, bias) if op == "layer_norm" else (scale,)
    # device views at the same offset (a fresh copy would be aligned again)
    dx = _arrays.to_device(flat)[offset:].reshape(rows, L)
    dev = [_arrays.to_device(a) for a in params]
    fwd, back = getattr(nbdnn, op), getattr(nbdnn, op + "_backward")
    want, got = fwd(x, *params), fwd(dx, *dev)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.copy_to_host(), w, rtol=2e-4, atol=2e-4)
    stats = want[1:]
    dstats = [_arrays.to_device(a) for a in stats]
    want = back(dy, x, *stats, scale)
    got = back(_arrays.to_device(dy), dx, *dstats, dev[0])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.copy_to_host(), w, rtol=2e-4, atol=2e-4 * np.sqrt(rows))


def test_kernel_table_has_every_row_variant():
    names = {name for name, _ in NM._KERNELS}
    assert {"rows_v1", "rows_v16", "rows_bwd_v1", "rows_bwd_v8", "fwd", "bwd"} <= names


@pytest.mark.parametrize("op, L, offset, dtype", [
    ("layer_norm", 1032, 0, np.float32),      # 16-byte path
    ("layer_norm", 1032, 1, np.float32),      # scalar path (misaligned views)
    ("rms_norm", 600, 0, np.float64),
    ("layer_norm", 1032, 0, ml_dtypes.bfloat16),  # 16-bit storage, float32 partials
    ("rms_norm", 1032, 1, np.float16)])
def test_fused_parameter_gradients_loop_over_rows(op, L, offset, dtype):
    """Block-a-row backward rows sum dscale/dbias inside the dx kernel: more rows than
    blocks (each block loops), both access paths, every dtype (16-bit rows took the
    unfused kernels before: 16% of copy), against the CPU reference; the fused
    path is the one that ran."""
    rng = np.random.default_rng(L + offset)
    from nbdnn.cuda.runtime.device import sm_count
    rows = 2 * NM.FUSED_LANES_PER_SM // 64 * sm_count() + 3   # blocks loop over rows
    flat = (rng.standard_normal(rows * L + offset) * 2 + 5).astype(dtype)
    x = flat[offset:].reshape(rows, L)
    dy = rng.standard_normal((rows, L)).astype(dtype)
    scale = rng.standard_normal(L).astype(dtype)
    fwd, back = getattr(nbdnn, op), getattr(nbdnn, op + "_backward")
    stats = fwd(x, scale)[1:]
    want = back(dy, x, *stats, scale)
    dx = _arrays.to_device(flat)[offset:].reshape(rows, L)
    with launched() as names:
        got = back(_arrays.to_device(dy), dx, *map(_arrays.to_device, stats),
                   _arrays.to_device(scale))
    tol = {np.float32: 1e-4, np.float64: 1e-11, np.float16: 2e-3}.get(dtype, 1e-2)
    for g, w in zip(got, want):  # (16-bit: both sides rounded once from float32)
        np.testing.assert_allclose(_arrays.to_host(g).astype(np.float64),
                                   w.astype(np.float64), rtol=tol, atol=tol * np.sqrt(rows))
    assert any(n.startswith("norm_rows_bwdp") for n in names), names


# group norm's dscale/dbias partials: channels first (a block a channel, 4 elements a
# thread with masked tails) and channels last (lanes on 32 channels: 40 masks 24 of the
# second block's lanes), both in several chunks of samples (shapes chosen for the
# GPU's and the simulator's block counts: asserted), plus a (N, C) tensor (HW = 1)
# where: "sim" / "gpu" (sized for that target's block counts) or "both"
GN_CASES = [((5, 2, 3, 3), 1, "NCHW", "sim"), ((24, 2, 39, 41), 2, "NCHW", "gpu"),
            ((6, 3, 3, 40), 4, "NHWC", "sim"), ((48, 5, 4, 40), 8, "NHWC", "gpu"),
            ((7, 40), 5, "NHWC", "both")]


@pytest.mark.parametrize("shape, groups, layout, where", GN_CASES)
def test_group_norm_backward_paths_match_reference(shape, groups, layout, where):
    from nbdnn.cuda import SIMULATOR
    if where != "both" and (where == "sim") != SIMULATOR:
        pytest.skip("sized for the other target's block counts")
    rng = np.random.default_rng(len(shape) + groups)
    x = rng.standard_normal(shape) + 2.0
    dy = rng.standard_normal(shape)
    C = shape[-1] if layout == "NHWC" else shape[1]
    s = rng.standard_normal(C)
    want = nbdnn.group_norm_backward(dy, x, *nbdnn.group_norm(x, groups, s, layout=layout)[1:],
                                     s, groups=groups, layout=layout)
    N, gx = shape[0], (-(-C // 32) if layout == "NHWC" else C)
    if where != "both":  # sized to split the samples into several chunks
        assert -(-N // max(1, min(N, -(-NM.GN_TARGET_BLOCKS // gx)))) < N
    x32, dy32, s32 = (a.astype(np.float32) for a in (x, dy, s))
    _, mean, inv = nbdnn.group_norm(x32, groups, s32, layout=layout, backend="cuda")
    got = nbdnn.group_norm_backward(dy32, x32, mean, inv, s32, groups=groups, layout=layout,
                                    backend="cuda")
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-4 * np.abs(w).max())


# the block-a-row kernels' walk (_row_walk): planes of 1 element, planes longer than a
# block, one channel a group, channels last with groups wider than a block
@pytest.mark.parametrize("shape, groups, layout", [
    ((3, 6, 1), 3, "NCHW"), ((2, 4, 70), 2, "NCHW"), ((2, 5, 3, 3), 5, "NCHW"),
    ((2, 3, 70), 1, "NHWC"), ((2, 2, 6), 2, "NHWC")])
def test_group_norm_walk_matches_reference(shape, groups, layout):
    rng = np.random.default_rng(sum(shape))
    x, dy = rng.standard_normal(shape) + 1.0, rng.standard_normal(shape)
    C = shape[-1] if layout == "NHWC" else shape[1]
    s, b = rng.standard_normal(C), rng.standard_normal(C)
    want = nbdnn.group_norm(x, groups, s, b, layout=layout)
    got = nbdnn.group_norm(x.astype(np.float32), groups, s.astype(np.float32),
                           b.astype(np.float32), layout=layout, backend="cuda")
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    gw = nbdnn.group_norm_backward(dy, x, *want[1:], s, groups=groups, layout=layout)
    gg = nbdnn.group_norm_backward(dy.astype(np.float32), x.astype(np.float32), *got[1:],
                                   s.astype(np.float32), groups=groups, layout=layout,
                                   backend="cuda")
    for g, w in zip(gg, gw):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-4 * np.abs(w).max())

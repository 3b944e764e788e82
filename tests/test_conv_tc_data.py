"""A stride-1 data gradient on the tensor cores with the filter read as stored
(conv's data variant filter_as_stored, wgmma_conv.forward's w_stored: B MN-major): the
generated producer's loads multiplied out in Python (no GPU), then the kernel
on an H200 against the CPU reference on the same 16-bit operands."""
import numpy as np
import pytest
from tensorcore_cases import cc as _cc
from test_conv_tensorcore import CASES, _geometry, _im2col_walk

from nbdnn.cuda import SIMULATOR

# stride-1 cases whose paddings are at most d (R - 1) (the data gradient as a forward):
# ResNet's 3x3, per-side padding in mode "convolution" (C = 40: a part box), dilation 2
DATA_CASES = [CASES[0], CASES[2], CASES[3]]


def _data_geometry(xs, ws, padding, dilation, mode):
    """The forward geometry conv's filter_as_stored builds (_as_stored_geometry): dy read with the
    backward paddings d (R - 1) - q through the flipped filter, w's channels swapped."""
    g = _geometry(xs, ws, 1, padding, dilation, mode)
    nd = len(xs) - 2
    pads = ((padding, padding),) * nd if isinstance(padding, int) else padding
    dl = (dilation,) * nd if isinstance(dilation, int) else dilation
    back = tuple((d * (r - 1) - a, d * (r - 1) - b) for (a, b), d, r in
                 zip(pads, dl, ws[1:-1]))
    flipped = "cross_correlation" if mode == "convolution" else "convolution"
    dys = (xs[0], g.PH, g.PW, ws[0])
    return dys, _geometry(dys, (ws[-1],) + ws[1:-1] + (ws[0],), 1, back, dilation, flipped)


@pytest.mark.parametrize("bn", [64, 128, 192])
@pytest.mark.parametrize("case", DATA_CASES, ids=["3x3", "per_side_flipped", "dilation2"])
def test_generated_producer_reads_the_filter_as_stored(case, bn):
    """wgmma_im2col.load_lines with B MN-major: per k-tile one im2col box of dy (64
    channels of one tap) and BN / 64 boxes (64 reduction channels, the tap, 64 output
    channels) of w (K, R, S, C) as stored; every tile's k-tiles multiplied out give
    the CPU reference's dx, the columns past C zero (TMA's out-of-bounds fill)."""
    import nbdnn
    from nbdnn.cuda.conv.wgmma_conv import geometry_values
    from nbdnn.cuda.matmul.tensor_core_gemm import wgmma_im2col as I
    xs, ws, _, padding, dilation, mode = case
    dys, g = _data_geometry(xs, ws, padding, dilation, mode)
    rng = np.random.default_rng(5)
    dy, w = rng.standard_normal(dys), rng.standard_normal(ws)
    ref = np.asarray(nbdnn.conv_backward_data(dy, w, xs, padding=padding, dilation=dilation,
                                              mode=mode, layout="NHWC", backend="cpu"))
    ref = ref.reshape(-1, xs[-1])
    taps, Kp, C = g.R * g.S, -(-ws[0] // 64) * 64, xs[-1]
    wk = w.reshape(ws[0], taps, C)
    bm, M, per = 64, ref.shape[0], 1 + bn // 64
    code = "\n".join(["def produce(m0, n0, k0, ktiles, offs):"] +
                     ["    " + line for line in I.geometry_lines("")] +
                     ["    " + line for line in I.tile_lines("", 64)] +
                     ["    for kt in range(ktiles):", "        s = 0"] +
                     ["        " + line for line in I.load_lines("", 64, False, bn)])
    for m0 in range(0, M, bm):
        for n0 in range(0, C, bn):
            got = np.zeros((min(bm, M - m0), bn))
            loads = []
            env = {"I": int, "I32": int, "U16": int, "U32": int, "full0": 0, "sa": 0,
                   "sb": 0, "map_a": 0, "map_b": 0,
                   "tma_load_im2col_4d": lambda sa, m, c, x0, y0, n, ow, oh, bar:
                   loads.append(("a", c, (n, y0, x0), (ow, oh))),
                   "tma_load_3d": lambda sb, m, c, tap, k, bar:
                   loads.append(("b", sb, c, tap, k))}
            exec(code, env)
            env["produce"](m0, n0, 0, taps * Kp // 64, geometry_values(g))
            assert len(loads) == taps * Kp // 64 * per
            for kt in range(taps * Kp // 64):
                (_, k0, start, o), *bs = loads[kt * per:kt * per + per]
                a = _im2col_walk(dy, g, bm, k0, start, o)[:got.shape[0]]
                for j, (_, sb, c0, tap, kb) in enumerate(bs):
                    assert (sb, c0, kb) == (j * 64 * 64 * 2, n0 + 64 * j, k0)
                    b = np.zeros((64, 64))
                    block = wk[kb:kb + 64, tap, c0:c0 + 64]
                    b[:block.shape[0], :block.shape[1]] = block
                    got[:, 64 * j:64 * j + 64] += a @ b
            cols = min(bn, C - n0)
            np.testing.assert_allclose(got[:, :cols], ref[m0:m0 + bm, n0:n0 + cols],
                                       rtol=1e-10, atol=1e-10)


@pytest.mark.skipif(SIMULATOR, reason="inline PTX needs a GPU")
@pytest.mark.parametrize("case", DATA_CASES + [((1, 6, 6, 192), (128, 3, 3, 192), 1, 1, 1,
                                                 "cross_correlation")],
                         ids=["3x3", "per_side_flipped", "dilation2", "36_rows"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_data_gradient_reads_the_filter_as_stored(case, dtype, monkeypatch):
    """conv's data variant filter_as_stored ("auto"'s choice): a 16-bit channels-last stride-1 data gradient
    runs one wgmma_conv "_wn" kernel (no transposed copy of w) and matches the CPU
    reference on the same rounded operands, with alpha and beta; the last case's 36
    rows take the 64-row tile (widths of 128 and more)."""
    torch = pytest.importorskip("torch")
    import nbdnn
    from nbdnn.cuda.runtime.launch.kernel import launched
    if _cc() < (9, 0):
        pytest.skip("wgmma needs sm_90")
    xs, ws, _, padding, dilation, mode = case
    dys, _ = _data_geometry(xs, ws, padding, dilation, mode)
    rng = np.random.default_rng(sum(ws))

    def t(shape):
        return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32)) \
            .to(getattr(torch, dtype)).cuda()

    dy, w, old = t(dys), t(ws), t(xs)
    kw = dict(padding=padding, dilation=dilation, mode=mode, layout="NHWC")
    with launched() as names:
        dx = nbdnn.conv_backward_data(dy, w, xs, alpha=0.5, beta=2.0, out=old.clone(), **kw)
    assert any(n.startswith("wgmma_conv") and "_wn" in n for n in names), names
    assert not any("transform" in n or "transpose" in n for n in names), names
    want = nbdnn.conv_backward_data(dy.double().cpu().numpy(), w.double().cpu().numpy(), xs,
                                    alpha=0.5, beta=2.0, out=old.double().cpu().numpy(),
                                    backend="cpu", **kw)
    red = ws[0] * int(np.prod(ws[1:-1]))
    tol = 2.0 ** -7 * 4 + 1e-3 * np.sqrt(red) / 8
    np.testing.assert_allclose(dx.double().cpu().numpy(), want, rtol=tol, atol=tol)

"""The tensor-core GEMM's switchable variants on a GPU (nbdnn/cuda/matmul/tensor_core_gemm/wgmma_gemm.py):
C through TMA stores or direct stores (TMA_STORE), tensor maps made by the blocks or
encoded on the host (OWN_MAPS), the lean tile setup (LEAN_SETUP), float32 C staged
(TMA_STORE_F32), the 64-row tile for skinny M (SKINNY_TILE): each side of each switch.
Skipped under the simulator (inline PTX); CI compiles each variant to PTX
(tests/test_ptx.py)."""
import numpy as np
import pytest
from tensorcore_cases import TC_SHAPES, cc as _cc, check_16bit_matmul as _check_16bit_matmul, \
    flags, torch_pair as _torch_pair

from nbdnn.cuda import SIMULATOR

pytestmark = pytest.mark.skipif(SIMULATOR, reason="inline PTX needs a GPU")


_STORE_CASES = [(dt, s, True) for dt in ("float16", "bfloat16") for s in TC_SHAPES] + \
    [("bfloat16", TC_SHAPES[0], False), ("bfloat16", TC_SHAPES[3], False)]


@pytest.mark.parametrize("ta,tb", [(False, False), (True, True)])
@pytest.mark.parametrize("dtype,shapes,own", _STORE_CASES,
                         ids=lambda v: f"{v[0]}x{v[1]}" if isinstance(v, tuple) else str(v))
def test_epilogue_by_tma_stores(dtype, shapes, own, ta, tb, monkeypatch):
    """TMA_STORE (staged_store.py): C through swizzled staging tiles and TMA stores,
    with the fused bias, gelu and alpha, and plain; TMA clips the ragged rows and
    columns and writes each batch's matrix. beta (old C read), an N not a multiple of 8
    and split-K keep the direct epilogue."""
    torch = pytest.importorskip("torch")
    import nbdnn
    from nbdnn.cuda.matmul.tensor_core_gemm import wgmma_gemm as W
    from nbdnn.cuda.runtime.launch.kernel import launched
    from scipy.special import erf
    if _cc() < (9, 0):
        pytest.skip("wgmma needs sm_90")
    monkeypatch.setattr(W, "TMA_STORE", True)
    monkeypatch.setattr(W, "OWN_MAPS", own)
    rng = np.random.default_rng(len(shapes[0]) * 5 + ta)
    tdt = getattr(torch, dtype)
    (ash, bsh) = shapes
    a, av = _torch_pair(rng, ash, tdt, ta)
    b, bv = _torch_pair(rng, bsh, tdt, tb)
    N, K = bsh[-1], ash[-1]
    bias, biasv = _torch_pair(rng, (1, N), tdt, False)
    with launched() as names:
        c = nbdnn.matmul(a, b, trans_a=ta, trans_b=tb, bias=bias[0], activation="gelu",
                         alpha=0.5)
        plain = nbdnn.matmul(a, b, trans_a=ta, trans_b=tb)
        nbdnn.matmul(a, b, trans_a=ta, trans_b=tb, beta=0.5, out=plain.clone())
    assert ["ts" in flags(n) for n in names] == [True, True, False], names
    r = av @ bv + biasv[0]
    ulp = 2.0 ** -8 if dtype == "bfloat16" else 2.0 ** -11
    np.testing.assert_allclose(c.double().cpu().numpy(), 0.25 * r * (1 + erf(r / np.sqrt(2))),
                               rtol=2 * ulp, atol=1e-5 * np.sqrt(K) + 2 * ulp)
    np.testing.assert_allclose(plain.double().cpu().numpy(), av @ bv, rtol=2 * ulp,
                               atol=1e-5 * np.sqrt(K))
    b6, bv6 = _torch_pair(rng, bsh[:-1] + (6,), tdt, True)  # N = 6: C rows of 12 bytes
    with launched() as names:
        c6 = nbdnn.matmul(a, b6, trans_a=ta, trans_b=True)
    assert len(names) == 1 and names[0].startswith("wgmma_gemm") and \
        "ts" not in flags(names[0]), names
    np.testing.assert_allclose(c6.double().cpu().numpy(), av @ bv6, rtol=2 * ulp,
                               atol=1e-5 * np.sqrt(K))


@pytest.mark.parametrize("own", [True, False], ids=["own", "host"])
@pytest.mark.parametrize("ta,tb", [(False, False), (True, True)])
@pytest.mark.parametrize("shapes", TC_SHAPES[:2] + TC_SHAPES[3:5], ids=lambda s: f"{s[0]}x{s[1]}")
def test_tensor_maps_own_or_host(shapes, ta, tb, own, monkeypatch):
    """OWN_MAPS (wgmma_gemm.py) on, the default: each block writes its tensor maps from
    address-free templates (tensormap.replace, cp_fenceproxy); off: the host encodes
    them per address. The same results either way, split-K included; and the call plans
    only with the blocks' own maps: five calls on new tensors, the last two replayed
    (or, host maps, all run eagerly), each right."""
    import torch
    import nbdnn
    from nbdnn.cuda.matmul.tensor_core_gemm import wgmma_gemm as W
    from nbdnn.ops import _plan
    if _cc() < (9, 0):
        pytest.skip("wgmma needs sm_90")
    monkeypatch.setattr(W, "OWN_MAPS", own)
    _plan.clear()  # (a signature's state does not hold OWN_MAPS)
    _check_16bit_matmul("bfloat16", shapes, ta, tb, "wgmma_gemm", len(shapes[0]) * 3 + ta)
    rng = np.random.default_rng(11)
    for call in range(5):  # (64, 2048) x (2048, 264): split-K
        a, av = _torch_pair(rng, (64, 2048), torch.bfloat16, False)
        b, bv = _torch_pair(rng, (2048, 264), torch.bfloat16, True)
        c = nbdnn.matmul(a, b, trans_b=True)
        np.testing.assert_allclose(c.double().cpu().numpy(), av @ bv, rtol=2 ** -7,
                                   atol=1e-5 * np.sqrt(2048))
    planned = any(type(p) is _plan.Plan for p in _plan.plans_of_this_thread().values())
    _plan.clear()
    assert planned == own, "the call did not plan" if own else "host maps planned"


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "full"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("shapes", TC_SHAPES[:1] + TC_SHAPES[3:4] + TC_SHAPES[5:],
                         ids=lambda s: f"{s[0]}x{s[1]}")
def test_lean_tile_setup(shapes, dtype, lean, monkeypatch):
    """LEAN_SETUP (wgmma_gemm.py, tile_order.py), on by default: the tile schedule in 32
    bits and no batch-table read for one matrix; the same results for one matrix, a
    batch and a broadcast batch (the table read), and split-K's chunks (zk past the
    matrices); and with it off (the 64-bit setup, the table always read)."""
    torch = pytest.importorskip("torch")
    import nbdnn
    from nbdnn.cuda.matmul.tensor_core_gemm import wgmma_gemm as W
    from nbdnn.cuda.runtime.launch.kernel import launched
    if _cc() < (9, 0):
        pytest.skip("wgmma needs sm_90")
    monkeypatch.setattr(W, "LEAN_SETUP", lean)
    _check_16bit_matmul(dtype, shapes, False, False, "wgmma_gemm", len(shapes[0]) * 7)
    rng = np.random.default_rng(13)
    a, av = _torch_pair(rng, (2, 64, 2048), getattr(torch, dtype), False)  # 2 matrices x 2
    b, bv = _torch_pair(rng, (2, 2048, 264), getattr(torch, dtype), True)  # tiles x 2 chunks
    with launched() as names:
        c = nbdnn.matmul(a, b, trans_b=True)
    assert ("ls" in flags(names[0])) == lean and names[-1] == "_splitk_sum", names
    np.testing.assert_allclose(c.double().cpu().numpy(), av @ bv, rtol=2 ** -7,
                               atol=1e-5 * np.sqrt(2048))


@pytest.mark.parametrize("shapes", [((296, 200), (200, 520)), ((40, 37), (37, 524)),
                                    ((3, 136, 72), (3, 72, 264)), ((2, 1, 24, 16), (3, 16, 36)),
                                    ((64, 3000), (3000, 264)), ((40, 64), (64, 523))],
                         ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("f32", [True, False], ids=["f32store", "direct"])
def test_float32_c_by_tma_stores(shapes, f32, monkeypatch):
    """TMA_STORE_F32 (staged_store.py), on by default: tf32's float32 C, with bias, gelu
    and alpha, through 64 x 32 float32 staging tiles and TMA stores, and split-K's chunk
    sums the same way (64 x 3000: two chunks); an N not a multiple of 4 keeps the
    direct epilogue. Then 16-bit split-K over two matrices (zk past the matrices) with
    its chunks staged. Off (direct): every float32 C by direct stores."""
    torch = pytest.importorskip("torch")
    import nbdnn
    from nbdnn.cpu.matmul import tf32
    from nbdnn.cuda.matmul.tensor_core_gemm import wgmma_gemm as W
    from nbdnn.cuda.runtime.launch.kernel import launched
    from scipy.special import erf
    if _cc() < (9, 0):
        pytest.skip("wgmma needs sm_90")
    monkeypatch.setattr(W, "TMA_STORE_F32", f32)
    rng = np.random.default_rng(len(shapes[0]) * 7 + shapes[1][-1])
    (ash, bsh) = shapes
    a, av = _torch_pair(rng, ash, torch.float32, False)
    b, bv = _torch_pair(rng, bsh, torch.float32, True)
    N, K = bsh[-1], ash[-1]
    bias, biasv = _torch_pair(rng, (1, N), torch.float32, False)
    with launched() as names:
        c = nbdnn.matmul(a, b, trans_b=True, bias=bias[0], activation="gelu", alpha=0.5,
                         math="tf32")
    gemms = [n for n in names if n.startswith("wgmma_gemm_tf32")]
    assert len(gemms) == 1 and ("ts" in flags(gemms[0])) == (f32 and N % 4 == 0), names
    assert ("_partial" in gemms[0]) == (K == 3000), names
    r = tf32(av).astype(np.float64) @ tf32(bv).astype(np.float64) + biasv[0]
    want = 0.5 * (0.5 * r * (1 + erf(r / np.sqrt(2))))
    np.testing.assert_allclose(c.double().cpu().numpy(), want, rtol=1e-5, atol=3e-7 * K)
    if len(ash) > 2 or K != 3000:
        return
    for dtype in (torch.bfloat16, torch.float16):
        a, av = _torch_pair(rng, (2, 64, 2048), dtype, False)  # 2 matrices x 2 tiles x
        b, bv = _torch_pair(rng, (2, 2048, 264), dtype, True)  # 2 chunks
        with launched() as names:
            c = nbdnn.matmul(a, b, trans_b=True)
        assert "partial" in flags(names[0]) and names[-1] == "_splitk_sum", names
        assert ("ts" in flags(names[0])) == f32, names
        np.testing.assert_allclose(c.double().cpu().numpy(), av @ bv, rtol=2 ** -7,
                                   atol=1e-5 * np.sqrt(2048))


@pytest.mark.parametrize("ta,tb,skinny", [(False, False, True), (False, True, True),
                                          (True, False, True), (True, True, True),
                                          (False, False, False), (True, True, False)])
@pytest.mark.parametrize("shapes", [((64, 200), (200, 520)), ((40, 64), (64, 24)),
                                    ((3, 40, 64), (3, 64, 264))],
                         ids=lambda s: f"{s[0]}x{s[1]}")
def test_skinny_tile(shapes, ta, tb, skinny, monkeypatch):
    """SKINNY_TILE (wgmma_gemm.py, wgmma_stage.py), on by default: for M <= 64 a 64 x 256
    tile whose consumers split the columns (m64n128 each), 5 stages (4 beside TMA
    stores): the epilogue both ways, the four operand majors, a batch; then split-K over
    it. Off: the 128-row tile, half its rows past M."""
    torch = pytest.importorskip("torch")
    import nbdnn
    from nbdnn.cuda.matmul.tensor_core_gemm import wgmma_gemm as W
    from nbdnn.cuda.runtime.launch.kernel import launched
    if _cc() < (9, 0):
        pytest.skip("wgmma needs sm_90")
    monkeypatch.setattr(W, "SKINNY_TILE", W.SKINNY if skinny else None)
    with launched() as names:
        _check_16bit_matmul("bfloat16", shapes, ta, tb, "wgmma_gemm", len(shapes[0]) + 2 * ta + tb)
    assert len(names) == 2 and all(("_m64n256" in n) == skinny for n in names), names
    rng = np.random.default_rng(17)
    a, av = _torch_pair(rng, (64, 2048), torch.float16, ta)
    b, bv = _torch_pair(rng, (2048, 264), torch.float16, tb)
    with launched() as names:
        c = nbdnn.matmul(a, b, trans_a=ta, trans_b=tb)
    assert "_partial" in names[0] and ("_m64n256s" in names[0]) == skinny, names
    np.testing.assert_allclose(c.double().cpu().numpy(), av @ bv, rtol=2 ** -10,
                               atol=1e-5 * np.sqrt(2048))


def test_skinny_tile_in_tf32(monkeypatch):
    """SKINNY_TILE with float32 math="tf32" (m64n128k8, 32-element k-tiles), plain and
    split-K, against float64 products of the TF32-rounded operands."""
    torch = pytest.importorskip("torch")
    import nbdnn
    from nbdnn.cpu.matmul import tf32
    from nbdnn.cuda.matmul.tensor_core_gemm import wgmma_gemm as W
    from nbdnn.cuda.runtime.launch.kernel import launched
    if _cc() < (9, 0):
        pytest.skip("wgmma needs sm_90")
    monkeypatch.setattr(W, "SKINNY_TILE", W.SKINNY)
    rng = np.random.default_rng(19)
    for M, K, N in ((40, 64, 264), (64, 3000, 264)):
        a, av = _torch_pair(rng, (M, K), torch.float32, False)
        b, bv = _torch_pair(rng, (K, N), torch.float32, True)
        with launched() as names:
            c = nbdnn.matmul(a, b, trans_b=True, math="tf32")
        assert "_m64n256" in names[0], names
        want = tf32(av).astype(np.float64) @ tf32(bv).astype(np.float64)
        np.testing.assert_allclose(c.double().cpu().numpy(), want, rtol=1e-5, atol=3e-7 * K)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("ta,tb", [(False, False), (True, True)])
@pytest.mark.parametrize("shapes", [((1000, 200), (200, 3000)), ((2, 504, 72), (2, 72, 1000))],
                         ids=lambda s: f"{s[0]}x{s[1]}")
def test_tile_width_192(shapes, ta, tb, dtype, monkeypatch):
    """split_k.WIDTHS with 192: a grid that one wave of 192-wide tiles fits better than
    256-wide ones takes them (wgmma m64n192, 3 TMA boxes or stores where 256 takes 4):
    the epilogue both ways (beta: direct stores, 5 stages; TMA stores, 4), a batch."""
    pytest.importorskip("torch")
    from nbdnn.cuda.matmul.tensor_core_gemm import split_k
    from nbdnn.cuda.runtime.device import sm_count
    from nbdnn.cuda.runtime.launch.kernel import launched
    if _cc() < (9, 0):
        pytest.skip("wgmma needs sm_90")
    monkeypatch.setattr(split_k, "WIDTHS", (256, 192))
    monkeypatch.setattr(split_k, "NARROW", False)  # (with it, 2 x 504 x 1000 takes 64 wide:
    (ash, bsh) = shapes                              # test_narrow_tiles' kind)
    row_tiles = -(-ash[-2] // 128) * (ash[0] if len(ash) > 2 else 1)
    want = split_k.tile_width(-(-ash[-2] // 128), bsh[-1], ash[0] if len(ash) > 2 else 1)
    with launched() as names:
        _check_16bit_matmul(dtype, shapes, ta, tb, "wgmma_gemm", row_tiles + 2 * ta)
    assert all(("n192" in n) == (want == 192) for n in names), (names, sm_count())
    assert want == 192 or sm_count() != 132, "on an H200 both shapes take 192"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("ta,tb", [(False, True), (True, False)])
@pytest.mark.parametrize("shapes", [((20000, 96), (96, 64)), ((6000, 200), (200, 120))],
                         ids=lambda s: f"{s[0]}x{s[1]}")
def test_narrow_tiles(shapes, ta, tb, dtype, monkeypatch):
    """split_k.NARROW: 64- and 128-wide tiles for N = 64 and 120 (a 1x1 convolution's
    filters; wgmma m64n64 / m64n128, one TMA box or store a side): the epilogue both
    ways (beta: direct stores; TMA stores), both operand majors."""
    pytest.importorskip("torch")
    from nbdnn.cuda.matmul.tensor_core_gemm import split_k
    from nbdnn.cuda.runtime.launch.kernel import launched
    if _cc() < (9, 0):
        pytest.skip("wgmma needs sm_90")
    monkeypatch.setattr(split_k, "NARROW", True)
    (ash, bsh) = shapes
    with launched() as names:
        _check_16bit_matmul(dtype, shapes, ta, tb, "wgmma_gemm", 5 + 2 * ta)
    width = split_k.tile_width(-(-ash[-2] // 128), bsh[-1], 1)  # (N = 120 at 47 row
    want = f"n{width}"  # tiles: 64 wide, one wave of 94 tiles; 128 on fewer SMs)
    assert width in (64, 128) and all(want in flags(n) or want in n for n in names), names


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_narrow_tiles_split_k(dtype, monkeypatch):
    """split_k.NARROW's 64-wide tile under split-K (a 1x1 filter gradient's dW, 256 x
    64 = dy^T x over 8192 positions: two tiles, their reductions in chunks) and in
    tf32 (K-major operands), against float64."""
    torch = pytest.importorskip("torch")
    import nbdnn
    from nbdnn.cuda.matmul.tensor_core_gemm import split_k
    from nbdnn.cuda.runtime.launch.kernel import launched
    if _cc() < (9, 0):
        pytest.skip("wgmma needs sm_90")
    monkeypatch.setattr(split_k, "NARROW", True)
    g = torch.Generator().manual_seed(5)
    a, b = torch.rand(8192, 256, generator=g) - 0.5, torch.rand(8192, 64, generator=g) - 0.5
    want = a.double().T @ b.double()
    dt = getattr(torch, dtype)
    if dtype == "float32":  # tf32's operands K-major: a^T (256, 8192), b^T (64, 8192)
        da, db, kw = a.T.contiguous().cuda(), b.T.contiguous().cuda(), dict(trans_b=True)
        kw["math"] = "tf32"
    else:
        da, db, kw = a.to(dt).cuda(), b.to(dt).cuda(), dict(trans_a=True)
    with launched() as names:
        c = nbdnn.matmul(da, db, **kw)
    err = float((c.double().cpu() - want).abs().max() / want.abs().max())
    assert err < (2e-3 if dtype == "float32" else 1e-2), err
    assert any("n64" in flags(n) or "n64" in n for n in names) and \
        any("partial" in n for n in names), names

"""The tensor-core intrinsics (nbdnn/cuda/tensorcore) on a GPU: each one-tile kernel of
tiles.py against NumPy. mma.sync needs sm_80, wgmma and TMA sm_90 (the H200). Under the
simulator (no inline PTX) these are skipped; CI compiles the kernels to PTX instead
(tests/test_ptx.py: sm_80/sm_90 for mma.sync, sm_90a for wgmma and TMA)."""
import numpy as np
import pytest
from tensorcore_cases import TC_SHAPES, cc as _cc, check_16bit_matmul as _check_16bit_matmul, \
    torch_pair as _torch_pair

from nbdnn.cpu.matmul import tf32
from nbdnn.cuda import SIMULATOR

pytestmark = pytest.mark.skipif(SIMULATOR, reason="inline PTX needs a GPU")


def _bits(x, kind):
    """float32 values -> (the uint16/float32 array the kernel reads, the float64 values
    it sees): float16 and bfloat16 (round to nearest even) bits; tf32 as float32 values
    already TF32-exact, so that the products are exact whatever the unit's rounding."""
    x = np.asarray(x, np.float32)
    if kind == "f16":
        h = x.astype(np.float16)
        return h.view(np.uint16), h.astype(np.float64)
    if kind == "bf16":
        u = x.view(np.uint32).astype(np.uint64)
        b = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        return b, (b.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    x = tf32(x)
    return x, x.astype(np.float64)


def _core_order(m, cols):
    """rows x k (K contiguous) -> core matrices of 8 rows x `cols` elements (16 bytes),
    [row/8][k/cols][8][cols]: wgmma's no-swizzle K-major layout."""
    r, k = m.shape
    return np.ascontiguousarray(m.reshape(r // 8, 8, k // cols, cols).transpose(0, 2, 1, 3)
                                ).ravel()


def _run(name, grid, block, *args):
    from nbdnn.cuda.tensorcore import tiles
    tiles.kernels()[name].dispatcher[grid, block](*args)


@pytest.mark.parametrize("kind", ["f16", "bf16", "tf32"])
def test_mma_sync_tile(kind):
    from numba import cuda
    rng = np.random.default_rng(1)
    K = 8 if kind == "tf32" else 16
    a, av = _bits(rng.standard_normal((16, K)), kind)
    bt, bv = _bits(rng.standard_normal((8, K)), kind)
    d = cuda.device_array(128, np.float32)
    _run(f"mma_tile_{kind}", 1, 32, cuda.to_device(a.ravel()), cuda.to_device(bt.ravel()), d)
    np.testing.assert_allclose(d.copy_to_host().reshape(16, 8), av @ bv.T, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("N", [8, 64, 256])
@pytest.mark.parametrize("kind", ["f16", "bf16", "tf32"])
def test_wgmma_tile(kind, N):
    from numba import cuda
    if _cc() < (9, 0):
        pytest.skip("wgmma needs sm_90")
    rng = np.random.default_rng(N)
    K, cols = (8, 4) if kind == "tf32" else (16, 8)
    a, av = _bits(rng.standard_normal((64, K)), kind)
    bt, bv = _bits(rng.standard_normal((N, K)), kind)
    d = cuda.device_array(64 * N, np.float32)
    _run(f"wgmma_tile_{kind}_n{N}", 1, 128, cuda.to_device(_core_order(a, cols)),
         cuda.to_device(_core_order(bt, cols)), d)
    np.testing.assert_allclose(d.copy_to_host().reshape(64, N), av @ bv.T, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("N", [64, 256])
@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_tma_swizzled_wgmma_k_steps(kind, N):
    """TMA's 128-byte swizzle and wgmma's swizzled descriptors agree, and a k-step is a
    32-byte advance of the descriptor: D = A(64x64) @ B (B^T: N x 64)."""
    from numba import cuda
    from nbdnn.cuda.tensorcore.tensormap import tensor_map
    if _cc() < (9, 0):
        pytest.skip("TMA needs sm_90")
    rng = np.random.default_rng(2 * N)
    a, av = _bits(rng.standard_normal((64, 64)), kind)
    bt, bv = _bits(rng.standard_normal((N, 64)), kind)
    da, db = cuda.to_device(a), cuda.to_device(bt)
    dtype = "bfloat16" if kind == "bf16" else "float16"
    ma = tensor_map(da.__cuda_array_interface__["data"][0], (64, 64), dtype, (64, 64), "128B")
    mb = tensor_map(db.__cuda_array_interface__["data"][0], (N, 64), dtype, (N, 64), "128B")
    d = cuda.device_array(64 * N, np.float32)
    _run(f"tma_wgmma_tile_{kind}_n{N}", 1, 128, np.uint64(ma), np.uint64(mb), d)
    np.testing.assert_allclose(d.copy_to_host().reshape(64, N), av @ bv.T, atol=1e-4,
                               rtol=1e-4)


def test_tma_load_and_store_a_box():
    """A 64x16 box at column 16, row 64 of a 128x64 float16 tensor, loaded and stored
    by TMA: exactly that box arrives, nothing else is written."""
    from numba import cuda
    from nbdnn.cuda.tensorcore.tensormap import tensor_map
    if _cc() < (9, 0):
        pytest.skip("TMA needs sm_90")
    g = np.random.default_rng(3).standard_normal((128, 64)).astype(np.float16)
    src, dst = cuda.to_device(g.view(np.uint16)), cuda.to_device(np.zeros((128, 64), np.uint16))
    maps = [tensor_map(a.__cuda_array_interface__["data"][0], (128, 64), "float16", (64, 16))
            for a in (src, dst)]
    _run("tma_copy", 1, 128, np.uint64(maps[0]), np.uint64(maps[1]), np.int32(16), np.int32(64))
    want = np.zeros_like(g)
    want[64:128, 16:32] = g[64:128, 16:32]
    assert np.array_equal(dst.copy_to_host().view(np.float16), want)


def test_clusters_fixed_at_compile_time_share_shared_memory():
    """cluster_swap (tiles.py): cluster_dims(2, 1, 1) in the kernel's body fixes its
    cluster shape (.reqnctapercluster), so nbdnn's plain cuLaunchKernel launches 4
    blocks as 2 clusters, and each block reads its partner's shared memory through
    mapa / ld.shared::cluster after a cluster barrier."""
    from numba import cuda
    from nbdnn.cuda.tensorcore import tiles
    if _cc() < (9, 0):
        pytest.skip("clusters need sm_90")
    k = tiles.kernels()["cluster_swap"]
    x = cuda.to_device(np.arange(128, dtype=np.float32))
    y = cuda.to_device(np.zeros(128, np.float32))
    k.launch(k.sigs[0], 4, 32, 0, x, y)
    cuda.synchronize()
    want = np.arange(128, dtype=np.float32).reshape(4, 32)[[1, 0, 3, 2]].ravel()
    assert np.array_equal(y.copy_to_host(), want)
    assert ".reqnctapercluster 2, 1, 1" in cuda.compile_ptx(k.pyfunc, k.sigs[0], cc=(9, 0))[0]


@pytest.mark.parametrize("name,instruction", [("mma_tile_f16", "HMMA.16816.F32"),
                                              ("mma_tile_tf32", "HMMA.1688.F32.TF32"),
                                              ("wgmma_tile_bf16_n64", "HGMMA.64x64x16.F32.BF16"),
                                              ("tma_wgmma_tile_f16_n256", "HGMMA.64x256x16.F32"),
                                              ("tma_copy", "UTMASTG")])
def test_sass_has_the_tensor_core_instruction(name, instruction):
    """The machine code holds the instruction the PTX asked for (nvdisasm on the GPU
    machine) and no local memory."""
    from nbdnn.cuda.tensorcore import tiles
    if _cc() < (9, 0):
        pytest.skip("sm_90 kernels")
    k = tiles.kernels()[name]
    sig = k.sigs[0]
    try:
        sass = k.dispatcher.compile(sig).inspect_sass()
    except Exception as e:  # (no nvdisasm)
        pytest.skip(f"no SASS: {e}")
    assert instruction in sass, f"{name}: no {instruction}"
    assert k.resources(sig)["local_bytes"] == 0


# (a shape, b shape): tails in M, N and K (TMA's zero fill), one exact tile, a tiny
# product, equal batches, a batch of a against one b (stacked into one GEMM), batch
# axes broadcast both ways (the matrix table)
@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("shapes", TC_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_matmul_on_tensor_cores(dtype, shapes, ta, tb):
    """The wgmma kernel (variant T2, nbdnn/cuda/matmul/tensor_core_gemm/wgmma_gemm.py) for every operand
    major, tails, batches and broadcasts (_check_16bit_matmul)."""
    if _cc() < (9, 0):
        pytest.skip("wgmma needs sm_90")
    _check_16bit_matmul(dtype, shapes, ta, tb, "wgmma_gemm", len(shapes[0]) * 7 + ta + 2 * tb)


# the blocks' own maps (the default) everywhere; host-encoded maps on two shapes in bf16
# (each combination JITs its own kernels: ~10 s each on the GPU machine)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tensor_core_matmul_is_deterministic_and_backward_runs_there(dtype):
    """Reruns are bit-identical (no atomics); matmul_backward's two products run on the
    tensor cores too (a batch of a against one b: db is one stacked GEMM)."""
    torch = pytest.importorskip("torch")
    import nbdnn
    from nbdnn.cuda.runtime.launch.kernel import launched
    if _cc() < (9, 0):
        pytest.skip("wgmma needs sm_90")
    tdt = getattr(torch, dtype)
    rng = np.random.default_rng(5)
    a, av = _torch_pair(rng, (4, 264, 520), tdt, False)
    b, bv = _torch_pair(rng, (520, 392), tdt, False)
    c1, c2 = nbdnn.matmul(a, b), nbdnn.matmul(a, b)
    assert torch.equal(c1.view(torch.int16), c2.view(torch.int16))
    dc, dcv = _torch_pair(rng, (4, 264, 392), tdt, False)
    with launched() as names:
        da, db = nbdnn.matmul_backward(dc, a, b)
    # (db: 520 x 392 is 6 tiles, so its K of 4 x 264 runs split: chunks + ordered sum)
    assert all(n.startswith("wgmma_gemm") or n == "_splitk_sum" for n in names), names
    assert len([n for n in names if n.startswith("wgmma_gemm")]) == 2, names
    ulp = 2.0 ** -8 if dtype == "bfloat16" else 2.0 ** -11
    np.testing.assert_allclose(da.double().cpu().numpy(), dcv @ bv.T, rtol=2 * ulp,
                               atol=1e-5 * np.sqrt(520))
    np.testing.assert_allclose(db.double().cpu().numpy(),
                               np.einsum("zmk,zmn->kn", av, dcv), rtol=2 * ulp,
                               atol=1e-5 * np.sqrt(4 * 264))


# (a shape, b shape) whose rows TMA cannot stride over (not 16-byte multiples): K odd
# (a's rows; a transposed b's), N odd (C an element a store; a plain b's rows), M odd
# (a transposed a's rows), a batch of a against one b with K odd (stacked rows of the
# padded pitch), and all three odd past a tile in each
ODD_SHAPES = [((40, 13), (13, 24)), ((40, 16), (16, 23)), ((37, 24), (24, 40)),
              ((3, 40, 21), (21, 32)), ((297, 203), (203, 517))]


@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("shapes", ODD_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_rows_tma_cannot_stride_run_on_tensor_cores(shapes, ta, tb):
    """Operands whose rows are not 16-byte multiples run on the tensor cores over padded
    copies (matmul's variant wgmma_padded: one padded_copy an operand that needs it), C of
    odd width through the odd epilogue (an element a store; beta's old C read likewise):
    each operand major, the full epilogue and none."""
    if _cc() < (9, 0):
        pytest.skip("wgmma needs sm_90")
    M, K, N = shapes[0][-2], shapes[0][-1], shapes[1][-1]
    copies = int((M if ta else K) % 8 != 0) + int((K if tb else N) % 8 != 0)
    _check_16bit_matmul("bfloat16", shapes, ta, tb, "wgmma_gemm", 11 + ta + 2 * tb,
                        copies=copies)


def test_rows_tma_cannot_stride_in_float16_and_from_an_unaligned_base():
    """float16 with K and N odd; a 2-byte-offset view (rows of 16 elements, its base 2
    bytes past 16-aligned) copied too, though its rows are whole."""
    torch = pytest.importorskip("torch")
    import nbdnn
    from nbdnn.cuda.runtime.launch.kernel import launched
    if _cc() < (9, 0):
        pytest.skip("wgmma needs sm_90")
    _check_16bit_matmul("float16", ((72, 45), (45, 33)), False, False, "wgmma_gemm", 3,
                        copies=2)
    rng = np.random.default_rng(9)
    big, bigv = _torch_pair(rng, (1, 40 * 16 + 1), torch.bfloat16, False)
    a, av = big[0, 1:].view(40, 16), bigv[0, 1:].reshape(40, 16)
    b, bv = _torch_pair(rng, (16, 24), torch.bfloat16, False)
    with launched() as names:
        c = nbdnn.matmul(a, b)
    assert names[0] == "padded_copy" and names[1].startswith("wgmma_gemm"), names
    np.testing.assert_allclose(c.double().cpu().numpy(), av @ bv, rtol=2 ** -7, atol=1e-4)


def test_a_gradient_both_products_pad_is_copied_once():
    """matmul_backward with dc's rows odd (an LM head's logits): dA = dc B^T and
    dB = A^T dc both read dc through the same padded copy (one padded_copy of dc, one of
    B, whose rows are odd too), and both gradients match NumPy."""
    torch = pytest.importorskip("torch")
    import nbdnn
    from nbdnn.cuda.runtime.launch.kernel import launched
    if _cc() < (9, 0):
        pytest.skip("wgmma needs sm_90")
    rng = np.random.default_rng(12)
    a, av = _torch_pair(rng, (64, 24), torch.bfloat16, False)
    b, bv = _torch_pair(rng, (24, 37), torch.bfloat16, False)
    dc, dcv = _torch_pair(rng, (64, 37), torch.bfloat16, False)
    with launched() as names:
        da, db = nbdnn.matmul_backward(dc, a, b)
    assert names.count("padded_copy") == 2, names
    assert sum(n.startswith("wgmma_gemm") for n in names) == 2, names
    np.testing.assert_allclose(da.double().cpu().numpy(), dcv @ bv.T, rtol=2 ** -7, atol=1e-3)
    np.testing.assert_allclose(db.double().cpu().numpy(), av.T @ dcv, rtol=2 ** -7, atol=1e-3)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_forced_simt_runs_operands_tma_cannot_take(dtype):
    """The SIMT kernel, forced, still runs odd K, odd N and an unaligned base correctly
    (the path every other GPU takes)."""
    torch = pytest.importorskip("torch")
    import nbdnn
    from nbdnn.cuda import matmul as mm
    from nbdnn.cuda.runtime.launch.kernel import launched
    tdt = getattr(torch, dtype)
    rng = np.random.default_rng(9)
    cases = [((40, 13), (13, 24)), ((40, 16), (16, 23))]
    for ash, bsh in cases:
        a, av = _torch_pair(rng, ash, tdt, False)
        b, bv = _torch_pair(rng, bsh, tdt, False)
        with launched() as names, mm.forced("simt"):
            c = nbdnn.matmul(a, b)
        assert not any(n.startswith(("wgmma_gemm", "padded")) for n in names), names
        np.testing.assert_allclose(c.double().cpu().numpy(), av @ bv, rtol=2 ** -7, atol=1e-4)


@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_skinny_matmul_splits_k_deterministically(dtype, tb):
    """Too few tiles to fill the GPU (M = 64, N = 264: 2 tiles): the reduction runs in
    chunks on the tensor cores, their float32 sums added in chunk order with the
    epilogue (wgmma_gemm.split, splitk_sum); bit-identical reruns."""
    torch = pytest.importorskip("torch")
    import nbdnn
    from nbdnn.cuda.matmul.tensor_core_gemm import wgmma_gemm as W
    from nbdnn.cuda.runtime.launch.kernel import launched
    if _cc() < (9, 0):
        pytest.skip("wgmma needs sm_90")
    tdt = getattr(torch, dtype)
    rng = np.random.default_rng(11)
    M, N, K = 64, 264, 3000
    assert W.split(2, K, W.BK)[0] > 1
    a, av = _torch_pair(rng, (M, K), tdt, False)
    b, bv = _torch_pair(rng, (K, N), tdt, tb)
    bias, biasv = _torch_pair(rng, (1, N), tdt, False)
    old, oldv = _torch_pair(rng, (M, N), tdt, False)
    with launched() as names:
        c = nbdnn.matmul(a, b, trans_b=tb, bias=bias[0], activation="relu", alpha=0.5,
                         beta=0.25, out=old)
    assert names[-1] == "_splitk_sum" and "_partial" in names[0], names
    want = 0.5 * np.maximum(av @ bv + biasv[0], 0) + 0.25 * oldv
    ulp = 2.0 ** -8 if dtype == "bfloat16" else 2.0 ** -11
    np.testing.assert_allclose(c.double().cpu().numpy(), want, rtol=2 * ulp,
                               atol=1e-5 * np.sqrt(K) + 2 * ulp)
    c1, c2 = nbdnn.matmul(a, b, trans_b=tb), nbdnn.matmul(a, b, trans_b=tb)
    assert torch.equal(c1.view(torch.int16), c2.view(torch.int16))


# (a shape, b shape) for float32's TF32 modes: tails, an odd N (float32 C takes any
# N), a K that is no multiple of 4 (the parts' zero padding), batches both ways, a
# skinny product (split-K: float32 chunk sums, then the ordered sum with the epilogue)
TF32_SHAPES = [((296, 200), (200, 520)), ((40, 37), (37, 523)), ((3, 136, 72), (3, 72, 264)),
               ((2, 1, 24, 16), (3, 16, 33)), ((3, 40, 64), (64, 24)), ((64, 3000), (3000, 264))]


@pytest.mark.parametrize("mode", ["tf32", "3xtf32"])
@pytest.mark.parametrize("ta,tb", [(False, False), (True, True), (False, True)])
@pytest.mark.parametrize("shapes", TF32_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_tf32_modes_on_tensor_cores(shapes, ta, tb, mode):
    """float32 with math="tf32" / "3xtf32" runs tf32_parts (K-major rounded parts) for
    the operands that need it and then the wgmma kernel in tf32 with the float32
    epilogue (bias, gelu, alpha/beta), against float64 products of the same parts: the
    GPU and the reference differ only by float32 accumulation. "tf32" hands an operand
    that is already K-major (K a multiple of 4) straight to TMA, which rounds it as
    the reference does (ties to even)."""
    torch = pytest.importorskip("torch")
    import nbdnn
    from nbdnn.cuda.runtime.launch.kernel import launched
    if _cc() < (9, 0):
        pytest.skip("wgmma needs sm_90")
    rng = np.random.default_rng(len(shapes[0]) * 3 + ta + (mode == "tf32"))
    ash, bsh = shapes
    a, av = _torch_pair(rng, ash, torch.float32, ta)
    b, bv = _torch_pair(rng, bsh, torch.float32, tb)
    N, K = bsh[-1], ash[-1]
    bias, biasv = _torch_pair(rng, (1, N), torch.float32, False)
    old, oldv = _torch_pair(rng, np.broadcast_shapes(ash[:-2], bsh[:-2]) + (ash[-2], N),
                            torch.float32, False)
    with launched() as names:
        c = nbdnn.matmul(a, b, trans_a=ta, trans_b=tb, bias=bias[0], activation="gelu",
                         alpha=0.5, beta=0.25, out=old, math=mode)
    passes = int(ta) + int(not tb) if mode == "tf32" and K % 4 == 0 else 2
    assert len(names) > passes and all(n.startswith("tf32_parts_") for n in names[:passes]), \
        names
    assert names[passes].startswith("wgmma_gemm_tf32_kk"), names
    hi_a, hi_b = tf32(av).astype(np.float64), tf32(bv).astype(np.float64)
    r = hi_a @ hi_b
    if mode == "3xtf32":
        lo_a = tf32((av - hi_a).astype(np.float32)).astype(np.float64)
        lo_b = tf32((bv - hi_b).astype(np.float32)).astype(np.float64)
        r = r + hi_a @ lo_b + lo_a @ hi_b
        assert np.abs(r - av @ bv).max() < 1e-5 * K  # (float32-level, unlike tf32 alone)
    from scipy.special import erf
    r = r + biasv[0]
    want = 0.5 * (0.5 * r * (1 + erf(r / np.sqrt(2)))) + 0.25 * oldv
    # (float32 sums: ~K 2^-24 |r| apart; tf32 against ieee would differ by ~sqrt(K) 2^-11)
    np.testing.assert_allclose(c.double().cpu().numpy(), want, rtol=1e-5, atol=3e-7 * K)


@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("shapes", TC_SHAPES[:2] + TC_SHAPES[3:5], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_matmul_on_mma_sync(dtype, shapes, ta, tb):
    """The sm_80-89 tensor-core GEMM (mma_gemm.py: mma.sync + ldmatrix + cp.async), run
    on any GPU from sm_80 by forcing matmul's variant mma_sync: every operand major,
    tails, batches, the full epilogue (_check_16bit_matmul)."""
    from nbdnn.cuda import matmul as mm
    if _cc() < (8, 0):
        pytest.skip("mma.sync needs sm_80")
    with mm.forced("mma_sync"):
        _check_16bit_matmul(dtype, shapes, ta, tb, "mma_gemm",
                            len(shapes[0]) * 5 + ta + 2 * tb)

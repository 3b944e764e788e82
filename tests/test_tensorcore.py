"""The tensor-core intrinsics (nbdnn/cuda/tensorcore) on a GPU: each one-tile kernel of
tiles.py against NumPy. mma.sync needs sm_80, wgmma and TMA sm_90 (the H200). Under the
simulator (no inline PTX) these are skipped; CI compiles the kernels to PTX instead
(tests/test_ptx.py: sm_80/sm_90 for mma.sync, sm_90a for wgmma and TMA)."""
import numpy as np
import pytest

from nbdnn.cpu.matmul import tf32
from nbdnn.cuda import SIMULATOR

pytestmark = pytest.mark.skipif(SIMULATOR, reason="inline PTX needs a GPU")


def _cc():
    from numba import cuda
    return cuda.get_current_device().compute_capability


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


@pytest.mark.parametrize("M,N,K", [(300, 520, 200), (128, 256, 64), (1, 2, 8)])
@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_wgmma_gemm_variant_t1(kind, M, N, K):
    """The warp-specialised TMA + wgmma GEMM (nbdnn/cuda/matmul/wgmma_gemm.py) against
    NumPy on the same rounded operands: tails in M, N and K (TMA's zero fill), one
    exact tile, a 1 x 2 product; the result rounded once to the 16-bit dtype."""
    from numba import cuda
    from nbdnn.cuda.matmul import wgmma_gemm as W
    if _cc() < (9, 0):
        pytest.skip("wgmma needs sm_90")
    rng = np.random.default_rng(M + K)
    a, av = _bits(rng.standard_normal((M, K)), kind)
    bt, bv = _bits(rng.standard_normal((N, K)), kind)
    c = cuda.device_array(M * N // 2, np.uint32)
    dtype = "bfloat16" if kind == "bf16" else "float16"
    W.gemm(cuda.to_device(a), cuda.to_device(bt), c, M, N, K, 0.5, dtype)
    got16 = c.copy_to_host().view(np.uint16).reshape(M, N)
    got = _bits_to_float(got16, kind)
    want = 0.5 * (av @ bv.T)
    ulp = 2.0 ** -7 if kind == "bf16" else 2.0 ** -10
    np.testing.assert_allclose(got, want, rtol=2 * ulp, atol=1e-5 * np.sqrt(K))


def _bits_to_float(bits, kind):
    if kind == "f16":
        return bits.view(np.float16).astype(np.float64)
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)

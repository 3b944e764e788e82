"""Shared by the tensor-core GEMM tests (test_tensorcore.py, test_tensorcore_variants.py):
the shapes, 16-bit operand pairs as torch CUDA tensors with their float64 values, and
the check of a 16-bit matmul with and without its epilogue against NumPy."""
import numpy as np
import pytest


def cc():
    from numba import cuda
    return cuda.get_current_device().compute_capability


TC_SHAPES = [((296, 200), (200, 520)), ((128, 64), (64, 256)), ((8, 8), (8, 8)),
             ((3, 136, 72), (3, 72, 264)), ((3, 40, 64), (64, 24)),
             ((2, 1, 24, 16), (3, 16, 32))]


def flags(name):
    """The variant tokens of a kernel name: "wgmma_gemm_bf16_km_partial_om_ts_ls_m64n256s4"
    holds partial, om (own maps), ts (TMA stores), ls (lean setup), m64n256s4 (tile)."""
    return set(name.split("_"))


def torch_pair(rng, shape, tdt, trans):
    """A (..., r, c) operand as a CUDA tensor (stored transposed when trans) and its
    float64 values as the kernel sees them."""
    import torch
    x = torch.from_numpy(rng.uniform(-1, 1, shape).astype(np.float32)).to(tdt)
    want = x.double().numpy()
    dev = (x.transpose(-1, -2).contiguous() if trans else x).cuda()
    return dev, want


def check_16bit_matmul(dtype, shapes, ta, tb, kernel, seed, copies=0):
    """nbdnn.matmul of 16-bit torch tensors, with the epilogue (bias, gelu, alpha/beta)
    and without, runs `kernel` (a name prefix) and matches NumPy in float64 on the same
    rounded operands: one rounding of the float32 sum to the output dtype. copies: the
    padded_copy launches each call makes first (matmul's variant wgmma_padded)."""
    torch = pytest.importorskip("torch")
    import nbdnn
    from nbdnn.cuda.runtime.launch.kernel import launched
    tdt = getattr(torch, dtype)
    rng = np.random.default_rng(seed)
    (ash, bsh) = shapes
    a, av = torch_pair(rng, ash, tdt, ta)
    b, bv = torch_pair(rng, bsh, tdt, tb)
    N, K = bsh[-1], ash[-1]
    bias, biasv = torch_pair(rng, (1, N), tdt, False)
    bias, biasv = bias[0], biasv[0]
    old, oldv = torch_pair(rng, np.broadcast_shapes(ash[:-2], bsh[:-2]) + (ash[-2], N), tdt,
                            False)
    with launched() as names:
        c = nbdnn.matmul(a, b, trans_a=ta, trans_b=tb, bias=bias, activation="gelu",
                         alpha=0.5, beta=0.25, out=old)
        plain = nbdnn.matmul(a, b, trans_a=ta, trans_b=tb)
    n = copies + 1  # (each call: its copies, then the product)
    assert len(names) == 2 * n, names
    for call in (names[:n], names[n:]):
        assert call[:copies] == ["padded_copy"] * copies and call[copies].startswith(kernel), \
            names
    from scipy.special import erf
    r = av @ bv + biasv
    want = 0.5 * (0.5 * r * (1 + erf(r / np.sqrt(2)))) + 0.25 * oldv
    ulp = 2.0 ** -8 if dtype == "bfloat16" else 2.0 ** -11
    np.testing.assert_allclose(c.double().cpu().numpy(), want, rtol=2 * ulp,
                               atol=1e-5 * np.sqrt(K) + 2 * ulp)
    np.testing.assert_allclose(plain.double().cpu().numpy(), av @ bv, rtol=2 * ulp,
                               atol=1e-5 * np.sqrt(K))

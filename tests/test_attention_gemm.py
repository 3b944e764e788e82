"""cuda/attention/gemm.py: attention as GEMMs around two row kernels (float32 in its
math modes; float16 through TF32 GEMMs), forward and backward against the CPU
reference (the simulator without a GPU: tiny shapes, the path's thresholds lowered, its
workspace shrunk so that calls split into chunks of whole kv heads or into row slices
of one)."""
import numpy as np
import pytest

import nbdnn
from nbdnn.cuda.runtime.launch.kernel import launched

# (dtype, layout, (B, Hq, Hk, Sq, Sk, D, Dv), keywords, workspace bytes or None: one chunk)
CASES = [
    (np.float32, "BHSD", (2, 4, 2, 5, 7, 8, 6), {"is_causal": True}, None),
    (np.float32, "BSHD", (1, 2, 1, 6, 9, 4, 5), {"attn_mask": "bool", "dropout_p": 0.3,
                                                 "seed": 5, "offset": 11},
     5 * 9 * 4),  # row slices of 5, 5, 2
    (np.float32, "BHSD", (2, 2, 2, 4, 6, 4, 4), {"attn_mask": "float", "math": "tf32"},
     2 * 4 * 6 * 4),  # two heads a chunk
    (np.float32, "BHSD", (1, 3, 3, 5, 5, 4, 4), {"attn_mask": "dead rows", "math": "3xtf32",
                                                 "scale": 0.3}, None),
    (np.float16, "BSHD", (2, 4, 2, 6, 7, 8, 5), {"attn_mask": "float", "is_causal": True},
     6 * 7 * 4),  # (16-bit: cast, TF32 GEMMs, p' rounded to float16)
    (np.float16, "BHSD", (1, 2, 1, 5, 9, 4, 4), {"attn_mask": "bool", "dropout_p": 0.5,
                                                 "seed": 2, "offset": 3}, None),
]


def _case(dtype, layout, dims, kw, seed):
    rng = np.random.default_rng(seed)
    B, Hq, Hk, Sq, Sk, D, Dv = dims

    def t(H, S, d):
        shape = (B, H, S, d) if layout == "BHSD" else (B, S, H, d)
        return rng.uniform(-1, 1, shape).astype(dtype)
    q, k, v = t(Hq, Sq, D), t(Hk, Sk, D), t(Hk, Sk, Dv)
    if kw.get("math") == "tf32":  # (TF32-exact q and k: the reference rounds alike anyway)
        q, k = (nbdnn.cpu.matmul.tf32(x) for x in (q, k))
    mask = kw.get("attn_mask")
    if mask == "bool":
        kw = dict(kw, attn_mask=rng.random((1, Hq, Sq, Sk)) > 0.3)
    elif mask == "float":
        kw = dict(kw, attn_mask=rng.uniform(-1, 1, (Sq, Sk)).astype(dtype))
    elif mask == "dead rows":  # rows 1 and 3 of every head fully masked: o 0, lse -inf
        m = np.ones((Sq, Sk), bool)
        m[[1, 3]] = False
        kw = dict(kw, attn_mask=m)
    do = rng.uniform(-1, 1, q.shape[:-1] + (Dv,)).astype(dtype)
    return (q, k, v, do), dict(kw, enable_gqa=Hq != Hk, layout=layout)


@pytest.fixture
def gemm_on(monkeypatch):
    from nbdnn.cuda.attention import gemm
    monkeypatch.setattr(gemm, "MIN_QUERIES", 1)
    monkeypatch.setattr(gemm, "MIN_KEYS", 1)
    return gemm


def _tol(dtype, kw):
    if dtype == np.float16:
        return 2e-3
    return 1e-3 if kw.get("math") == "tf32" else 2e-5  # (tf32: p rounded before p v)


def _wide(kw):
    """The keywords for the float64 reference: float masks widened."""
    return {n: a.astype(np.float64) if isinstance(a, np.ndarray) and a.dtype.kind == "f"
            else a for n, a in kw.items()}


@pytest.mark.parametrize("dtype,layout,dims,kw,workspace", CASES)
def test_gemm_forward_matches_reference(dtype, layout, dims, kw, workspace, gemm_on,
                                        monkeypatch):
    if workspace:
        monkeypatch.setattr(gemm_on, "WORKSPACE", workspace)
    (q, k, v, _), kw = _case(dtype, layout, dims, kw, len(kw))
    with launched() as names:
        o, lse = nbdnn.scaled_dot_product_attention(q, k, v, backend="cuda", **kw)
    chunks = len(gemm_on._chunks(dims[0] * dims[2], dims[1] // dims[2] * dims[3], dims[4]))
    assert names.count("attention_rows_fwd") == chunks > (workspace is not None), names
    want_o, want_lse = nbdnn.scaled_dot_product_attention(
        *(x.astype(np.float64) if dtype == np.float16 else x for x in (q, k, v)),
        backend="cpu", **(_wide(kw) if dtype == np.float16 else kw))
    tol = _tol(dtype, kw)
    np.testing.assert_allclose(np.asarray(o, np.float64), want_o, rtol=tol, atol=tol)
    np.testing.assert_allclose(np.asarray(lse), want_lse, rtol=tol, atol=tol)
    if kw.get("scale") == 0.3:  # the dead rows
        assert np.all(np.asarray(lse)[:, :, [1, 3]] == -np.inf)
        assert np.all(np.asarray(o)[:, :, [1, 3]] == 0)


@pytest.mark.parametrize("dtype,layout,dims,kw,workspace", CASES)
def test_gemm_backward_matches_reference(dtype, layout, dims, kw, workspace, gemm_on,
                                         monkeypatch):
    if workspace:
        monkeypatch.setattr(gemm_on, "WORKSPACE", workspace)
    (q, k, v, do), kw = _case(dtype, layout, dims, kw, len(kw) + 10)
    o, lse = nbdnn.scaled_dot_product_attention(q, k, v, backend="cpu", **kw)
    with launched() as names:
        got = nbdnn.scaled_dot_product_attention_backward(do, q, k, v, o, lse, backend="cuda",
                                                          **kw)
    assert "attention_rows_bwd" in names, names
    want = nbdnn.scaled_dot_product_attention_backward(do, q, k, v, o, lse, backend="cpu", **kw)
    tol = 4 * _tol(dtype, kw)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64),
                                   rtol=tol, atol=tol)


def test_gemm_path_thresholds_and_lengths(monkeypatch):
    """Few scores, or seq_lens (padding may hold anything), keep the exact kernels; float32
    and 16-bit calls only."""
    (q, k, v, _), kw = _case(np.float32, "BHSD", (1, 2, 2, 3, 70, 4, 4), {}, 0)
    with launched() as names:
        nbdnn.scaled_dot_product_attention(q, k, v, backend="cuda", **kw)
    assert "attention_fwd" in names and "attention_rows_fwd" not in names, names
    from nbdnn.cuda.attention import gemm
    assert gemm.usable("float32", 64, 64, 0, 0) and gemm.usable("float16", 64, 64, 0, 0)
    assert gemm.usable("bfloat16", 64, 64, 0, 0) and not gemm.usable("float32", 64, 64, 1, 0) \
        and not gemm.usable("float64", 64, 64, 0, 0) and not gemm.usable("float32", 63, 64, 0, 0)


@pytest.mark.parametrize("dtype,math,workspace,D,kw", [
    ("float32", "ieee", None, 64, {"attn_mask": "float", "is_causal": True}),
    ("float32", "3xtf32", 150 * 300 * 4, 64, {"attn_mask": "float", "is_causal": True}),
    ("bfloat16", "ieee", None, 96, {"attn_mask": "bool", "dropout_p": 0.2, "seed": 9}),
])
def test_gemm_path_at_gpu_sizes(dtype, math, workspace, D, kw, monkeypatch):
    """The shipped thresholds on a GPU: 400 grouped-query rows a kv head against 300 keys
    (float32: causal, a float mask, the tensor-core GEMMs under 3xtf32 in row slices of
    150; bfloat16 at a head dim flash.py does not take, a boolean mask and dropout),
    forward and backward against the float64 reference."""
    from nbdnn.cuda.attention import gemm
    from nbdnn.cuda.runtime.simulator import SIMULATOR
    if SIMULATOR:
        pytest.skip("a GPU's size")
    from nbdnn.cuda.attention import forced
    if workspace:
        monkeypatch.setattr(gemm, "WORKSPACE", workspace)
    ml_dtypes = pytest.importorskip("ml_dtypes")
    (q, k, v, do), kw = _case(np.float32, "BHSD", (2, 4, 2, 200, 300, D, D),
                              dict(kw, math=math), 1)
    if dtype == "bfloat16":
        q, k, v, do = (x.astype(ml_dtypes.bfloat16) for x in (q, k, v, do))
    with launched() as names, forced("gemm"):  # (3xtf32 D 64's forward: flash_tf32's)
        o, lse = nbdnn.scaled_dot_product_attention(q, k, v, backend="cuda", **kw)
        grads = nbdnn.scaled_dot_product_attention_backward(do, q, k, v, o, lse,
                                                            backend="cuda", **kw)
    assert "attention_rows_fwd" in names and "attention_rows_bwd" in names, names
    wide = _wide(kw)
    args = [np.asarray(x, np.float64) for x in (q, k, v)]
    want_o, want_lse = nbdnn.scaled_dot_product_attention(*args, backend="cpu", **wide)
    want = nbdnn.scaled_dot_product_attention_backward(
        np.asarray(do, np.float64), *args, want_o, want_lse, backend="cpu", **wide)
    np.testing.assert_allclose(np.asarray(lse), want_lse, rtol=1e-5, atol=1e-5)
    tol = 1e-5 if dtype == "float32" else 4e-2  # (bf16: o, p', the gradients rounded: as
    # tests/test_attention_flash.py's backward, the largest error over the largest value)
    for name, g, w in zip(("o", "dq", "dk", "dv"), (o,) + tuple(grads), (want_o,) + want):
        err = np.abs(np.asarray(g, np.float64) - w).max() / np.abs(w).max()
        assert err <= tol, (name, err)

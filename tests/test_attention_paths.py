"""Which attention kernels run, and each against the CPU reference (the simulator
without a GPU): flash-decoding (cuda/attention/decode.py) for few queries against
many keys, over its features; the exact path otherwise."""
import numpy as np
import pytest

import nbdnn
from nbdnn.cuda import cuda
from nbdnn.cuda.attention import flash
from nbdnn.cuda.runtime.launch.kernel import launched


def _inputs(rng, dtype, layout, B, Hq, Hk, Sq, Sk, D, Dv):
    def t(H, S, d):
        shape = (B, H, S, d) if layout == "BHSD" else (B, S, H, d)
        return rng.uniform(-1, 1, shape).astype(dtype)
    return t(Hq, Sq, D), t(Hk, Sk, D), t(Hk, Sk, Dv)


@pytest.mark.parametrize("dtype,layout,Sq,kw", [
    (np.float64, "BHSD", 1, {}),
    (np.float32, "BSHD", 3, {"is_causal": True}),
    (np.float64, "BHSD", 1, {"dropout_p": 0.3, "seed": 5, "offset": 11}),
    (np.float64, "BHSD", 2, {"attn_mask": "bool", "seq_lens_q": np.array([1, 2]),
                             "seq_lens_k": np.array([50, 0], np.int32)}),
    (np.float16, "BHSD", 4, {"attn_mask": "float"}),
])
def test_decode_matches_reference(dtype, layout, Sq, kw, monkeypatch):
    from nbdnn.cuda.attention import decode
    monkeypatch.setattr(decode, "MIN_KEYS", 40)  # (simulator-sized: 3 chunks of 32)
    rng = np.random.default_rng(Sq)
    B, Hq, Hk, Sk = 2, 4, 2, 77
    q, k, v = _inputs(rng, dtype, layout, B, Hq, Hk, Sq, Sk, 8, 6)
    if kw.get("attn_mask") == "bool":
        kw = dict(kw, attn_mask=rng.random((1, Hq, Sq, Sk)) > 0.3)
    elif kw.get("attn_mask") == "float":
        kw = dict(kw, attn_mask=rng.uniform(-1, 1, (Sq, Sk)).astype(dtype))
    kw = dict(kw, enable_gqa=True, layout=layout)
    with launched() as names:
        o, lse = nbdnn.scaled_dot_product_attention(q, k, v, backend="cuda", **kw)
    assert names[-2:] == ["attention_decode_part", "attention_decode_combine"], names
    ref = {n: a.astype(np.float64) if isinstance(a, np.ndarray) and a.dtype.kind == "f"
           else a for n, a in kw.items()}
    want_o, want_lse = nbdnn.scaled_dot_product_attention(
        *(a.astype(np.float64) for a in (q, k, v)), backend="cpu", **ref)
    tol = {np.float64: 1e-12, np.float32: 1e-5, np.float16: 2e-3}[dtype]
    np.testing.assert_allclose(np.asarray(o, np.float64), want_o, rtol=tol, atol=tol)
    np.testing.assert_allclose(np.asarray(lse), want_lse, rtol=tol, atol=tol)


@pytest.mark.parametrize("D,Hq,Hk,Sq,layout,kw", [
    (64, 4, 2, 1, "BHSD", {}),
    (64, 2, 2, 3, "BSHD", {"is_causal": True}),
    (128, 4, 2, 2, "BHSD", {"seq_lens_q": np.array([1, 2]), "seq_lens_k": np.array([70, 0])}),
    (64, 8, 2, 2, "BSHD", {"seq_lens_k": np.array([77, 76])}),
    (64, 4, 2, 2, "BHSD", {"attn_mask": "bool", "dropout_p": 0.3, "seed": 5, "offset": 11}),
    (128, 2, 2, 1, "BSHD", {"attn_mask": "float", "is_causal": True}),
])
def test_decode_split_matches_reference(D, Hq, Hk, Sq, layout, kw, monkeypatch):
    """decode_split.py in float16: grouped-query rows (R = G
    Sq up to MAX_ROWS: 8 at D 64, 4 at D 128), a key tail past whole tiles, causal, both
    lengths (a row with no key: o = 0, lse = -inf), both layouts, both mask kinds,
    dropout (nbdnn.dropout's stream); NaN in a key past seq_lens_k takes no part."""
    from nbdnn.cuda.attention import decode
    monkeypatch.setattr(decode, "MIN_KEYS", 40)
    rng = np.random.default_rng(D + Sq)
    q, k, v = _inputs(rng, np.float16, layout, 2, Hq, Hk, Sq, 77, D, D)
    if kw.get("attn_mask") == "bool":
        kw = dict(kw, attn_mask=rng.random((2, 1, Sq, 77)) > 0.3)
    elif kw.get("attn_mask") == "float":
        kw = dict(kw, attn_mask=rng.uniform(-1, 1, (Sq, 77)).astype(np.float16))
    if "seq_lens_k" in kw:
        (k if layout == "BHSD" else k.transpose(0, 2, 1, 3))[0, :, 75] = np.nan
        (v if layout == "BHSD" else v.transpose(0, 2, 1, 3))[0, :, 76] = np.nan
    kw = dict(kw, enable_gqa=Hq != Hk, layout=layout)
    with launched() as names:
        o, lse = nbdnn.scaled_dot_product_attention(q, k, v, backend="cuda", **kw)
    assert names[-2].startswith("attention_splitkv_d") and \
        names[-1] == "attention_decode_combine", names
    ref = {n: a.astype(np.float64) if isinstance(a, np.ndarray) and a.dtype.kind == "f"
           else a for n, a in kw.items()}
    want_o, want_lse = nbdnn.scaled_dot_product_attention(
        *(a.astype(np.float64) for a in (q, k, v)), backend="cpu", **ref)
    np.testing.assert_allclose(np.asarray(o, np.float64), want_o, rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(np.asarray(lse), want_lse, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("D,Hq,Hk,Sq,causal", [(128, 16, 4, 1, False), (64, 8, 4, 4, True)])
def test_decode_split_long_cache(D, Hq, Hk, Sq, causal, monkeypatch):
    """decode_split.py at its real sizes on a GPU, in bfloat16: a 20000-key
    cache split into many chunks (B 2, lengths 20000 and 13001: a chunk past the shorter
    one holds no key), R = 4 and 8 rows a kv head, against the float64 reference."""
    from nbdnn.cuda.runtime.simulator import SIMULATOR
    if SIMULATOR:
        pytest.skip("20000 keys: a GPU's size")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(D)
    q, k, v = (a.astype(ml_dtypes.bfloat16) for a in
               _inputs(rng, np.float32, "BHSD", 2, Hq, Hk, Sq, 20000, D, D))
    kw = dict(is_causal=causal, enable_gqa=True, seq_lens_k=np.array([20000, 13001]))
    with launched() as names:
        o, lse = nbdnn.scaled_dot_product_attention(q, k, v, backend="cuda", **kw)
    assert names[-2].startswith("attention_splitkv_d"), names
    want_o, want_lse = nbdnn.scaled_dot_product_attention(
        *(np.asarray(a, np.float64) for a in (q, k, v)), backend="cpu", **kw)
    np.testing.assert_allclose(np.asarray(o, np.float64), want_o, rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(np.asarray(lse), want_lse, rtol=1e-4, atol=1e-4)


def test_exact_path_below_the_decode_threshold():
    rng = np.random.default_rng(0)
    q, k, v = _inputs(rng, np.float32, "BHSD", 1, 2, 2, 1, 20, 8, 8)
    with launched() as names:
        nbdnn.scaled_dot_product_attention(q, k, v, backend="cuda")
    assert "attention_fwd" in names and not any("decode" in n for n in names), names


def test_forced_variants():
    """forced(name) runs that variant where the order would pick another, raises
    NotSupportedError where its kernels cannot take the call and ValueError for a name
    no table has; each table's names are unique and documented, and ends in the exact
    kernels, which take every call."""
    from nbdnn.cuda import attention as A
    for table in (A.FORWARD, A.BACKWARD):
        assert len({v.name for v in table}) == len(table) and all(v.doc for v in table)
        assert table[-1].name == "simt"
    rng = np.random.default_rng(1)
    q, k, v = _inputs(rng, np.float32, "BHSD", 1, 2, 2, 64, 64, 8, 8)
    with launched() as names:
        nbdnn.scaled_dot_product_attention(q, k, v, backend="cuda")
    assert any(n.startswith("attention_rows") for n in names), names  # (the order's choice)
    with A.forced("simt"), launched() as names:
        o, lse = nbdnn.scaled_dot_product_attention(q, k, v, backend="cuda")
        nbdnn.scaled_dot_product_attention_backward(o, q, k, v, o, lse, backend="cuda")
    assert "attention_fwd" in names and not any("attention_rows" in n for n in names), names
    with A.forced("gemm"), pytest.raises(nbdnn.NotSupportedError, match="gemm"):
        nbdnn.scaled_dot_product_attention(q, k, v, seq_lens_k=np.array([3]), backend="cuda")
    with pytest.raises(ValueError, match="tiled"):
        with A.forced("tiled"):
            pass


def test_forced_variants_are_never_planned():
    """Eager call plans do not hold the forced variant, so inside forced() calls go
    unplanned: a plan learnt outside is not replayed (it would skip the forced variant's
    refusal); after it the order's choice runs again."""
    from nbdnn.cuda import attention as A
    from nbdnn.cuda.runtime.memory.arrays import to_device
    rng = np.random.default_rng(2)
    q, k, v = (to_device(a) for a in _inputs(rng, np.float32, "BHSD", 1, 2, 2, 64, 64, 8, 8))
    for _ in range(4):  # (the 4th and later replay a plan)
        nbdnn.scaled_dot_product_attention(q, k, v)
    with A.forced("decode"), pytest.raises(nbdnn.NotSupportedError, match="decode"):
        nbdnn.scaled_dot_product_attention(q, k, v)
    with A.forced("simt"):
        for _ in range(5):
            nbdnn.scaled_dot_product_attention(q, k, v)
    with launched() as names:
        nbdnn.scaled_dot_product_attention(q, k, v)
    assert any(n.startswith("attention_rows") for n in names), names


def test_flash_takes_masks_and_dropout_over_whole_key_groups():
    """flash.takes (the tensor-core kernels' features; the GPU decides the rest): no mask,
    a boolean or an additive one; dropout only where Sk % 4 == 0 (a Philox call's 4
    words are 4 adjacent keys of one row); 16-bit, D = Dv in 64, 128."""
    import ml_dtypes
    from nbdnn.cuda.attention.geometry import geometry

    def geo(Sk=256, D=64, Dv=64, mask=None, p=0.0, dtype=ml_dtypes.bfloat16):
        q = np.zeros((1, 2, 32, D), dtype)
        k, v = np.zeros((1, 2, Sk, D), dtype), np.zeros((1, 2, Sk, Dv), dtype)
        m = None if mask is None else np.zeros((1, 1, 32, Sk), mask)
        return flash.takes(np.dtype(dtype).name, geometry(
            q, k, v, np.zeros((1, 2, 32, Dv), dtype), m, p, False, None, 7, 0, "BHSD", 0, 0,
            "ieee"))
    assert geo() and geo(mask=bool) and geo(p=0.1) and geo(mask=bool, p=0.5, D=128, Dv=128)
    assert geo(mask=ml_dtypes.bfloat16) and geo(mask=np.float16, dtype=np.float16, p=0.2)
    assert geo(Sk=255) and not geo(Sk=255, p=0.1) and not geo(Sk=254, p=0.1)
    assert not geo(D=32, Dv=32) and not geo(Dv=128)
    assert not geo(dtype=np.float32)


# the lanes' test below: one batch entry and head of many, an offset past 32 bits,
# 16 rows r0, r0 + 8 from ROW0 and 64 columns from COL0
_B, _HQ, _SQ, _SK, _BI, _HI = 2, 3, 56, 72, 1, 2
_P, _SEED, _OFFSET = 0.5, 77, 2 ** 33 + 5
_ROW0, _COL0, _COLS = 16, 8, 64


def _rows_lanes(out, thr, kscale):
    """The forward's (and dQ's) lanes: rows r0, r1 (queries), columns n0 + 8 j + cb + {0, 1}."""
    lane = cuda.threadIdx.x
    r0 = _ROW0 + lane // 4
    r1 = r0 + 8
    cb = 2 * (lane % 4)
    eb = np.uint64((_BI * _HQ + _HI) * _SQ + (r0 if lane % 2 == 0 else r1)) * \
        np.uint64(_SK) + np.uint64(4 * ((lane % 4) // 2))
    ev = lane % 2 == 0
    n0 = _COL0
    for j in range(_COLS // 8):
        f0, f1, f2, f3 = flash.pair_keep((eb + np.uint64(n0 + 8 * j)) >> np.uint64(2), ev, thr,
                                         kscale, np.uint64(_OFFSET & 0xFFFFFFFF),
                                         np.uint64(_OFFSET >> 32), np.uint64(_SEED),
                                         np.uint64(0))
        c = n0 + 8 * j + cb - _COL0
        out[r0 - _ROW0, c] = f0
        out[r0 - _ROW0, c + 1] = f1
        out[r1 - _ROW0, c] = f2
        out[r1 - _ROW0, c + 1] = f3


def _keys_lanes(out, thr, kscale):
    """dK/dV's lanes: keys r0, r1 (the warp's 16 from n0), queries cl + 8 j + {0, 1}."""
    lane = cuda.threadIdx.x
    n0 = _COL0
    r0 = n0 + lane // 4
    cb = 2 * (lane % 4)
    kl = (lane // 4) % 4
    kg = r0 + 8 * (kl // 2) - kl
    src1 = lane % 4 + 4 * ((kl + 1) % 4) + 16 * (lane // 16)
    src2 = lane % 4 + 4 * ((kl + 2) % 4) + 16 * (lane // 16)
    src3 = lane % 4 + 4 * ((kl + 3) % 4) + 16 * (lane // 16)
    rb = (_BI * _HQ + _HI) * _SQ
    cl = _ROW0 + cb
    for j in range(4):
        f = flash.quad_keep((np.uint64(rb + cl + 8 * j + kl % 2) * np.uint64(_SK) +
                             np.uint64(kg)) >> np.uint64(2), kl, src1, src2, src3, thr, kscale,
                            np.uint64(_OFFSET & 0xFFFFFFFF), np.uint64(_OFFSET >> 32),
                            np.uint64(_SEED), np.uint64(0))
        for x in range(4):  # pair x: query cl + 8 j + x % 2, key r0 + 8 (x // 2)
            out[cl + 8 * j + x % 2 - _ROW0, r0 + 8 * (x // 2) - n0] = f[x]


@pytest.fixture
def warp_shuffles(monkeypatch):
    """Under the simulator (which has no warp shuffles: a thread a Python thread), a
    warp's shfl_sync / shfl_xor_sync by a barrier over its 32 threads; on a GPU, nothing."""
    from nbdnn.cuda import SIMULATOR
    if not SIMULATOR:
        return
    import threading
    from numba.cuda.simulator.kernelapi import FakeCUDAModule
    values, barrier = [None] * 32, threading.Barrier(32)

    def exchange(module, value, src):
        lane = module.threadIdx.x % 32
        values[lane] = value
        barrier.wait()
        got = values[src % 32]
        barrier.wait()
        return got
    monkeypatch.setattr(FakeCUDAModule, "shfl_sync",
                        lambda self, mask, value, src: exchange(self, value, src), raising=False)
    monkeypatch.setattr(FakeCUDAModule, "shfl_xor_sync",
                        lambda self, mask, value, xor: exchange(
                            self, value, (self.threadIdx.x % 32) ^ xor), raising=False)


@pytest.mark.parametrize("scheme", ["rows", "keys"])
def test_flash_dropout_lanes_draw_nbdnn_dropouts_mask(scheme, warp_shuffles):
    """The flash kernels' keep factors (flash.pair_keep: the forward and dQ, a lane pair
    sharing a Philox call's 4 adjacent keys; flash.quad_keep: dK/dV, a key group's 4 lanes
    sharing 4 calls) on one warp, its lanes set up as the generated kernels set them
    (flash_source.py, flash_bwd_source.py), against nbdnn.dropout's mask of the same
    (seed, offset) over (B, Hq, Sq, Sk): every score's factor is its element's."""
    from nbdnn.cpu.dropout import mask
    from nbdnn._philox import keep_threshold
    thr, kscale = np.uint64(keep_threshold(_P)), np.float32(1 / (1 - _P))
    keep = mask(_B * _HQ * _SQ * _SK, _P, _SEED, _OFFSET).reshape(_B, _HQ, _SQ, _SK)[_BI, _HI]
    if scheme == "rows":
        got = cuda.to_device(np.full((16, _COLS), -1, np.float32))
        cuda.jit(_rows_lanes)[1, 32](got, thr, kscale)
        want = keep[_ROW0:_ROW0 + 16, _COL0:_COL0 + _COLS] * kscale
    else:
        got = cuda.to_device(np.full((32, 16), -1, np.float32))
        cuda.jit(_keys_lanes)[1, 32](got, thr, kscale)
        want = keep[_ROW0:_ROW0 + 32, _COL0:_COL0 + 16] * kscale
    np.testing.assert_array_equal(got.copy_to_host(), want)


def _mask_terms(ms, out, isc):
    i = cuda.threadIdx.x
    out[i] = flash.mask_term(ms[i], isc)


@pytest.mark.filterwarnings("ignore:overflow encountered")  # (the simulator's float32)
def test_an_additive_mask_joins_the_raw_score_over_scale_and_never_overflows():
    """flash.mask_term (the tensor-core kernels' additive mask, m / scale beside the raw
    score): -inf stays -inf, a finite value whose quotient would overflow float32
    (bfloat16's lowest, a padding mask's) is held at -1e30 (a row of them averages, as
    PyTorch's float32 kernels), the rest divided exactly."""
    ms = np.array([-np.inf, -3.3895314e38, -2.0, 0.0, 3.0, -1e29], np.float32)
    out = cuda.to_device(np.zeros(len(ms), np.float32))
    cuda.jit(_mask_terms)[1, len(ms)](cuda.to_device(ms), out, np.float32(8))
    np.testing.assert_array_equal(out.copy_to_host(),
                                  np.array([-np.inf, -1e30, -16, 0, 24, -8e29], np.float32))


def test_flash_sources_keep_per_score_branches_out():
    """The generated flash kernels (forward, dK/dV, dQ; every head dim, mask kind,
    dropout, logit cap and ALiBi) write their per-score selections as sel() calls and bitwise conditions:
    numba's IR makes each conditional expression or short-circuit two blocks and a phi
    variable, and its SSA and liveness passes cost blocks times variables (64 per-score
    conditional expressions made the D 64 forward's JIT 27 s, the dK/dV kernel's 36;
    as calls 10 and 7, the same PTX in the loop). What remains is per tile or per row;
    a boolean mask's read stays behind its pair's bounds (one short-circuit a score);
    a logit cap and ALiBi add none.
    docs/decisions.md "flash_jit_branches"."""
    import ast
    import itertools
    from nbdnn.cuda.attention import flash_bwd, flash_bwd_source as fb, flash_source as fs
    for D, masked, dropped, capped, alibi in itertools.product(
            (64, 128), (0, 1, 2), (False, True), (False, True), (False, True)):
        feat = masked, dropped, capped, alibi
        srcs = [fs.source(flash.KINDS["bfloat16"], D, *flash.TILES[D], True, False, False,
                          *feat)[1]]
        srcs += [f(flash.KINDS["bfloat16"], D, flash_bwd.STAGES[D], feat)[1]
                 for f in (fb.dkv_source, fb.dq_source)]
        for src in srcs:
            nodes = list(ast.walk(ast.parse(src)))
            ifexp = sum(isinstance(n, ast.IfExp) for n in nodes)
            boolop = sum(isinstance(n, ast.BoolOp) for n in nodes)
            assert ifexp <= 16, (feat, ifexp)
            assert boolop <= (40 if masked == 1 else 6), (feat, boolop)

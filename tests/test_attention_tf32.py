"""cuda/attention/flash_tf32.py: float32 attention's forward
fused on the tensor cores in "tf32" and "3xtf32", every feature, against the CPU
reference in the same math mode; GPU only (inline PTX: the simulator runs none; CI
compiles it to PTX)."""
import numpy as np
import pytest

import nbdnn
from nbdnn.cuda.runtime.launch.kernel import launched
from nbdnn.cuda.runtime.simulator import SIMULATOR

pytestmark = pytest.mark.skipif(SIMULATOR, reason="mma.sync: inline PTX")

# (D, math, layout, causal (True: top-left, or the alignment), (B, Hq, Hk, Sq, Sk),
# (seq_lens_q, seq_lens_k) or None, extra)
CASES = [
    (64, "3xtf32", "BHSD", False, (2, 4, 2, 100, 77), None, {}),
    (128, "3xtf32", "BSHD", True, (1, 2, 1, 130, 130), None, {}),
    (40, "3xtf32", "BHSD", True, (2, 2, 2, 65, 90), ([60, 3], [90, 0]), {}),
    (64, "tf32", "BSHD", False, (1, 3, 1, 33, 200), ([33], [150]), {}),
    (8, "tf32", "BHSD", True, (1, 1, 1, 70, 33), None, {}),
    (64, "3xtf32", "BHSD", False, (2, 2, 1, 70, 100), None,
     {"attn_mask": "bool", "dropout_p": 0.25, "seed": 7, "offset": 3}),
    (32, "3xtf32", "BSHD", True, (1, 2, 2, 80, 64), None, {"attn_mask": "float"}),
    (64, "tf32", "BHSD", "bottom_right", (2, 2, 1, 100, 77), ([100, 40], [77, 60]), {}),
    (40, "3xtf32", "BSHD", "bottom_right", (1, 2, 2, 65, 150), None, {}),
    (64, "tf32", "BHSD", True, (2, 2, 1, 150, 150), None, {"window": (40, None)}),
    (32, "3xtf32", "BSHD", False, (1, 2, 2, 70, 200), ([70], [180]), {"window": (9, 20)}),
    (64, "3xtf32", "BHSD", "bottom_right", (1, 2, 1, 40, 300), None,
     {"window": (50, 0), "attn_mask": "bool"}),
    (64, "3xtf32", "BSHD", False, (2, 2, 1, 70, 90), None, {"softcap": 0.3}),
    (32, "tf32", "BHSD", True, (1, 2, 2, 65, 100), ([60], [90]),
     {"softcap": 2.0, "attn_mask": "float"}),
    (64, "3xtf32", "BSHD", "bottom_right", (2, 2, 1, 70, 90), ([70, 33], [90, 60]),
     {"alibi_slopes": np.float32([[0.3, 0.1], [0.05, 0.8]])}),
    (32, "tf32", "BHSD", False, (1, 4, 2, 65, 100), None,
     {"alibi_slopes": np.float32([0.5, 0.25, 0.125, 0.0625]), "softcap": 1.0}),
]


@pytest.mark.parametrize("D,math,layout,causal,dims,lens,extra", CASES)
def test_flash_tf32_matches_reference(D, math, layout, causal, dims, lens, extra,
                                      monkeypatch):
    """Query and key tails, causal (top-left, and bottom-right: the diagonal at each
    entry's Lk - Lq, the first rows of a longer query side seeing no key), sliding
    windows (a left side that skips a block's first key tiles, a right side past the
    diagonal, one with a mask), logit caps (one that bites, one with an additive
    mask), ALiBi (per (entry, head) slopes about moving bottom-right diagonals, per head
    with a cap), grouped-query heads, lengths (a batch entry with no
    key: o = 0, lse = -inf; rows past a query length: the same), both layouts; keys
    past a length hold NaN, which takes no part; masks of both kinds (broadcast over
    batch or heads), dropout."""
    from nbdnn.cuda.attention import flash_tf32
    monkeypatch.setattr(flash_tf32, "MAX_D_3X", 128)  # (D 128 3xtf32: gemm.py's otherwise)
    B, Hq, Hk, Sq, Sk = dims
    rng = np.random.default_rng(D + Sq)

    def t(H, S):
        return rng.uniform(-1, 1, (B, H, S, D) if layout == "BHSD" else (B, S, H, D)) \
            .astype(np.float32)
    q, k, v = t(Hq, Sq), t(Hk, Sk), t(Hk, Sk)
    kw = dict(extra, is_causal=bool(causal), enable_gqa=Hq != Hk, layout=layout, math=math,
              alignment=causal if isinstance(causal, str) else "top_left")
    if extra.get("attn_mask") == "bool":  # (a row of head 0 fully masked: o 0, lse -inf)
        m = rng.random((1, Hq, Sq, Sk)) > 0.3
        m[0, 0, 5] = False
        kw["attn_mask"] = m
    elif extra.get("attn_mask") == "float":
        kw["attn_mask"] = rng.uniform(-2, 2, (B, 1, Sq, Sk)).astype(np.float32)
    if lens:
        kw.update(seq_lens_q=np.array(lens[0]), seq_lens_k=np.array(lens[1]))
        for b, n in enumerate(lens[1]):  # (a NaN past a key length never reaches a row)
            (k if layout == "BHSD" else k.swapaxes(1, 2))[b, :, n:] = np.nan
            (v if layout == "BHSD" else v.swapaxes(1, 2))[b, :, n:] = np.nan
    with launched() as names:
        o, lse = nbdnn.scaled_dot_product_attention(q, k, v, backend="cuda", **kw)
    assert names[-1].startswith(f"attention_flash_tf32_d{D}_"), names
    want_o, want_lse = nbdnn.scaled_dot_product_attention(q, k, v, backend="cpu", **kw)
    tol = 2e-5 if math == "3xtf32" else 1e-3  # (tf32: p rounded to TF32 before p v)
    np.testing.assert_allclose(np.asarray(o), want_o, rtol=tol, atol=tol)
    np.testing.assert_allclose(np.asarray(lse), want_lse, rtol=tol, atol=tol)


@pytest.mark.parametrize("key_tile,q_raw", [(16, False), (32, True), (16, True)])
@pytest.mark.parametrize("case", [0, 1, 5, 9])
def test_flash_tf32_tile_configs(case, key_tile, q_raw, monkeypatch):
    """The other shapes of the block: 16 keys a tile (KEY_TILES), Q kept raw and split
    at each fragment load (Q_RAW), on the plain, the causal D 128, the masked and
    dropped, and a windowed case (its first key tile a multiple of the tile's keys)."""
    from nbdnn.cuda.attention import flash_tf32
    D, math = CASES[case][:2]
    monkeypatch.setattr(flash_tf32, "KEY_TILES", {(D, flash_tf32.MODES[math]): key_tile})
    monkeypatch.setattr(flash_tf32, "Q_RAW", q_raw)
    test_flash_tf32_matches_reference(*CASES[case], monkeypatch)


def test_flash_tf32_only_where_it_fits(monkeypatch):
    """ieee, Dv != D, D past 128 or not a multiple of 8 keep the other paths."""
    from nbdnn.cuda.attention import flash_tf32
    assert flash_tf32.usable("float32", "3xtf32", 64, 64)
    assert flash_tf32.usable("float32", "tf32", 8, 8)
    assert not flash_tf32.usable("float32", "ieee", 64, 64)
    assert not flash_tf32.usable("float32", "tf32", 64, 32)
    assert not flash_tf32.usable("float32", "tf32", 136, 136)
    assert not flash_tf32.usable("float32", "tf32", 20, 20)
    assert not flash_tf32.usable("bfloat16", "tf32", 64, 64)
    assert flash_tf32.usable("float32", "3xtf32", 128, 128)  # (gemm.py cannot take it)
    assert not flash_tf32.usable("float32", "3xtf32", 128, 128, gemm_takes_it=True)
    assert flash_tf32.usable("float32", "tf32", 128, 128, gemm_takes_it=True)

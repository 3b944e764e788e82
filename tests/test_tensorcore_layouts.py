"""The tensor-core kernels' generated layouts, checked without a GPU (the simulator runs
no inline PTX; tests/test_tensorcore.py runs the kernels on one, tests/test_ptx.py
compiles them): addresses evaluated from the generated source against the layout
the hardware expects."""
import re

import numpy as np
import pytest

from nbdnn.cuda.matmul.tensor_core_gemm.epilogue import staged_store as S
from nbdnn.cuda.matmul.tensor_core_gemm import wgmma_gemm as W
from nbdnn.cuda.matmul.tensor_core_gemm import wgmma_params as P


def test_staged_store_writes_each_staging_word_once_without_bank_conflicts():
    """The TMA-store epilogue's generated source (no GPU needed; its PTX compiles in
    tests/test_ptx.py): per 64-column chunk, the 128 threads' st.shared addresses,
    evaluated from the source, cover the 64 x 128-byte staging tile once, hold logical
    (row, column) at TMA's 128-byte swizzle, and a warp's 32 stores hit 32 banks."""
    name, src = W.source("bf16", True, False, True, "gelu", False, own_maps=True, store=True)
    assert name == "wgmma_gemm_bf16_km_b_gelu_om_ts"
    assert src.count("tma_store_3d(") == 4 and src.count("bar_sync(") == 8
    assert "bulk_wait(0)" in src and "fence_proxy_tensormap_acquire(map_c)" in src
    # (each store follows its values: "v0 = d[acc] ...", then st_shared_u32(U32(address)))
    stores = re.findall(r"v0 = d\[(\d+)\].*?st_shared_u32\(U32\((.+?)\), cvt", src, re.S)
    stores = [(expr, acc) for acc, expr in stores]
    assert len(stores) == 64  # 32 column pairs x rows r, r + 8: 4 chunks of 16
    for q in range(4):
        seen = {}
        for expr, acc in stores[16 * q:16 * q + 16]:
            j, k = divmod(int(acc), 4)  # accumulators 4j, 4j + 2: pair j, rows r / r + 8
            for warp in range(4):
                banks = set()
                for lane in range(32):
                    i = 32 * warp + lane
                    sw = (i % 32) // 4
                    at = eval(expr, {"stage_c": 0, "rl": 16 * (i // 32) + sw, "sw": sw,
                                     "i": i, "sq": 0})
                    row, col = 16 * warp + lane // 4 + 4 * k, 8 * (j % 8) + 2 * (lane % 4)
                    assert at == row * 128 + (((col // 8) ^ (row % 8)) << 4) + 2 * (col % 8)
                    assert at not in seen
                    seen[at] = (row, col)
                    banks.add(at // 4 % 32)
                assert len(banks) == 32
        assert sorted(seen) == list(range(0, S.TILE_BYTES, 4))
    assert W.shared_bytes(256, 4, True) <= W.MAX_SHARED < W.shared_bytes(256, 5, True)
    assert S.usable("bf16", False, False, 520, 256)
    for kind, partial, beta, N, c_address in (("tf32", False, False, 520, 256),
                                              ("bf16", True, False, 520, 256),
                                              ("bf16", False, True, 520, 256),
                                              ("bf16", False, False, 6, 256),
                                              ("bf16", False, False, 520, 260)):
        assert not S.usable(kind, partial, beta, N, c_address)
    assert P.signature("bf16", False, True, True).startswith(
        "void(uint64[::1], uint64[::1], uint64[::1], uint16[::1], uint16[::1], int64[::1], "
        "uint32[::1]")
    assert P.signature("f16", False, False, True).startswith("void(uint64, uint64, uint64, uint32")


def test_float32_staged_store_covers_each_staging_word_once():
    """The TMA-store epilogue for float32 C (tf32's C with its epilogue; split-K's raw
    chunk sums): 32 columns a 128-byte staging row, eight chunks a 256-wide half-tile,
    each thread's column pair one 8-byte st.shared.v2.f32 at TMA's 128-byte swizzle;
    the 128 threads cover each staging tile once, and a warp's stores fill each bank
    twice (256 bytes: two wavefronts, the fewest). usable(): float32 C only with
    TMA_STORE_F32's flag, N a multiple of 4."""
    for kind, partial, bias, act, label in (("tf32", False, True, "gelu", "_b_gelu_om_ts"),
                                            ("bf16", True, False, None, "_partial_om_ts")):
        name, src = W.source(kind, True, True, bias, act, False, partial, own_maps=True,
                             store=True)
        assert name.endswith(label), name
        assert src.count("tma_store_3d(") == 8 and src.count("st_shared_v2_f32(") == 64
        assert "st_shared_u32(" not in src and "cvt(" not in src
        got = re.findall(r"st_shared_v2_f32\(U32\((.+?)\), (?:a \* )?(?:v0|d\[(\d+)\])", src)
        assert len(got) == 64
        for q in range(8):  # chunk q: accumulator pairs 4j (+2: rows + 8), j = 4q .. 4q + 3
            seen = {}
            for n, (expr, _) in enumerate(got[8 * q:8 * q + 8]):
                j, k = 4 * q + n // 2, 2 * (n % 2)
                for warp in range(4):
                    banks = {}
                    for lane in range(32):
                        i = 32 * warp + lane
                        sw = (i % 32) // 4
                        at = eval(expr, {"stage_c": 0, "rl": 16 * (i // 32) + sw, "sw": sw,
                                         "i": i, "sq": 0})
                        row, col = 16 * warp + lane // 4 + 4 * k, 8 * (j % 4) + 2 * (lane % 4)
                        assert at == row * 128 + (((col // 4) ^ (row % 8)) << 4) + 4 * (col % 4)
                        assert at not in seen
                        seen[at] = (row, col)
                        for b in (at // 4 % 32, at // 4 % 32 + 1):
                            banks[b] = banks.get(b, 0) + 1
                    assert sorted(banks.values()) == [2] * 32
            assert sorted(seen) == list(range(0, S.TILE_BYTES, 8))
    assert S.columns(True) == 32 and S.columns(False) == 64
    assert S.usable("tf32", False, False, 260, 256, f32=True)
    assert S.usable("bf16", True, False, 260, 256, f32=True)
    assert not S.usable("tf32", False, False, 260, 256)       # the flag off
    assert not S.usable("tf32", False, False, 262, 256, f32=True)  # rows not 16-byte strides
    assert not S.usable("tf32", False, True, 260, 256, f32=True)   # beta: the direct epilogue


@pytest.mark.parametrize("f32", [False, True])
@pytest.mark.parametrize("bn", [32, 64, 128, 192, 256])
def test_staging_tiles_alternate_across_a_blocks_tiles(bn, f32):
    """The TMA-store epilogue's protocol, run in Python over four tiles of a persistent
    block (staged_store.tile_lines, one consumer, thread 0's view): the bulk stores are
    modelled as reading their staging tile until a bulk_wait_read lets them go, and no
    chunk writes a staging tile that a store may still be reading. Consumers of 64 or
    192 columns (16-bit: one or three chunks a tile) began each tile on the tile the
    last chunk's store was reading before."""
    cols = S.columns(f32)
    if bn % cols:
        pytest.skip("not whole staging tiles (usable() sends these to direct stores)")
    pending, seen = [], []  # stores not yet waited for: their staging tiles

    def wait_read(n):
        del pending[:max(0, len(pending) - n)]

    def write(address, *values):
        tile = address // S.TILE_BYTES
        assert tile not in pending, (bn, len(seen), pending)
        seen.append(tile)

    def store(m, c, r, z, address):
        pending.append(address // S.TILE_BYTES)

    lines = S.prologue_lines("") + ["for tile in range(4):"] + \
        ["    " + x for x in S.tile_lines(bn, False, None, f32=f32)] + S.final_lines("")
    env = {"ebase": 0, "w": 0, "i": 0, "map_c": 0, "m0": 0, "n0": 0, "r": 0, "cb": 0,
           "zk": 0, "a": 1.0, "d": [0.0] * 128, "U32": int, "I32": int,
           "cvt": lambda *v: 0, "fence_proxy_tensormap_acquire": lambda m: None,
           "bulk_wait_read": wait_read, "bulk_wait": wait_read, "bar_sync": lambda *v: None,
           "fence_proxy_async": lambda: None, "st_shared_u32": write,
           "st_shared_v2_f32": write, "tma_store_3d": store, "bulk_commit": lambda: None}
    exec("\n".join(lines), env)
    assert len(set(seen)) == 2 and not pending


def test_skinny_tile_splits_the_columns_between_the_consumers():
    """SKINNY_TILE (64 x 256, wgmma_stage.py): both consumer warpgroups read the stage's
    64 rows of A and their own 128 columns of B (K-major rows or MN-major boxes at
    w * 16 KB), hold 64 accumulators (m64n128), place their pairs at columns n0 + 128 w,
    and their TMA stores start there; 5 stages fit (40 KB each), 4 beside TMA stores'
    staging, which gemm() drops to."""
    name, src = W.source("bf16", True, False, True, "gelu", False, own_maps=True,
                         tile=(256, 4, 64), store=True)
    assert name == "wgmma_gemm_bf16_km_b_gelu_om_ts_m64n256s4"
    assert src.count("F32(0), ") == 64 and src.count("d = mma(") == 4
    assert "                sa = base + s * 40960\n" in src
    assert "                sb = base + s * 40960 + 8192 + w * 16384\n" in src
    assert "            r = m0 + 16 * (i // 32) + (i % 32) // 4\n" in src
    assert "            cb = n0 + w * 128 + 2 * (i % 4)\n" in src
    stores = re.findall(r"tma_store_3d\(map_c, I32\((.+?)\), I32\((.+?)\),", src)
    assert stores == [("n0 + w * 128 + 0", "m0"), ("n0 + w * 128 + 64", "m0")]
    assert src.count("tma_load_3d(") == 1 + 4  # A: one K-major box; B: 4 MN-major boxes
    assert W.shared_bytes(256, 5, False, 64) <= W.MAX_SHARED < W.shared_bytes(256, 5, True, 64)
    assert W.shared_bytes(256, 4, True, 64) <= W.MAX_SHARED
    _, plain = W.source("bf16", True, True, False, None, False)
    assert "            cb = n0 + 2 * (i % 4)\n" in plain and "w * 16384" not in plain


def test_lean_tile_schedule_is_the_same_schedule():
    """tile_order.py: the lean tile_of (uint32 arithmetic) and chunk lines, run as
    Python on the generated source, give every tile index the same (zk, m0, n0), matrix
    z and first k as the int64 version, and each tile of each matrix and chunk once."""
    from nbdnn.cuda.matmul.tensor_core_gemm import tile_order as T

    class _Jit:
        @staticmethod
        def jit(device=True):
            return lambda f: f

    def build(lean):
        ns = {"cuda": _Jit, "U32": lambda x: int(x) & 0xFFFFFFFF, "I": int, "F32": float}
        exec("\n".join(T.helper_lines(64, 256, lean)), ns)
        body = "\n".join(["def chunk(zk, nz, ksplit):"] + T.chunk_lines("    ", lean) +
                         ["    return z, k0"])
        exec(body, ns)
        return ns["tile_of"], ns["chunk"]
    plain, lean = build(False), build(True)
    for tm, tn, nz, splits, group in ((1, 16, 1, 4, 8), (5, 3, 2, 3, 8), (9, 7, 3, 1, 4),
                                      (2, 40, 1, 8, 1)):
        seen = set()
        for t in range(tm * tn * nz * splits):
            got = [f[0](t, tm, tn, group) for f in (plain, lean)]
            assert got[0] == got[1]
            zk = got[0][0]
            assert plain[1](zk, nz, 512) == lean[1](zk, nz, 512)
            seen.add(got[0])
        assert len(seen) == tm * tn * nz * splits
    lines = T.batch_lines("", True)
    assert lines == ["za = I32(offs[2 * z]) if nz > 1 else I32(0)",
                     "zb = I32(offs[2 * z + 1]) if nz > 1 else I32(0)"]


def test_each_tile_element_has_one_accumulator():
    """The consumers' fragment places (wgmma_stage.place_lines) with the direct
    epilogue's column pairs cb + 8 j (j < columns / 8) and rows r, r + 8: for the
    128 x 256 tile (a warpgroup 64 rows) and the skinny 64 x 256 (128 columns each),
    the 256 threads' pairs cover the tile once."""
    from nbdnn.cuda.matmul.tensor_core_gemm import wgmma_stage as WS
    for bm, nw in ((128, 256), (64, 128)):
        lines = WS.place_lines(bm, 256)
        seen = set()
        for w in range(2):
            for i in range(128):
                ns = {"m0": 0, "n0": 0, "w": w, "i": i}
                for line in lines:
                    exec(line.strip(), ns)
                for j in range(nw // 8):
                    for row in (ns["r"], ns["r"] + 8):
                        for col in (ns["cb"] + 8 * j, ns["cb"] + 8 * j + 1):
                            assert (row, col) not in seen
                            seen.add((row, col))
        assert seen == {(r, c) for r in range(bm) for c in range(256)}


def test_tile_width_takes_the_fewest_waves(monkeypatch):
    """split_k.tile_width: with 192 among the widths, a grid of 128-row tiles takes the
    width whose waves x width is least on 132 SMs: 1000 x 3000 (96 tiles of 256, one
    wave a quarter empty; 128 of 192, one full wave) takes 192, and two of them too (two
    waves either way); 4096 and 4000 square (4 waves of 256 against 6 of 192) and 512 x
    8192 (one wave of 256 against two of 192) keep 256; 256 alone (as before)
    always 256.
    A 192-wide kernel's source: 3 TMA boxes of an MN-major B, 3 TMA stores for a
    consumer's 192 columns."""
    from nbdnn.cuda.matmul.tensor_core_gemm import split_k
    monkeypatch.setattr(split_k, "sm_count", lambda: 132)
    monkeypatch.setattr(split_k, "NARROW", False)  # (its widths: the test below)
    monkeypatch.setattr(split_k, "WIDTHS", (256,))
    assert split_k.tile_width(8, 3000, 1) == 256
    monkeypatch.setattr(split_k, "WIDTHS", (256, 192))
    assert split_k.tile_width(8, 3000, 1) == 192
    assert [split_k.tile_width(rt, n, 1) for rt, n in ((32, 4096), (32, 4000), (4, 8192))] == \
        [256, 256, 256]
    assert split_k.tile_width(8, 3000, 2) == 192  # (two waves either way: 192 of 256, 256 of 192)
    name, src = W.source("bf16", True, False, False, None, False, own_maps=True,
                         tile=(192, 4), store=True, lean=True)
    assert name.endswith("_n192s4") and src.count("tma_store_3d(") == 3
    assert src.count("tma_load_3d(U32(sb + ") == 3 and "sb = sa + 16384" in src


def test_narrow_widths_for_narrow_n(monkeypatch):
    """split_k.NARROW (on): 128 and 64 join the widths, ranked by waves x (128 + width) on
    132 SMs: N = 64 over 784 row tiles (a 1x1 convolution's 64 filters at batch 32)
    takes 64 (192 without NARROW), N = 128 over 196 row tiles 128 (2 waves of 128 + 128
    against 3 of 128 + 64), and 4096^2 and 1000 x 3000 keep 256 and 192."""
    from nbdnn.cuda.matmul.tensor_core_gemm import split_k
    monkeypatch.setattr(split_k, "sm_count", lambda: 132)
    monkeypatch.setattr(split_k, "NARROW", False)
    assert split_k.tile_width(784, 64, 1) == 192
    monkeypatch.setattr(split_k, "NARROW", True)
    assert [split_k.tile_width(rt, n, 1) for rt, n in ((784, 64), (196, 128), (32, 4096),
                                                       (8, 3000))] == [64, 128, 256, 192]


def test_split_k_chunks(monkeypatch):
    """split_k.split on 132 SMs: no split for a grid of half the SMs or more, or a K
    under two chunks; otherwise chunks of at least MIN_CHUNK that fill the SMs (64 x
    4096 x 4096's 16 tiles: 4 chunks of 1024, K-bound; 32 tiles of 8192: 5 chunks, 160
    blocks) or, ONE_WAVE (shipped), as many as one wave holds (32 tiles: 4,
    128 blocks)."""
    from nbdnn.cuda.matmul.tensor_core_gemm import split_k
    monkeypatch.setattr(split_k, "sm_count", lambda: 132)
    monkeypatch.setattr(split_k, "ONE_WAVE", False)
    assert split_k.split(66, 8192, 64) == (1, 8192) and split_k.split(8, 2000, 64) == (1, 2048)
    assert split_k.split(16, 4096, 64) == (4, 1024)
    assert split_k.split(32, 8192, 64) == (5, 1664)
    monkeypatch.setattr(split_k, "ONE_WAVE", True)
    assert split_k.split(32, 8192, 64) == (4, 2048) and split_k.split(16, 4096, 64) == (4, 1024)
    assert split_k.split(64, 8192, 64) == (2, 4096)
    # a filter gradient's few tiles over a long reduction: past MAX_SPLITS (16), as
    # many as one wave and SPLIT_BYTES hold (3 tiles: 44 chunks; 1 tile: 98, K-bound)
    assert split_k.split(3, 100352, 64) == (44, 2304)
    assert split_k.split(1, 100352, 64) == (98, 1024)
    assert split_k.split(8, 100352, 64)[0] == 16  # (8 tiles x 16 chunks = 32 MiB)


def test_tf32_parts_vector_variant_matches(monkeypatch):
    """tf32_parts' variant 4 (VECTOR: float4 loads and stores) writes what variant 3
    writes, for both operand layouts, one and three parts (tf32, 3xtf32), ragged tiles
    and a batch; where x's contiguous extent is not a multiple of 4 it falls back to
    variant 3 (the kernel names say which ran)."""
    from numba import cuda
    from nbdnn.cuda.matmul import tf32_parts as T
    from nbdnn.cuda.runtime.launch.kernel import launched
    rng = np.random.default_rng(29)
    for shape, k_last in (((2, 12, 20), True), ((3, 9, 16), False), ((9, 14), False)):
        x = rng.standard_normal(shape).astype(np.float32)
        for which, mode in ((1, "tf32"), (0, "3xtf32")):
            got = {}
            for vec in (False, True):
                monkeypatch.setattr(T, "VECTOR", vec)
                with launched() as names:
                    got[vec] = T.operand(cuda.to_device(x), k_last, which, mode, 0).copy_to_host()
                contiguous = shape[-1]
                assert ("_v4_" in names[0]) == (vec and contiguous % 4 == 0), names
            np.testing.assert_array_equal(got[True], got[False])
    assert np.count_nonzero(got[True]) > 0


def test_gemm_plans_its_launches(monkeypatch):
    """wgmma_gemm.gemm's host side without a GPU (tensor maps, arrays and kernels faked,
    132 SMs): which kernel variant, grid and shared memory each product gets. 4096^3:
    one persistent wave of 128 x 256 tiles through TMA stores; 64 x 4096 x 4096: the
    64-row tile's split-K chunks, then the ordered sum, and 128 x 4096 x 4096 too (two
    64-row tiles a column: SKINNY_ROWS 128), 4 chunks (ONE_WAVE); WIDTHS (256, 192):
    1000 x 3000 in 128 tiles of 192."""
    from nbdnn.cuda.matmul.tensor_core_gemm import split_k
    launches = []

    class Fake:
        def __init__(self, *args, **kw):
            self.args, self.kw, self.sigs = args, kw, ["sig"]

        def launch(self, sig, grid, block, stream, *args, shmem=0, owners=()):
            launches.append((self.kw, grid, shmem))

    monkeypatch.setattr(W, "encoded", lambda *a: ("map", "template"))
    monkeypatch.setattr(W, "empty", lambda c, shape, dtype: np.zeros(shape, dtype))
    monkeypatch.setattr(W, "ptr", lambda x: 256)
    monkeypatch.setattr(W, "sm_count", lambda: 132)
    monkeypatch.setattr(split_k, "sm_count", lambda: 132)
    monkeypatch.setattr(W, "kernel", Fake)
    monkeypatch.setattr(W, "splitk_sum", lambda dtype: (Fake(sum=True), "sig"))

    def plan(M, N, K):
        launches.clear()
        a, b = np.zeros((M, K), np.float16), np.zeros((K, N), np.float16)
        W.gemm(a, b, np.zeros((M, N), np.float16), False, False, None, None, 0.0, 1.0, 0.0, 0)
        return [({k: kw.get(k) for k in ("partial", "tile", "store", "sum")}, grid)
                for kw, grid, _ in launches]

    assert plan(4096, 4096, 4096) == [({"partial": False, "tile": (256, 4), "store": True,
                                        "sum": None}, 132)]
    skinny = plan(64, 4096, 4096)
    assert skinny[0] == ({"partial": True, "tile": (256, 4, 64), "store": True, "sum": None},
                         64) and skinny[1][0]["sum"]
    assert plan(128, 4096, 4096)[0] == ({"partial": True, "tile": (256, 4, 64), "store": True,
                                         "sum": None}, 128)
    assert plan(1000, 3000, 2040) == [({"partial": False, "tile": (192, 4), "store": True,
                                        "sum": None}, 128)]

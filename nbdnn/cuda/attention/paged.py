"""paged_attention on the GPU: attention of a few query rows against key and value caches
held in pages (nbdnn/cpu/attention.py's paged_attention has the meaning). The keys of
batch entry b are found through its block-table row: key j lives in page
table[b, j // P], row j % P:

    k_cache (pages, P, Hk, D)     page p: P consecutive keys of every kv head
    table   (B, W)                b's pages in order; W P keys at most a sequence
    key j of b  ->  k_cache[table[b, j // P], j % P, hk, :]

The grid and the workspace follow the table's capacity W P, not the lengths: the
lengths and the table are read on the device only, so a call can be captured in a CUDA
graph once and replayed as the sequences grow (the caller updates both in place).
Kernels: decode.py's flash-decoding, its part kernels in their paged form (keys in
chunks over blocks, each key's rows through the table once a tile), its combine kernel:
- decode_split (decode_split.py, paged): 16-bit, D = Dv in 64 and 128, up to
  MAX_ROWS[D] query rows a kv head, 16-byte loads;
- decode (decode.py's "paged_part"): every other call, a thread a key.
Traffic: what the unpaged kernels move, plus one table entry (8 bytes) a key a tile;
decode_split stops each chunk at its sequence's length (no tile past it is loaded), so
a table's spare capacity costs blocks that exit early, not bytes. Bottom-right causal
rows (is_causal) take simt.key_range's mode 2."""
import dataclasses

from ..runtime import variants
from ..runtime.device import sm_count
from ..runtime.memory.arrays import dtype_name, empty
from ..runtime.variants import Variant
from . import decode, decode_split
from .geometry import MODES, NO_DROPOUT, Geometry, alibi_fields, band, strides


@dataclasses.dataclass
class Call:
    """One validated call as the variants take it: table (B W,) and lens (B,) int64,
    geo the Geometry (Sk the table's capacity W P; k and v as "BSHD" (pages, P, Hk, D):
    kb the page stride, kh D, kj a row's)."""
    q: object
    k: object
    v: object
    table: object
    lens: object
    geo: Geometry
    P: int
    W: int
    pages: int
    stream: object

    @property
    def paging(self):
        """The paged kernels' last arguments."""
        return self.table, self.P, self.W, self.pages

    def workspaces(self, chunks):
        """(ws_o, ws_ml) for `chunks` chunks a row (decode.py's layout)."""
        g = self.geo
        ct = "float64" if dtype_name(self.q) == "float64" else "float32"
        rows = g.B * g.Hq * g.Sq
        return tuple(empty(self.q, (rows * chunks * n,), ct) for n in (g.Dv, 2))

    def stand_ins(self):
        """(ma, mb, lens_q): arrays the kernels take and never read here (no mask, no
        query lengths)."""
        return self.q, empty(self.q, (1,), "uint8"), self.lens


def _split_usable(c):
    g = c.geo
    return decode_split.usable(c.q, g.G, g.Sq, g.D, g.Dv, c.k, c.v, g)


def _split(c):
    g = c.geo
    chunks = decode_split.chunking(g.B, g.Hq // g.G, g.Sk, sm_count())[0]
    ws = c.workspaces(chunks)
    ma, mb, lq = c.stand_ins()
    decode_split.forward(c.q, c.k, c.v, ws, ma, mb, lq, c.lens, g, c.stream, c.paging)
    return ws, chunks


def _generic(c):
    g = c.geo
    chunks = -(-g.Sk // decode.CHUNK)
    ws = c.workspaces(chunks)
    kern, sig = decode.KERNELS["paged_part", dtype_name(c.q)]
    kern.launch(sig, g.B * (g.Hq // g.G) * chunks, decode.CHUNK, c.stream, c.q, c.k, c.v,
                *ws, *c.stand_ins(), c.lens, *g, *c.paging)
    return ws, chunks


PAGED = (  # in order of preference; run(c) launches a part kernel: (workspaces, chunks)
    Variant("decode_split", _split_usable, _split,
            "decode_split.py (paged): 16-bit at D 64 and 128, 16-byte loads, a thread a key"),
    Variant("decode", lambda c: True, _generic,
            "decode.py's paged_part: every dtype and head dim, a thread a key"),
)


def paged_attention(q, k_cache, v_cache, table, lens, is_causal, scale, layout, window=None,
                    softcap=0.0, *, out, stream):
    """(o, lse), validated by the front end; table (B, W) and lens (B,) int64 (the
    backend's entry widens int32 ones on the device)."""
    dtype = dtype_name(q)
    B, Hq, Sq, D = (int(s) for s in q.shape) if layout == "BHSD" else \
        (int(q.shape[0]), int(q.shape[2]), int(q.shape[1]), int(q.shape[3]))
    pages, P, Hk, _ = (int(s) for s in k_cache.shape)
    Dv, W = int(v_cache.shape[3]), int(table.shape[1])
    o_shape = (B, Hq, Sq, Dv) if layout == "BHSD" else (B, Sq, Hq, Dv)
    o = out if out is not None else empty(q, o_shape, dtype)
    lse = empty(q, (B, Hq, Sq), "float64" if dtype == "float64" else "float32")
    if not B * Hq * Sq:
        return o, lse
    geo = Geometry(B, Hq, Hq // Hk, Sq, W * P, D, Dv, *strides(q.shape, layout),
                   *strides(k_cache.shape, "BSHD"), *strides(v_cache.shape, "BSHD"),
                   *strides(o_shape, layout), 0, 0, 0, 0, 0, 0, 1, 2 if is_causal else 0,
                   float(scale), MODES["ieee"], NO_DROPOUT, 1.0, 0, 0, 0, 0,
                   *band(2 if is_causal else 0, window), float(softcap),
                   *alibi_fields(q, None, 0, Hq))
    c = Call(q, k_cache, v_cache, table.reshape((B * W,)), lens, geo, P, W, pages, stream)
    (ws_o, ws_ml), chunks = variants.choose("attention", "paged_attention", PAGED, c).run(c)
    kern, sig = decode.KERNELS["combine", dtype]
    kern.launch(sig, B * Hq * Sq, decode.CHUNK, stream, ws_o, ws_ml, o, lse, Hq, Sq, chunks,
                Dv, *geo.o_strides)
    return o, lse

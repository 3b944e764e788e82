"""scaled_dot_product_attention on the GPU. Kernels, one module each:
- simt.py: the exact path on the CUDA cores (every dtype and math mode, both layouts,
  masks, causal bands of either alignment and sliding windows, logit caps, ALiBi,
  grouped-query heads, dropout, variable lengths; the simulator runs it): a thread a
  query row (forward, dq), a thread a key row (dk, dv).
- flash.py (flash_source.py): the tensor-core forward for 16-bit q, k, v at head dims
  64 and 128, any mask, dropout where Sk % 4 == 0, any causal band, logit caps (wgmma,
  TMA; sm_90), ALiBi; flash_bwd.py
  (flash_bwd_source.py): its backward (dK and dV, then dQ by a second pass: deterministic).
- flash_tf32.py: float32's forward in "tf32" / "3xtf32" fused on the tensor cores
  (mma.sync m16n8k8, online softmax; flash.py's features; 3xtf32 past D 64 on
  gemm.py, which is faster there).
- gemm.py: GEMMs around row kernels, the scores in a workspace (nbdnn.cuda.matmul), for
  float32 in every math mode, and the 16-bit calls flash.py does not take (dropout
  with Sk % 4 != 0, other head dims: TF32 tensor cores, exact on 16-bit values); no
  seq_lens, no logit cap, no ALiBi.
- decode.py: the forward for Sq <= 16 queries against >= decode.MIN_KEYS keys
  (flash-decoding: the keys split over blocks, the chunks combined by log-sum-exp);
  every feature of the exact path. decode_split.py: its part kernel for 16-bit data at
  D 64 and 128, every feature but sliding windows, logit caps and ALiBi (16-byte loads,
  a thread a key).
- paged.py: paged_attention, both part kernels reading a paged cache through its block
  table (PAGED: decode_split where it takes the call, else decode).
geometry.py names a call as the kernels see it (Geometry). FORWARD and BACKWARD below
declare the variants, the first usable one runs a call; `forced(name)` makes a test or
a benchmark run one (NotSupportedError where it cannot take the call)."""
import dataclasses

from ..runtime.memory.arrays import dtype_name, empty
from ..runtime.device import sm_count
from ..runtime import variants
from ..runtime.variants import Variant
from ..runtime.simulator import SIMULATOR
from . import decode, decode_split, flash, flash_bwd, flash_tf32, gemm, paged, simt
from .geometry import geometry

BLOCK = 32 if SIMULATOR else 128


@dataclasses.dataclass
class Call:
    """One validated call's arrays and geometry, as the variants take it. Forward: o and
    lse are the outputs; backward: do, dl (the rows' delta) and the gradients too."""
    q: object
    k: object
    v: object
    o: object
    lse: object
    attn_mask: object
    dropout_p: float
    layout: str
    math: str
    stream: object
    geo: tuple = None
    ma: object = None   # the mask as the kernels read it: additive values (ma) or bools (mb)
    mb: object = None
    lq: object = None   # int64 sequence lengths (a 1-element stand-in when none)
    lk: object = None
    do: object = None
    dl: object = None
    grads: tuple = ()   # (dq, dk, dv)

    @property
    def dtype(self):
        return dtype_name(self.q)


def _mask_arrays(ref, attn_mask):
    """(ma, mb): an additive mask is read from ma, a boolean one from mb; the other is a
    stand-in the kernels never read."""
    if attn_mask is None:
        return ref, empty(ref, (1,), "uint8")
    if dtype_name(attn_mask) == "bool":
        return ref, attn_mask
    return attn_mask, empty(ref, (1,), "uint8")


def _lengths(ref, lens, stream):
    """(int64 lengths, present) for the kernels."""
    if lens is None:
        return empty(ref, (1,), "int64"), 0
    if dtype_name(lens) == "int64":
        return lens, 1
    n = int(lens.shape[0])
    wide = empty(ref, (max(n, 1),), "int64")
    if n:
        k, sig = simt.KERNELS["lengths64"]
        k.launch(sig, -(-n // BLOCK), BLOCK, stream, lens, wide, n)
    return wide, 1


def _prepare(c, seq_lens_q, seq_lens_k, is_causal, scale, seed, offset, window, softcap,
             slopes, alibi):
    """Fill c's geometry, mask and length arrays."""
    c.ma, c.mb = _mask_arrays(c.q, c.attn_mask)
    c.lq, has_lq = _lengths(c.q, seq_lens_q, c.stream)
    c.lk, has_lk = _lengths(c.q, seq_lens_k, c.stream)
    c.geo = geometry(c.q, c.k, c.v, c.o, c.attn_mask, c.dropout_p, is_causal, scale, seed,
                     offset, c.layout, has_lq, has_lk, c.math, window, softcap, slopes, alibi)


# ---- the forward's variants, in order of preference
def _decode_usable(c):
    return decode.usable(c.geo.Sq, c.geo.Sk, c.geo.G)


def _split_usable(c):
    g = c.geo
    return _decode_usable(c) and decode_split.usable(c.q, g.G, g.Sq, g.D, g.Dv, c.k, c.v, g)


def _decode(c, split):
    """Flash-decoding: the keys in chunks over blocks (part kernels), each row's chunks
    combined by their log-sum-exp."""
    g = c.geo
    rows = g.B * g.Hq * g.Sq
    chunks = decode_split.chunking(g.B, g.Hq // g.G, g.Sk, sm_count())[0] if split else \
        -(-g.Sk // decode.CHUNK)
    ct = "float64" if c.dtype == "float64" else "float32"
    ws_o, ws_ml = (empty(c.q, (rows * chunks * n,), ct) for n in (g.Dv, 2))
    if split:
        decode_split.forward(c.q, c.k, c.v, (ws_o, ws_ml), c.ma, c.mb, c.lq, c.lk, g, c.stream)
    else:
        kern, sig = decode.KERNELS["part", c.dtype]
        kern.launch(sig, g.B * (g.Hq // g.G) * chunks, decode.CHUNK, c.stream, c.q, c.k, c.v,
                    ws_o, ws_ml, c.ma, c.mb, c.lq, c.lk, *g, c.lk, 1, 1, 0)  # (no pages)
    kern, sig = decode.KERNELS["combine", c.dtype]
    kern.launch(sig, rows, decode.CHUNK, c.stream, ws_o, ws_ml, c.o, c.lse, g.Hq, g.Sq, chunks,
                g.Dv, *g.o_strides)


def _gemm_usable(c):
    return gemm.usable(c.dtype, c.geo.Sq, c.geo.Sk, *c.geo.lengths) and not c.geo.softcap and \
        not c.geo.alibi


def _simt_forward(c):
    kern, sig = simt.KERNELS["forward", c.dtype]
    rows = c.geo.B * c.geo.Hq * c.geo.Sq
    kern.launch(sig, -(-rows // BLOCK), BLOCK, c.stream, c.q, c.k, c.v, c.o, c.lse, c.ma, c.mb,
                c.lq, c.lk, *c.geo)


FORWARD = (
    Variant("decode_split", _split_usable, lambda c: _decode(c, True),
            "decode_split.py: Sq <= 16 queries against >= 1024 keys, 16-bit at D 64 and 128, "
            "16-byte loads, a thread a key"),
    Variant("decode", _decode_usable, lambda c: _decode(c, False),
            "decode.py: Sq <= 16 queries against >= 1024 keys, every dtype and feature"),
    Variant("flash", lambda c: flash.usable(c.q, c.k, c.v, c.geo),
            lambda c: flash.forward(c.q, c.k, c.v, c.o, c.lse, c.lq, c.lk, c.mb, c.ma,
                                    c.geo, c.layout, c.stream),
            "flash.py: 16-bit at D 64 and 128, any mask, dropout where Sk % 4 == 0, wgmma "
            "and TMA (sm_90)"),
    Variant("flash_tf32", lambda c: flash_tf32.usable(c.dtype, c.math, c.geo.D, c.geo.Dv,
                                                      _gemm_usable(c)),
            lambda c: flash_tf32.forward(c.q, c.k, c.v, c.o, c.lse, c.ma, c.mb, c.lq, c.lk,
                                         c.geo, c.math, c.stream),
            "flash_tf32.py: float32 in tf32 / 3xtf32 fused on mma.sync (3xtf32 past D 64: "
            "gemm's where it takes the call)"),
    Variant("gemm", _gemm_usable,
            lambda c: gemm.forward(c.q, c.k, c.v, c.o, c.lse, c.ma, c.mb, c.geo, c.layout,
                                   c.math, c.stream),
            "gemm.py: the scores in a workspace between matmul's GEMMs, no seq_lens, at "
            "least 64 x 64 scores a head"),
    Variant("simt", lambda c: True, _simt_forward,
            "simt.py: the exact kernels, every call (a thread a query row)"),
)


# ---- the backward's variants
def _simt_backward(c):
    g = c.geo
    dq, dk, dv = c.grads
    rows, keys = g.B * g.Hq * g.Sq, g.B * (g.Hq // g.G) * g.Sk
    if rows:
        kern, sig = simt.KERNELS["grad_q", c.dtype]
        kern.launch(sig, -(-rows // BLOCK), BLOCK, c.stream, c.do, c.q, c.k, c.v, c.lse, c.dl,
                    dq, c.ma, c.mb, c.lq, c.lk, *g)
    if keys:
        kern, sig = simt.KERNELS["grad_kv", c.dtype]
        kern.launch(sig, -(-keys // BLOCK), BLOCK, c.stream, c.do, c.q, c.k, c.v, c.lse, c.dl,
                    dk, dv, c.ma, c.mb, c.lq, c.lk, *g)


BACKWARD = (
    Variant("flash", lambda c: flash_bwd.usable(c.q, c.k, c.v, c.geo, (c.do,)),
            lambda c: flash_bwd.backward(c.do, c.q, c.k, c.v, c.lse, c.dl, *c.grads, c.lq,
                                         c.lk, c.mb, c.ma, c.geo, c.layout, c.stream),
            "flash_bwd.py: flash's calls; dK and dV a block of 128 keys, then dQ"),
    Variant("gemm", _gemm_usable,
            lambda c: gemm.backward(c.do, c.q, c.k, c.v, c.lse, c.dl, *c.grads, c.ma, c.mb,
                                    c.geo, c.layout, c.math, c.stream),
            "gemm.py: five GEMMs around a row kernel, the forward's calls"),
    Variant("simt", lambda c: True, _simt_backward,
            "simt.py: the exact kernels (a thread a query row for dq, a key row for dk, dv)"),
)



def forced(name):
    """Inside (this thread): calls run the variant `name` (forward and backward, where
    each table has one by that name) or raise NotSupportedError where its kernels cannot
    take a call (runtime/variants.py)."""
    return variants.forced("attention", name, variants.names(FORWARD, BACKWARD,
                                                            paged.PAGED))


def choose(table, c):
    """The variant of `table` that runs call c."""
    return variants.choose("attention", "scaled_dot_product_attention", table, c)


def scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale,
                                 enable_gqa, seed, offset, layout, seq_lens_q, seq_lens_k,
                                 math="ieee", window=None, softcap=0.0, alibi_slopes=None,
                                 alibi_code=0, *, out=None, stream=0):
    """(o, lse) (nbdnn/cpu/attention.py); validated by the front end."""
    dtype = dtype_name(q)
    o_shape = tuple(int(s) for s in q.shape[:3]) + (int(v.shape[3]),)
    o = out if out is not None else empty(q, o_shape, dtype)
    c = Call(q, k, v, o, None, attn_mask, dropout_p, layout, math, stream)
    _prepare(c, seq_lens_q, seq_lens_k, is_causal, scale, seed, offset, window, softcap,
             alibi_slopes, alibi_code)
    g = c.geo
    c.lse = empty(q, (g.B, g.Hq, g.Sq), "float64" if dtype == "float64" else "float32")
    if g.B * g.Hq * g.Sq:
        choose(FORWARD, c).run(c)
    return o, c.lse


def scaled_dot_product_attention_backward(do, q, k, v, o, lse, attn_mask, dropout_p,
                                          is_causal, scale, enable_gqa, seed, offset,
                                          layout, seq_lens_q, seq_lens_k, math="ieee",
                                          window=None, softcap=0.0, alibi_slopes=None,
                                          alibi_code=0, *, out=None, stream=0):
    """(dq, dk, dv): the rows' delta = rowsum(do o), then the chosen variant."""
    dtype = dtype_name(q)
    grads = out if out is not None else tuple(
        empty(q, tuple(int(s) for s in t.shape), dtype) for t in (q, k, v))
    c = Call(q, k, v, o, lse, attn_mask, dropout_p, layout, math, stream, do=do, grads=grads)
    _prepare(c, seq_lens_q, seq_lens_k, is_causal, scale, seed, offset, window, softcap,
             alibi_slopes, alibi_code)
    g = c.geo
    rows, keys = g.B * g.Hq * g.Sq, g.B * (g.Hq // g.G) * g.Sk
    c.dl = empty(q, (max(rows, 1),), "float64" if dtype == "float64" else "float32")
    if rows:
        kern, sig = simt.KERNELS["delta", dtype]
        kern.launch(sig, -(-rows // BLOCK), BLOCK, stream, do, o, c.dl, g.B, g.Hq, g.Sq, g.Dv,
                    *g.o_strides)
    if rows and keys:
        choose(BACKWARD, c).run(c)
    elif rows or keys:  # (the gradients of an empty side's partners: zeros)
        _simt_backward(c)
    return grads


def paged_attention(q, k_cache, v_cache, block_table, seq_lens_k, is_causal, scale, layout,
                    window=None, softcap=0.0, *, out=None, stream=0):
    """(o, lse) (nbdnn/cpu/attention.py); validated by the front end. The block table and
    the lengths widened to int64 on the device (no host read: graph-safe)."""
    B, W = (int(s) for s in block_table.shape)
    if B == 0:
        return paged.paged_attention(q, k_cache, v_cache, block_table, seq_lens_k, is_causal,
                                     scale, layout, window, softcap, out=out, stream=stream)
    table, _ = _lengths(q, block_table.reshape((B * W,)), stream)
    lens, _ = _lengths(q, seq_lens_k, stream)
    return paged.paged_attention(q, k_cache, v_cache, table.reshape((B, W)), lens, is_causal,
                                 scale, layout, window, softcap, out=out, stream=stream)

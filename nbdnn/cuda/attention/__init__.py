"""scaled_dot_product_attention on the GPU (issue 25). Kernels, one module each:
- simt.py: the exact path on the CUDA cores (every dtype and math mode, both layouts,
  masks, causal, grouped-query heads, dropout, variable lengths; the simulator runs
  it): a thread a query row (forward, dq), a thread a key row (dk, dv).
- flash.py (flash_source.py): the tensor-core forward for 16-bit q, k, v at head dims
  64 and 128 without a mask or dropout (wgmma, TMA; sm_90); flash_bwd.py
  (flash_bwd_source.py): its backward (dK and dV, then dQ by a second pass: deterministic).
- flash_tf32.py: float32's forward in "tf32" / "3xtf32" fused on the tensor cores
  (mma.sync m16n8k8, online softmax; 3xtf32 past D 64 on gemm.py, which is faster there).
- gemm.py: GEMMs around row kernels, the scores in a workspace (nbdnn.cuda.matmul), for
  float32 in every math mode; no seq_lens. With gemm.HALF (on since run AT) also
  the 16-bit calls flash.py does not take (masks, dropout, other head dims:
  TF32 tensor cores, exact on 16-bit values).
- tiled.py, tiled_bwd.py: the forward and backward on the CUDA cores in 32 x 32 tiles
  (float32 compute; off until they have run on a GPU: tiled.ON).
- decode.py: the forward for Sq <= 16 queries against >= decode.MIN_KEYS keys
  (flash-decoding: the keys split over blocks, the chunks combined by log-sum-exp);
  every feature of the exact path. decode_split.py: its part kernel for 16-bit data at
  D 64 and 128, every feature (16-byte loads, a thread a key).
The launchers below turn the call into the kernels' geometry: each tensor's (batch,
head, row) strides in its layout, the mask's broadcast strides, the dropout stream."""
import numpy as np

from ..runtime.arrays import dtype_name, empty
from ..runtime.device import sm_count
from ..runtime.simulator import SIMULATOR
from ...cpu.dropout import MASK32, keep_threshold
from . import decode, decode_split, flash, flash_bwd, flash_tf32, gemm, simt, tiled, tiled_bwd

BLOCK = 32 if SIMULATOR else 128
MODES = {"ieee": 0, "tf32": 1, "3xtf32": 2}


def _strides(shape, layout):
    """(batch, head, row) element strides of a C-contiguous 4-d tensor in `layout`."""
    B, a, b, D = (int(s) for s in shape)
    return (a * b * D, b * D, D) if layout == "BHSD" else (a * b * D, D, b * D)


def _mask(ref, attn_mask, full):
    """(ma, mb, kind, strides): the mask as the kernels read it (kind 0 none, 1 bool in
    mb, 2 additive in ma), its element strides over (B, Hq, Sq, Sk), 0 on broadcast axes."""
    if attn_mask is None:
        return ref, empty(ref, (1,), "uint8"), 0, (0, 0, 0, 0)
    ms = (1,) * (4 - len(attn_mask.shape)) + tuple(int(s) for s in attn_mask.shape)
    st, run = [], 1
    for n in ms[::-1]:
        st.append(run if n != 1 else 0)
        run *= n
    st = tuple(st[::-1])
    if dtype_name(attn_mask) == "bool":
        return ref, attn_mask, 1, st
    return attn_mask, empty(ref, (1,), "uint8"), 2, st


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


def _geometry(q, k, v, o, attn_mask, dropout_p, is_causal, scale, seed, offset, layout,
              seq_lens_q, seq_lens_k, math, stream):
    """(mask and length arrays, the geometry scalars: simt.geometry_types)."""
    B, Hq, Sq, D = (int(s) for s in q.shape) if layout == "BHSD" else \
        (int(q.shape[0]), int(q.shape[2]), int(q.shape[1]), int(q.shape[3]))
    Hk = int(k.shape[1] if layout == "BHSD" else k.shape[2])
    Sk = int(k.shape[2] if layout == "BHSD" else k.shape[1])
    Dv = int(v.shape[3])
    ma, mb, kind, ms = _mask(q, attn_mask, (B, Hq, Sq, Sk))
    lq, has_lq = _lengths(q, seq_lens_q, stream)
    lk, has_lk = _lengths(q, seq_lens_k, stream)
    thr = keep_threshold(dropout_p) if dropout_p > 0 else 1 << 32
    geo = (B, Hq, Hq // Hk, Sq, Sk, D, Dv, *_strides(q.shape, layout),
           *_strides(k.shape, layout), *_strides(v.shape, layout),
           *_strides(o.shape, layout), kind, *ms, has_lq, has_lk, int(is_causal),
           float(1 / np.sqrt(D) if scale is None else scale),  # (a NumPy scalar has a
           # shape: the simulator's launch would pass it as an array)
           MODES[math] if dtype_name(q) == "float32" else 0, thr, 1 / (1 - dropout_p),
           offset & MASK32, offset >> 32, seed & MASK32, seed >> 32)
    return (ma, mb, lq, lk), geo


def scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale,
                                 enable_gqa, seed, offset, layout, seq_lens_q, seq_lens_k,
                                 math="ieee", *, out=None, stream=0):
    """(o, lse) (nbdnn/cpu/attention.py); validated by the front end."""
    dtype = dtype_name(q)
    Dv = int(v.shape[3])
    o_shape = tuple(int(s) for s in q.shape[:3]) + (Dv,)
    o = out if out is not None else empty(q, o_shape, dtype)
    (ma, mb, lq, lk), geo = _geometry(q, k, v, o, attn_mask, dropout_p, is_causal, scale,
                                      seed, offset, layout, seq_lens_q, seq_lens_k, math,
                                      stream)
    B, Hq, Sq = geo[0], geo[1], geo[3]
    lse = empty(q, (B, Hq, Sq), "float64" if dtype == "float64" else "float32")
    rows = B * Hq * Sq
    G, Sk, Dv = geo[2], geo[4], geo[6]
    if rows and decode.usable(Sq, Sk, G):
        split = decode_split.usable(q, G, Sq, geo[5], Dv, k, v, geo)
        chunks = decode_split.chunking(B, Hq // G, Sk, sm_count())[0] if split else \
            -(-Sk // decode.CHUNK)
        ct = "float64" if dtype == "float64" else "float32"
        ws_o, ws_ml = empty(q, (rows * chunks * Dv,), ct), empty(q, (rows * chunks * 2,), ct)
        if split:
            decode_split.forward(q, k, v, (ws_o, ws_ml), ma, mb, lq, lk, geo, stream)
        else:
            kern, sig = decode.KERNELS["part", dtype]
            kern.launch(sig, B * (Hq // G) * chunks, decode.CHUNK, stream,
                        q, k, v, ws_o, ws_ml, ma, mb, lq, lk, *geo)
        kern, sig = decode.KERNELS["combine", dtype]
        kern.launch(sig, rows, decode.CHUNK, stream, ws_o, ws_ml, o, lse, Hq, Sq, chunks,
                    Dv, *geo[16:19])
    elif rows and flash.usable(q, k, v, attn_mask, dropout_p, geo[27], Sq, geo[5], Dv):
        flash.forward(q, k, v, o, lse, lq, lk, *geo[24:26], geo, layout, stream)
    elif rows and flash_tf32.usable(dtype, math, geo[5], Dv,
                                    gemm.usable(dtype, Sq, Sk, *geo[24:26])):
        flash_tf32.forward(q, k, v, o, lse, ma, mb, lq, lk, geo, math, stream)
    elif rows and gemm.usable(dtype, Sq, Sk, *geo[24:26]):
        gemm.forward(q, k, v, o, lse, ma, mb, geo, layout, math, stream)
    elif rows and tiled.usable(dtype, Dv):
        tiled.forward(q, k, v, o, lse, ma, mb, lq, lk, geo, stream)
    elif rows:
        kern, sig = simt.KERNELS["forward", dtype]
        kern.launch(sig, -(-rows // BLOCK), BLOCK, stream,
                    q, k, v, o, lse, ma, mb, lq, lk, *geo)
    return o, lse


def scaled_dot_product_attention_backward(do, q, k, v, o, lse, attn_mask, dropout_p,
                                          is_causal, scale, enable_gqa, seed, offset,
                                          layout, seq_lens_q, seq_lens_k, math="ieee", *,
                                          out=None, stream=0):
    """(dq, dk, dv): delta, then dq a query row a thread, then dk and dv a key row a
    thread (simt.py)."""
    dtype = dtype_name(q)
    dq, dk, dv = out if out is not None else tuple(
        empty(q, tuple(int(s) for s in t.shape), dtype) for t in (q, k, v))
    (ma, mb, lq, lk), geo = _geometry(q, k, v, o, attn_mask, dropout_p, is_causal, scale,
                                      seed, offset, layout, seq_lens_q, seq_lens_k, math,
                                      stream)
    B, Hq, G, Sq, Sk, D, Dv = geo[:7]
    ct = "float64" if dtype == "float64" else "float32"
    rows, keys = B * Hq * Sq, B * (Hq // G) * Sk
    dl = empty(q, (max(rows, 1),), ct)
    if rows:
        kern, sig = simt.KERNELS["delta", dtype]
        kern.launch(sig, -(-rows // BLOCK), BLOCK, stream, do, o, dl, B, Hq, Sq, Dv,
                    *geo[16:19])
    if rows and keys and flash_bwd.usable(q, k, v, attn_mask, dropout_p, geo[27], D, Dv,
                                          (do,)):
        flash_bwd.backward(do, q, k, v, lse, dl, dq, dk, dv, lq, lk, *geo[24:26], geo, layout,
                           stream)
        return dq, dk, dv
    if rows and keys and gemm.usable(dtype, Sq, Sk, *geo[24:26]):
        gemm.backward(do, q, k, v, lse, dl, dq, dk, dv, ma, mb, geo, layout, math, stream)
        return dq, dk, dv
    if rows and keys and tiled_bwd.usable(dtype, D, Dv):
        tiled_bwd.backward(do, q, k, v, lse, dl, dq, dk, dv, ma, mb, lq, lk, geo, stream)
        return dq, dk, dv
    if rows:
        kern, sig = simt.KERNELS["grad_q", dtype]
        kern.launch(sig, -(-rows // BLOCK), BLOCK, stream,
                    do, q, k, v, lse, dl, dq, ma, mb, lq, lk, *geo)
    if keys:
        kern, sig = simt.KERNELS["grad_kv", dtype]
        kern.launch(sig, -(-keys // BLOCK), BLOCK, stream,
                    do, q, k, v, lse, dl, dk, dv, ma, mb, lq, lk, *geo)
    return dq, dk, dv

"""The tensor-core backward of scaled_dot_product_attention (sm_90): flash_bwd_source.py
writes its two kernels, dK/dV a block of keys and dQ a block of queries, each
recomputing P from the forward's lse (FlashAttention-2's algorithm; dQ by a second pass
rather than atomics, so reruns are bit-identical). delta = rowsum(dO o) comes first,
from simt.py's delta kernel.

Where it runs (`usable`): flash.py's limits (16-bit, D = Dv = 64 or 128, any mask,
dropout where Sk % 4 == 0, positive scale, any band); otherwise gemm.py's or simt.py's kernels.

Measured (H200): tests/test_attention_flash.py's backward rows pass (every feature, both
head dims, bit-identical reruns), racecheck clean; bf16 backward 123-207 TFLOP/s,
0.48-0.62x cuDNN's (perf/RESULTS.md, "Attention"). CI compiles the kernels for sm_90a.
"""
import math

import numpy as np
from numba import types

from ..runtime.memory.arrays import dtype_name, ptr
from ..runtime.device_code.intrinsics import array_type
from ..runtime.launch.codegen import compile_source
from ..runtime.launch.kernel import Kernel
from ..tensorcore.tensormap import encoded
from ..tensorcore.wgmma import wgmma, wgmma_rs
from . import flash, flash_bwd_source as fb

STAGES = {64: 4, 128: 3}  # D -> streamed stages (flash_bwd_source.shared_bytes)
_TAIL = ("int64[::1], int64[::1], int64, int64, int64, int64, int64, int64, int64, int64, "
         "int64, int64, float32, float32, int64, int64, int64, ")


def sig(which, dtype):
    """4 tensor maps, lse and delta, the gradients' 16-bit pairs (dk and dv, or dq), the
    lengths .. the gradient's strides (the band's sides after causal), then the masks and
    dropout as flash.sig's."""
    grads = "uint32[::1], uint32[::1], " if which == "dkv" else "uint32[::1], "
    return "void(uint64, uint64, uint64, uint64, float32[::1], float32[::1], " + grads + \
        _TAIL + flash.FEATURE_TYPES.format(array_type(dtype)) + ")"


_KERNELS = {}


def kernel(which, dtype, D, masked=0, dropped=False, capped=False, alibi=False):
    """The "dkv" or "dq" Kernel for dtype and head dim D, with the mask's kind (0 none,
    1 boolean, 2 additive), dropout, the logit cap and ALiBi compiled in or not, built on
    first use."""
    key = which, dtype, D, masked, dropped, capped, alibi
    if key not in _KERNELS:
        kind = flash.KINDS[dtype]
        stages, st = STAGES[D], fb.step_of(which, D, dropped)
        name, src = (fb.dkv_source if which == "dkv" else fb.dq_source)(kind, D, stages,
                                                                         (masked, dropped,
                                                                          capped, alibi))
        ns = dict(flash.namespace(kind), mma_s=wgmma(st, kind),
                  mma_rs=wgmma_rs(D, kind, 1),
                  LOG2E=types.float32(math.log2(math.e)), INF=types.float32(np.inf))
        fn = compile_source(name, src, ns, about={
            "config": f"{dtype}, D {D}: {fb.BLOCK} resident rows, {st}-row steps, "
                      f"{stages} stages, 1 producer + 2 consumer warpgroups",
            "traffic": f"a step: {2 * st * D * 2} B in, "
                       f"{(8 if which == 'dkv' else 6) * fb.BLOCK * st * D} flops",
            "why": "flash_bwd.py"})
        _KERNELS[key] = Kernel(fn, [sig(which, dtype)], arch="sm_90a",
                               shared_bytes=fb.shared_bytes(D, stages, st),
                               max_registers=flash.MAX_REGS)
    return _KERNELS[key]


def usable(q, k, v, geo, more):
    """Whether these kernels run the call: the forward's limits (flash.fits), and
    TMA's 16-byte aligned bases for the `more` arrays too (do)."""
    return flash.fits(q, k, v, geo) and all(ptr(t) % 16 == 0 for t in more)


def backward(do, q, k, v, lse, dl, dq, dk, dv, lq, lk, mb, ma, geo, layout, stream):
    """dK, dV then dQ (geo: the call's geometry.Geometry; dl the rows' delta, float32
    like lse; mb, ma the boolean and the additive mask, or stand-ins the kernels do not
    read)."""
    B, Hq, G, Sq, Sk, D = geo[:6]
    qs, ks = (geo.qb, geo.qh, geo.qi), (geo.kb, geo.kh, geo.kj)
    causal, scale, (has_lq, has_lk) = geo.causal, geo.scale, geo.lengths
    dtype, Hk, bhsd = dtype_name(q), Hq // G, layout == "BHSD"
    shq, shk = ((B * Hq, Sq, D), (B * Hk, Sk, D)) if bhsd else ((B, Sq, Hq * D), (B, Sk, Hk * D))
    rows = B * Hq * Sq
    st = fb.step_of("dkv", D, geo.dropped)

    def maps(tensors):
        return [encoded(ptr(t), shp, dtype, (1, r, 64), "128B", stream, t)
                for t, shp, r in tensors]
    common = (lq, lk, Hq, G, Sq, Sk, has_lq, has_lk, causal, geo.win_lo, geo.win_hi, int(bhsd),
              float(scale * math.log2(math.e)), float(scale))
    feat, tail = flash.features(geo, mb, ma)
    m = maps(((k, shk, fb.BLOCK), (v, shk, fb.BLOCK), (q, shq, st), (do, shq, st)))
    kern = kernel("dkv", dtype, D, *feat)
    kern.launch(kern.sigs[0], B * Hk * -(-Sk // fb.BLOCK), flash.THREADS, stream, *(x[0] for x in m),
                lse, dl, (ptr(dk), B * Hk * Sk * D // 2), (ptr(dv), B * Hk * Sk * D // 2),
                *common, *ks, *tail,
                shmem=kern.shared_bytes, owners=tuple(x[1] for x in m) + (dk, dv))
    m = maps(((q, shq, fb.BLOCK), (do, shq, fb.BLOCK), (k, shk, fb.STEP), (v, shk, fb.STEP)))
    kern = kernel("dq", dtype, D, *feat)
    kern.launch(kern.sigs[0], B * Hq * -(-Sq // fb.BLOCK), flash.THREADS, stream, *(x[0] for x in m),
                lse, dl, (ptr(dq), rows * D // 2), *common, *qs, *tail,
                shmem=kern.shared_bytes, owners=tuple(x[1] for x in m) + (dq,))


def ptx_examples():
    """Both kernels at both head dims in bfloat16 (float16's differ only in the names of
    their conversions; a compile costs CI 20-40 s), and both at D 128 with a boolean mask
    and dropout and a logit cap, and with an additive mask and ALiBi."""
    for which in ("dkv", "dq"):
        for D in (64, 128):
            kernel(which, "bfloat16", D)
        kernel(which, "bfloat16", 128, 1, True, True)
        kernel(which, "bfloat16", 128, 2, False, False, True)

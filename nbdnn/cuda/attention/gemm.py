"""Attention composed of matrix products: the score matrix in a float32 workspace
between nbdnn.cuda.matmul's GEMMs and two row kernels, as PyTorch's math backend
composes it, for what the fused tensor-core kernels (flash.py, flash_bwd.py) do not
take: float32 in every math mode ("ieee": the SIMT GEMM, 32 TFLOP/s on the H200;
"tf32" / "3xtf32": the tensor cores; flash_tf32.py takes the forward in both where
it is faster), and 16-bit storage with a mask, dropout or a head dim other than 64 and
128 (which otherwise runs the exact kernels, under 1 TFLOP/s: here bf16 S 1k-4k with a
key-padding mask 16-44 TFLOP/s forward, 0.06-0.11x PyTorch's fused masked kernels; D 96
11-36, 0.03-0.08x). 16-bit tensors
are cast to float32 and multiplied in "tf32", which is exact on 16-bit values (8 or 11
significant bits; TF32 keeps 11): the tensor cores' products with float32 sums, as the
reference models them, with p' rounded to the storage dtype before P V as it rounds it
(the backward's dS, a float32, is rounded to TF32: 2^-11).

Heads are stacked: a kv head's G query heads are consecutive in BHSD, so Q viewed as
(B Hk, G Sq, D) makes one GEMM a kv head (its G heads' rows share K and V), and the
products that sum over the group (dK, dV) sum through the GEMM's reduction axis.
BSHD tensors go through a transposing copy first (and the results back).

    forward   S = Q K^T                                       GEMM  (G Sq) x Sk x D
              row kernel: s = scale S + bias (removed pairs out), (m, l) online,
              lse = m + log l, P = exp(s - lse) keep / (1 - p) into S
              O = P V                                         GEMM  (G Sq) x Dv x Sk
    backward  S = Q K^T, dP = dO V^T                          GEMMs
              row kernel: p = exp(s - lse), P' = p keep into S,
              dS = p (dP keep - delta) into dP (delta_i = do_i . o_i, given)
              dV = P'^T dO,  dQ = scale dS K,  dK = scale dS^T Q    GEMMs

Traffic a score (float32): forward 4 B written by the first GEMM, 4 + 4 B read and
written by the row kernel (its second read from L1/L2), 4 B read by the second GEMM:
~16 B against 2 (D + Dv) flops, so at D = 64 the GEMMs' 30-100 TFLOP/s, not DRAM, bound
it. Backward: S and dP written (8 B), read and rewritten (16 B), read by three GEMMs
(12 B). The workspace holds at most WORKSPACE bytes of scores (twice, backward): whole
kv heads a chunk, or row slices of one when a head's (G Sq) x Sk exceeds it; dK and dV
accumulate over a head's row slices (the GEMM's beta = 1).

Measured (H200, float32 "ieee", B S = 16k, 16 heads, S 1k-4k): forward 10.6-17.7 TFLOP/s
at D 64-128 (0.31-0.40x PyTorch's efficient kernel, itself 3xTF32 on the tensor cores;
the exact kernels: 0.27), causal half that (every score is computed, half of them
removed); backward 14-23 TFLOP/s (0.44-0.67x); "3xtf32" no faster (7.8 against 7.85
causal: its operand passes over P cost what the tensor cores save). The "gpt" step
(perf/suites/transformer_step.py, fp32) went from 405 to 41 ms (PyTorch eager 20).

Answers differ from the exact path's (simt.py) only in the order of float32 sums, and
in one documented case: a removed pair's P is 0, and a GEMM multiplies it, so a NaN or
inf in a v row (backward: also k and q rows, and do rows of removed queries) met only
through removed pairs reaches the output, as on the 16-bit tensor-core path and in
PyTorch's math backend; calls with seq_lens (padded batches, whose padding may hold
anything) keep the exact kernels.
"""
import math

import numpy as np
from numba import cuda, float32

from ..matmul import matmul
from ..runtime.memory.arrays import dtype_name, empty
from ..runtime.device_code.block_reduce import SHM, device_functions
from ..runtime.device_code.intrinsics import array_type, narrow, widen
from ..runtime.launch.kernel import Kernel
from ..runtime.simulator import SIMULATOR
from ..tensor import cast_tensor, transform_tensor
from .simt import attention_device_functions, band_range

MIN_KEYS = MIN_QUERIES = 64     # below: the exact kernels' one launch costs less
WORKSPACE = 1 << 28             # bytes of float32 scores a chunk (256 MB)
T = 32 if SIMULATOR else 128    # a row kernel's block: one score row
NEG = float32(-np.inf)
DROP_NONE = np.uint64(1 << 32)

_, _keep, _, _, _bias, *_ = attention_device_functions(float32)
_red = device_functions(np.float32)
_update, _pair = _red["update"], _red["grp_pair"]


@cuda.jit(device=True)
def _row(bh0, r0, nr, Hk, G, Sq):
    """(b, h, i) of row x of a chunk whose matrices start at kv head bh0, rows r0 .. r0 +
    nr - 1 of each (a matrix's rows: G Sq, head-major)."""
    x = cuda.blockIdx.x
    bh, r = bh0 + x // nr, r0 + x % nr
    return bh // Hk, (bh % Hk) * G + r // Sq, r % Sq


@cuda.jit(device=True)
def _key_range(i, Sq, Sk, causal, lo, hi):
    """Keys j0 .. j1 - 1 of row i (no seq_lens here: the diagonal's offset 0 top-left,
    Sk - Sq bottom-right): simt.key_range's rule."""
    if causal == 0:
        return 0, Sk
    return band_range(i, Sk - Sq if causal == 2 else 0, lo, hi, Sk)


def attention_rows_fwd(s, lse, ma, mb, like, bh0, r0, nr, Hk, G, Sq, Sk, mkind, m0, m1, m2,
                       m3, causal, win_lo, win_hi, scale, thr, kscale, off_lo, off_hi, key_lo,
                       key_hi):
    """A block a score row: s (chunk rows, Sk) in, P' out (rounded to like's dtype, the
    storage's, as the reference rounds it before P V); lse (B, Hq, Sq)."""
    rm = cuda.shared.array(SHM, float32)
    rs = cuda.shared.array(SHM, float32)
    t = cuda.threadIdx.x
    b, h, i = _row(bh0, r0, nr, Hk, G, Sq)
    at = cuda.blockIdx.x * Sk  # (int64: a chunk holds up to 2**26 scores)
    j0, j1 = _key_range(i, Sq, Sk, causal, win_lo, win_hi)
    mo = b * m0 + h * m1 + i * m2
    m, l = NEG, float32(0)
    for j in range(j0 + t, j1, T):
        ok, add = _bias(ma, mb, mkind, mo + j * m3)
        if ok:
            m, l = _update(m, l, s[at + j] * scale + add, False)
    m, l = _pair(m, l, T, rm, rs)
    if l != l or m == -NEG:  # a NaN score, or +inf: a NaN row, as the reference
        ls = float32(np.nan)
    elif m == NEG:  # no live score: P = 0, lse = -inf
        ls = NEG
    else:
        ls = m + math.log(l)
    gr = (b * Hk * G + h) * Sq + i
    if t == 0:
        lse[gr] = ls
    e0 = np.uint64(gr) * np.uint64(Sk)
    for j in range(t, Sk, T):
        p = float32(0)
        if j0 <= j < j1 and ls != NEG:
            ok, add = _bias(ma, mb, mkind, mo + j * m3)
            if ok:
                p = math.exp(s[at + j] * scale + add - ls)
                if thr != DROP_NONE:
                    p *= _keep(e0 + np.uint64(j), thr, kscale, off_lo, off_hi, key_lo, key_hi)
                p = widen(narrow(p, like))
        s[at + j] = p


def attention_rows_bwd(s, dp, lse, dl, ma, mb, like, bh0, r0, nr, Hk, G, Sq, Sk, mkind, m0,
                       m1, m2, m3, causal, win_lo, win_hi, scale, thr, kscale, off_lo, off_hi,
                       key_lo, key_hi):
    """A block a score row: s and dP in, P' = p keep (rounded as forward) into s, dS =
    p (dP keep - delta) into dp (removed pairs and rows with lse -inf or NaN: 0)."""
    t = cuda.threadIdx.x
    b, h, i = _row(bh0, r0, nr, Hk, G, Sq)
    at = cuda.blockIdx.x * Sk
    j0, j1 = _key_range(i, Sq, Sk, causal, win_lo, win_hi)
    mo = b * m0 + h * m1 + i * m2
    gr = (b * Hk * G + h) * Sq + i
    ls, delta = lse[gr], dl[gr]
    if not ls > NEG:
        j1 = j0
    e0 = np.uint64(gr) * np.uint64(Sk)
    for j in range(t, Sk, T):
        pk, ds = float32(0), float32(0)
        if j0 <= j < j1:
            ok, add = _bias(ma, mb, mkind, mo + j * m3)
            if ok:
                p = math.exp(s[at + j] * scale + add - ls)
                kf = float32(1) if thr == DROP_NONE else \
                    _keep(e0 + np.uint64(j), thr, kscale, off_lo, off_hi, key_lo, key_hi)
                pk, ds = widen(narrow(p * kf, like)), p * (dp[at + j] * kf - delta)
        s[at + j] = pk
        dp[at + j] = ds


def _signature(which, dtype):
    """(s[, dp], lse[, delta]: float32; the mask pair and `like` in the storage dtype)."""
    a = f"{array_type(dtype)}[::1]"
    f32 = ", ".join(["float32[::1]"] * (2 if which == "fwd" else 4))
    return f"void({f32}, {a}, uint8[::1], {a}, " + ", ".join(["int64"] * 15) + \
        ", float32, uint64, float32, uint64, uint64, uint64, uint64)"


DTYPES = ("float32", "float16", "bfloat16")
KERNELS = {which: Kernel(fn, [_signature(which, t) for t in DTYPES])
           for which, fn in (("fwd", attention_rows_fwd), ("bwd", attention_rows_bwd))}


def usable(dtype, Sq, Sk, has_lq, has_lk):
    """float32 or 16-bit, no seq_lens, at least MIN_QUERIES x MIN_KEYS scores a head."""
    return dtype in DTYPES and \
        not (has_lq or has_lk) and Sq >= MIN_QUERIES and Sk >= MIN_KEYS


def _chunks(n, M, Sk):
    """(bh0, bh1, r0, r1) pieces of n kv heads of M x Sk scores, each at most WORKSPACE
    bytes: runs of whole heads, or row slices of one head."""
    per = M * Sk * 4
    if per <= WORKSPACE:
        step = WORKSPACE // per
        return [(a, min(n, a + step), 0, M) for a in range(0, n, step)]
    rows = max(1, WORKSPACE // (Sk * 4))
    return [(a, a + 1, r, min(M, r + rows)) for a in range(n) for r in range(0, M, rows)]


def _parts(c, M):
    """(rows, heads): chunk c's views of a stacked tensor's query-side rows and of its
    kv heads' whole matrices; 3-d (heads, rows, cols) for whole heads, 2-d for a slice."""
    bh0, bh1, r0, r1 = c
    if (r0, r1) == (0, M):
        return (lambda x: x[bh0:bh1]), (lambda x: x[bh0:bh1])
    return (lambda x: x[bh0, r0:r1]), (lambda x: x[bh0])


def _bhsd32(x, layout, stream):
    """x as float32 in BHSD: itself, or a cast and / or transposed copy (16-bit values
    are exact in TF32, so the TF32 GEMMs multiply them exactly)."""
    if dtype_name(x) != "float32":
        x = cast_tensor(x, "float32", alpha=1.0, beta=0.0, out=None, stream=stream)
    return x if layout == "BHSD" else transform_tensor(x, (0, 2, 1, 3), alpha=1.0, beta=0.0,
                                                      out=None, stream=stream)


def _result(y, like, layout):
    """Where a result (BHSD, float32) is computed: y itself when it is that, else a
    temporary that _store moves into y."""
    if layout == "BHSD" and dtype_name(y) == "float32":
        return y
    B, a, b, d = (int(n) for n in y.shape)
    return empty(like, (B, b, a, d) if layout == "BSHD" else (B, a, b, d), "float32")


def _store(t, y, layout, stream):
    """y (its layout, its dtype) = t (BHSD, float32), unless t is y."""
    if t is y:
        return
    if layout == "BSHD":
        t = transform_tensor(t, (0, 2, 1, 3), alpha=1.0, beta=0.0,
                             out=y if dtype_name(y) == "float32" else None, stream=stream)
    if t is not y:
        cast_tensor(t, dtype_name(y), alpha=1.0, beta=0.0, out=y, stream=stream)


def _stacked(x, Hk):
    """A BHSD tensor (B, H, S, d) as (B Hk, (H / Hk) S, d): each kv head's rows."""
    B, H, S, d = (int(n) for n in x.shape)
    return x.reshape((B * Hk, H // Hk * S, d))


def _workspace(like, chunks, Sk):
    """A flat float32 buffer for the largest chunk's scores."""
    return empty(like, (max((c[1] - c[0]) * (c[3] - c[2]) for c in chunks) * Sk,), "float32")


def _view(ws, c, M, Sk):
    """(flat, matrices) of chunk c's scores in ws: (heads, M, Sk) or a slice (rows, Sk)."""
    bh0, bh1, r0, r1 = c
    flat = ws[:(bh1 - bh0) * (r1 - r0) * Sk]
    return flat, flat.reshape((bh1 - bh0, M, Sk) if (r0, r1) == (0, M) else (r1 - r0, Sk))


def _rows(name, flats, lse, dl, ma, mb, like, geo, c, stream):
    """Launch a row kernel over chunk c's score rows (geo: the launcher's geometry)."""
    kern, sig = KERNELS[name], _signature(name, dtype_name(like))
    G, Sq, Sk = geo.G, geo.Sq, geo.Sk
    tail = (ma, mb, like, c[0], c[2], c[3] - c[2], geo.Hq // G, G, Sq, Sk, *geo.mask,
            geo.causal, geo.win_lo, geo.win_hi, geo.scale, *geo.dropout)
    vecs = (lse,) if dl is None else (lse, dl)
    kern.launch(sig, (c[1] - c[0]) * (c[3] - c[2]), T, stream, *flats, *vecs, *tail)


def _gemm(a, b, trans_a, trans_b, out, math_mode, stream, alpha=1.0, beta=0.0):
    return matmul(a, b, trans_a, trans_b, None, None, 0.0, math_mode, alpha=alpha, beta=beta,
                  out=out, stream=stream)


def forward(q, k, v, o, lse, ma, mb, geo, layout, math_mode, stream):
    """o and lse of a call `usable` took (geo: the launcher's geometry)."""
    B, Hq, G, Sq, Sk, D, Dv = geo[:7]
    Hk, M = Hq // G, G * Sq
    mode = math_mode if dtype_name(q) == "float32" else "tf32"
    qs, ks, vs = (_stacked(_bhsd32(x, layout, stream), Hk) for x in (q, k, v))
    ob = _result(o, q, layout)
    os_ = _stacked(ob, Hk)
    chunks = _chunks(B * Hk, M, Sk)
    ws = _workspace(q, chunks, Sk)
    for c in chunks:
        flat, sm = _view(ws, c, M, Sk)
        rows, heads = _parts(c, M)
        _gemm(rows(qs), heads(ks), False, True, sm, mode, stream)
        _rows("fwd", (flat,), lse, None, ma, mb, q, geo, c, stream)
        _gemm(sm, heads(vs), False, False, rows(os_), mode, stream)
    _store(ob, o, layout, stream)


def backward(do, q, k, v, lse, dl, dq, dk, dv, ma, mb, geo, layout, math_mode, stream):
    """dq, dk, dv of a call `usable` took; dl: delta (B, Hq, Sq), float32."""
    B, Hq, G, Sq, Sk, D, Dv = geo[:7]
    Hk, M, scale = Hq // G, G * Sq, geo.scale
    mode = math_mode if dtype_name(q) == "float32" else "tf32"
    qs, ks, vs, dos = (_stacked(_bhsd32(x, layout, stream), Hk) for x in (q, k, v, do))
    outs = [_result(g, q, layout) for g in (dq, dk, dv)]
    dqs, dks, dvs = (_stacked(g, Hk) for g in outs)
    chunks = _chunks(B * Hk, M, Sk)
    ws_s, ws_dp = _workspace(q, chunks, Sk), _workspace(q, chunks, Sk)
    for c in chunks:
        (fs, sm), (fdp, dpm) = _view(ws_s, c, M, Sk), _view(ws_dp, c, M, Sk)
        rows, heads = _parts(c, M)
        kc, vc, qc, doc = heads(ks), heads(vs), rows(qs), rows(dos)
        _gemm(qc, kc, False, True, sm, mode, stream)
        _gemm(doc, vc, False, True, dpm, mode, stream)
        _rows("bwd", (fs, fdp), lse, dl, ma, mb, q, geo, c, stream)
        acc = 0.0 if c[2] == 0 else 1.0  # (a head's later row slices add to dK, dV)
        _gemm(sm, doc, True, False, heads(dvs), mode, stream, beta=acc)
        _gemm(dpm, kc, False, False, rows(dqs), mode, stream, alpha=scale)
        _gemm(dpm, qc, True, False, heads(dks), mode, stream, alpha=scale, beta=acc)
    for t, g in zip(outs, (dq, dk, dv)):
        _store(t, g, layout, stream)

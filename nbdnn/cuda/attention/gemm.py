"""Attention composed of matrix products (float32, every math mode): the score matrix in
a float32 workspace between nbdnn.cuda.matmul's GEMMs ("ieee": its SIMT kernel; "tf32"
and "3xtf32": the tensor cores, its operand passes) and two row kernels, as PyTorch's
math backend composes it, where the fused kernels (flash.py, tiled.py) leave float32 on
the CUDA cores: a GEMM runs float32 at 32 TFLOP/s ieee and ~100 3xtf32 on the H200.

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
from ..runtime.arrays import empty
from ..runtime.block_reduce import SHM, device_functions
from ..runtime.launch import Kernel
from ..runtime.simulator import SIMULATOR
from ..tensor import transform_tensor
from .simt import _device_functions

ON = True
MIN_KEYS = MIN_QUERIES = 64     # below: the exact kernels' one launch costs less
WORKSPACE = 1 << 28             # bytes of float32 scores a chunk (256 MB)
T = 32 if SIMULATOR else 128    # a row kernel's block: one score row
NEG = float32(-np.inf)
DROP_NONE = np.uint64(1 << 32)

_, _keep, _, _bias, _ = _device_functions(float32)
_red = device_functions(np.float32)
_update, _pair = _red["update"], _red["grp_pair"]


@cuda.jit(device=True)
def _row(bh0, r0, nr, Hk, G, Sq):
    """(b, h, i) of row x of a chunk whose matrices start at kv head bh0, rows r0 .. r0 +
    nr - 1 of each (a matrix's rows: G Sq, head-major)."""
    x = cuda.blockIdx.x
    bh, r = bh0 + x // nr, r0 + x % nr
    return bh // Hk, (bh % Hk) * G + r // Sq, r % Sq


def attention_rows_fwd(s, lse, ma, mb, bh0, r0, nr, Hk, G, Sq, Sk, mkind, m0, m1, m2, m3,
                       causal, scale, thr, kscale, off_lo, off_hi, key_lo, key_hi):
    """A block a score row: s (chunk rows, Sk) in, P out; lse (B, Hq, Sq)."""
    rm = cuda.shared.array(SHM, float32)
    rs = cuda.shared.array(SHM, float32)
    t = cuda.threadIdx.x
    b, h, i = _row(bh0, r0, nr, Hk, G, Sq)
    at = cuda.blockIdx.x * Sk  # (int64: a chunk holds up to 2**26 scores)
    n = min(Sk, i + 1) if causal != 0 else Sk
    mo = b * m0 + h * m1 + i * m2
    m, l = NEG, float32(0)
    for j in range(t, n, T):
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
        if j < n and ls != NEG:
            ok, add = _bias(ma, mb, mkind, mo + j * m3)
            if ok:
                p = math.exp(s[at + j] * scale + add - ls)
                if thr != DROP_NONE:
                    p *= _keep(e0 + np.uint64(j), thr, kscale, off_lo, off_hi, key_lo, key_hi)
        s[at + j] = p


def attention_rows_bwd(s, dp, lse, dl, ma, mb, bh0, r0, nr, Hk, G, Sq, Sk, mkind, m0, m1, m2,
                       m3, causal, scale, thr, kscale, off_lo, off_hi, key_lo, key_hi):
    """A block a score row: s and dP in, P' = p keep into s, dS = p (dP keep - delta)
    into dp (removed pairs and rows with lse -inf or NaN: 0)."""
    t = cuda.threadIdx.x
    b, h, i = _row(bh0, r0, nr, Hk, G, Sq)
    at = cuda.blockIdx.x * Sk
    n = min(Sk, i + 1) if causal != 0 else Sk
    mo = b * m0 + h * m1 + i * m2
    gr = (b * Hk * G + h) * Sq + i
    ls, delta = lse[gr], dl[gr]
    if not ls > NEG:
        n = 0
    e0 = np.uint64(gr) * np.uint64(Sk)
    for j in range(t, Sk, T):
        pk, ds = float32(0), float32(0)
        if j < n:
            ok, add = _bias(ma, mb, mkind, mo + j * m3)
            if ok:
                p = math.exp(s[at + j] * scale + add - ls)
                kf = float32(1) if thr == DROP_NONE else \
                    _keep(e0 + np.uint64(j), thr, kscale, off_lo, off_hi, key_lo, key_hi)
                pk, ds = p * kf, p * (dp[at + j] * kf - delta)
        s[at + j] = pk
        dp[at + j] = ds


_MASKS = "float32[::1], uint8[::1], "
_TAIL = "int64, int64, int64, int64, int64, int64, int64, int64, int64, int64, int64, " \
    "int64, int64, float32, uint64, float32, uint64, uint64, uint64, uint64)"
KERNELS = {
    "fwd": (Kernel(attention_rows_fwd, ["void(float32[::1], float32[::1], " + _MASKS + _TAIL]),
            "void(float32[::1], float32[::1], " + _MASKS + _TAIL),
    "bwd": (Kernel(attention_rows_bwd, ["void(float32[::1], float32[::1], float32[::1], "
                                        "float32[::1], " + _MASKS + _TAIL]),
            "void(float32[::1], float32[::1], float32[::1], float32[::1], " + _MASKS + _TAIL)}


def usable(dtype, Sq, Sk, has_lq, has_lk):
    """ON, float32, no seq_lens, at least MIN_QUERIES x MIN_KEYS scores a head."""
    return ON and dtype == "float32" and not (has_lq or has_lk) and Sq >= MIN_QUERIES and \
        Sk >= MIN_KEYS


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


def _bhsd(x, layout, stream):
    """x in BHSD: itself, or a transposed copy of a BSHD tensor."""
    return x if layout == "BHSD" else transform_tensor(x, (0, 2, 1, 3), alpha=1.0, beta=0.0,
                                                      out=None, stream=stream)


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


def _rows(name, flats, lse, dl, ma, mb, geo, c, stream):
    """Launch a row kernel over chunk c's score rows (geo: the launcher's geometry)."""
    kern, sig = KERNELS[name]
    G, Sq, Sk = geo[2], geo[3], geo[4]
    tail = (ma, mb, c[0], c[2], c[3] - c[2], geo[1] // G, G, Sq, Sk, geo[19], *geo[20:24],
            geo[26], geo[27], geo[29], geo[30], *geo[31:35])
    vecs = (lse,) if dl is None else (lse, dl)
    kern.launch(sig, (c[1] - c[0]) * (c[3] - c[2]), T, stream, *flats, *vecs, *tail)


def _gemm(a, b, trans_a, trans_b, out, math_mode, stream, alpha=1.0, beta=0.0):
    return matmul(a, b, trans_a, trans_b, None, None, 0.0, math_mode, alpha=alpha, beta=beta,
                  out=out, stream=stream)


def forward(q, k, v, o, lse, ma, mb, geo, layout, math_mode, stream):
    """o and lse of a call `usable` took (geo: the launcher's geometry)."""
    B, Hq, G, Sq, Sk, D, Dv = geo[:7]
    Hk, M = Hq // G, G * Sq
    qs, ks, vs = (_stacked(_bhsd(x, layout, stream), Hk) for x in (q, k, v))
    ob = o if layout == "BHSD" else empty(o, (B, Hq, Sq, Dv), "float32")
    os_ = _stacked(ob, Hk)
    chunks = _chunks(B * Hk, M, Sk)
    ws = _workspace(q, chunks, Sk)
    for c in chunks:
        flat, sm = _view(ws, c, M, Sk)
        rows, heads = _parts(c, M)
        _gemm(rows(qs), heads(ks), False, True, sm, math_mode, stream)
        _rows("fwd", (flat,), lse, None, ma, mb, geo, c, stream)
        _gemm(sm, heads(vs), False, False, rows(os_), math_mode, stream)
    if layout != "BHSD":
        transform_tensor(ob, (0, 2, 1, 3), alpha=1.0, beta=0.0, out=o, stream=stream)


def backward(do, q, k, v, lse, dl, dq, dk, dv, ma, mb, geo, layout, math_mode, stream):
    """dq, dk, dv of a call `usable` took; dl: delta (B, Hq, Sq), float32."""
    B, Hq, G, Sq, Sk, D, Dv = geo[:7]
    Hk, M, scale = Hq // G, G * Sq, geo[27]
    qs, ks, vs, dos = (_stacked(_bhsd(x, layout, stream), Hk) for x in (q, k, v, do))
    outs = (dq, dk, dv) if layout == "BHSD" else [
        empty(g, (B, H, S, d), "float32") for g, (H, S, d) in
        zip((dq, dk, dv), ((Hq, Sq, D), (Hk, Sk, D), (Hk, Sk, Dv)))]
    dqs, dks, dvs = (_stacked(g, Hk) for g in outs)
    chunks = _chunks(B * Hk, M, Sk)
    ws_s, ws_dp = _workspace(q, chunks, Sk), _workspace(q, chunks, Sk)
    for c in chunks:
        (fs, sm), (fdp, dpm) = _view(ws_s, c, M, Sk), _view(ws_dp, c, M, Sk)
        rows, heads = _parts(c, M)
        kc, vc, qc, doc = heads(ks), heads(vs), rows(qs), rows(dos)
        _gemm(qc, kc, False, True, sm, math_mode, stream)
        _gemm(doc, vc, False, True, dpm, math_mode, stream)
        _rows("bwd", (fs, fdp), lse, dl, ma, mb, geo, c, stream)
        acc = 0.0 if c[2] == 0 else 1.0  # (a head's later row slices add to dK, dV)
        _gemm(sm, doc, True, False, heads(dvs), math_mode, stream, beta=acc)
        _gemm(dpm, kc, False, False, rows(dqs), math_mode, stream, alpha=scale)
        _gemm(dpm, qc, True, False, heads(dks), math_mode, stream, alpha=scale, beta=acc)
    if layout != "BHSD":
        for g, got in zip((dq, dk, dv), outs):
            transform_tensor(got, (0, 2, 1, 3), alpha=1.0, beta=0.0, out=g, stream=stream)

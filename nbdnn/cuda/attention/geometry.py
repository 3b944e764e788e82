"""One attention call as its kernels see it: the sizes, each tensor's strides in its
layout, the mask, the lengths, the causal band, the scale, the math mode and the
dropout stream, named, in the order every forward-shaped kernel takes them after its
tensors (simt.geometry_types: `*geo` passes them on).

The band: with causal != 0 (1: the diagonal top-left, 2: bottom-right, at key i + d for
query i, d = Lk - Lq), query i attends keys j with win_lo <= j - i - d <= win_hi; plain
causal is (-NO_BOUND, 0), a sliding window's sides are finite (split-key decoding
leaves `windowed` calls to the other paths). ALiBi's distances |i + d - j| are about the
diagonal of its own code (the call's alignment, causal or not)."""
from typing import NamedTuple

import numpy as np

from ..runtime.memory.arrays import dtype_name, empty
from ..._philox import MASK32, keep_threshold

MODES = {"ieee": 0, "tf32": 1, "3xtf32": 2}
NO_DROPOUT = 1 << 32  # keep_threshold's value for p = 0: every draw kept
NO_BOUND = 1 << 40  # a band side without a limit (past any sequence; int64 sums stay exact)


class Geometry(NamedTuple):
    B: int
    Hq: int
    G: int          # query heads a k/v head (grouped-query attention)
    Sq: int
    Sk: int
    D: int
    Dv: int
    qb: int         # q's (batch, head, row) element strides in its layout
    qh: int
    qi: int
    kb: int
    kh: int
    kj: int
    vb: int
    vh: int
    vj: int
    ob: int
    oh: int
    oi: int
    mask_kind: int  # 0 none, 1 bool (True attends), 2 additive
    m0: int         # the mask's element strides over (B, Hq, Sq, Sk), 0 where broadcast
    m1: int
    m2: int
    m3: int
    has_lq: int     # seq_lens_q / seq_lens_k given
    has_lk: int
    causal: int
    scale: float
    mode: int       # float32's math mode (MODES); 0 for the other dtypes
    threshold: int  # dropout: a draw below it is kept (NO_DROPOUT: none dropped)
    keep_scale: float  # 1 / (1 - p)
    offset_lo: int
    offset_hi: int
    seed_lo: int
    seed_hi: int
    win_lo: int     # the band's sides about the diagonal (causal != 0; module docstring)
    win_hi: int
    softcap: float  # scores capped to softcap tanh(s / softcap); 0: none
    alibi: int      # ALiBi: 0 none, else its diagonal's code (1 top-left, 2 bottom-right)
    slope_b: int    # slopes[b slope_b + h]: Hq for (B, Hq) slopes, 0 for (Hq,)
    slopes: object  # the float32 slopes on the device (a stand-in without ALiBi), last:
    #                 the kernels' only array among these

    @property
    def strides(self):
        """q's, k's, v's and o's (batch, head, row) strides, 12 ints."""
        return self[7:19]

    @property
    def o_strides(self):
        return self[16:19]

    @property
    def mask(self):
        """(kind, 4 strides)."""
        return self[19:24]

    @property
    def lengths(self):
        """(has_lq, has_lk)."""
        return self[24:26]

    @property
    def dropout(self):
        """(threshold, keep_scale, offset and seed halves): the keep factors' stream."""
        return self[29:35]

    @property
    def masked(self):
        return self.mask_kind != 0

    @property
    def dropped(self):
        return self.threshold != NO_DROPOUT

    @property
    def windowed(self):
        """A band other than plain causal (a sliding window)."""
        return self.causal != 0 and (self.win_lo != -NO_BOUND or self.win_hi != 0)


def strides(shape, layout):
    """(batch, head, row) element strides of a C-contiguous 4-d tensor in `layout`."""
    B, a, b, D = (int(s) for s in shape)
    return (a * b * D, b * D, D) if layout == "BHSD" else (a * b * D, D, b * D)


def mask_strides(attn_mask):
    """(kind, its element strides over (B, Hq, Sq, Sk), 0 on broadcast axes)."""
    if attn_mask is None:
        return 0, (0, 0, 0, 0)
    ms = (1,) * (4 - len(attn_mask.shape)) + tuple(int(s) for s in attn_mask.shape)
    st, run = [], 1
    for n in ms[::-1]:
        st.append(run if n != 1 else 0)
        run *= n
    return (1 if dtype_name(attn_mask) == "bool" else 2), tuple(st[::-1])


def band(is_causal, window):
    """(win_lo, win_hi) of the causal code and the front end's window: (lo, hi), None
    on an open side; None: plain causal."""
    if not is_causal:
        return -NO_BOUND, NO_BOUND
    lo, hi = window if window is not None else (None, 0)
    return -NO_BOUND if lo is None else lo, NO_BOUND if hi is None else hi


def geometry(q, k, v, o, attn_mask, dropout_p, is_causal, scale, seed, offset, layout,
             has_lq, has_lk, math, window=None, softcap=0.0, slopes=None, alibi=0):
    """The Geometry of a validated call (o: the output or an array of its shape)."""
    B, Hq, Sq, D = (int(s) for s in q.shape) if layout == "BHSD" else \
        (int(q.shape[0]), int(q.shape[2]), int(q.shape[1]), int(q.shape[3]))
    Hk = int(k.shape[1] if layout == "BHSD" else k.shape[2])
    Sk = int(k.shape[2] if layout == "BHSD" else k.shape[1])
    kind, ms = mask_strides(attn_mask)
    return Geometry(
        B, Hq, Hq // Hk, Sq, Sk, D, int(v.shape[3]), *strides(q.shape, layout),
        *strides(k.shape, layout), *strides(v.shape, layout), *strides(o.shape, layout),
        kind, *ms, has_lq, has_lk, int(is_causal),
        float(1 / np.sqrt(D) if scale is None else scale),  # (a NumPy scalar has a shape:
        # the simulator's launch would pass it as an array)
        MODES[math] if dtype_name(q) == "float32" else 0,
        keep_threshold(dropout_p) if dropout_p > 0 else NO_DROPOUT, 1 / (1 - dropout_p),
        offset & MASK32, offset >> 32, seed & MASK32, seed >> 32, *band(is_causal, window),
        float(softcap), *alibi_fields(q, slopes, alibi, Hq))


def alibi_fields(ref, slopes, alibi, Hq):
    """(alibi, slope_b, slopes) of Geometry: a 1-element stand-in without slopes."""
    if slopes is None:
        return 0, 0, empty(ref, (1,), "float32")
    return alibi, Hq if len(slopes.shape) == 2 else 0, slopes

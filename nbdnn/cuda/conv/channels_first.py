"""Channels-first (NCHW) forwards on sm_90's tensor cores through channels-last copies
(16-bit, and float32 in math "tf32"): x, w and a residual copied channels-last by the
tiled transpose (tensor/transpose.py), the channels-last tensor-core variants, y copied
back.
Extra traffic: x, w, residual and y each read and written once more (s1 3x3 of
ResNet-50 at batch 32: 4 x 12.8 MB), so a layer goes this way only where its GEMM has
the flops to pay for the copies (`pays`).

float32 in "tf32" goes this way wherever a filter has more than one tap: its other path
is im2col's columns (R S T times x's items written and read) and the TF32 GEMM, against
which the copies' 2 (C + K) items a position are the smaller traffic (a rule by count:
no timing of the two decides it).

Measured (H200, bf16 NCHW, batch 32, graph replay, against the SIMT algorithms):
through the copies, ResNet-50's 1x1 layers of s2-s4 (51-205 GEMM flops a copied byte)
1.06-2.83x and s1's 3x3 (144; the SIMT implicit GEMM otherwise) 2.41x the speed; s1's
1x1 layers (16-26 flops a byte) 0.52-0.71x; the 3x3 layers of s2-s4 0.43-0.81x against
winograd, which "auto" keeps."""
from ..runtime.memory.arrays import empty
from ..tensor import transform_into

MIN_FLOP_PER_BYTE = 40


def pays(g, dtype, choice):
    """Whether a channels-first forward goes through the copies: the algorithm it
    would run otherwise (`choice`: "auto"'s pick, or "implicit_gemm" asked for) is the
    implicit GEMM, and the GEMM does at least MIN_FLOP_PER_BYTE flops for each byte the
    copies move (x and y each read and written once more: 2 (C + K) items a position,
    2 taps C K flops)."""
    if choice != "implicit_gemm":
        return False
    item = 2 if dtype in ("float16", "bfloat16") else 4
    flops = 2 * g.T * g.R * g.S * g.C * g.K
    return flops >= MIN_FLOP_PER_BYTE * 2 * (g.C + g.K) * item


def forward(x, w, y, residual, g, dtype, stream, channels_last):
    """y from channels-first x, w through channels-last copies (conv's variant
    channels_first_copies says where): channels_last(xt, wt, yt, rt, gl) runs the
    channels-last call on the copies (rt: the residual's copy or None; gl: g
    channels-last)."""
    gl = g._replace(last=1)  # (every other field is the layout's own: geometry.py)
    nd = len(x.shape) - 2
    to_last, to_first = (0,) + tuple(range(2, nd + 2)) + (1,), (0, nd + 1) + tuple(range(1, nd + 1))
    xl, wl, yl = (tuple(int(a.shape[p]) for p in to_last) for a in (x, w, y))
    xt, wt, yt = (empty(x, shape, dtype) for shape in (xl, wl, yl))
    transform_into(x, tuple(x.shape), to_last, xt, 1.0, 0.0, stream)
    transform_into(w, tuple(w.shape), to_last, wt, 1.0, 0.0, stream)
    rt = None
    if residual is not None:
        rt = empty(x, yl, dtype)
        transform_into(residual, tuple(y.shape), to_last, rt, 1.0, 0.0, stream)
    channels_last(xt, wt, yt, rt, gl)  # (beta: the residual's weight; 0 without one)
    transform_into(yt, yl, to_first, y, 1.0, 0.0, stream)

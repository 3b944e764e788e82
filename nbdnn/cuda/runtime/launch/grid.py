"""Index helpers shared by the convolution kernels: every kernel sees (N, C, D, H, W)
tensors (1-d and 2-d problems get leading spatial axes of size 1), channels first or
last."""
from numba import cuda, int64, uint32, uint64

from ..simulator import SIMULATOR

BLOCK = 64 if SIMULATOR else 256
MAX_BLOCKS = 2 ** 31 - 1


def launch(table, name, dtype, total, stream, *args):
    """Launch table[name, dtype], a grid-stride kernel over `total` items, BLOCK threads
    a block (nothing when total is 0)."""
    k, sig = table[name, dtype]
    if total:
        k.launch(sig, min(-(-total // BLOCK), MAX_BLOCKS), BLOCK, stream, *args)


@cuda.jit(device=True)
def strides(C, D, H, W, last):
    """(n, c, d, h, w) element strides of an (N, C, D, H, W) tensor, channels first or
    last."""
    if last:
        return D * H * W * C, 1, H * W * C, W * C, C
    return C * D * H * W, D * H * W, H * W, W, 1


U, I, U32 = (int, int, int) if SIMULATOR else (uint64, int64, uint32)


@cuda.jit(device=True)
def split(i, C, D, H, W, last):
    """(n, c, d, h, w) of flat index i >= 0 in memory order. Unsigned divisions: numba's
    signed // and % add floor-rounding fix-ups to each (I casts back, since numba types
    uint64 op int64 as float64)."""
    u, c = U(i), U(0)
    if last:
        q = u // U(C)
        c, u = u - q * U(C), q
    q = u // U(W)
    w, u = u - q * U(W), q
    q = u // U(H)
    h, u = u - q * U(H), q
    q = u // U(D)
    d, u = u - q * U(D), q
    if not last:
        q = u // U(C)
        c, u = u - q * U(C), q
    return I(u), I(c), I(d), I(h), I(w)


@cuda.jit(device=True)
def split32(i, C, D, H, W, last):
    """split for 0 <= i < 2**32 (the caller's test): each division is a 64-bit one of
    zero-extended 32-bit values, which LLVM narrows to div.u32 (a 64-bit division is a
    ~70-instruction subroutine)."""
    u, c = U(U32(i)), U(0)
    if last:
        q = u // U(U32(C))
        c, u = u - q * U(C), q
    q = u // U(U32(W))
    w, u = u - q * U(W), q
    q = u // U(U32(H))
    h, u = u - q * U(H), q
    q = u // U(U32(D))
    d, u = u - q * U(D), q
    if not last:
        q = u // U(U32(C))
        c, u = u - q * U(C), q
    return I(u), I(c), I(d), I(h), I(w)


@cuda.jit(device=True)
def landing(ix, pad, tap, dil, stride, P):
    """The output position p whose tap `tap` reads padded input index ix + pad
    (p*stride + tap*dil == ix + pad), or -1 when there is none. Strides 1 and 2 (nearly
    every network's) by a test and a shift, others by one 32-bit division (an axis'
    index is below 2**31; div.u32 is ~20 instructions, a 64-bit one a ~70-instruction
    subroutine): a col2im-style gather asks once a tap an element)."""
    u = ix + pad - tap * dil
    if u < 0:
        return -1
    if stride == 1:
        q = U32(u)
    elif stride == 2:
        if u & 1:
            return -1
        q = U32(u) >> U32(1)
    else:
        q = U32(u) // U32(stride)
        if U32(u) - q * U32(stride) != U32(0):
            return -1
    if I(q) >= P:
        return -1
    return I(q)

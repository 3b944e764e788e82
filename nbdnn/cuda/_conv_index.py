"""Index helpers shared by the convolution kernels: every kernel sees (N, C, D, H, W)
tensors (1-d and 2-d problems get leading spatial axes of size 1), channels first or
last."""
from numba import cuda

from . import SIMULATOR

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


@cuda.jit(device=True)
def split(i, C, D, H, W, last):
    """(n, c, d, h, w) of flat index i in memory order."""
    c = 0
    if last:
        c = i % C
        i //= C
    w = i % W
    i //= W
    h = i % H
    i //= H
    d = i % D
    i //= D
    if not last:
        c = i % C
        i //= C
    return i, c, d, h, w


@cuda.jit(device=True)
def landing(ix, pad, tap, dil, stride, P):
    """The output position p whose tap `tap` reads padded input index ix + pad
    (p*stride + tap*dil == ix + pad), or -1 when there is none."""
    u = ix + pad - tap * dil
    if u >= 0 and u % stride == 0 and u // stride < P:
        return u // stride
    return -1

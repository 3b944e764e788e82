"""A pooling call as its kernels see it: 27 ints, three spatial axes (1-d and 2-d calls
lead with axes of size 1), named. The general kernels take them in this order
(`*geometry`, the names their parameters bear); the compiled-window kernels (fast.py,
fast_bwd.py) the 2-d window."""
from typing import NamedTuple


class PoolGeometry(NamedTuple):
    N: int
    C: int
    D: int   # the input's spatial shape
    H: int
    W: int
    KD: int  # the window
    KH: int
    KW: int
    PD: int  # the output's spatial shape
    PH: int
    PW: int
    sd: int  # strides
    sh: int
    sw: int
    qd: int  # leading padding
    qh: int
    qw: int
    ed: int  # where the padded input ends (size + trailing padding)
    eh: int
    ew: int
    dd: int  # dilation
    dh: int
    dw: int
    last: int       # 1: channels last
    mode: int       # _vocab.POOL_MODES' index
    propagate: int  # max: 1 gives NaN for a window holding one
    div: int        # the averages' divisor, 0 for each window's count

    @property
    def window2d(self):
        """(KH, KW, sh, sw, qh, qw, dh, dw): what the compiled-window kernels bake in."""
        return (self.KH, self.KW, self.sh, self.sw, self.qh, self.qw, self.dh, self.dw)

"""ConvGeometry: the 24 ints every convolution kernel takes, named. 1-d and 2-d problems
get leading spatial axes of size 1, so one kernel serves every rank; the kernels take
the fields in this order (a NamedTuple unpacks as the plain ints: `*g`)."""
import functools
from typing import NamedTuple


class ConvGeometry(NamedTuple):
    N: int        # batch
    C: int        # input channels
    K: int        # filters (output channels)
    G: int        # groups
    D: int        # input depth, height, width
    H: int
    W: int
    T: int        # filter depth, height, width (taps)
    R: int
    S: int
    PD: int       # output depth, height, width
    PH: int
    PW: int
    sd: int       # strides
    sh: int
    sw: int
    qd: int       # pre-paddings (the post-paddings only shorten the output)
    qh: int
    qw: int
    dd: int       # dilations
    dh: int
    dw: int
    flip: int     # 1: mode "convolution" (the filter flipped), 0: cross-correlation
    last: int     # 1: channels last (NHWC), 0: channels first

    @property
    def planar(self):
        """The depth axis is trivial, so a kernel that ignores it (2-d and 1-d problems,
        taking D, T, PD as 1 and qd as 0) computes the call: one input plane, one filter
        tap and one output plane, read without padding. D == T == 1 alone is not
        enough: depth padding makes several output planes of the one input plane
        (PD > 1), or puts the one tap in the padding (qd > 0)."""
        return self.D == 1 and self.T == 1 and self.PD == 1 and self.qd == 0


@functools.lru_cache(maxsize=1024)
def geometry(x_shape, w_shape, stride, pads, dilation, groups, mode, last):
    """The call's ConvGeometry, remembered per call geometry (tuples, ints and a string:
    every eager call asks)."""
    xs = (x_shape[0], x_shape[-1]) + tuple(x_shape[1:-1]) if last else tuple(x_shape)
    ws = (w_shape[0], w_shape[-1]) + tuple(w_shape[1:-1]) if last else tuple(w_shape)
    lead = (1,) * (5 - len(xs))
    S, R = lead + xs[2:], lead + ws[2:]
    st, dl = (1,) * len(lead) + tuple(stride), (1,) * len(lead) + tuple(dilation)
    pre = (0,) * len(lead) + tuple(a for a, _ in pads)
    post = (0,) * len(lead) + tuple(b for _, b in pads)
    P = tuple((s + a + b - d * (r - 1) - 1) // q + 1
              for s, a, b, d, r, q in zip(S, pre, post, dl, R, st))
    return ConvGeometry(xs[0], xs[1], ws[0], groups, *S, *R, *P, *st, *pre, *dl,
                        int(mode == "convolution"), int(last))

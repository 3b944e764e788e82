"""The names every generated convolution kernel's source runs in, per compute type:
CT, ZERO and INF, the fused activation `act_fn`, the epilogue, the index helpers
(strides, split, U, I, U32, W32, UB), store4 and `window_sum`. The implicit GEMM (kernels.py) and the depthwise
row kernels (depthwise_rows.py, built on first use) both take a copy."""
import functools

import numpy as np
from numba import cuda, float32, float64, int64, uint64

from .. import activation as _act
from ..runtime.launch.grid import I, U, U32, split, split32, strides
from ..runtime.device_code.intrinsics import narrow, narrow4, store4, widen
from ..runtime.simulator import SIMULATOR
from ..runtime.device_code.stencil import W32
from .gemm import make_epilogue

COMPUTE = {"float32": (float32, np.float32), "float64": (float64, np.float64)}


def make_window_sum(CT):
    """window_sum(x, w, xb, wb, h0, w0, H, W, R, S, dh, dw, xh, xw, flip): one output of
    a 2-d depthwise window summed over the taps that land inside the H x W plane only
    (a tap outside is absent, not a zero times the weight). Backward data runs the
    forward kernels over dy padded by R - 1 - q; there a term outside dy does not
    exist, so an output those kernels make non-finite is summed again through this
    (0 * inf would make it nan; nbdnn/cpu/conv.py states the rule)."""
    @cuda.jit(device=True)
    def window_sum(x, w, xb, wb, h0, w0, H, W, R, S, dh, dw, xh, xw, flip):
        acc = CT(0)
        xb, wb, xh, xw = int64(xb), int64(wb), int64(xh), int64(xw)  # (callers' U32/U64)
        for r in range(R):
            ih = h0 + r * dh
            if 0 <= ih < H:
                for s in range(S):
                    iw = w0 + s * dw
                    if 0 <= iw < W:
                        tap = R * S - 1 - r * S - s if flip else r * S + s
                        acc += widen(x[xb + ih * xh + iw * xw]) * widen(w[wb + tap])
        return acc
    return window_sum


@functools.lru_cache(maxsize=None)
def namespace(ct_name):
    """The base names for compute type ct_name ("float32" or "float64"); callers exec
    into a copy (dict(namespace(ct))), never into this one."""
    CT, nt = COMPUTE[ct_name]
    act_fn = _act.fused(nt)
    return {"cuda": cuda, "CT": CT, "ZERO": nt(0), "INF": nt(np.inf), "act_fn": act_fn, "strides": strides,
            "split": split, "split32": split32, "store4": store4, "U": U, "I": I,
            "U32": U32, "W32": W32, "UB": (lambda v: int(v) % (1 << 64)) if SIMULATOR else uint64,
            "epilogue": make_epilogue(CT, act_fn), "window_sum": make_window_sum(CT),
            "widen": widen, "narrow": narrow, "narrow4": narrow4}  # loads widen, stores narrow

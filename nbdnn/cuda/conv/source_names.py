"""The names every generated convolution kernel's source runs in, per compute type:
CT and ZERO, the fused activation `act_fn`, the epilogue, the index helpers (strides,
split, U, I, U32, W32, UB) and store4. The implicit GEMM (kernels.py) and the depthwise
row kernels (depthwise_rows.py, built on first use) both take a copy."""
import functools

import numpy as np
from numba import cuda, float32, float64, uint64

from .. import activation as _act
from ..runtime.grid import I, U, U32, split, split32, strides
from ..runtime.intrinsics import store4
from ..runtime.simulator import SIMULATOR
from ..runtime.stencil import W32
from .gemm import make_epilogue

COMPUTE = {"float32": (float32, np.float32), "float64": (float64, np.float64)}


@functools.lru_cache(maxsize=None)
def namespace(ct_name):
    """The base names for compute type ct_name ("float32" or "float64"); callers exec
    into a copy (dict(namespace(ct))), never into this one."""
    CT, nt = COMPUTE[ct_name]
    act_fn = _act.fused(nt)
    return {"cuda": cuda, "CT": CT, "ZERO": nt(0), "act_fn": act_fn, "strides": strides,
            "split": split, "split32": split32, "store4": store4, "U": U, "I": I,
            "U32": U32, "W32": W32, "UB": (lambda v: int(v) % (1 << 64)) if SIMULATOR else uint64,
            "epilogue": make_epilogue(CT, act_fn)}

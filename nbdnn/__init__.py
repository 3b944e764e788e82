"""nbdnn: cuDNN's primitives as numba.cuda kernels, each with a NumPy/SciPy reference.

NumPy arrays run on the CPU reference, CUDA arrays (numba, CuPy, PyTorch) on the GPU;
`backend="cuda"` moves NumPy inputs to the GPU and the results back.

The public ops are the op registry's (nbdnn/ops/registry.py): each family module under
nbdnn/ops registers its ops with @op, and this module exports them, wrapped in eager
call plans where the record says planned (nbdnn/ops/_plan.py; NBDNN_PLANS=0 turns them
off; `op.unplanned` is the bare op)."""
from . import _gpu_check  # noqa: F401  (chooses numba's simulator before numba.cuda loads)
from .errors import (BadParamError, DeviceError, DtypeError, NbdnnError,
                     NotSupportedError, ShapeError)
from .ops import registry as _registry
from .ops._plan import planned as _planned
from ._math_mode import get_math, math_mode, set_math

__version__ = "0.1.0"

for _rec in _registry.load().values():
    globals()[_rec.name] = _planned(_rec.fn) if _rec.planned else _rec.fn
del _rec

__all__ = ["BadParamError", "DeviceError", "DtypeError", "NbdnnError", "NotSupportedError",
           "ShapeError", "get_math", "math_mode", "set_math", *_registry.OPS]

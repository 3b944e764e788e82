"""What an array is, without importing numba.cuda: its shape, dtype and layout
(describe), which side of the bus it lives on (kind: NumPy arrays "cpu"; arrays
exposing `__cuda_array_interface__` — numba device arrays, CuPy arrays, PyTorch CUDA
tensors — and numba's simulated device arrays "cuda"), and this thread's capture state.
Below both backends: nbdnn.cpu and nbdnn.cuda read it, nbdnn.backend dispatches on it."""
import importlib
import threading

import numpy as np

from .errors import BadParamError, DeviceError, DtypeError, fail

capture_state = threading.local()  # this thread's .graph (cuda.Graph) and .plan (ops._plan)
dry_launches = []  # the lists of the dry runs in progress (cuda/runtime/launch/kernel.py
# dry_run): while any is, every thread's launches are noted in the last, not made
describers = {}  # type -> fn(x) -> (shape, dtype, c_contiguous); filled on first sight
array_facts = {}  # CUDA array type -> fn(x) -> (shape, dtype, count, address) | None; filled
# by nbdnn.cuda.runtime.memory.arrays.facts (this module does not import numba.cuda)


class Refused(Exception):
    """A describer's refusal of an array, which its caller raises as `cls` naming the op
    and the parameter (fail(cls, op, name, expected, given))."""

    def __init__(self, cls, expected, given):
        super().__init__(given)
        self.cls, self.expected, self.given = cls, expected, given


def _describe_numpy(x):
    return x.shape, x.dtype, x.flags.c_contiguous


def _refuse_subclass(x):
    """np.matrix turns * into a matrix product and a masked array's mask would be read by
    one backend and dropped by the other: neither has nbdnn's meaning, so both are
    refused, with the one-call fix. (np.memmap, a plain array in a file, is taken.)"""
    raise Refused(DtypeError, "a plain numpy.ndarray (pass np.asarray(x): subclasses such "
                  "as np.matrix and masked arrays change what operators and reductions mean)",
                  f"{type(x).__module__}.{type(x).__name__}")


def _describe_torch(x):
    if not x.is_cuda:
        raise Refused(DeviceError, "a NumPy array or a CUDA array (pass tensor.numpy() for "
                      "the CPU backend or tensor.cuda() for the GPU)",
                      f"a torch tensor on {x.device}")
    d = x.dtype
    return tuple(x.shape), torch_dtypes.get(d) or numpy_dtype_of(d), x.is_contiguous()


torch_dtypes = {}


def numpy_dtype_of(tdt):
    dt = torch_dtypes.get(tdt)
    if dt is None:
        name = str(tdt).replace("torch.", "")
        try:
            dt = np.dtype(name)
        except TypeError:  # bfloat16 and friends: ml_dtypes where installed
            dt = np.dtype(getattr(importlib.import_module("ml_dtypes"), name))
        torch_dtypes[tdt] = dt
    return dt


def _describe_cai(x):
    cai = x.__cuda_array_interface__
    shape = tuple(cai["shape"])
    dtype = np.dtype(cai["typestr"])
    strides = cai.get("strides")
    return shape, dtype, strides is None or strides == _c_strides(shape, dtype.itemsize)


def _describe_numba(x):
    """numba's simulated device arrays."""
    return x.shape, x.dtype, x.is_c_contiguous()


def _describe_numba_device(x):
    """numba device arrays, described once: their shape, dtype and layout never change
    (a model's parameters are described on every call that uses them)."""
    d = x.__dict__.get("_nbdnn_described")
    if d is None:
        d = x.__dict__["_nbdnn_described"] = (x.shape, x.dtype, x.is_c_contiguous())
    return d


def _describe_cupy(x):
    return x.shape, x.dtype, x.flags.c_contiguous


def _c_strides(shape, itemsize):
    strides, acc = [], itemsize
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


def _describer(t):
    f = describers.get(t)
    if f is not None:
        return f
    mod = t.__module__ or ""
    if t is np.ndarray or issubclass(t, np.memmap):
        f = _describe_numpy
    elif issubclass(t, np.ndarray):
        f = _refuse_subclass
    elif mod.startswith("torch"):
        f = _describe_torch
    elif mod.startswith("numba.cuda.simulator") and hasattr(t, "is_c_contiguous"):
        f = _describe_numba
    elif mod.startswith("numba.cuda") and hasattr(t, "is_c_contiguous") and \
            hasattr(t, "device_ctypes_pointer"):
        f = _describe_numba_device
    elif mod.startswith("cupy"):
        f = _describe_cupy
    elif hasattr(t, "__cuda_array_interface__"):
        f = _describe_cai
    else:
        f = None
    if f is not None:
        describers[t] = f
    return f


def is_array(x):
    return _describer(type(x)) is not None


array_kinds = {}  # type -> 'cpu' | 'cuda', filled on first sight


def kind(x):
    """'cpu' for NumPy arrays, 'cuda' for device arrays, None for anything else."""
    t = type(x)
    k = array_kinds.get(t)
    if k is None:
        if issubclass(t, np.ndarray):
            k = "cpu"
        elif _describer(t) is not None:
            k = "cuda"
        else:
            return None
        array_kinds[t] = k
    return k


def describe(op, name, x):
    """(shape, dtype, c_contiguous) of any supported array; a clear error otherwise."""
    f = _describer(type(x))
    if f is None:
        fail(BadParamError, op, name, "a NumPy array or a CUDA array",
             f"{type(x).__module__}.{type(x).__name__}")
    try:
        return f(x)
    except Refused as r:
        fail(r.cls, op, name, r.expected, r.given)

"""Which backend runs a call, and what an array is, without importing numba.cuda.

NumPy arrays run on the CPU reference; arrays exposing `__cuda_array_interface__`
(numba device arrays, CuPy arrays, PyTorch CUDA tensors) and numba's simulated device
arrays run on the CUDA backend. `backend="cpu"|"cuda"` forces a backend; the
environment variable NBDNN_BACKEND sets the default for NumPy inputs, so a whole
script of NumPy calls can be moved to the GPU without edits.
"""
import importlib
import os
import threading

import numpy as np

from .errors import BadParamError, DeviceError, DtypeError, fail

BACKENDS = ("cpu", "cuda")
capture_state = threading.local()  # this thread's .graph (cuda.Graph) and .plan (ops._plan)
describers = {}  # type -> fn(x) -> (shape, dtype, c_contiguous); filled on first sight
array_facts = {}  # CUDA array type -> fn(x) -> (shape, dtype, count, address) | None; filled
# by nbdnn.cuda.runtime.arrays.facts (this module does not import numba.cuda)


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


def check_stream(op, stream):
    """BadParamError naming op unless stream is one the README names: None; a CUstream
    handle as an int >= 0 (0: the legacy default stream; what torch's
    `Stream.cuda_stream` gives); a numba, CuPy or PyTorch stream object; or any object
    with `__cuda_stream__`. (A string, a negative number or an arbitrary object would
    otherwise reach the driver as a raw handle.)"""
    if stream is None:
        return
    if isinstance(stream, (int, np.integer)) and not isinstance(stream, (bool, np.bool_)):
        if 0 <= stream < 2 ** 64:
            return
    elif hasattr(stream, "__cuda_stream__") or any(
            hasattr(stream, a) for a in ("cuda_stream", "ptr", "handle")) or \
            type(stream).__module__.startswith("numba.cuda.simulator"):
        return
    fail(BadParamError, op, "stream", "None, a CUDA stream (numba, CuPy, PyTorch, or an "
         "object with __cuda_stream__) or a stream handle (an int >= 0)", repr(stream))


def choose(op, arrays, backend=None):
    """The backend for a call over `arrays` (name -> array or None).

    Returns (backend_name, copy): copy is True when NumPy inputs go to the GPU and the
    results come back to NumPy."""
    if backend is None or backend == "cuda":  # fast path: every array a known CUDA kind
        cuda = False
        for a in arrays.values():
            if a is not None:
                cuda = array_kinds.get(type(a)) == "cuda"
                if not cuda:
                    break
        if cuda:
            return "cuda", False
    kinds = {}
    for name, a in arrays.items():
        if a is None:
            continue
        k = array_kinds.get(type(a)) or kind(a)
        if k is None:
            fail(BadParamError, op, name, "a NumPy array or a CUDA array",
                 f"{type(a).__module__}.{type(a).__name__}")
        kinds.setdefault(k, name)
    if len(kinds) > 1:
        describe(op, kinds["cuda"], arrays[kinds["cuda"]])  # (a torch CPU tensor: named)
        raise DeviceError(
            f"{op}: {kinds['cpu']} is a NumPy (host) array but {kinds['cuda']} is a CUDA "
            "(device) array; pass both on one side (copy with cuda.to_device / .copy_to_host)")
    k = next(iter(kinds), "cpu")
    if backend is not None and backend not in BACKENDS:
        fail(BadParamError, op, "backend", f"one of {BACKENDS} or None", repr(backend))
    if k == "cuda":
        if backend == "cpu":
            raise DeviceError(f"{op}: backend='cpu' needs NumPy arrays; got CUDA arrays "
                              "(copy them to the host first)")
        return "cuda", False
    if backend is None:
        backend = os.environ.get("NBDNN_BACKEND", "cpu") or "cpu"
        if backend not in BACKENDS:
            fail(BadParamError, op, "NBDNN_BACKEND", f"one of {BACKENDS}", repr(backend))
    return backend, backend == "cuda"


def module(backend, family, op=None):
    """The backend's module for an op family: nbdnn.cpu.<family> or nbdnn.cuda.<family>
    (a DeviceError for op when CUDA kernels can run neither on a GPU nor simulated)."""
    if backend == "cuda":
        cuda_runtime("simulator").require_gpu(op or family)
    return importlib.import_module(f"nbdnn.{backend}.{family}")


_SEVERAL = []  # [whether more than one CUDA device is visible], asked on the first CUDA call


def several_devices():
    """Whether calls must find their arrays' device (issue 27): more than one visible."""
    if not _SEVERAL:
        _SEVERAL.append(cuda_runtime("device").count() > 1)
    return _SEVERAL[0]


def cuda_runtime(name):
    """nbdnn.cuda.runtime.<name> (arrays, launch, strided, plan_record, device), for the
    front end: ops/ reaches the CUDA backend only through this module."""
    return importlib.import_module(f"nbdnn.cuda.runtime.{name}")

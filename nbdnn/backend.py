"""Which backend runs a call, and the two backends' dispatch tables.

NumPy arrays run on the CPU reference (nbdnn.cpu), CUDA arrays on the CUDA backend
(nbdnn.cuda; nbdnn.arrays says which an array is). `backend="cpu"|"cuda"` forces a
backend; the environment variable NBDNN_BACKEND sets the default for NumPy inputs, so a
whole script of NumPy calls can be moved to the GPU without edits. A call's function is
found by its family in the backend's table (nbdnn/cpu/families.py,
nbdnn/cuda/families.py: ops/conv's `c.run("conv_forward", ...)` runs
nbdnn.cuda.conv.conv_forward); the CUDA table, and numba.cuda with it, is imported on
the first CUDA call. ops/ reaches the backends only through this module."""
import os

import numpy as np

from .arrays import array_kinds, describe, kind
from .errors import BadParamError, DeviceError, fail

BACKENDS = ("cpu", "cuda")


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


def families(backend):
    """The backend's dispatch table: family name -> its module (nbdnn/cpu/families.py,
    nbdnn/cuda/families.py)."""
    if backend == "cuda":
        from .cuda import families as table  # numba.cuda loads here, on the first CUDA call
    else:
        from .cpu import families as table
    return table.FAMILIES


def module(backend, family, op=None):
    """The backend's module for an op family: nbdnn.cpu.<family> or nbdnn.cuda.<family>
    (a DeviceError for op when CUDA kernels can run neither on a GPU nor simulated)."""
    if backend == "cuda":
        cuda_runtime("simulator").require_gpu(op or family)
    return families(backend)[family]


_SEVERAL = []  # [whether more than one CUDA device is visible], asked on the first CUDA call


def several_devices():
    """Whether calls must find their arrays' device: more than one visible."""
    if not _SEVERAL:
        _SEVERAL.append(cuda_runtime("device").count() > 1)
    return _SEVERAL[0]


_RUNTIME = {}  # name -> module of nbdnn.cuda.runtime, filled on the first CUDA call


def cuda_runtime(name):
    """nbdnn.cuda.runtime.<name> (arrays, device, launch, plan_record, simulator,
    strided), for the front end: ops/ reaches the CUDA backend only through this module."""
    m = _RUNTIME.get(name)
    if m is None:
        from .cuda.runtime.memory import arrays, strided
        from .cuda.runtime import device, simulator
        from .cuda.runtime.launch import kernel as launch
        from .cuda.runtime.capture import plan_record
        _RUNTIME.update(arrays=arrays, device=device, launch=launch, plan_record=plan_record,
                        simulator=simulator, strided=strided)
        m = _RUNTIME[name]
    return m

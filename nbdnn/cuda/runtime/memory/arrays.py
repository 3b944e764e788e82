"""Device arrays of every kind (numba, CuPy, PyTorch, numba's simulator): pointers,
allocation of results of the caller's kind, host/device copies, stream handles.

Results come back as the kind of array that came in: a torch tensor in gives a torch
tensor out (allocated by torch's caching allocator, which is also the cheapest
allocation on the host), CuPy gives CuPy, anything else a numba device array.
"""
import numpy as np
from numba import cuda

from ..simulator import SIMULATOR
from ....arrays import array_facts as _facts_fns, capture_state, torch_dtypes, describe
from ....arrays import numpy_dtype_of as _np_dtype_of_torch


def _ptr_numba(x):
    return _numba_facts(x)[1][0]


def _ptr_torch(x):
    return x.data_ptr()


def _ptr_cupy(x):
    return x.data.ptr


def _ptr_cai(x):
    return x.__cuda_array_interface__["data"][0]


def _ptr_simulated(x):
    return x._ary.__array_interface__["data"][0]


def _is_numba_device_array(t):
    """A real numba DeviceNDArray type. (gpu_data is an instance attribute: testing the
    type for it was False, which sent numba arrays down the __cuda_array_interface__
    path: 1.6 us an array of the H200 host's time.)"""
    mod = t.__module__ or ""
    return mod.startswith("numba.cuda") and not mod.startswith("numba.cuda.simulator") \
        and hasattr(t, "device_ctypes_pointer") and hasattr(t, "is_c_contiguous")


def _array_kind(t):
    mod = t.__module__ or ""
    if mod.startswith("torch"):
        return "torch"
    if mod.startswith("cupy"):
        return "cupy"
    if mod.startswith("numba.cuda.simulator"):  # host memory behind a fake
        return "simulated"
    return "numba" if _is_numba_device_array(t) else None


def _chosen(cache, table, t):
    """table's function for type t's kind (table[None] for any other kind), remembered
    per type: ptr, ptr_size and facts run on every launch."""
    f = cache[t] = table.get(_array_kind(t)) or table[None]
    return f


_ptr_fns = {}
_PTR = {"torch": _ptr_torch, "cupy": _ptr_cupy, "simulated": _ptr_simulated,
        "numba": _ptr_numba, None: _ptr_cai}


def ptr(x):
    """The device address of x's first element (an int)."""
    t = type(x)
    return (_ptr_fns.get(t) or _chosen(_ptr_fns, _PTR, t))(x)


def span(x):
    """(first byte, one past the last byte) that a CUDA array of any kind covers, from
    its address, shape and strides: two arrays whose spans meet may share memory (the
    front end's overlap test, as NumPy's may_share_memory)."""
    p, shape, item = ptr(x), tuple(x.shape), dtype_of(x).itemsize
    if any(n == 0 for n in shape):
        return p, p
    kind = _array_kind(type(x))
    if kind == "torch":
        strides = [s * item for s in x.stride()]
    elif kind == "simulated":
        strides = x._ary.strides
    elif kind in ("cupy", "numba"):
        strides = x.strides
    else:
        strides = x.__cuda_array_interface__.get("strides") or \
            tuple(item * int(np.prod(shape[i + 1:])) for i in range(len(shape)))
    lo = hi = p
    for n, st in zip(shape, strides):
        lo, hi = (lo + (n - 1) * st, hi) if st < 0 else (lo, hi + (n - 1) * st)
    return lo, hi + item


def size(x):
    n = x.numel() if hasattr(x, "numel") else x.size
    return int(n)


def _numba_facts(x):
    """(facts, (address, count)) of a numba device array, kept in the array's __dict__:
    a DeviceNDArray's memory, shape and dtype never change (copy.copy, as in bind(),
    keeps them too), and its address takes MemoryPointer -> CUdeviceptr -> int."""
    facts = x.__dict__.get("_nbdnn_facts")
    if facts is None:
        n = x.size
        p = (x.gpu_data.device_pointer_value or 0) if n else 0  # int(CUdeviceptr)
        facts = (x.shape, x.dtype, n, p) if x.is_c_contiguous() else None
        facts = x.__dict__["_nbdnn_facts"] = (facts, (p, n))
    return facts


def _ptr_size_numba(x):
    return _numba_facts(x)[1]


def _ptr_size_torch(x):
    return x.data_ptr(), x.numel()


def _ptr_size_any(x):
    return ptr(x), size(x)


def _ptr_size_simulated(x):
    a = x._ary  # the simulator's host memory behind the fake device array
    return a.__array_interface__["data"][0], a.size


_ptr_size_fns = {}
_PTR_SIZE = {"torch": _ptr_size_torch, "numba": _ptr_size_numba,
             "simulated": _ptr_size_simulated, None: _ptr_size_any}


def ptr_size(x):
    """(device address, element count) of a C-contiguous device array: the two
    numbers a kernel launch needs, fetched the cheapest way for x's kind."""
    t = type(x)
    return (_ptr_size_fns.get(t) or _chosen(_ptr_size_fns, _PTR_SIZE, t))(x)


def _facts_torch(x):
    if x.is_cuda and x.is_contiguous():  # a CPU tensor takes the full path's error
        d = x.dtype
        return x.shape, torch_dtypes.get(d) or _np_dtype_of_torch(d), x.numel(), x.data_ptr()
    return None


def _facts_numba(x):
    return _numba_facts(x)[0]


def _facts_any(x):
    """CuPy, __cuda_array_interface__ objects, the simulator's arrays."""
    shape, dtype, contig = describe("facts", "x", x)
    return (shape, dtype, size(x), ptr(x)) if contig else None


_FACTS = {"torch": _facts_torch, "numba": _facts_numba, None: _facts_any}


def facts(x):
    """(shape, NumPy dtype, element count, device address) of a C-contiguous CUDA array;
    None for a strided one. What an eager call plan's signature (ops/_plan.py) needs
    from each array, fetched in one call: one function per array kind."""
    t = type(x)
    return (_facts_fns.get(t) or _chosen(_facts_fns, _FACTS, t))(x)


def _plan_facts_torch(x):
    """(shape, torch dtype, bytes, address): four of torch's C getters."""
    if x.is_cuda and x.is_contiguous():
        return x.shape, x.dtype, x.nbytes, x.data_ptr()
    return None


def _plan_facts_numba(x):
    """(shape, dtype, bytes, address), kept in the array's __dict__ as facts() are."""
    f = x.__dict__.get("_nbdnn_plan_facts", False)
    if f is False:
        g = _numba_facts(x)[0]
        f = x.__dict__["_nbdnn_plan_facts"] = \
            None if g is None else (g[0], g[1], g[2] * g[1].itemsize, g[3])
    return f


def _plan_facts_any(x):
    f = _facts_any(x)
    return None if f is None else (f[0], f[1], f[2] * f[1].itemsize, f[3])


_PLAN_FACTS = {"torch": _plan_facts_torch, "numba": _plan_facts_numba, None: _plan_facts_any}
_plan_facts_fns = {}


def plan_facts(t):
    """fn(x) -> (shape, dtype, bytes, address), None for a strided array: what an eager
    call plan's signature (ops/_plan.py) reads from an array of type t (the bytes tell
    it which arrays overlap)."""
    return _plan_facts_fns.get(t) or _chosen(_plan_facts_fns, _PLAN_FACTS, t)


_dtype_names = {}


def dtype_name(x):
    """'float32' etc. for any array kind (torch dtypes print as 'torch.float32'); cached
    per dtype object (str() of a NumPy dtype costs ~2 us, and a conv call asks thrice)."""
    d = x.dtype
    name = _dtype_names.get(d)
    if name is None:
        name = _dtype_names[d] = str(d).rpartition(".")[2]
    return name


_dtypes = {}


def vector_aligned(*arrays, alignment=None):
    """True when every array's base address suits load4/store4 (their first array's
    itemsize decides the alignment), or is a multiple of `alignment` bytes when given
    (load8/store8: 16); None entries are skipped."""
    from ..device_code.intrinsics import vector_alignment
    a = 0
    for x in arrays:
        if x is not None:
            a |= ptr(x)
    return a % (alignment or vector_alignment(dtype_of(arrays[0]).itemsize)) == 0


def dtype_of(x):
    """x's dtype as a NumPy dtype, for any array kind (cached per dtype object)."""
    d = x.dtype
    nd = _dtypes.get(d)
    if nd is None:
        nd = _dtypes[d] = np.dtype(str(d).rpartition(".")[2])
    return nd


TO_TORCH = {}  # a dtype as nbdnn names it (str or np.dtype) -> torch's


def torch_dtype(dtype):
    t = TO_TORCH.get(dtype)
    if t is None:
        import torch
        t = TO_TORCH[dtype] = getattr(torch, np.dtype(dtype).name)
    return t


def empty(like, shape, dtype):
    """An uninitialised C-contiguous device array of like's kind (torch's and CuPy's
    caching allocators for their arrays: a few us; numba's allocator: ~40 us)."""
    shape = tuple(int(s) for s in shape)
    tls = capture_state.__dict__
    alloc = tls.get("alloc")  # a reuse.Trace or Arena (graph capture with buffer reuse)
    a = allocate(like, shape, dtype) if alloc is None else alloc(like, shape, dtype)
    plan = tls.get("plan")
    if plan is not None:  # an eager call being recorded for its plan (ops/_plan.py)
        plan.alloc(like, shape, dtype, a)
    return a


def allocate(like, shape, dtype):
    mod = type(like).__module__ or ""
    if mod.startswith("torch"):
        import torch
        return torch.empty(shape, dtype=TO_TORCH.get(dtype) or torch_dtype(dtype),
                           device=like.device)
    if mod.startswith("cupy"):
        import cupy
        with like.device:
            return cupy.empty(shape, dtype=dtype)
    return cuda.device_array(shape, dtype=dtype)


def host_copy():
    """A copy between host and device: an eager call being recorded can't be planned."""
    plan = capture_state.__dict__.get("plan")
    if plan is not None:
        plan.impure()


def to_device(a, stream=0):
    """A C-contiguous device copy of `a` (any NumPy array or view: reversed, strided,
    size-1 axes with any stride)."""
    host_copy()
    return landed_copy(a, stream)


def landed_copy(a, stream=0):
    """to_device's copy without telling a recorded call (a caller whose replay makes
    the copy again itself: tensormap's maps); on the legacy stream it has landed when
    this returns."""
    a = np.asarray(a)
    if a.dtype.name == "bfloat16" and not SIMULATOR:
        return _bfloat16_to_torch(a)
    if a.size and a.strides != _c_strides(a.shape, a.itemsize):
        # (NumPy calls an array whose only odd strides are on size-1 axes contiguous,
        # and numba's to_device keeps those strides: a negative one gave a device
        # array of the wrong shape, a 0 one an array numba calls non-contiguous; a
        # new array has the canonical strides)
        a = np.array(a, order="C", copy=True)
    dev = cuda.to_device(a, stream=stream or 0)
    if not stream and not SIMULATOR:
        # A synchronous copy from pageable memory returns once the data is staged; the
        # DMA lands later on the legacy stream. A kernel on the legacy stream (or a
        # blocking one) is ordered after it, but one on a non-blocking stream (PyTorch's
        # side streams) is not: an H200 probe, whose first calls ran on such a
        # stream, hit an illegal instruction (a TMA map or a table read before it
        # landed). The copy itself waited for the legacy stream's earlier work, so this
        # waits only for its own DMA (uploads are rare: cached tables, maps, NumPy inputs).
        cuda.default_stream().synchronize()
    return dev


def _bfloat16_to_torch(a):
    """A bfloat16 NumPy array on the GPU: numba's device arrays have no bfloat16 dtype,
    so a PyTorch tensor holds it (kernels take its bits as uint16)."""
    try:
        import torch
    except ImportError:
        from ....errors import NotSupportedError
        raise NotSupportedError("bfloat16 arrays on the GPU are PyTorch tensors (numba's "
                                "device arrays have no bfloat16): install torch") from None
    return torch.from_numpy(bfloat16_bits(a)).cuda().view(torch.bfloat16)


def bfloat16_bits(a):
    """A C-contiguous int16 copy of a bfloat16 array's bits, of a's shape (0-d stays 0-d:
    np.ascontiguousarray would make it 1-d, and the GPU result (1,))."""
    return np.array(a, order="C", copy=True).view(np.int16)


def _c_strides(shape, itemsize):
    out, step = [], itemsize
    for n in reversed(shape):
        out.append(step)
        step *= max(n, 1)
    return tuple(reversed(out))


def to_host(x):
    """A NumPy copy of any device array (synchronises)."""
    host_copy()
    mod = type(x).__module__ or ""
    if mod.startswith("torch"):
        if str(x.dtype) == "torch.bfloat16":  # (torch has no NumPy bfloat16)
            import ml_dtypes
            return x.detach().view(torch_dtype("int16")).cpu().numpy().view(ml_dtypes.bfloat16)
        return x.detach().cpu().numpy()
    if mod.startswith("cupy"):
        return x.get()
    if hasattr(x, "copy_to_host"):
        return x.copy_to_host()
    return cuda.as_cuda_array(x).copy_to_host()


def flat(x):
    """A 1-D view for the simulator's launch path, which indexes like NumPy; bfloat16 as
    its uint16 bits, as kernels get it on the GPU (so a store that skips `narrow`, or a
    load that skips `widen`, fails in the simulator too)."""
    v = x.reshape(int(np.prod(x.shape, dtype=np.int64)))
    return v.view(np.uint16) if getattr(v.dtype, "name", "") == "bfloat16" else v


def stream_handle(stream):
    """The CUstream handle (int) of a numba, CuPy or PyTorch stream, or of any object
    with `__cuda_stream__`; None and 0 mean the legacy default stream."""
    if stream is None or stream == 0 or SIMULATOR:
        return 0
    if isinstance(stream, int):
        return stream
    if hasattr(stream, "__cuda_stream__"):
        return int(stream.__cuda_stream__()[1])
    for attr in ("cuda_stream", "ptr", "handle"):
        h = getattr(stream, attr, None)
        if h is not None:
            return int(getattr(h, "value", h) or 0)
    from ....errors import BadParamError
    raise BadParamError(f"stream must be a CUDA stream (numba, CuPy, PyTorch, or an object "
                        f"with __cuda_stream__); got {type(stream).__name__}")


def is_device(x):
    from ....arrays import kind
    return kind(x) == "cuda"

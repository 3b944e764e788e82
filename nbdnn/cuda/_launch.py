"""Compile each kernel once per signature; launch without numba's dispatcher.

numba's `kernel[grid, block](...)` re-types and re-flattens every argument in Python on
each call (20-40 us on the H200, more with torch tensors). Here a `Kernel` compiles one
signature once (`dispatcher.compile(sig)`), takes the CUfunction/CUkernel handle from
the loaded module, and keeps a packed parameter buffer per signature. A launch writes
the few values that change (pointers, sizes, scalars) into that buffer with one
`struct.pack_into` and calls cuda.bindings' `cuLaunchKernel` (~4 us of host time on the H200's host).

How numba passes arguments (numba-cuda 0.30, `_Kernel._prepare_args`): an array is
flattened to meminfo, parent, nitems, itemsize, data pointer, then one shape and one
stride (bytes) per dimension; scalars are their C type. Every nbdnn kernel takes 1-D
C-contiguous arrays (`float32[::1]`) and explicit int64 sizes, so an array is always
seven 8-byte slots. Each parameter gets its own 8-byte slot in the buffer; the kernel
parameter array `void*[]` points at the slots.

Validation happens in nbdnn.ops before we get here: the fast path trusts dtypes, sizes
and contiguity (numba's specialised dispatchers would not check them either).

Under numba's simulator `Kernel.launch` uses the plain `kernel[grid, block]` call.
"""
import ctypes
import struct
import threading

from numba import cuda

from . import SIMULATOR
from ._arrays import flat, ptr_size

REGISTRY = []  # every Kernel with the signatures it is used with (PTX test, warm-up)
_recording = threading.local()  # .graph: the nbdnn.cuda.Graph recording this thread


def recording():
    """The Graph recording this thread's launches, or None."""
    return getattr(_recording, "graph", None)


def _slot_codes(t):
    """struct codes for one numba argument type, one 8-byte slot per parameter."""
    name = str(t)
    if name.startswith("array("):
        if t.ndim != 1 or t.layout != "C":
            raise TypeError(f"fast launch takes 1-D C arrays only, got {t}")
        return "qqqqQqq"
    return {"int64": "q", "uint64": "Q", "int32": "i4x", "uint32": "I4x",
            "float32": "f4x", "float64": "d", "boolean": "?7x"}[name]


class _Launcher:
    """Packed parameters and the function handle of one compiled signature.

    `pack` is generated per signature (straight-line code, no per-argument loop: this
    runs on every eager call) and writes every parameter into the shared buffer."""

    def __init__(self, handle, argtypes, name):
        self.handle, self.name = handle, name
        packer = struct.Struct("<" + "".join(_slot_codes(t) for t in argtypes))
        self.buf = ctypes.create_string_buffer(packer.size)
        base = ctypes.addressof(self.buf)
        nslots = packer.size // 8
        self.params = (ctypes.c_void_p * nslots)(*[base + 8 * i for i in range(nslots)])
        self.params_address = ctypes.addressof(self.params)
        self.function = _driver.CUfunction(handle)
        self.lock = threading.Lock()
        self.pack = _make_packer(argtypes, packer.pack_into, self.buf)

    def __call__(self, grid, block, stream, args, shmem, recorder=None):
        gx, gy, gz = grid if type(grid) is tuple else (grid, 1, 1)
        bx, by, bz = block if type(block) is tuple else (block, 1, 1)
        with self.lock:  # the buffer is shared; cuLaunchKernel copies it
            self.pack(*args)
            rc, = _cuLaunchKernel(self.function, gx, gy, gz, bx, by, bz, shmem, stream,
                                  self.params_address, 0)
            if recorder is not None and not rc:
                recorder.record(self, (gx, gy, gz), (bx, by, bz), shmem, self.buf.raw)
        if rc:
            from ..errors import DeviceError
            raise DeviceError(f"cuLaunchKernel({self.name}) failed: {_error_name(int(rc))} "
                              f"(grid {grid}, block {block}, shared {shmem} B)")


def _make_packer(argtypes, pack_into, buf):
    """pack(*args): an array argument (a device array or a (pointer, count) tuple)
    becomes meminfo, parent, nitems, itemsize, data, shape, stride; a scalar itself."""
    names, body, vals = [], [], []
    for i, t in enumerate(argtypes):
        a = f"a{i}"
        names.append(a)
        if str(t).startswith("array("):
            isz = t.dtype.bitwidth // 8
            body.append(f"    p{i}, n{i} = {a} if type({a}) is tuple else ptr_size({a})")
            vals += ["0", "0", f"n{i}", str(isz), f"p{i}", f"n{i}", str(isz)]
        else:
            vals.append(a)
    src = (f"def pack({', '.join(names)}):\n" + "\n".join(body) +
           f"\n    pack_into(buf, 0, {', '.join(vals)})\n")
    ns = {"ptr_size": ptr_size, "pack_into": pack_into, "buf": buf}
    exec(compile(src, "<nbdnn packer>", "exec"), ns)
    return ns["pack"]


_cuLaunchKernel = None
_libcuda = None


_driver = None


def _bind_driver():
    """cuLaunchKernel from cuda.bindings, called with the address of the packed
    parameter array: 3.9 us a call on the H200 host, against 5.2 us through ctypes."""
    global _cuLaunchKernel, _libcuda, _driver
    if _cuLaunchKernel is None:
        from cuda.bindings import driver
        _libcuda = ctypes.CDLL("libcuda.so.1")
        _driver = driver
        _cuLaunchKernel = driver.cuLaunchKernel


def _function_handle(kernel_handle):
    """The CUfunction of a CUkernel (numba-cuda 0.30 loads modules as libraries) in the
    current context: launching a CUkernel makes the driver look the function up on
    every launch; the CUfunction skips that."""
    func = ctypes.c_void_p()
    rc = _libcuda.cuKernelGetFunction(ctypes.byref(func), ctypes.c_void_p(kernel_handle))
    return func.value if rc == 0 and func.value else kernel_handle


def _error_name(rc):
    s = ctypes.c_char_p()
    _libcuda.cuGetErrorName(rc, ctypes.byref(s))
    return (s.value or b"?").decode() + f" ({rc})"


class Kernel:
    """A numba kernel compiled once per signature and launched on the fast path.

    pyfunc: the Python kernel; sigs: the signatures nbdnn launches it with (used by
    the PTX test and `warm_up`); jit_options go to `cuda.jit`."""

    def __init__(self, pyfunc, sigs, **jit_options):
        self.pyfunc, self.sigs = pyfunc, tuple(sigs)
        self.name = pyfunc.__name__
        self.jit_options = jit_options
        self.dispatcher = cuda.jit(**jit_options)(pyfunc)  # lazy: compiles on demand
        self._launchers = {}
        self._thread_ctx = threading.local()
        REGISTRY.append(self)

    def compile(self, sig):
        """Compile and load `sig`; returns the launcher (the fast path's state)."""
        launcher = self._launchers.get(sig)
        if launcher is None:
            _bind_driver()
            kern = self.dispatcher.compile(sig)
            cufunc = kern._codelibrary.get_cufunc()
            launcher = _Launcher(_function_handle(int(cufunc.handle)), kern.argument_types,
                                 self.name)
            self._launchers[sig] = launcher
        return launcher

    def resources(self, sig):
        """Registers, local memory (spills) and shared memory of the compiled kernel."""
        attrs = self.dispatcher.compile(sig)._codelibrary.get_cufunc().attrs
        return {"regs": attrs.regs, "local_bytes": attrs.local, "shared_bytes": attrs.shared}

    def launch(self, sig, grid, block, stream, *args, shmem=0, owners=()):
        """Run the kernel: grid/block ints or 3-tuples, stream a CUstream handle (int).
        An array may be passed as a (pointer, count) tuple; `owners` then names the
        arrays behind such pointers, which a graph being recorded keeps alive."""
        recorder = getattr(_recording, "graph", None)
        if SIMULATOR:
            flat_args = [flat(a) if hasattr(a, "shape") else a for a in args]
            self.dispatcher[grid, block, 0, shmem](*flat_args)
            if recorder is not None:
                recorder.record_simulated(self.dispatcher, grid, block, shmem, flat_args)
                recorder.keep(args, owners)
            return
        launcher = self._launchers.get(sig) or self.compile(sig)
        if not getattr(self._thread_ctx, "ready", False):
            cuda.current_context()  # make the primary context current on this thread
            self._thread_ctx.ready = True
        launcher(grid, block, stream, args, shmem, recorder)
        if recorder is not None:
            recorder.keep(args, owners)


def warm_up(kernels=None):
    """Compile every registered signature now (JIT happens here, not in a timed run)."""
    for k in kernels or REGISTRY:
        for sig in k.sigs:
            k.compile(sig)

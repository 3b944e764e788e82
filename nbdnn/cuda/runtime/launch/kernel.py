"""Compile each kernel once per signature; launch without numba's dispatcher.

numba's `kernel[grid, block](...)` re-types and re-flattens every argument in Python on
each call (20-40 us on the H200, more with torch tensors). Here a `Kernel` compiles one
signature once (`dispatcher.compile(sig)`), takes the CUfunction/CUkernel handle from
the loaded module, and keeps a packed parameter buffer per signature. A launch writes
the few values that change (pointers, sizes, scalars) into that buffer with one
`struct.pack_into` and calls the driver's `cuLaunchKernel` from an @njit function
that reads the launch record (_Launcher: 3.7-3.9 us of host time on the H200's host).
An eager call plan replays a whole call's launches from one such @njit call over its
own packed records (LaunchTable): only the array addresses change between replays.

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
import contextlib
import ctypes
import os
import struct
import threading

import numpy as np
from numba import cuda

from ..simulator import SIMULATOR
from ..memory.arrays import flat, ptr_size
from . import compile_passes, kernel_cache
from .codegen import compile_source
# this thread's .graph (the nbdnn.cuda.Graph recording it) and .plan (an eager call
# plan's recorder, ops/_plan.py)
from ....arrays import capture_state, dry_launches

if os.environ.get("NBDNN_NUMBA_PASSES") != "numba":
    compile_passes.install()  # (two of numba's passes in linear time: the same IR)

REGISTRY = []  # every Kernel with the signatures it is used with (PTX test, warm-up)


def recording():
    """The Graph recording this thread's launches, or None."""
    return getattr(capture_state, "graph", None)


def issue(fn):
    """fn(stream): GPU work that is not an nbdnn kernel (an NCCL collective), on the
    legacy default stream in order with nbdnn's kernels; inside a Graph capture also
    recorded, so replays run it (Graph.external)."""
    g = getattr(capture_state, "graph", None)
    if g is not None:
        g.external(fn)
    else:
        fn(0)


@contextlib.contextmanager
def launched():
    """The names of the kernels this thread launches inside the block, in order (how a
    test sees which variant ran: `with launched() as names: ...`). Blocks nest: an
    enclosing block's list gets the inner block's names too. Eager call plans are not
    replayed meanwhile (a replay launches without Kernel.launch)."""
    tls = capture_state.__dict__
    outer, names = tls.get("watch"), []
    tls["watch"] = names
    try:
        yield names
    finally:
        tls["watch"] = outer
        if outer is not None:
            outer.extend(names)


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
    """One compiled signature's launch record and parameters, in one buffer:

        slot 0 function handle, 1 the parameter array's address, 2-4 grid, 5-7 block,
        8 shared bytes, 9 stream, then one 8-byte slot a kernel parameter.

    `pack` (generated per signature: straight-line code, this runs on every eager
    call) writes slots 2 onwards with one `struct.pack_into`; `_launch_record`, an
    @njit function, reads the record and calls the driver's cuLaunchKernel. On the
    H200's host that call costs 3.7-3.9 us against 4.1-4.4 us through cuda.bindings
    (which converts eleven Python arguments) and up to 4.9 us through @njit with the
    values as arguments (numba types every int; one array's type is a single C check)."""

    def __init__(self, handle, argtypes, name):
        self.handle, self.name = handle, name
        packer = struct.Struct("<7qQ" + "".join(_slot_codes(t) for t in argtypes))
        self.buf = ctypes.create_string_buffer(16 + packer.size)
        base = ctypes.addressof(self.buf)
        nslots = packer.size // 8 - 8
        self.params = (ctypes.c_void_p * nslots)(*[base + 80 + 8 * i for i in range(nslots)])
        self.params_address = ctypes.addressof(self.params)
        struct.pack_into("<QQ", self.buf, 0, handle, self.params_address)
        self.record = np.frombuffer(self.buf, np.int64, 10)
        self.function = driver.CUfunction(handle)
        self.lock = threading.Lock()
        self.pack = _make_packer(argtypes, packer.pack_into, self.buf)
        self.nslots = nslots
        self.data_slots, self.param_slots, slot = [], [], 0  # each array argument's
        # data-pointer slot; each argument's first slot
        for t in argtypes:
            n = struct.calcsize("<" + _slot_codes(t)) // 8
            self.data_slots.append(slot + 4 if n == 7 else None)
            self.param_slots.append(slot)
            slot += n


def _make_packer(argtypes, pack_into, buf):
    """pack(gx, gy, gz, bx, by, bz, shmem, stream, *args) into slots 2 onwards: an
    array argument (a device array or a (pointer, count) tuple) becomes meminfo,
    parent, nitems, itemsize, data, shape, stride; a scalar itself."""
    names, body = ["gx", "gy", "gz", "bx", "by", "bz", "shmem", "stream"], []
    vals = list(names)
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
           f"\n    pack_into(buf, 16, {', '.join(vals)})\n")
    ns = {"ptr_size": ptr_size, "pack_into": pack_into, "buf": buf}
    return compile_source("pack", src, ns, about={
        "what": "a kernel's argument packer: the parameter buffer cuLaunchKernel reads"})


cuLaunchKernel = None  # cuda.bindings' (graph instantiation; perf/suites/launch_overhead.py)
_launch_record = None
launch_table = None
libcuda = None
driver = None


def bind_driver():
    """The driver entry points: cuda.bindings' module, libcuda through ctypes, and
    `_launch_record(record) -> CUresult`, compiled here once a process (~0.3 s)."""
    global cuLaunchKernel, _launch_record, launch_table, libcuda, driver
    if _launch_record is None:
        from cuda.bindings import driver as bindings
        from numba import njit
        libcuda = ctypes.CDLL("libcuda.so.1")
        driver = bindings
        cuLaunchKernel = driver.cuLaunchKernel
        launch = ctypes.CDLL("libcuda.so.1").cuLaunchKernel  # own object: own argtypes
        launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        launch.restype = ctypes.c_int

        @njit
        def launch_record(r):
            return launch(r[0], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[1], 0)

        @njit
        def launch_table(m):  # LaunchTable's layout
            patches, starts, bases = m[1], m[3], m[4]
            for i in range(m[0]):
                q = patches + 3 * i
                m[m[q]] = m[bases + m[q + 1]] + m[q + 2]
            for k in range(m[2]):
                r = m[starts + k]
                rc = launch(m[r], m[r + 2], m[r + 3], m[r + 4], m[r + 5], m[r + 6],
                            m[r + 7], m[r + 8], m[r + 9], m[r + 1], 0)
                if rc:
                    m[5] = rc
                    return k + 1
            return 0
        _launch_record, launch_table = launch_record, launch_table


class Patch:
    """A LaunchTable argument: `count` elements at byte `offset` from base `base`."""

    __slots__ = ("base", "offset", "count")

    def __init__(self, base, offset, count):
        self.base, self.offset, self.count = base, offset, count


class LaunchTable:
    """A fixed sequence of launches whose array arguments move, issued by one @njit call
    (an eager call plan's replay, ops/_plan.py): one packed launch record a kernel
    instead of a `pack` and a driver call from Python each (~3 us a launch on the
    H200's host), and its own buffers, so no lock.

    launches: [(kernel, sig, grid, block, shmem, args)], an argument that moves given
    as a Patch; n_bases: how many base addresses the patches name. The int64 table m:
        0-5   number of patches, where they start, number of launches, where their
              starts are, where the bases are, the failing launch's CUresult;
        then each launch's record (10 slots, _Launcher's), parameters, and the
        pointers to its parameters (cuLaunchKernel's void**);
        patches (parameter slot, base, byte offset); launch starts; bases.
    A replay writes the bases (m[bases + i]) and calls launch_table(m), which adds
    each patch's offset to its base, launches in order and returns 0, or k for a
    failed k-th launch (its CUresult in m[5]; `failed` raises)."""

    def __init__(self, launches, n_bases):
        blocks, patches, end = [], [], 6
        for kernel, sig, grid, block, shmem, args in launches:
            la = kernel.compile(sig)
            vals = list(args)
            for i, a in enumerate(args):
                if type(a) is Patch:
                    vals[i] = (0, a.count)
                    patches.append((end + 10 + la.data_slots[i], a.base, a.offset))
            grid = grid if type(grid) is tuple else (grid, 1, 1)
            block = block if type(block) is tuple else (block, 1, 1)
            with la.lock:
                la.pack(*grid, *block, shmem, 0, *vals)
                raw = la.buf.raw
            blocks.append((end, raw, la.nslots, kernel.name))
            end += 10 + 2 * la.nslots
        m = self.m = np.zeros(end + 3 * len(patches) + len(blocks) + n_bases, np.int64)
        address = m.ctypes.data
        for start, raw, n, _ in blocks:
            m[start:start + 10 + n] = np.frombuffer(raw, np.int64, 10 + n)
            m[start + 1] = address + 8 * (start + 10 + n)
            m[start + 10 + n:start + 10 + 2 * n] = address + 8 * (start + 10 + np.arange(n))
        p = end
        m[0:5] = len(patches), p, len(blocks), p + 3 * len(patches), \
            p + 3 * len(patches) + len(blocks)
        m[p:p + 3 * len(patches)] = np.array(patches, np.int64).reshape(-1)
        m[m[3]:m[3] + len(blocks)] = [b[0] for b in blocks]
        self.bases = int(m[4])
        self.names = [b[3] for b in blocks]

    def failed(self, k):
        """Raise for launch k (1-based, launch_table's return)."""
        from ....errors import DeviceError
        raise DeviceError(f"cuLaunchKernel({self.names[k - 1]}) failed: "
                          f"{error_name(int(self.m[5]))} (replaying an eager call plan)")


def _function_handle(kernel_handle):
    """The CUfunction of a CUkernel (numba-cuda 0.30 loads modules as libraries) in the
    current context: launching a CUkernel makes the driver look the function up on
    every launch; the CUfunction skips that."""
    func = ctypes.c_void_p()
    rc = libcuda.cuKernelGetFunction(ctypes.byref(func), ctypes.c_void_p(kernel_handle))
    return func.value if rc == 0 and func.value else kernel_handle


def error_name(rc):
    s = ctypes.c_char_p()
    libcuda.cuGetErrorName(rc, ctypes.byref(s))
    return (s.value or b"?").decode() + f" ({rc})"


@contextlib.contextmanager
def dry_run():
    """Inside: no kernel is compiled or launched; each launch is noted, (Kernel,
    signature) in order, in the yielded list. A workload run inside names the kernels it
    needs without compiling them (precompile.py compiles them in parallel); what it
    computes is garbage, and eager call plans stand aside (ops/_plan.py). Every thread's
    launches are noted while it is open (PyTorch runs a CUDA backward on its autograd
    engine's own thread); runs nest, an enclosing run's list getting the inner's too."""
    seen = []
    dry_launches.append(seen)
    try:
        yield seen
    finally:
        dry_launches.remove(seen)
        if dry_launches:
            dry_launches[-1].extend(seen)


class Kernel:
    """A numba kernel compiled once per signature and launched on the fast path.

    pyfunc: the Python kernel; sigs: the signatures nbdnn launches it with (used by
    the PTX test and `warm_up`); arch: None (any sm_80+ GPU) or "sm_90a" (wgmma, TMA,
    setmaxnreg: the PTX test compiles it for that target only); shared_bytes: the
    most dynamic shared memory a launch asks for (past 48 KB the function must be
    allowed it first: CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, set when it
    loads); jit_options go to `cuda.jit`."""

    def __init__(self, pyfunc, sigs, arch=None, shared_bytes=0, **jit_options):
        self.pyfunc, self.sigs, self.arch = pyfunc, tuple(sigs), arch
        self.shared_bytes = shared_bytes
        self.name = pyfunc.__name__
        self.jit_options = jit_options
        self.dispatcher = cuda.jit(**jit_options)(pyfunc)  # lazy: compiles on demand
        self._launchers = {}
        REGISTRY.append(self)

    def compile(self, sig):
        """Compile and load `sig`; returns the launcher (the fast path's state)."""
        launcher = self._launchers.get(sig)
        if launcher is None:
            self._check_sig(sig)
            bind_driver()
            handle, argtypes = kernel_cache.compiled(self, sig)  # (from disk if cached)
            handle = _function_handle(handle)
            if self.shared_bytes > 48 * 1024:  # (8: ..._MAX_DYNAMIC_SHARED_SIZE_BYTES)
                rc = libcuda.cuFuncSetAttribute(ctypes.c_void_p(handle), 8,
                                                 ctypes.c_int(self.shared_bytes))
                if rc:
                    from ....errors import DeviceError
                    raise DeviceError(f"{self.name}: {self.shared_bytes} B of shared memory "
                                      f"refused ({error_name(rc)})")
            launcher = _Launcher(handle, argtypes, self.name)
            self._launchers[sig] = launcher
        return launcher

    def _check_sig(self, sig, nargs=None):
        """Every launch uses a registered signature: the PTX test compiles exactly
        those (a signature made up at the call site would reach the GPU untested).
        Under the simulator, which types nothing, also as many arguments as the
        signature has parameters (a parameter added to a kernel but not to its
        signature fails only at compile time on a GPU)."""
        if sig not in self.sigs:
            raise RuntimeError(f"nbdnn: kernel {self.name} launched with {sig!r}, not one of "
                               f"its registered signatures {self.sigs}")
        if nargs is not None and nargs != _param_count(sig):
            raise RuntimeError(f"nbdnn: kernel {self.name} launched with {nargs} arguments; "
                               f"its signature {sig!r} has {_param_count(sig)}")

    def resources(self, sig):
        """Registers, local memory (spills) and static shared memory of the compiled
        kernel, as the driver reports them for the function `launch` runs (loaded from
        the kernel cache when it is there: a spill test over a family's kernels costs
        no JIT after `nbdnn cache warm`)."""
        handle = ctypes.c_void_p(self.compile(sig).handle)
        value = ctypes.c_int()

        def attribute(code):  # CUfunction_attribute
            rc = libcuda.cuFuncGetAttribute(ctypes.byref(value), code, handle)
            if rc:
                from ....errors import DeviceError
                raise DeviceError(f"{self.name}: cuFuncGetAttribute({code}) failed: "
                                  f"{error_name(rc)}")
            return value.value
        # 4: NUM_REGS, 3: LOCAL_SIZE_BYTES, 1: SHARED_SIZE_BYTES
        return {"regs": attribute(4), "local_bytes": attribute(3),
                "shared_bytes": attribute(1)}

    def launch(self, sig, grid, block, stream, *args, shmem=0, owners=()):
        """Run the kernel: grid/block ints or 3-tuples, stream a CUstream handle (int).
        An array may be passed as a (pointer, count) tuple; `owners` then names the
        arrays behind such pointers, which a graph being recorded keeps alive.
        Straight-line on purpose: every eager call of every op runs it."""
        if dry_launches:  # (dry_run: noted, not compiled or launched)
            dry_launches[-1].append((self, sig))
            return
        tls = capture_state.__dict__  # this thread's: the graph recording, context ready
        recorder = tls.get("graph")
        planner = tls.get("plan")
        if planner is not None:
            planner.launch(self, sig, grid, block, shmem, args, owners)
        watch = tls.get("watch")
        if watch is not None:
            watch.append(self.name)
        if SIMULATOR:
            self._check_sig(sig, len(args))
            flat_args = [flat(a) if hasattr(a, "shape") else a for a in args]
            self.dispatcher[grid, block, 0, shmem](*flat_args)
            if recorder is not None:
                recorder.record_simulated(self.dispatcher, grid, block, shmem, flat_args)
                recorder.keep(args, owners)
            return
        la = self._launchers.get(sig) or self.compile(sig)
        if "ready" not in tls:
            cuda.current_context()  # make the primary context current on this thread
            tls["ready"] = True
        gx, gy, gz = grid if type(grid) is tuple else (grid, 1, 1)
        bx, by, bz = block if type(block) is tuple else (block, 1, 1)
        with la.lock:  # the buffer is shared; cuLaunchKernel copies it
            la.pack(gx, gy, gz, bx, by, bz, shmem, stream, *args)
            rc = _launch_record(la.record)
            if recorder is not None and not rc:
                recorder.record(la, (gx, gy, gz), (bx, by, bz), shmem, la.buf.raw[80:])
        if rc:
            from ....errors import DeviceError
            raise DeviceError(f"cuLaunchKernel({self.name}) failed: {error_name(rc)} "
                              f"(grid {grid}, block {block}, shared {shmem} B)")
        if recorder is not None:
            recorder.keep(args, owners)


def _param_count(sig):
    """Parameters of a signature string: top-level commas between its parentheses
    (array types such as float32[:, ::1] hold commas inside brackets)."""
    body, depth, n = sig[sig.index("(") + 1:sig.rindex(")")], 0, 1
    for ch in body:
        depth += ch in "[(" and 1 or (ch in "])" and -1 or 0)
        n += ch == "," and depth == 0
    return n if body.strip() else 0


def loaded():
    """(kernel name, signature) of every kernel this process has compiled or loaded from
    the kernel cache: how many specialisations a workload needs."""
    return [(k.name, sig) for k in REGISTRY for sig in list(k._launchers)]


def is_loaded(kernel, sig):
    """Whether this process has kernel's signature sig compiled or loaded."""
    return sig in kernel._launchers


def warm_up(kernels=None):
    """Compile every registered signature now (JIT happens here, not in a timed run)."""
    for k in kernels or REGISTRY:
        for sig in k.sigs:
            k.compile(sig)

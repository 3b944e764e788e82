"""CUDA graphs of nbdnn calls: record a sequence of calls once, replay it for about a
microsecond a kernel instead of the tens of microseconds of host time an eager call
costs.

    g = nbdnn.cuda.Graph()
    with g.capture():                  # runs the calls once, eagerly, and records them
        nbdnn.conv2d(x, w, b, out=y, activation="relu")
        logits = nbdnn.matmul(y.reshape(n, -1), w2, trans_b=True)
    x.copy_to_device(next_batch)       # replays read whatever the buffers hold now
    g.replay()                         # logits is rewritten

How it works: inside `capture()` every nbdnn kernel launch on this thread runs as
usual and is also recorded: its function, grid, block and packed parameter bytes (the
very pointers and scalars of that call). The block is an ordinary eager run, so JIT
compilation, module loads and nbdnn's cached index tables all happen there: the
warm-up before capture is automatic, and nothing that a stream capture forbids
(allocation, host copies, synchronisation) can break it. Leaving the block issues the
recorded launches into a CUDA stream capture on a private non-blocking stream and
instantiates the graph.

What a replay sees:
- the data in every buffer at replay time (inputs, parameters, running statistics);
- the shapes, scalars (alpha, eps, lr, seed) and Python control flow of the capture:
  they are baked in. Pass per-replay values in device arrays (dropout's `offset` may
  be a device counter, advanced on the device by every replay).
- Arrays allocated inside the block (results without out=, workspaces) belong to the
  graph, like torch.cuda.graph's private pool: the graph keeps every array its kernels
  touch alive, and each replay rewrites the results you hold.

Refused during capture (NotSupportedError): NumPy inputs to a CUDA call (their data
would be copied once, and replays would not see new host data) and a second capture
on the same thread. Only nbdnn kernel launches are recorded: other GPU work inside the
block (a torch op, a copy) runs once and is not replayed. Any error inside the block
ends the recording and leaves no graph; the context stays usable.

PyTorch interop: nbdnn calls given `stream=torch.cuda.current_stream()` inside
`torch.cuda.graph(...)` are captured by PyTorch's own stream capture. Warm up first
(one eager call of the same sequence, as PyTorch's docs ask for its own ops): a
first call compiles kernels and uploads index tables, which a capture forbids. The TMA
maps of the capture's new addresses are written inside the graph (tensormap.py).

Under the simulator `replay()` runs the recorded launches again, eagerly, so code and
tests that use graphs run without a GPU.
"""
import contextlib
import ctypes

from ..simulator import SIMULATOR
from .. import device as _device
from ..launch import kernel as _launch
from ..memory.arrays import stream_handle
from ....errors import DeviceError, NbdnnError, NotSupportedError


def capturing(stream):
    """Whether the stream (a CUstream handle, int) is being captured into a CUDA graph
    (cuStreamIsCapturing; False under the simulator and for the legacy stream, which
    no capture uses)."""
    if SIMULATOR or not stream:
        return False
    _launch.bind_driver()
    status = ctypes.c_int()
    rc = _launch.libcuda.cuStreamIsCapturing(ctypes.c_void_p(stream), ctypes.byref(status))
    return rc == 0 and status.value != 0  # (0: CU_STREAM_CAPTURE_STATUS_NONE)


class Graph:
    """A recorded sequence of nbdnn kernel launches, replayable as one CUDA graph."""

    def __init__(self):
        self._records, self._simulated, self._kept = [], [], []
        self._graph = self._exec = self._arena = None
        self._recording = False
        self.device = None  # several GPUs: the device of its first captured launch

    # -- recording (called by _launch.Kernel.launch while this graph records) --
    def record(self, launcher, grid, block, shmem, params):
        if _device.count() > 1:
            self._same_device()
        self._records.append((launcher.function, launcher.name, grid, block, shmem, params))

    def record_simulated(self, dispatcher, grid, block, shmem, args):
        if _device.count() > 1:
            self._same_device()
        self._simulated.append((dispatcher, grid, block, shmem, list(args)))

    def _same_device(self):
        """A graph is one device's: its first launch's device, a DeviceError for a
        launch on another (an nbdnn call runs on its arrays' device)."""
        d = _device.current()
        if self.device is None:
            self.device = d
        elif d != self.device:
            raise DeviceError(f"nbdnn.cuda.Graph: capturing on cuda:{self.device}; a call "
                              f"on cuda:{d} cannot join it (a graph runs on one device: "
                              "capture one graph a device)")

    def record_step(self, fn):
        """Simulator only: a host-side step (fn()) that replay repeats in order."""
        self._simulated.append(fn)

    def external(self, fn):
        """GPU work that is not an nbdnn kernel, issued by fn(stream) on the raw stream
        handle it gets (an NCCL collective): run now, on the legacy default stream, in
        order with the eager capture's kernels, and issued again into the graph's stream
        capture when it is instantiated, so every replay runs it in its place."""
        if _device.count() > 1:
            self._same_device()
        fn(0)
        if SIMULATOR:
            self._simulated.append(lambda: fn(0))
        else:
            self._records.append((fn, None, None, None, None, None))

    def keep(self, args, owners):
        if self._arena is not None:
            self._arena.check(args, owners)
        self._kept.extend(a for a in args if hasattr(a, "shape"))
        self._kept.extend(owners)

    # -- public API --
    @contextlib.contextmanager
    def capture(self, arena=None):
        """Record the nbdnn calls made in the `with` block (they also run, once).
        arena: a reuse.Arena planned from a traced run of the same calls, whose
        allocations then share its memory (cuda/runtime/memory/reuse.py)."""
        if _launch.recording() is not None:
            raise NotSupportedError("Graph.capture: this thread is already capturing a "
                                    "graph; captures do not nest")
        if self._recording:
            raise NotSupportedError("Graph.capture: this graph is capturing")
        self.reset()
        self._recording, self._arena = True, arena
        _launch.capture_state.graph = self
        _launch.capture_state.alloc = None if arena is None else arena.allocate
        try:
            yield self
            if arena is not None:
                arena.finish(self.kernels)
                self._kept.append(arena.buffer)  # (None when nothing was placed)
        except BaseException:
            self.reset()
            raise
        finally:
            _launch.capture_state.graph = _launch.capture_state.alloc = None
            self._recording, self._arena = False, None
        if not SIMULATOR and self._records:
            self._instantiate()

    def replay(self, stream=None):
        """Run the captured launches again (asynchronously, on `stream` or the default
        stream), reading the current contents of the captured buffers."""
        if self._recording:
            raise NotSupportedError("Graph.replay: called inside this graph's capture")
        if SIMULATOR:
            for step in self._simulated:
                if callable(step):
                    step()
                else:
                    dispatcher, grid, block, shmem, args = step
                    dispatcher[grid, block, 0, shmem](*args)
            return
        if self._exec is None:
            if not self._records:
                return  # an empty capture replays nothing
            raise NbdnnError("Graph.replay: no graph captured")
        with _device.on(self.device):  # (the default stream: the graph's device's)
            _check("cuGraphLaunch", _driver().cuGraphLaunch(self._exec, stream_handle(stream)))

    @property
    def kernels(self):
        """Names of the captured kernels, in launch order."""
        if SIMULATOR:
            return [s[0].py_func.__name__ for s in self._simulated if not callable(s)]
        return [name for _, name, *_ in self._records if name is not None]

    def __len__(self):
        return len(self.kernels)

    def __repr__(self):
        return f"<nbdnn.cuda.Graph: {len(self)} kernels>"

    def reset(self):
        """Drop the captured graph and the buffers it kept alive."""
        self._destroy()
        self._records, self._simulated, self._kept = [], [], []
        self.device = None

    def __del__(self):
        try:
            self._destroy()
        except Exception:  # interpreter shutdown: the driver may be gone
            pass

    # -- CUDA --
    def _destroy(self):
        d = _driver() if (self._exec is not None or self._graph is not None) else None
        if self._exec is not None:
            d.cuGraphExecDestroy(self._exec)
            self._exec = None
        if self._graph is not None:
            d.cuGraphDestroy(self._graph)
            self._graph = None

    def _instantiate(self):
        """Issue the recorded launches into a stream capture and instantiate it (on
        the graph's device)."""
        with _device.on(self.device):
            self._instantiate_here()

    def _instantiate_here(self):
        d = _driver()
        err, stream = d.cuStreamCreate(d.CUstream_flags.CU_STREAM_NON_BLOCKING)
        _check("cuStreamCreate", (err,))
        held = []  # parameter buffers must live until cuLaunchKernel has copied them
        try:
            _check("cuStreamBeginCapture", d.cuStreamBeginCapture(
                stream, d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
            try:
                for function, name, grid, block, shmem, params in self._records:
                    if name is None:  # (external(): its work, on the capturing stream)
                        function(int(stream))
                        continue
                    buf = ctypes.create_string_buffer(params, len(params))
                    base = ctypes.addressof(buf)
                    slots = (ctypes.c_void_p * (len(params) // 8))(
                        *range(base, base + len(params), 8))
                    held.append((buf, slots))
                    _check(f"cuLaunchKernel({name}) in capture", _launch.cuLaunchKernel(
                        function, *grid, *block, shmem, stream, ctypes.addressof(slots), 0))
            finally:
                err, graph = d.cuStreamEndCapture(stream)
            _check("cuStreamEndCapture", (err,))
            self._graph = graph
            err, self._exec = d.cuGraphInstantiate(graph, 0)
            _check("cuGraphInstantiate", (err,))
        except BaseException:
            self.reset()
            raise
        finally:
            d.cuStreamDestroy(stream)


def _driver():
    _launch.bind_driver()
    return _launch.driver


def _check(what, result):
    rc = int(result[0])
    if rc:
        raise DeviceError(f"nbdnn.cuda.Graph: {what} failed: {_launch.error_name(rc)}")

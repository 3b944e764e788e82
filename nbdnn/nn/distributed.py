"""Data-parallel training of nbdnn.nn models: one process a GPU, each its
shard of the batch, gradients averaged over the processes by an existing engine: NCCL
through torch.distributed (gloo for the CPU backend's NumPy arrays), or NCCL through
cupy.cuda.nccl (a communicator: `nccl_communicator()`). nbdnn has no collectives of
its own.

    dist.init_process_group("nccl")              # torchrun sets rank and world size
    torch.cuda.set_device(local_rank)
    model = nn.resnet50().to(f"cuda:{local_rank}")
    sync = nn.GradientAllReduce(model)           # rank 0's parameters everywhere
    opt = nn.SGD(model, lr=0.1, momentum=0.9)
    loss = nn.train_step(model, loss_fn, opt, x_shard, target_shard, allreduce=sync)

Overlap: Sequential.backward hands each top-level layer (a ResNet block) to
`layer_done` as soon as its gradients exist, and their all-reduces start then,
asynchronously, while the layers before it run their backward; `wait()` (before the
optimizer) waits for the last. The arrays are lent to torch without copies (NumPy
through torch.from_numpy, device arrays through __cuda_array_interface__), and each
all-reduce writes its sum in place; NCCL averages (ReduceOp.AVG), gloo sums and nbdnn
scales by 1 / world. Ordering: nbdnn's kernels run on the device's legacy default
stream, which is PyTorch's default stream too, so a collective starts after the
backward kernels that made its gradient, and `wait()` makes the stream wait for it.

A GraphedSteps step with allreduce over torch.distributed replays two graphs around
the collectives (forward and backward; the optimizer): torch.distributed's NCCL runs on
its own streams, outside what nbdnn.cuda.Graph records. With a cupy.cuda.nccl
communicator (comm=) the collectives are issued on nbdnn's stream itself
(cuda.runtime.launch.issue), so the whole step, all-reduces included, is one captured
graph (NCCL supports stream capture); they run in order with the kernels, not beside
them.
"""
import json
import os
import time

import numpy as np

import nbdnn


class GradientAllReduce:
    """The averaging of an nbdnn.nn model's gradients over the processes, as
    train_step(..., allreduce=this) runs it. The engine is what is there: comm (a
    cupy.cuda.nccl communicator) where given; else torch.distributed's process group
    (group; default the world) where one is initialised; else a cupy.cuda.nccl
    communicator made from the environment (nccl_communicator())."""

    def __init__(self, model, *, group=None, comm=None, broadcast=True):
        self.model, self.group = model, group
        self._pending = []  # (work or None, gradient array)
        if comm is None and not _torch_group():
            comm = nccl_communicator()
        self.comm = comm
        if comm is not None:  # cupy.cuda.nccl: sums on nbdnn's stream, then 1 / world
            self.dist, self.world, self.average = None, comm.size(), False
        else:
            import torch.distributed as dist
            if not dist.is_available() or not dist.is_initialized():
                raise nbdnn.BadParamError(
                    "GradientAllReduce: torch.distributed has no process group: call "
                    "torch.distributed.init_process_group first, or pass comm=")
            self.dist, self.world = dist, dist.get_world_size(group)
            self.average = dist.get_backend(group) == "nccl"  # (gloo: no AVG; sum, scale)
        if broadcast:
            self.broadcast_parameters()

    @property
    def capturable(self):
        """Whether its collectives join a captured graph (a cupy.cuda.nccl communicator)."""
        return self.comm is not None

    def broadcast_parameters(self, src=0):
        """Every process's parameters and buffers become rank src's (as DDP does when
        it wraps a model): the same start everywhere."""
        for m in self.model.layers():
            for d in (m.params, m.buffers):
                for v in d.values():
                    if self.comm is not None:
                        _issue(lambda s, v=v: _nccl(self.comm, "bcast", v, s, src))
                    else:
                        self.dist.broadcast(_torch_view(v), src, group=self.group)

    def layer_done(self, layer):
        """Start averaging the gradients of layer (and of the layers inside it)."""
        if self.comm is not None:
            for m in layer.layers():
                for g in m.grads.values():
                    _issue(lambda s, g=g: _nccl(self.comm, "allReduce", g, s))
                    self._pending.append((None, g))
            return
        op = self.dist.ReduceOp.AVG if self.average else self.dist.ReduceOp.SUM
        for m in layer.layers():
            for g in m.grads.values():
                t = _torch_view(g)
                self._pending.append((self.dist.all_reduce(t, op, group=self.group,
                                                           async_op=True), g))

    def wait(self):
        """Wait for every started all-reduce (the stream, on CUDA; the host, on the
        CPU); with gloo, divide the sums by the world size."""
        pending, self._pending = self._pending, []
        for work, g in pending:
            if work is not None:
                work.wait()
            if not self.average and self.world > 1:
                nbdnn.scale_tensor(g, 1.0 / self.world, out=g)

    def __call__(self):
        """All of the model's gradients at once (no overlap), then wait."""
        for m in self.model.layers():
            if m.grads:
                self.layer_done(_Only(m))
        self.wait()


class _Only:
    """One layer without the layers inside it (their own turn comes)."""

    def __init__(self, m):
        self.m = m

    def layers(self):
        return [self.m]


def nccl_communicator(group=None, *, id_file=None, timeout=120.0):
    """A cupy.cuda.nccl.NcclCommunicator over the processes, on this process's current
    device: the comm= that makes GradientAllReduce's collectives part of a captured
    step. Rank 0's unique id goes round through torch.distributed's group where one is
    initialised; else ranks come from the environment (RANK, WORLD_SIZE: torchrun's,
    or OMPI_COMM_WORLD_RANK / _SIZE: mpirun's) and the id through a file all of them
    see (id_file, or NBDNN_NCCL_ID_FILE; a fresh path each run: a stale one would hand
    the others an old id), which rank 0 writes."""
    by_torch = _torch_group()
    rank, world = (None, None) if by_torch else _env_rank()
    try:
        import cupy
        from cupy.cuda import nccl
    except ImportError:
        raise nbdnn.NotSupportedError("nccl_communicator: cupy is not installed (pip "
                                      "install cupy-cuda12x or -cuda13x)") from None
    if by_torch:
        import torch.distributed as dist
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        uid = [nccl.get_unique_id() if rank == 0 else None]
        dist.broadcast_object_list(uid, src=0, group=group)
        uid = uid[0]
    else:
        uid = _shared_id(rank, id_file or os.environ.get("NBDNN_NCCL_ID_FILE"), timeout,
                         nccl.get_unique_id)
    with cupy.cuda.Device(_device().current()):
        return nccl.NcclCommunicator(world, uid, rank)


def _torch_group():
    """Whether torch.distributed is installed and has a process group."""
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return dist.is_available() and dist.is_initialized()


def _env_rank():
    for r, w in (("RANK", "WORLD_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if r in os.environ and w in os.environ:
            return int(os.environ[r]), int(os.environ[w])
    raise nbdnn.BadParamError(
        "GradientAllReduce: no engine: torch.distributed has no process group, and the "
        "environment names no rank (RANK and WORLD_SIZE) for a cupy.cuda.nccl communicator")


def _shared_id(rank, path, timeout, make):
    """Rank 0's make() (an NCCL unique id, a tuple of ints), through file path."""
    if not path:
        raise nbdnn.BadParamError("nccl_communicator: without torch.distributed the ranks "
                                  "meet through a file: pass id_file= or set "
                                  "NBDNN_NCCL_ID_FILE")
    if rank == 0:
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(list(make()), f)
        os.replace(tmp, path)  # (whole or absent: the others never read half)
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise nbdnn.DeviceError(f"nccl_communicator: rank 0's id did not appear in "
                                    f"{path} within {timeout} s")
        time.sleep(0.05)
    with open(path) as f:
        return tuple(json.load(f))


# NCCL's data types by dtype name (cupy.cuda.nccl's constants, looked up when used)
_NCCL_TYPES = {"float16": "NCCL_FLOAT16", "bfloat16": "NCCL_BFLOAT16",
               "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64"}


def _nccl(comm, what, a, stream, root=0):
    """comm.allReduce (a sum) or comm.bcast of array a in place on the raw stream."""
    from cupy.cuda import nccl
    from ..cuda.runtime.memory.arrays import ptr
    kind = getattr(nccl, _NCCL_TYPES[str(a.dtype).rpartition(".")[2]])
    n = int(np.prod(a.shape))
    if what == "bcast":
        comm.bcast(ptr(a), n, kind, root, stream)
    else:
        comm.allReduce(ptr(a), ptr(a), n, kind, nccl.NCCL_SUM, stream)


def _issue(fn):
    from ..cuda.runtime.launch.kernel import issue
    issue(fn)


def _torch_view(a):
    """Array a (NumPy, a device array, or a torch tensor) as a torch tensor sharing its
    memory."""
    import torch
    if isinstance(a, torch.Tensor):
        return a
    if isinstance(a, np.ndarray):
        return torch.from_numpy(a)
    if type(a).__module__.startswith("numba.cuda.simulator"):  # (its host memory: the
        return torch.from_numpy(a._ary)  # simulator's steps run over gloo in tests)
    return torch.as_tensor(a, device=f"cuda:{_device().of(a)}")


def _device():
    from ..cuda.runtime import device
    return device

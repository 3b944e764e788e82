"""A benchmark case, declared: what `nbdnn bench` times and how it counts."""
from typing import Callable, NamedTuple

from ..ops.registry import OPS


class BenchCase(NamedTuple):
    """One timed call. name: the row's label ("softmax/accurate/1024"); op: the registered
    op it times (its family and `--ops` names follow from the record); shape: the
    problem's shape as the row prints it; bytes: what a kernel must move at float32 (each
    input read once, each output written once: the %copy column reads against it);
    make(device_buffers, host_buffers) -> {"gpu": fn, "cpu": fn, "torch": fn or None};
    flops: the arithmetic a call does (0: memory-bound, no TFLOP/s column)."""
    name: str
    op: str
    shape: tuple
    bytes: int
    make: Callable
    flops: int = 0

    @property
    def family(self):
        return OPS[self.op].family

    @property
    def ops(self):
        return (self.op, self.name.split("/")[0])

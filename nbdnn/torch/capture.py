"""Capturing a converted model's training step with torch.cuda.graph after eager steps.

A parameter's AccumulateGrad node (where its gradient is summed into .grad) is made by
the first forward that uses the parameter and remembered by the parameter for as long
as any autograd graph holds it; every later forward reuses it, and it keeps the stream
it was made on. Backward syncs that stream with the one producing the gradient, and a
CUDA graph capture cannot sync with the legacy default stream ("operation would make
the legacy stream depend on a capturing blocking stream"). So a node made by eager
steps on the default stream must be gone before the capture's forward, which PyTorch's
recipe (warm up on a side stream, then capture) assumes.

With nbdnn.torch it was sometimes not gone (a unit test failed on an H100, the
first convolution's node: once, the parameters nearest the input; never on the
CPU). Nothing nbdnn keeps was found holding it (docs/decisions.md "graph_leak_probe").
Later runs did not see it again in any of graph_leak_race.py's ways: autograd's device
thread (backward on the calling thread against not, a sleep, a host sync or none), a
reference cycle (the collector off, a collect after each step, a census of cycles),
with and without the kernel cache, nor in 16 fresh processes of the test, so its cause
is not known. Whatever holds a node, a capture need not depend on it:

`fresh_accumulators(model)` makes every parameter forget its node, so the next forward
(the capture's) makes new ones on its own stream; a graph still holding an old node
stays valid (its backward still sums into .grad). Call it after the warm-up, right
before `torch.cuda.graph`. Not under DistributedDataParallel: its reducer hooks the
nodes themselves (a new node has no hook, and the gradients would go unreduced), so a
DDP wrapper is refused; hooks registered on the tensors
(register_post_accumulate_grad_hook) stay.
"""
import torch

from ..errors import NotSupportedError


def fresh_accumulators(module_or_params):
    """Make each parameter of a module (or an iterable of tensors) forget its
    AccumulateGrad node: the next forward makes a new one on the current stream.
    PyTorch drops a tensor's remembered node when `.data` changes dtype, so `.data`
    goes to an empty tensor of another dtype and back (no copy, no new storage)."""
    if isinstance(module_or_params, _hooking_wrappers()):
        raise NotSupportedError("nbdnn.torch.fresh_accumulators: a DistributedDataParallel "
                                "(or FSDP) model hooks its parameters' AccumulateGrad nodes; "
                                "new nodes would leave its gradients unreduced")
    params = module_or_params.parameters() if isinstance(module_or_params, torch.nn.Module) \
        else module_or_params
    for p in params:
        if p.requires_grad and p.is_leaf:
            data = p.data
            p.data = data.new_empty(0, dtype=torch.float64 if data.dtype != torch.float64
                                    else torch.float32)
            p.data = data


def _hooking_wrappers():
    """The wrapper classes whose reducer hooks AccumulateGrad nodes (FSDP where this
    PyTorch has it)."""
    wrappers = [torch.nn.parallel.DistributedDataParallel]
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
        wrappers.append(FullyShardedDataParallel)
    except ImportError:  # (a build without torch.distributed)
        pass
    return tuple(wrappers)

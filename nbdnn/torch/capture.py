"""Capturing a converted model's training step with torch.cuda.graph after eager steps.

A parameter's AccumulateGrad node (where its gradient is summed into .grad) is made by
the first forward that uses the parameter and remembered by the parameter for as long
as any autograd graph holds it; every later forward reuses it, and it keeps the stream
it was made on. Backward syncs that stream with the one producing the gradient, and a
CUDA graph capture cannot sync with the legacy default stream ("operation would make
the legacy stream depend on a capturing blocking stream"). So a node made by eager
steps on the default stream must be gone before the capture's forward, which PyTorch's
recipe (warm up on a side stream, then capture) assumes.

With nbdnn.torch it is sometimes not gone (runs AZ, BA: intermittently on CUDA, the
parameters nearest the input, never on the CPU; nothing nbdnn keeps was found holding
it, perf/experiments/graph_leak_probe.py). The likeliest holder, not yet confirmed
(perf/experiments/graph_leak_race.py counts it): on CUDA the backward runs on
autograd's device thread, which can drop the last reference to a step's graph after
loss.backward() has returned; freeing nbdnn's nodes (Python autograd Functions) there
needs the GIL, which the main thread holds while it runs the next forward, and that
forward reuses the parameters' nodes still alive, the ones nearest the input freed
last. Native PyTorch's nodes are C++ and free without the GIL.

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

"""nbdnn.torch.precompile(model, *inputs): the nbdnn kernels a model's step needs,
compiled in parallel into the kernel cache before its first step.

    model, _ = nt.convert(model)
    with torch.autocast("cuda", torch.bfloat16):      # as the step will run
        print(nt.precompile(model, x))                # seconds, not minutes, of JIT
    ...train as usual: the first step loads its kernels from the cache

The model runs once as a dry run (nbdnn launches nothing and notes what it would:
nbdnn/cuda/runtime/launch/precompile.py), forward and, for a model in training mode,
backward (torch.autograd.grad of its floating outputs' sum: the parameters' .grad are
not touched). The run changes nothing the model keeps: its buffers (batch norm's
running statistics, which PyTorch's own layers would update with the dry run's
garbage) and the random generators' states are put back after it."""
import contextlib

import torch

from ..cuda import precompile as _cuda_precompile
from .convert import floating_tensors
from .intercept import functional_calls


def precompile(model, *inputs, kwargs=None, train=None, functional=False, workers=None):
    """Compile the kernels model(*inputs, **kwargs) needs (and, with train, its
    backward: default model.training) in `workers` processes (default: the cores less
    one); functional: the run under functional_calls(), as a model whose own F.* calls
    go to nbdnn. Call it where the step will run (the same autocast, layout and
    shapes). Returns the Summary (what was noted, cached, compiled, left)."""
    kwargs = dict(kwargs or {})
    train = model.training if train is None else train
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None

    def step():
        scope = functional_calls() if functional else contextlib.nullcontext()
        with scope, torch.set_grad_enabled(train):
            out = model(*inputs, **kwargs)
            outs = floating_tensors(out)
            params = [p for p in model.parameters() if p.requires_grad]
            if train and outs and params:
                total = sum(o.float().sum() for o in outs if o.requires_grad)
                if isinstance(total, torch.Tensor):
                    torch.autograd.grad(total, params, allow_unused=True)
    try:
        return _cuda_precompile(step, workers=workers)
    finally:
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)

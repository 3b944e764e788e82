"""nbdnn inside PyTorch: torch.nn.functional's names backed by nbdnn's ops.

    import nbdnn.torch as nt
    y = nt.conv2d(x, w, b, padding=1)        # differentiable; x on CUDA: nbdnn's kernels
    y = torch.ops.nbdnn.conv(x, w, b, [1, 1], [1, 1, 1, 1], [1, 1], 1)   # the custom op

Every function is a torch.library custom op (`torch.ops.nbdnn.<name>`) with a fake
implementation and a backward registered for autograd, so torch.compile(fullgraph=True),
torch.library.opcheck and CUDA graph capture see one op, not Python. CUDA tensors run on
PyTorch's current stream; CPU tensors run nbdnn's CPU reference (zero-copy through
NumPy); `with nbdnn.torch.reference():` runs every call on the reference, CUDA tensors
copied, to check a model against it; `with nbdnn.torch.functional_calls():` sends the
torch.nn.functional calls a model makes itself to nbdnn too.

Differences from torch.nn.functional, each an error rather than a silent change:
hardtanh with bounds other than (0, max) or (-max, max); softmax without dim; dropout with p 1; attn_mask together with is_causal (as PyTorch);
scaled_dot_product_attention with enable_gqa and query, key, value of different ranks;
a norm's eps <= 0 and batch norm's momentum outside [0, 1] (PyTorch takes them).
What F refuses is refused too, naming the function and the argument (a float stride,
a tuple of another length, padding 'same' with a stride, pool padding past half the
kernel, momentum None; tests/test_torch_refusals.py), and int-or-tuple arguments are
read as F reads them (one-element tuples, a pool's stride ()). inplace=True writes the
result into the input as PyTorch does, its version counter bumped and the write
recorded by autograd (the op itself reads a copy while autograd records).
Differences that are not errors: max_pool's return_indices name a window's first NaN
where it holds several (PyTorch's kernels: the last; the gradient goes where the index
says either way); a fully masked
attention row gives 0 (PyTorch's math backend: NaN); a max-pool window holding only
padding gives -inf, as PyTorch's, and no gradient (PyTorch's CPU kernel sends its
gradient to a stray element); a float attn_mask's gradient is PyTorch's math form's (its
(B, H, L, S) scores materialised, only when it requires grad); dropout's mask is nbdnn's
Philox stream seeded from torch's generator (not PyTorch's stream; on CUDA its offset is
drawn on the device, so a captured CUDA graph draws fresh masks on every replay, as
PyTorch's). Channels-last tensors run as NHWC and results stay channels-last (as
PyTorch's). Dtypes: float16, bfloat16, float32, float64 (others: DtypeError).
Convolutions and pools take one sample without the batch axis, softmax a 0-d tensor, as
PyTorch's do. Second and higher-order gradients (create_graph=True: gradient penalties,
Hessian-vector products) work: the first backward is nbdnn's op, its own derivative
PyTorch's formula of it (nbdnn/torch/_second_order.py); attention with dropout has no
second order (an error). torch.func's transforms work: grad, vjp, jacrev, vmap (the
batch as one nbdnn call where the op allows, nbdnn/torch/_batching.py, else a call a
sample), per-sample gradients (vmap of grad), and forward mode (jvp, jacfwd, hessian),
whose tangents are PyTorch's formula of each op at nbdnn's values
(nbdnn/torch/_forward_mode.py). Plain eager calls skip PyTorch's dispatcher
(nbdnn/torch/_bridge.py call()).
"""
from ._bridge import reference
from . import functional, modules, rules
from .capture import fresh_accumulators
from .convert import FlopShare, Report, compare, convert, flop_share
from .intercept import functional_calls
from .third_party import register
from .precompile import precompile

rules.register()
for _name in functional.__all__:  # (torch.nn.functional's names at the top level too)
    globals()[_name] = getattr(functional, _name)
del _name

__all__ = ["functional", "modules", "reference", "convert", "compare", "Report",
           "flop_share", "FlopShare",
           "functional_calls", "fresh_accumulators", "register", "precompile",
           *functional.__all__]

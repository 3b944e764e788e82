"""torch tensors in and out of nbdnn's ops, zero-copy both ways.

CUDA tensors go to nbdnn as they are (`__cuda_array_interface__`), on PyTorch's current
stream; nbdnn allocates their results through PyTorch's caching allocator and returns
torch tensors. CPU tensors go to nbdnn's CPU reference as NumPy views of their storage
(bfloat16 through ml_dtypes' bfloat16, which has torch's bit layout), and the reference's
NumPy results come back as tensors sharing their memory. BACKEND = "cpu" (set by
nbdnn.torch.reference(), for comparing a model against the reference) runs CUDA
tensors on the CPU reference too: copied to the host and the results back."""
import contextlib

import numpy as np
import torch

import nbdnn

BACKEND = None  # None: a tensor's own device picks; "cpu": the reference for every tensor
BACKENDS_FORCED = (None, "cpu")
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@contextlib.contextmanager
def backend(name):
    """Within: BACKEND is name (None: each tensor's device picks)."""
    global BACKEND
    before, BACKEND = BACKEND, name
    try:
        yield
    finally:
        BACKEND = before


def reference():
    """Within: every nbdnn.torch op runs nbdnn's CPU reference, CUDA tensors included
    (copied to the host and back), backwards too: a model checked against the reference
    as it is."""
    return backend("cpu")


def register_autograd(op, grad, setup):
    """op.register_autograd, the backward run on the backend its forward ran on (a
    backward called after reference() has exited still runs the reference). An op of
    several outputs has its backward read the first's gradient only (the others are
    statistics, masks, lse: non-differentiable), so autograd is told not to make zeros
    for the gradients it leaves undefined (a zeros tensor each, 4 fill kernels a batch
    norm: 212 launches a converted ResNet-50 step); the first's is made where undefined
    (an op whose first output nothing used but its backward still runs)."""
    def setup_context(ctx, inputs, output):
        ctx.nbdnn_backend = BACKEND
        if output.__class__ is tuple:
            ctx.set_materialize_grads(False)
            y = output[0]
            ctx.nbdnn_first = y.shape, y.stride(), y.dtype, y.device
        setup(ctx, inputs, output)

    def backward(ctx, *grads):
        if grads[0] is None:  # (only an op of several outputs: _first_grad)
            grads = (_first_grad(ctx),) + grads[1:]
        if ctx.nbdnn_backend is BACKEND:  # (the usual case: no context manager, ~0.8 us
            # a backward call on the CI host)
            return grad(ctx, *grads)
        with backend(ctx.nbdnn_backend):
            return grad(ctx, *grads)
    op.register_autograd(backward, setup_context=setup_context)
    def forward(ctx, *args):  # (forward(ctx, ...): a separate setup_context would have
        # apply() bind every call's arguments to the signature, ~10 us)
        out = (IMPLS.get(op) or eager_impl(op))(*args)
        setup_context(ctx, args, out)
        return out
    EAGER[op] = _bare_apply(type(op._name, (torch.autograd.Function,), {
        "forward": staticmethod(forward), "backward": staticmethod(backward)}))
    AUTOGRAD[op] = setup_context, backward


def _first_grad(ctx):
    """Zeros in the first output's shape, strides and dtype: its gradient where autograd
    left it undefined."""
    shape, stride, dtype, device = ctx.nbdnn_first
    return torch.empty_strided(shape, stride, dtype=dtype, device=device).zero_()


AUTOGRAD = {}  # custom op -> (setup_context, backward) as register_autograd wraps them
JVP = {}  # custom op -> (save(ctx, inputs, output), jvp(ctx, *tangents)): forward-mode
# rules (nbdnn/torch/_forward_mode.py)
BATCHED = {}  # custom op -> rule(apply, B, in_dims, args): (outputs, out_dims), or None
# for a call a sample: vmap rules running the batch as one call (nbdnn/torch/_batching.py)


def transformable(op):
    """op's autograd.Function in the form torch.func's transforms take (forward without
    ctx, setup_context, vmap and jvp rules), whose apply call() uses under a transform:
    torch.library's own Function has no setup_context, so torch.func.grad, jacrev and
    vmap of a grad would fail. Its forward gets the tensors unwrapped (nbdnn reads
    their memory); its vmap rule is BATCHED's where that takes the call (the batch as
    one call), else runs op on each sample (as the dispatcher's fallback does) and
    stacks the results on dim 0; its jvp rule is JVP's (forward mode: torch.func.jvp,
    jacfwd, hessian)."""
    global TRANSFORMED
    fn = TRANSFORMABLE.get(op)
    if fn is not None:
        return fn
    TRANSFORMED = True
    IMPLS.clear()
    setup_context, backward = AUTOGRAD[op]
    save, jvp = JVP[op]

    def setup(ctx, inputs, output):
        setup_context(ctx, inputs, output)
        save(ctx, inputs, output)

    def vmap(info, in_dims, *args):
        rule = BATCHED.get(op)
        done = rule(cls.apply, info.batch_size, in_dims, args) if rule is not None else None
        if done is not None:
            return done
        outs = [cls.apply(*(a.select(d, i) if isinstance(a, torch.Tensor) and d is not None
                            else a for a, d in zip(args, in_dims)))
                for i in range(info.batch_size)]
        if isinstance(outs[0], torch.Tensor):
            return torch.stack(outs), 0
        return tuple(torch.stack(o) for o in zip(*outs)), (0,) * len(outs[0])
    cls = type(op._name, (torch.autograd.Function,), {
        "forward": staticmethod(op._init_fn), "setup_context": staticmethod(setup),
        "backward": staticmethod(backward), "vmap": staticmethod(vmap),
        "jvp": staticmethod(jvp)})
    fn = TRANSFORMABLE[op] = cls.apply
    return fn


def _bare_apply(cls):
    """autograd.Function cls's apply without its Python wrapper (C++'s, ~1.5 us less):
    what the wrapper adds is for torch.func transforms, which call() sends to
    TRANSFORMABLE's Functions, and for tensors left over from one (dead functorch
    wrappers, which no nbdnn op reads either way)."""
    base = getattr(torch._C, "_FunctionBase", None)
    bare = base.__dict__.get("apply") if base is not None else None
    return bare.__get__(None, cls) if bare is not None else cls.apply


EAGER = {}  # custom op -> the apply of the autograd.Function of its implementation and
# formulas
TRANSFORMABLE = {}  # custom op -> the same for torch.func's transforms (transformable())
TRANSFORMED = False  # whether one has been built (run() then unwraps dead wrappers)
PLAIN = (torch.Tensor, torch.nn.Parameter)
Tensor = torch.Tensor  # (a module global: ~0.02 us less a lookup than torch.Tensor)
_TENSOR = torch._C.OptionalType.ofTensor()
TENSORS = {}  # custom op -> the positions of its Tensor and Optional[Tensor] arguments


def tensor_positions(op):
    """The positions of op's tensor arguments, from its schema (only they can hold one)."""
    p = TENSORS.get(op)
    if p is None:
        p = TENSORS[op] = tuple(i for i, a in enumerate(op._opoverload._schema.arguments)
                                if a.type.isSubtypeOf(_TENSOR))
    return p


def call(op, *args):
    """op(*args). Through PyTorch's dispatcher where anything may need to see the custom
    op (torch.compile tracing, fake or other tensor subclasses, a dispatch mode); under a
    torch.func transform (grad, vmap, jacrev, jvp) through its TRANSFORMABLE Function; in
    plain eager mode its implementation directly, inside its autograd.Function where an
    input requires grad: the dispatcher's path for a Python custom op costs ~10 us a call
    (~17 us with autograd; 2-core CI host), the autograd.Function ~3 us, a direct call
    well under 1 us. (Only the tensor positions are looked at, no generators: this runs
    every call.)"""
    if compiling() or _dispatch_modes():
        return op(*args)
    if functorch():
        return (TRANSFORMABLE.get(op) or transformable(op))(*args)
    grad = False
    for i in TENSORS.get(op) or tensor_positions(op):
        a = args[i]
        if a is not None:
            if a.__class__ not in PLAIN:
                return op(*args)
            grad = grad or a.requires_grad
    if grad and torch.is_grad_enabled():
        return EAGER[op](*args)
    return (IMPLS.get(op) or eager_impl(op))(*args)


DIRECT = {}  # custom op -> its direct entry (direct())
IMPLS = {}  # custom op -> what its eager calls run (eager_impl())


def direct(op):
    """Decorator: fn becomes op's direct entry, which eager calls (call(), and the
    forward of its autograd.Function) run instead of op's implementation. An entry takes
    op's arguments and writes the common CUDA call out flat: the stream from
    stream_of(), tensors handed over as _run hands them (`.data` where they require
    grad, contiguous), nbdnn's op called with the keywords _run would give it; anything
    else (the CPU reference, an unusual layout) goes to op's implementation. It saves
    run()'s generic walk over the arguments and two frames (relu's wrapper 1.6 -> 0.7
    us a call on the CI host); tests/test_torch_direct.py checks that each
    entry hands nbdnn what the implementation does."""
    def register(fn):
        DIRECT[op] = fn
        IMPLS.clear()
        return fn
    return register


def eager_impl(op):
    """op's direct entry, else its implementation; the implementation alone once a
    torch.func transform has run (TRANSFORMED: run() unwraps what it leaves behind)."""
    fn = IMPLS[op] = op._init_fn if TRANSFORMED else DIRECT.get(op, op._init_fn)
    return fn


def unwrapped(t):
    """t without torch.func's wrappers (live or dead): the tensor holding its memory."""
    while torch._C._functorch.is_functorch_wrapped_tensor(t):
        t = torch._C._functorch.get_unwrapped(t)
    return t


def advance(buf, new):
    """buf.copy_(new): a buffer (batch norm's running statistics) advanced in place.
    Under a torch.func transform, below it, new's value unwrapped: the transforms refuse
    an in-place write into a tensor they did not wrap, and PyTorch's own batch norm
    writes its statistics there too."""
    if not functorch():
        buf.copy_(new)
        return
    new = unwrapped(new)
    if new.shape != buf.shape:  # (vmap: a statistic a sample)
        raise RuntimeError("nbdnn.torch.batch_norm: under vmap the running statistics, "
                           "updated in place, must be batched as the input is (as "
                           "PyTorch's batch norm requires)")
    with torch._C._DisableFuncTorch():
        buf.copy_(new)


compiling = torch.compiler.is_compiling
_dispatch_modes = torch._C._len_torch_dispatch_stack
functorch = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)  # (vmap,
# torch.func.grad: their wrapped tensors are plain Tensors to Python, with no storage
# nbdnn could read; the transforms unwrap them for an autograd.Function's forward)


def plain_eager(*tensors):
    """Whether these tensors are in plain eager mode: no compiler tracing, dispatch mode
    or torch.func transform, no reference backend forced, and each a plain tensor (a
    path that writes a tensor's memory itself may run)."""
    return not (compiling() or _dispatch_modes() or functorch()) and BACKEND is None and \
        all(t.__class__ in PLAIN for t in tensors)


def channels_last(t):
    """Whether 4-d t is laid out channels-last (NHWC in memory) and not also plain
    contiguous (C 1 or H W 1 are both: those go as NCHW). Such tensors go to nbdnn as
    their NHWC views with layout "NHWC", no copy, and results come back channels-last,
    as PyTorch keeps a channels-last model channels-last."""
    return t.dim() == 4 and not t.is_contiguous() and \
        t.is_contiguous(memory_format=torch.channels_last)


def nhwc(t):
    """An NCHW-shaped tensor's (N, H, W, C) view (no copy where it is channels-last)."""
    return None if t is None else t.permute(0, 2, 3, 1)


def nchw(t):
    """An (N, H, W, C) result as the NCHW-shaped channels-last tensor: a tensor of its own
    over the same memory, not a view (an op's output that is a view of a tensor made
    inside its autograd.Function cannot be modified in place: a residual `out +=
    identity` on a channels-last model's batch norm would fail). detach() makes one
    that autograd does not count as a view, ~1.3 us against set_()'s ~2.9 (a 2-core
    host; every channels-last result pays it)."""
    return t.permute(0, 3, 1, 2).detach()


def new(x, shape, last, dtype=None):
    """An empty tensor on x's device (a fake implementation's result), channels-last
    where last."""
    return torch.empty(shape, dtype=dtype or x.dtype, device=x.device,
                       memory_format=torch.channels_last if last else torch.contiguous_format)


def on_cpu(t):
    """Whether a call on tensor t runs the CPU reference."""
    return BACKEND == "cpu" or not t.is_cuda


def arr(t, cpu):
    """Tensor t (or None) as the array nbdnn takes: on the CPU reference (cpu) a NumPy
    view of its host copy, else the contiguous CUDA tensor."""
    if t is None:
        return None
    if t.requires_grad:
        t = t.detach()
    if not cpu:
        return t.contiguous()
    if not t.is_cpu:
        t = t.cpu()
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(_bfloat16())
    return t.numpy()


def _bfloat16():
    import ml_dtypes
    return ml_dtypes.bfloat16


def tensor(a, like):
    """nbdnn's result a as a torch tensor on tensor like's device (a NumPy result
    shares its memory where it stays on the CPU). (Per call: ~1 us; numpy's dtype.name
    alone costs ~1.5, so bfloat16 is told by its kind, "V", first.)"""
    if isinstance(a, torch.Tensor):
        return a
    if a.__class__ is not np.ndarray:
        a = np.asarray(a)
    flags = a.flags
    if not (flags.c_contiguous and flags.writeable):
        a = np.array(a, order="C")
    t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16) \
        if a.dtype.kind == "V" and a.dtype == _bfloat16() else torch.from_numpy(a)
    return t if like.is_cpu else t.to(like.device)


def stream_of(t):
    """Where a call on tensor t runs: None for nbdnn's CPU reference (t on the CPU, or
    reference() in force), else PyTorch's current stream on t's device as its raw
    handle, 0 for the legacy default stream (given to nbdnn only where it is not 0)."""
    if BACKEND == "cpu" or not t.is_cuda:
        return None
    return _raw_stream(t.get_device())


def _public_stream(index):
    return torch.cuda.current_stream(index).cuda_stream


# PyTorch's current CUDA stream on a device index, as its raw handle (int): the private
# getter inductor's generated code calls, a few hundred ns cheaper than
# torch.cuda.current_stream(); the public one where it is missing
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", _public_stream)


def _flag(name, public):
    """A TF32 flag's getter: torch._C's own (~0.08 us), else the public property."""
    return getattr(torch._C, name, public)


# nbdnn's ops that multiply matrices -> the getter of the TF32 permission PyTorch's
# products of that kind follow: cuDNN's (convolutions; torch.backends.cudnn.allow_tf32,
# on by default) or cuBLAS's (matmul, attention; torch.backends.cuda.matmul.allow_tf32,
# off by default, on under torch.set_float32_matmul_precision("high") or "medium"). (The
# public properties cost 0.4-0.6 us a read; they wrap these getters.)
CONV_TF32 = _flag("_get_cudnn_allow_tf32", lambda: torch.backends.cudnn.allow_tf32)
MATMUL_TF32 = _flag("_get_cublas_allow_tf32", lambda: torch.backends.cuda.matmul.allow_tf32)
PRODUCTS = {f: flag for flag, fs in (
    (CONV_TF32, (nbdnn.conv1d, nbdnn.conv2d, nbdnn.conv3d, nbdnn.conv_backward_data,
                  nbdnn.conv_backward_filter)),
    (MATMUL_TF32, (nbdnn.matmul, nbdnn.matmul_backward, nbdnn.scaled_dot_product_attention,
                    nbdnn.scaled_dot_product_attention_backward))) for f in fs}


def run(fn, like, *args, **kw):
    """fn(*args, **kw) (an nbdnn op) with the tensors among args and kw's values made
    arrays, on the CPU reference or on like's CUDA stream; the results as tensors on
    like's device (a tuple stays a tuple; None stays None). An fn that multiplies
    matrices runs float32 CUDA tensors in math mode "tf32" where PyTorch allows TF32 for
    its products of that kind (PRODUCTS), else in nbdnn's current math mode (the CPU
    reference: always the latter, as PyTorch's CPU kernels ignore the flags)."""
    return _run(fn, like, args, kw)


def _run(fn, like, args, kw):
    """run()'s body on its arguments as they came (run_as passes its own on, unpacked
    and packed again no more: ~0.3 us a call)."""
    stream = stream_of(like)
    if stream is None:
        args = [arr(a, True) if isinstance(a, torch.Tensor) else a for a in args]
        kw = {k: arr(v, True) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
        out = fn(*args, backend="cpu", **kw)
        if isinstance(out, tuple):
            return tuple(None if o is None else tensor(o, like) for o in out)
        return tensor(out, like)
    # CUDA: torch tensors in, torch tensors out (nbdnn allocates its results through
    # PyTorch's allocator). Tensors that require grad go as `.data` (~0.2 us each, 0.3
    # for detach()): nothing nbdnn keeps (a plan's recording, a cache, a view) may hold
    # an autograd graph alive, whose AccumulateGrad nodes a later step would reuse on
    # the stream they were made on (a CUDA graph capture after eager steps on the legacy
    # stream then fails). The stream is passed only where it is not the legacy
    # default (0): there nbdnn's eager call plans replay the call (a call given a stream
    # runs in full, ~20-200 us more: nbdnn/ops/_plan.py)
    if TRANSFORMED:  # (a torch.func transform has run: its pullbacks, called after it
        # returned, hand over its dead wrappers, which have no storage of their own)
        args = [unwrapped(a) if isinstance(a, torch.Tensor) else a for a in args]
        kw = {k: unwrapped(v) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    args = [(a.data if a.requires_grad else a).contiguous() if isinstance(a, Tensor)
            else a for a in args]
    for k, v in kw.items():
        if isinstance(v, Tensor):
            kw[k] = (v.data if v.requires_grad else v).contiguous()
    if stream:
        kw["stream"] = stream
    flag = PRODUCTS.get(fn)  # (None for most ops: asked before the dtype)
    if flag is not None and like.dtype is FLOAT32 and flag():
        kw["math"] = "tf32"
    return fn(*args, **kw)


FLOAT32 = torch.float32  # (dtypes are singletons: `is`, no module attribute lookup)


def run_as(fn, like, *args, nhwc_layout=False, **kw):
    """run(), but where tensor like is channels-last its 4-d tensor arguments (keywords'
    too) go as NHWC views (with layout="NHWC" where nhwc_layout) and 4-d results come back channels-last:
    elementwise ops and batch norm keep a channels-last model's layout without copies."""
    if not channels_last(like):
        return _run(fn, like, args, kw)
    args = [nhwc(a) if isinstance(a, torch.Tensor) and a.dim() == 4 else a for a in args]
    kw = {k: nhwc(a) if isinstance(a, torch.Tensor) and a.dim() == 4 else a
          for k, a in kw.items()}
    if nhwc_layout:
        kw["layout"] = "NHWC"
    out = _run(fn, like, args, kw)

    def back(t):
        return nchw(t) if t is not None and t.dim() == 4 else t
    return tuple(back(o) for o in out) if isinstance(out, tuple) else back(out)

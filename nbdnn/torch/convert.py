"""nbdnn.torch.convert: a model's supported layers onto nbdnn, and compare: the native
and converted model side by side, layer by layer.

convert swaps each supported module's class for its nbdnn-backed subclass
(nbdnn/torch/modules.py; other libraries' layers: nbdnn/torch/third_party.py): the module keeps its parameters, buffers, hooks and
state_dict keys, so checkpoints load either way. Modules nbdnn cannot run with
PyTorch's meaning, and every type it does not know, stay native; the report says which
and why."""
import copy
import dataclasses

import torch

from ..errors import BadParamError
from . import modules, third_party
from .intercept import functional_calls
from ._bridge import BACKENDS_FORCED, backend as _backend


@dataclasses.dataclass
class Report:
    """converted: [(qualified name, type name)]; native: [(name, type name, why)] for
    every leaf module left as it was (containers are not listed) and every module of a
    subclass of a replaced type; partly: [(name, type name, which calls)] for converted
    modules some of whose calls still run PyTorch's forward (MultiheadAttention's
    need_weights=True, its default)."""
    converted: list
    native: list
    partly: list = dataclasses.field(default_factory=list)

    def __str__(self):
        lines = [f"nbdnn.torch.convert: {len(self.converted)} modules on nbdnn, "
                 f"{len(self.native)} native"]
        but = {n: why for n, _, why in self.partly}
        lines += [f"  nbdnn   {n or '(root)'}: {t}" + (f" (but {but[n]})" if n in but else "")
                  for n, t in self.converted]
        lines += [f"  native  {n or '(root)'}: {t} ({why})" for n, t, why in self.native]
        return "\n".join(lines)


def _matches(name, m, selectors):
    """Whether module m (qualified name `name`) is named by selectors: module classes,
    class names, or qualified names (a name selects the module and those under it)."""
    for s in selectors:
        if isinstance(s, type) and isinstance(m, s):
            return True
        if isinstance(s, str) and (type(m).__name__ == s or name == s or
                                   name.startswith(s + ".")):
            return True
    return False


def convert(module, *, include=None, exclude=None, inplace=False, backend=None):
    """(model, Report): module with its supported layers run by nbdnn. include /
    exclude: module classes, class names or qualified names to take or leave (include
    None: every supported module). inplace False converts a deep copy. backend "cpu":
    the converted layers run nbdnn's CPU reference even on CUDA tensors (copies), forward
    and backward, for checking a model against the reference layer by layer."""
    if backend not in BACKENDS_FORCED:
        raise BadParamError(f"nbdnn.torch.convert: backend must be one of "
                            f"{BACKENDS_FORCED}; got {backend!r}")
    model = module if inplace else copy.deepcopy(module)
    # owners: converted modules that run their children's parameters themselves
    # (MultiheadAttention's out_proj)
    converted, native, owners, partly = [], [], [], []
    for name, m in model.named_modules():
        if any(o == "" or name.startswith(o + ".") for o in owners):
            continue
        base = type(m)
        mine = base in third_party.REGISTERED  # (nbdnn.torch.register: the user's word wins)
        sub = None if mine else modules.REPLACEMENTS.get(base)
        if sub is None and not isinstance(m, tuple(modules.REPLACEMENTS.values())):
            sub, why = third_party.replacement(base, m)
            if why:
                native.append((name, base.__name__, why))
                continue
        if sub is None:
            if isinstance(m, tuple(modules.REPLACEMENTS.values())) or \
                    third_party.converted(m):
                continue  # (converted already: convert of a converted model)
            known = next((t for t in modules.REPLACEMENTS if isinstance(m, t)), None)
            if known is not None:  # (timm's BatchNormAct2d, a weight-normed conv)
                native.append((name, base.__name__, _subclass_reason(m, known)))
            elif not list(m.children()):
                native.append((name, base.__name__, "not a module nbdnn replaces"))
            continue
        if include is not None and not _matches(name, m, include):
            native.append((name, base.__name__, "not in include"))
            continue
        if exclude is not None and _matches(name, m, exclude):
            native.append((name, base.__name__, "in exclude"))
            continue
        why = None if mine else modules.native_reason(m)
        if why:
            native.append((name, base.__name__, why))
            continue
        m.__class__ = sub
        if isinstance(m, modules.MultiheadAttention):
            partly.append((name, base.__name__, modules.MHA_NATIVE_CALLS))
        if backend is not None:
            m.register_forward_pre_hook(_enter(backend))
            m.register_forward_hook(_leave)
        converted.append((name, base.__name__))
        if isinstance(m, modules.MultiheadAttention):  # (its out_proj: run by its forward)
            owners.append(name)
    converted += _transformer_layers(model, {n for n, _ in converted})
    return model, Report(converted, native, partly)


def _subclass_reason(m, known):
    """Why a module of a subclass of a type nbdnn replaces stays native: its forward is
    its own (nbdnn replaces exact types)."""
    if getattr(type(m), "__module__", "") == "torch.nn.utils.parametrize":
        return f"a parametrized {known.__name__} (torch.nn.utils.parametrize: its weight " \
               "is computed each call)"
    return f"a subclass of {known.__name__} (its own forward; nbdnn replaces exact types)"


def _transformer_layers(model, done):
    """PyTorch's transformer containers with converted children, made to run them:
    nn.TransformerEncoderLayer's eval-mode fast path (torch._transformer_encoder_layer_fwd
    reads the children's weights and runs PyTorch's fused kernel) turned off by its own
    switch (activation_relu_or_gelu 0: "not relu or gelu", so forward goes through its
    children); nn.TransformerEncoder's nested tensors (chosen at construction:
    use_nested_tensor) off; and an encoder or decoder layer's activation held as the
    function F.relu or F.gelu (not a module, so not converted with the children)
    replaced by nbdnn.torch's. Returns their (name, type) rows for the report."""
    from . import functional as nf
    F, nn = torch.nn.functional, torch.nn
    rows = []
    for name, m in model.named_modules():
        if not isinstance(m, (nn.TransformerEncoder, nn.TransformerEncoderLayer,
                              nn.TransformerDecoderLayer)):
            continue
        prefix = name + "." if name else ""
        if not any(n.startswith(prefix) for n in done):
            continue
        if isinstance(m, nn.TransformerEncoder):
            m.use_nested_tensor = False
        else:
            m.activation_relu_or_gelu = 0
            m.activation = {F.relu: nf.relu, F.gelu: nf.gelu}.get(m.activation, m.activation)
        rows.append((name, type(m).__name__))
    return rows


def _enter(name):
    def hook(m, args):
        m._nbdnn_backend = _backend(name)
        m._nbdnn_backend.__enter__()
    return hook


def _leave(m, args, out):
    m._nbdnn_backend.__exit__(None, None, None)


@dataclasses.dataclass
class FlopShare:
    """flop_share's answer: total, the native model's FLOPs (PyTorch's flop counter:
    matrix products, convolutions, attention); native, those its converted model still
    runs on PyTorch's ops (by_op: which ones); on_nbdnn, the share on nbdnn's."""
    total: int
    native: int
    by_op: dict

    @property
    def on_nbdnn(self):
        return 1.0 - self.native / self.total if self.total else 1.0


def flop_share(native, converted, inputs, *, kwargs=None, functional=True):
    """How much of a forward's arithmetic the converted model moved onto nbdnn: both run
    once on inputs (a tensor or a tuple; keyword inputs kwargs) under PyTorch's
    FlopCounterMode, which counts PyTorch's own ops only (nbdnn's custom ops count
    nothing); functional: the converted model under functional_calls() (a model's own
    F.* calls, attention's above all, on nbdnn too)."""
    from torch.utils.flop_counter import FlopCounterMode
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    kwargs = dict(kwargs or {})
    counts = []
    for net, wrap in ((native, False), (converted, functional)):
        with torch.no_grad(), FlopCounterMode(display=False) as fc:
            if wrap:
                with functional_calls():
                    net(*inputs, **kwargs)
            else:
                net(*inputs, **kwargs)
        counts.append(fc)
    by_op = {str(op): n for op, n in counts[1].get_flop_counts().get("Global", {}).items() if n}
    return FlopShare(counts[0].get_total_flops(), counts[1].get_total_flops(), by_op)


def compare(model, inputs, *, kwargs=None, backend=None, seed=0, file=None):
    """Run model natively and converted (a copy; backend as convert's) on the same inputs
    (a tensor or a tuple of them, and keyword inputs `kwargs`, e.g. an attention_mask),
    backpropagate the same random cotangents through both (one for each floating
    tensor of the output, which may be a tensor, a tuple, a dict or a transformers
    ModelOutput), and print, for each converted layer, the largest absolute and relative
    difference of its outputs and of the gradients reaching them, then of each
    parameter's gradient. A converted layer that never ran (an attention dropout whose p
    the fused attention reads, an unused head) gets a "did not run" row. Returns the
    rows: (name, what, max abs, max rel)."""
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    kwargs = dict(kwargs or {})
    ours, report = convert(model, backend=backend)
    native = copy.deepcopy(model)
    runs = []
    for net in (native, ours):
        seen, handles = {}, []
        for name, _ in report.converted:
            handles.append(net.get_submodule(name).register_forward_hook(_capture(name, seen)))
        try:
            out = net(*(_leaf(t) for t in inputs), **{k: _leaf(v) for k, v in kwargs.items()})
            outs = [t for t in floating_tensors(out) if t.requires_grad]
            g = torch.Generator().manual_seed(seed)  # (on the host: the same draws anywhere)
            grads = [torch.randn(t.shape, generator=g, dtype=t.dtype).to(t.device)
                     for t in outs]
            if outs:
                torch.autograd.backward(outs, grads)
        finally:
            for h in handles:
                h.remove()
        runs.append((seen, dict(net.named_parameters())))
    rows = []
    for name, _ in report.converted:
        a_outs, b_outs = runs[0][0].get(name), runs[1][0].get(name)
        if a_outs is None or b_outs is None:
            rows.append((name, "did not run", float("nan"), float("nan")))
            continue
        for i, ((a, ga), (b, gb)) in enumerate(zip(a_outs, b_outs)):
            what = "output" if len(a_outs) == 1 else f"output {i}"
            rows += [(name, what, *_diff(a, b)), (name, f"grad of {what}", *_diff(ga[0], gb[0]))]
    for pname, p in runs[0][1].items():
        rows.append((pname, "grad", *_diff(p.grad, runs[1][1][pname].grad)))
    width = max(len(r[0]) for r in rows) if rows else 0
    for r in rows:
        print(f"{r[0]:{width}}  {r[1]:17} max abs {r[2]:.3e}  max rel {r[3]:.3e}", file=file)
    return rows


def _leaf(t):
    """An input for one run: a tensor detached and copied (floating ones requiring grad);
    anything else as it is."""
    if isinstance(t, torch.Tensor):
        return t.detach().clone().requires_grad_(t.is_floating_point())
    return t


def floating_tensors(out):
    """The floating tensors in a module's output: a tensor, or nested tuples, lists and
    dicts of them (a transformers ModelOutput is a dict), in order."""
    if isinstance(out, torch.Tensor):
        return [out] if out.is_floating_point() else []
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in floating_tensors(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in floating_tensors(o)]
    return []


def _capture(name, seen):
    def hook(m, args, out):
        got = []
        for t in floating_tensors(out):
            slot = [None]
            if t.requires_grad:
                t.register_hook(lambda g, slot=slot: slot.__setitem__(0, g.detach()))
            else:
                slot[0] = torch.zeros_like(t)
            got.append((t.detach().clone(), slot))  # (before a later in-place op)
        seen[name] = got
    return hook


def _diff(a, b):
    if a is None or b is None:
        return (float("nan"),) * 2
    d = (a.double() - b.double()).abs()
    if not d.numel():
        return 0.0, 0.0
    scale = b.double().abs().max().clamp_min(torch.finfo(torch.float64).tiny)
    return float(d.max()), float(d.max() / scale)

"""Layer classes of other libraries that convert replaces, known by their module and
class name (their packages are not imported here: a model holding one has imported it).

Each entry builds the nbdnn-backed subclass of its class on first sight, and only where
the class's forward is the one the entry was written for: the sha256 of its body as
ast.unparse writes it (FORMS; transformers 5.25, timm 1.0.31). A library version that
changes a forward leaves the layer native, and convert's report says why.
- transformers' Conv1D (GPT-2's projections: addmm(bias, x, weight), weight (in, out)):
  one nbdnn GEMM reading the weight as stored (functional.linear_in_out).
- transformers' GELU activations: GELUActivation (exact, erf), NewGELUActivation,
  FastGELUActivation, AccurateGELUActivation and GELUTanh (the tanh form, PyTorch's
  approximate="tanh"; nbdnn evaluates it in float32 and rounds once, where their
  several ops round between), SiLUActivation.
- the Llama form of RMSNorm (LlamaRMSNorm, MistralRMSNorm, Qwen2RMSNorm, Qwen3RMSNorm,
  Phi3RMSNorm: x in float32 over the last axis, float64 too, rounded to x's dtype,
  then times the weight in PyTorch's promotion): nbdnn's rms_norm without a weight (the
  same float32 arithmetic, one rounding; float64 x rounded to float32 first, as
  theirs), then the weight's product as theirs. Their float32 sums and nbdnn's add in
  different orders: float64 models agree to float32's precision there, not float64's.
- torchvision's ResNet blocks (Bottleneck, BasicBlock): each batch norm and the ReLU
  after it, and the last one's residual add, as one fused batch norm
  (functional.batch_norm_act: one pass forward, one backward) where the block holds
  plain BatchNorm2d and ReLU modules; with a hook on a child, or other children, the
  block's own forward runs.
- timm's BatchNormAct2d: with no drop and a ReLU, SiLU or Hardswish, one fused batch
  norm (functional.batch_norm_act); else batch norm, then its drop and act children,
  converted on their own, LayerNorm, LayerNorm2d (over the channels of NCHW, through NHWC views), Linear,
  and its activation classes GELU, GELUTanh, Swish, HardSwish, HardSigmoid, Sigmoid,
  Tanh (inplace as theirs).
"""
import ast
import functools
import hashlib
import inspect
import textwrap

import torch
from torch.nn import functional as F

from . import functional as nf, modules
from ._args import in_place


def _conv1d(self, x):
    return nf.linear_in_out(x, self.weight, self.bias)


def _llama_rms_norm(self, hidden_states):
    dtype = hidden_states.dtype
    x = hidden_states.float() if dtype == torch.float64 else hidden_states  # (theirs:
    # float32 arithmetic whatever the dtype; float32 accumulation in nbdnn's below)
    y = nf.rms_norm(x, (x.shape[-1],), None, self.variance_epsilon)
    return self.weight * y.to(dtype)


def _plain(m, torch_cls):
    """m is exactly torch_cls or nbdnn's replacement of it, and no hook (its own or a
    global one) would see it called: a fused forward that does not call m as a module
    may stand for it."""
    from torch.nn.modules import module as mm
    return type(m) in (torch_cls, modules.REPLACEMENTS.get(torch_cls)) and not (
        m._forward_hooks or m._forward_pre_hooks or mm._global_forward_hooks or
        mm._global_forward_pre_hooks)


def _fusable(block):
    """Whether a torchvision ResNet block's batch norms and ReLU are plain (_plain): the
    fused forward's assumption; else its own forward runs."""
    bns = [block.bn1, block.bn2] + ([block.bn3] if hasattr(block, "bn3") else [])
    return all(_plain(b, torch.nn.BatchNorm2d) for b in bns) and \
        _plain(block.relu, torch.nn.ReLU)


def _bottleneck(self, x):  # (torchvision.models.resnet.Bottleneck's forward, fused)
    if not _fusable(self):
        return type(self).__mro__[1].forward(self, x)
    out = modules.batch_norm(self.bn1, self.conv1(x), activation="relu")
    out = modules.batch_norm(self.bn2, self.conv2(out), activation="relu")
    out = self.conv3(out)
    identity = x if self.downsample is None else self.downsample(x)
    return modules.batch_norm(self.bn3, out, identity, "relu")


def _basic_block(self, x):  # (torchvision.models.resnet.BasicBlock's forward, fused)
    if not _fusable(self):
        return type(self).__mro__[1].forward(self, x)
    out = modules.batch_norm(self.bn1, self.conv1(x), activation="relu")
    out = self.conv2(out)
    identity = x if self.downsample is None else self.downsample(x)
    return modules.batch_norm(self.bn2, out, identity, "relu")


FUSED = {torch.nn.ReLU: ("relu", None), torch.nn.SiLU: ("swish", 1.0),
         torch.nn.Hardswish: ("hardswish", None)}  # activations batch norm fuses


def _fused_mode(act):
    """(nbdnn's mode, coef) of a plain (_plain) activation batch norm can fuse, "" for a
    plain Identity, else None."""
    if _plain(act, torch.nn.Identity):
        return ""
    return next((mode for cls, mode in FUSED.items() if _plain(act, cls)), None)


def _batch_norm_act(self, x):  # (timm's BatchNormAct2d: with no drop and an activation
    # nbdnn fuses, one fused batch norm forward and backward)
    mode = _fused_mode(self.act) if _plain(self.drop, torch.nn.Identity) else None
    if mode == "":
        return modules.batch_norm(self, x)
    if mode is not None and x.dim() == 4:
        return modules.batch_norm(self, x, activation=mode[0], coef=mode[1])
    return self.act(self.drop(modules.batch_norm(self, x)))


def _layer_norm(self, x):
    return nf.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


def _layer_norm_2d(self, x):  # (N, C, H, W): each pixel's C channels
    return nf.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight,
                         self.bias, self.eps).permute(0, 3, 1, 2)


def _linear(self, input):
    return nf.linear(input, self.weight, self.bias)


def _act(fn, inplace=False):
    """forward(self, x) = fn(x), in place into x where the module's inplace says so
    (timm's)."""
    if not inplace:
        return lambda self, x: fn(x)
    return lambda self, x: in_place(x, fn) if self.inplace else fn(x)


_GELU = functools.partial(nf.gelu, approximate="none")
_GELU_TANH = functools.partial(nf.gelu, approximate="tanh")
_T, _A = "transformers", "transformers.activations"
FORMS = {  # (module, class name) -> (the forward body's sha256[:16], forward)
    (f"{_T}.pytorch_utils", "Conv1D"): ("42b3c390b404119a", _conv1d),
    (_A, "GELUActivation"): ("9a5f78801fcb6620", _act(_GELU)),  # return self.act(input)
    (_A, "GELUTanh"): ("9a5f78801fcb6620", _act(_GELU_TANH)),
    (_A, "NewGELUActivation"): ("240ee949f6d3f712", _act(_GELU_TANH)),
    (_A, "FastGELUActivation"): ("4f67f044f1a02e69", _act(_GELU_TANH)),
    (_A, "AccurateGELUActivation"): ("50fec35fbe3f520f", _act(_GELU_TANH)),
    (_A, "SiLUActivation"): ("8c57732a60ed97b4", _act(nf.silu)),
    **{(f"{_T}.models.{m}.modeling_{m}", f"{n}RMSNorm"): ("1fbd6bd12111cde4", _llama_rms_norm)
       for m, n in (("llama", "Llama"), ("mistral", "Mistral"), ("qwen2", "Qwen2"),
                    ("qwen3", "Qwen3"), ("phi3", "Phi3"))},
    ("torchvision.models.resnet", "Bottleneck"): ("beb00956d9d5ce7e", _bottleneck),
    ("torchvision.models.resnet", "BasicBlock"): ("97b34fe129794fee", _basic_block),
    ("timm.layers.norm_act", "BatchNormAct2d"): ("28932fdef5672fa2", _batch_norm_act),
    ("timm.layers.norm", "LayerNorm"): ("103d61ca1211e174", _layer_norm),
    ("timm.layers.norm", "LayerNorm2d"): ("d56e723f576594bb", _layer_norm_2d),
    ("timm.layers.linear", "Linear"): ("d470aa2d6ea58819", _linear),
    ("timm.layers.activations", "GELU"): ("ec1390e8bcac41eb", _act(_GELU)),
    ("timm.layers.activations", "GELUTanh"): ("012ca39f61761e43", _act(_GELU_TANH)),
    ("timm.layers.activations", "Swish"): ("c5d489913ad3be97", _act(nf.silu, True)),
    ("timm.layers.activations", "HardSwish"): ("d8777d12f00d091f", _act(nf.hardswish, True)),
    ("timm.layers.activations", "HardSigmoid"): ("728506d03c3940cf",
                                                 _act(nf.hardsigmoid, True)),
    ("timm.layers.activations", "Sigmoid"): ("1deb2211f5bb6dff", _act(nf.sigmoid, True)),
    ("timm.layers.activations", "Tanh"): ("287eecd9c22bfa06", _act(nf.tanh, True)),
}


def body_hash(fn):
    """The sha256[:16] of fn's body as ast.unparse writes its statements ("; " between),
    its docstring left out; None where its source cannot be read."""
    try:
        f = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return None
    stmts = f.body
    if stmts and isinstance(stmts[0], ast.Expr) and isinstance(stmts[0].value, ast.Constant) \
            and isinstance(stmts[0].value.value, str):
        stmts = stmts[1:]
    return hashlib.sha256("; ".join(ast.unparse(s) for s in stmts).encode()).hexdigest()[:16]


def _act_is_gelu(m, approximate):
    """transformers' GELUActivation / GELUTanh: self.act is PyTorch's gelu (with
    approximate="tanh", a functools.partial, for GELUTanh) or their Python formula of
    the same."""
    act = getattr(m, "act", None)
    if approximate == "none":
        return act is F.gelu or getattr(act, "__name__", None) == "_gelu_python"
    return getattr(act, "__name__", None) == "_gelu_tanh_python" or (
        isinstance(act, functools.partial) and act.func is F.gelu and not act.args and
        act.keywords == {"approximate": "tanh"})


_BUILT = {}  # third-party class -> its nbdnn subclass
REGISTERED = {}  # class -> forward: what users taught convert (register)


def register(cls, forward):
    """Teach nbdnn.torch.convert a module class of your own or another library's:
    modules of exactly cls get forward(self, *args, **kwargs) in place of theirs (write
    it with nbdnn.torch's functions; it may call self's parameters and children, which
    convert also visits). A later register of cls replaces the earlier forward; a class
    nbdnn replaces itself (torch.nn's, FORMS's) can be registered too, and the
    registration wins. Returns cls.

        nbdnn.torch.register(MyRMSNorm, lambda self, x: nbdnn.torch.rms_norm(
            x, (x.shape[-1],), self.weight, self.eps))
    """
    from ..errors import BadParamError
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise BadParamError(f"nbdnn.torch.register: cls must be a torch.nn.Module class; "
                            f"got {cls!r}")
    if not callable(forward):
        raise BadParamError(f"nbdnn.torch.register: forward must be callable; got "
                            f"{forward!r}")
    REGISTERED[cls] = forward
    _BUILT.pop(cls, None)
    return cls


def converted(m):
    """Whether m is of a class this module built (convert of a converted model)."""
    return type(m) in _BUILT.values()


def replacement(cls, m):
    """(subclass, None) for module m of a class registered, or one FORMS knows with its
    forward as the entry was written for; (None, why) for a known class that differs;
    (None, None) for any other class."""
    if cls in REGISTERED:
        sub = _BUILT.get(cls)
        if sub is None:
            sub = _BUILT[cls] = type(cls.__name__, (cls,), {"forward": REGISTERED[cls],
                                                            "__module__": __name__})
        return sub, None
    form = FORMS.get((cls.__module__, cls.__name__))
    if form is None:
        return None, None
    digest, forward = form
    if body_hash(cls.forward) != digest:
        return None, f"its forward is not the one nbdnn's entry for {cls.__name__} replaces"
    if cls.__module__ == _A and cls.__name__ in ("GELUActivation", "GELUTanh") and \
            not _act_is_gelu(m, "tanh" if cls.__name__ == "GELUTanh" else "none"):
        return None, f"its act is {getattr(m, 'act', None)!r}, not the GELU nbdnn replaces"
    sub = _BUILT.get(cls)
    if sub is None:
        sub = _BUILT[cls] = type(cls.__name__, (cls,), {"forward": forward,
                                                        "__module__": __name__})
    return sub, None

"""Layer classes of other libraries that convert replaces, known by their module and
class name (their package is not imported here: a model holding one has imported it).

Each entry builds the nbdnn-backed subclass of the class on first sight. A class is
replaced only where its forward is the one the entry was written for (its source
compared): a library version that changes it leaves the layer native, saying why.
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
"""
import ast
import functools
import inspect
import textwrap

import torch
from torch.nn import functional as F

from . import functional as nf


def _conv1d(base):
    def forward(self, x):
        return nf.linear_in_out(x, self.weight, self.bias)
    return forward


def _gelu(approximate):
    def build(base):
        def forward(self, input):
            return nf.gelu(input, approximate)
        return forward
    return build


def _silu(base):
    def forward(self, input):
        return nf.silu(input)
    return forward


def _llama_rms_norm(base):
    def forward(self, hidden_states):
        dtype = hidden_states.dtype
        x = hidden_states.float() if dtype == torch.float64 else hidden_states  # (theirs:
        # float32 arithmetic whatever the dtype; float32 accumulation in nbdnn's below)
        y = nf.rms_norm(x, (x.shape[-1],), None, self.variance_epsilon)
        return self.weight * y.to(dtype)
    return forward


# the forward bodies the entries were written for (ast.unparse's statements, "; " between)
_ADDMM = ("size_out = x.size()[:-1] + (self.nf,); x = torch.addmm(self.bias, x.view(-1, "
          "x.size(-1)), self.weight); x = x.view(size_out); return x")
_GELU = "return self.act(input)"
_NEW_GELU = ("return 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + "
             "0.044715 * torch.pow(input, 3.0))))")
_FAST_GELU = ("return 0.5 * input * (1.0 + torch.tanh(input * 0.7978845608 * (1.0 + 0.044715 "
              "* input * input)))")
_ACCURATE_GELU = ("return 0.5 * input * (1 + torch.tanh(self.precomputed_constant * (input + "
                  "0.044715 * torch.pow(input, 3))))")
_SILU = "return nn.functional.silu(input)"
_LLAMA_RMS = ("input_dtype = hidden_states.dtype; hidden_states = hidden_states.to("
              "torch.float32); variance = hidden_states.pow(2).mean(-1, keepdim=True); "
              "hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon); "
              "return self.weight * hidden_states.to(input_dtype)")

_ACT = "transformers.activations"
ENTRIES = {  # (module, class name) -> (the forward's body, build(base) -> forward)
    ("transformers.pytorch_utils", "Conv1D"): (_ADDMM, _conv1d),
    (_ACT, "GELUActivation"): (_GELU, _gelu("none")),
    (_ACT, "GELUTanh"): (_GELU, _gelu("tanh")),
    (_ACT, "NewGELUActivation"): (_NEW_GELU, _gelu("tanh")),
    (_ACT, "FastGELUActivation"): (_FAST_GELU, _gelu("tanh")),
    (_ACT, "AccurateGELUActivation"): (_ACCURATE_GELU, _gelu("tanh")),
    (_ACT, "SiLUActivation"): (_SILU, _silu),
    **{(f"transformers.models.{m}.modeling_{m}", f"{n}RMSNorm"): (_LLAMA_RMS, _llama_rms_norm)
       for m, n in (("llama", "Llama"), ("mistral", "Mistral"), ("qwen2", "Qwen2"),
                    ("qwen3", "Qwen3"), ("phi3", "Phi3"))},
}


def _body(fn):
    """fn's body as ast.unparse writes its statements ("; " between), its docstring
    left out; None where its source cannot be read."""
    try:
        f = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return None
    stmts = f.body
    if stmts and isinstance(stmts[0], ast.Expr) and isinstance(stmts[0].value, ast.Constant) \
            and isinstance(stmts[0].value.value, str):
        stmts = stmts[1:]
    return "; ".join(ast.unparse(s) for s in stmts)


def _act_is_gelu(m, approximate):
    """GELUActivation's / GELUTanh's self.act: PyTorch's gelu (with approximate="tanh",
    as a functools.partial, for GELUTanh) or their Python formula of the same."""
    act = getattr(m, "act", None)
    if approximate == "none":
        return act is F.gelu or getattr(act, "__name__", None) == "_gelu_python"
    return getattr(act, "__name__", None) == "_gelu_tanh_python" or (
        isinstance(act, functools.partial) and act.func is F.gelu and not act.args and
        act.keywords == {"approximate": "tanh"})


_BUILT = {}  # third-party class -> its nbdnn subclass


def converted(m):
    """Whether m is of a class this module built (convert of a converted model)."""
    return type(m) in _BUILT.values()


def replacement(cls, m):
    """(subclass, None) for module m of a class ENTRIES knows, with its forward as the
    entry was written for; (None, why) for a known class that differs; (None, None)
    for any other class."""
    entry = ENTRIES.get((cls.__module__, cls.__name__))
    if entry is None:
        return None, None
    body, build = entry
    if _body(cls.forward) != body:
        return None, f"its forward is not the one nbdnn's entry for {cls.__name__} replaces"
    if body == _GELU and not _act_is_gelu(m, "tanh" if cls.__name__ == "GELUTanh" else "none"):
        return None, f"its act is {getattr(m, 'act', None)!r}, not the GELU nbdnn replaces"
    sub = _BUILT.get(cls)
    if sub is None:
        sub = _BUILT[cls] = type(cls.__name__, (cls,), {"forward": build(cls),
                                                        "__module__": __name__})
    return sub, None

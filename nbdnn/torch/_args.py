"""nbdnn.torch.functional's argument handling: dtype checks, torch.autocast's casts,
inplace=True, int-or-tuple arguments, and the NotSupportedError for what nbdnn cannot
compute with PyTorch's meaning."""
import torch

from ..errors import BadParamError, DtypeError, NotSupportedError, ShapeError
from ._bridge import DTYPES


def check(fn, *tensors):
    for t in tensors:
        if t is not None and t.dtype not in DTYPES:
            raise DtypeError(f"nbdnn.torch.{fn}: {t.dtype} tensors are not taken "
                             f"(float16, bfloat16, float32, float64)")


# torch.autocast's casts (which reach no custom op by themselves), as PyTorch casts the
# ops these replace: its lower-precision list, its float32 list (per device type;
# local_response_norm is float32 on both through the ops PyTorch composes it of), and
# the rest in x's dtype with their weights cast to it (PyTorch takes float32 weights
# beside 16-bit x there)
LOWER = {"conv", "linear", "scaled_dot_product_attention"}
FLOAT32 = {"cuda": {"softmax", "log_softmax", "layer_norm", "group_norm", "softplus",
                    "local_response_norm"},
           "cpu": {"avg_pool3d", "max_pool3d", "local_response_norm"}}
# ...but batch norm keeps float32 weights beside 16-bit x, as PyTorch's (cuDNN's batch
# norm takes float scale and bias for half inputs, and so does nbdnn's): no cast, and
# their gradients float32
FLOAT32_PARAMS = {"batch_norm"}


def autocast(op, *tensors):
    """tensors (x first) as autocast has op see them, unchanged outside autocast (asked
    first of all devices at once: ~0.07 us, where a tensor's device type costs ~0.3)."""
    if not any_autocast():
        return tensors
    device = tensors[0].device.type
    if not torch.is_autocast_enabled(device):
        return tensors
    to = torch.get_autocast_dtype(device) if op in LOWER else torch.float32 \
        if op in FLOAT32.get(device, ()) else tensors[0].dtype
    keep = torch.float32 if op in FLOAT32_PARAMS and to in DTYPES[:2] else None
    return tuple(t.to(to) if t is not None and t.dtype in DTYPES[:3] and
                 (i == 0 or t.dtype != keep) else t for i, t in enumerate(tensors))


any_autocast = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)


def ready(fn, op, x, w=None, b=None):
    """(x, w, b) as autocast has op see them, their dtypes checked for function fn: the
    common case (no autocast, dtypes nbdnn takes) asked inline, one frame (~0.17 us a
    call less than autocast() and check() on three tensors, on the CI host)."""
    if any_autocast():
        x, w, b = autocast(op, x, w, b)
    if x.dtype not in DTYPES or w is not None and w.dtype not in DTYPES or \
            b is not None and b.dtype not in DTYPES:
        check(fn, x, w, b)
    return x, w, b


def unsupported(fn, what):
    raise NotSupportedError(f"nbdnn.torch.{fn}: {what}")


def in_place(x, compute):
    """PyTorch's inplace=True: compute(x)'s result written into x and x returned, its
    version counter bumped and, where autograd records, the write recorded (x.copy_), so
    every other holder of x sees the new values as with PyTorch's own in-place ops. While
    autograd records, compute reads a copy of x: the op's saved input must stay as it was
    for its backward. (A leaf that requires grad is refused by copy_, as by PyTorch.)"""
    if torch.is_grad_enabled() and x.requires_grad:
        return x.copy_(compute(x.clone()))
    return x.copy_(compute(x))


def _is_int(v):
    return (isinstance(v, int) and not isinstance(v, bool)) or isinstance(v, torch.SymInt)


def ints(fn, name, v, nd, low=0, empty=None):
    """v as torch.nn.functional reads an int-or-tuple argument: an int, or a tuple / list
    of one int (repeated) or nd ints, each >= low, as a list of nd ints; `empty` is what
    () means where PyTorch takes it (a pool's stride: the kernel), else () is refused.
    Anything else (a float, a string, another length) is a BadParamError naming the
    function and the argument, where PyTorch raises too (no truncation: stride 1.5 is
    not 1)."""
    if v.__class__ is int and v >= low:  # (the common case)
        return [v] * nd
    if isinstance(v, (tuple, list, torch.Size)):
        items = list(v)
        if not items and empty is not None:
            return list(empty)
        if len(items) in (1, nd) and all(_is_int(i) for i in items):
            out = [int(i) if isinstance(i, int) else i for i in items] * (nd // len(items))
            if all(i >= low for i in out):
                return out
    elif _is_int(v) and v >= low:
        return [v] * nd
    raise BadParamError(f"nbdnn.torch.{fn}: {name} must be an int >= {low} or a tuple of 1 "
                        f"or {nd} of them (as torch.nn.functional takes it); got {v!r}")


def conv_geometry(fn, nd, weight, stride, padding, dilation):
    """(stride, per-side padding, dilation) as tuples of ints, the custom op's arguments
    (its int[]: tuples, so its direct entry can know a cached one by identity), checked
    as F.conv<nd>d checks them."""
    stride = ints(fn, "stride", stride, nd, low=1)
    dilation = ints(fn, "dilation", dilation, nd, low=1)
    if isinstance(padding, str):
        if padding not in ("valid", "same"):
            raise BadParamError(f"nbdnn.torch.{fn}: padding must be 'valid', 'same', an int "
                                f"or a tuple of ints; got {padding!r}")
        if padding == "same" and any(s != 1 for s in stride):
            raise BadParamError(f"nbdnn.torch.{fn}: padding 'same' with stride "
                                f"{tuple(stride)} (as PyTorch: 'same' is for stride 1 only)")
    if padding == "valid":
        pads = [0] * (2 * nd)
    elif padding == "same":  # (PyTorch: total d (R - 1), the odd one after)
        pads = []
        for R, d in zip(weight.shape[2:], dilation):
            total = d * (R - 1)
            pads += [total // 2, total - total // 2]
    else:
        pads = [p for v in ints(fn, "padding", padding, nd) for p in (v, v)]
    return tuple(stride), tuple(pads), tuple(dilation)


def positive_eps(fn, value):
    """A norm's eps as a float; NotSupportedError for eps <= 0, which PyTorch takes (a
    NaN or a division by a negative variance) and nbdnn's norms refuse (cuDNN's rule)."""
    e = float(value)
    if not e > 0:
        unsupported(fn, f"eps {value} (nbdnn's norms take eps > 0)")
    return e


def normalized(fn, input, normalized_shape):
    """len(normalized_shape), checked against input's trailing axes (one axis, the usual
    case, by its size: 0.15 us a call less on the CI host)."""
    shape = normalized_shape if normalized_shape.__class__ is tuple else \
        (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    n, size = len(shape), input.shape
    if n == 1 and size and size[-1] == shape[0]:
        return 1
    if size[len(size) - n:] != shape:  # (torch.Size is a tuple)
        raise ShapeError(f"nbdnn.torch.{fn}: normalized_shape {shape} must end the input's "
                         f"shape {tuple(input.shape)}")
    return n

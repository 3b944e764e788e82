"""nbdnn.torch.functional's pooling (max, average, adaptive average; 1-3 spatial axes,
batched or one sample), each a torch.ops.nbdnn.pool call (adaptive average pooling to
sizes that do not divide the input: two products on torch.ops.nbdnn.linear)."""
import torch

from ..errors import BadParamError, ShapeError
from ._bridge import call, channels_last as _channels_last, functorch
from ._args import autocast as _autocast, check as _check, \
    ints as _tuple
from ._ops_basic import linear as _linear
from ._ops_conv import pool, pool_indices


def one_sample(nd, op, input, *args):
    """call(op, input, *args), where input is one sample (nd + 1 dimensions: no batch
    axis) as a batch of one, the result without the batch axis again."""
    if input.dim() == nd + 1:
        return call(op, input.unsqueeze(0), *args).squeeze(0)
    return call(op, input, *args)


def _pool(fn, nd, input, kernel_size, stride, padding, dilation, mode, ceil_mode,
          return_indices=False, divisor=None):
    """The pool's output (and with return_indices, max only, the int64 flat index of
    each window's first maximal element in its plane, as PyTorch's); divisor: the
    averages' divisor_override."""
    (input,) = _autocast(fn, input)
    _check(fn, input)
    if input.dim() not in (nd + 1, nd + 2):
        raise ShapeError(f"nbdnn.torch.{fn}: input must be {nd + 2}-d (batched) or "
                         f"{nd + 1}-d (one sample), channels first; got {input.dim()}-d")
    if input.dim() == nd + 1 and input.shape[0] == 0:
        raise ShapeError(f"nbdnn.torch.{fn}: an unbatched input must have channels; got "
                         f"shape {tuple(input.shape)}")
    kernel = _tuple(fn, "kernel_size", kernel_size, nd, low=1)
    stride = kernel if stride is None else _tuple(fn, "stride", stride, nd, low=1,
                                                  empty=kernel)
    dilation = _tuple(fn, "dilation", dilation, nd, low=1)
    padding = _tuple(fn, "padding", padding, nd)
    for p, k, d in zip(padding, kernel, dilation):
        if 2 * p > d * (k - 1) + 1:  # (PyTorch: at most half the effective kernel)
            raise BadParamError(f"nbdnn.torch.{fn}: padding {tuple(padding)} must be at most "
                                f"half the effective kernel size (kernel_size "
                                f"{tuple(kernel)}, dilation {tuple(dilation)})")
    pads = [p for v in padding for p in (v, v)]
    if divisor is not None:
        if isinstance(divisor, bool) or not isinstance(divisor, int) or divisor == 0:
            raise BadParamError(f"nbdnn.torch.{fn}: divisor_override must be a nonzero int; "
                                f"got {divisor!r}")
        y = one_sample(nd, pool, input, kernel, stride, pads, dilation, mode, bool(ceil_mode),
                       divisor)
    else:
        y = one_sample(nd, pool, input, kernel, stride, pads, dilation, mode, bool(ceil_mode))
    if not return_indices:
        return y
    return y, one_sample(nd, pool_indices, input.detach(), kernel, stride, pads, dilation,
                         bool(ceil_mode))


def _max_pool(fn, nd, input, kernel_size, stride, padding, dilation, ceil_mode,
              return_indices):
    """With return_indices, (output, indices): the indices name the element each output
    came from and the gradient goes to (the first maximal one of its window; a window
    with several NaNs names its first, where PyTorch's kernels name the last)."""
    return _pool(fn, nd, input, kernel_size, stride, padding, dilation, "max", ceil_mode,
                 bool(return_indices))


def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    return _max_pool("max_pool1d", 1, input, kernel_size, stride, padding, dilation,
                     ceil_mode, return_indices)


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    return _max_pool("max_pool2d", 2, input, kernel_size, stride, padding, dilation,
                     ceil_mode, return_indices)


def max_pool3d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    return _max_pool("max_pool3d", 3, input, kernel_size, stride, padding, dilation,
                     ceil_mode, return_indices)


def _avg_pool(fn, nd, input, kernel_size, stride, padding, ceil_mode, count_include_pad,
              divisor_override=None):
    return _pool(fn, nd, input, kernel_size, stride, padding, 1,
                 "avg" if count_include_pad else "avg_exclude_pad", ceil_mode,
                 divisor=divisor_override)


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True):
    return _avg_pool("avg_pool1d", 1, input, kernel_size, stride, padding, ceil_mode,
                     count_include_pad)


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    return _avg_pool("avg_pool2d", 2, input, kernel_size, stride, padding, ceil_mode,
                     count_include_pad, divisor_override)


def avg_pool3d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    return _avg_pool("avg_pool3d", 3, input, kernel_size, stride, padding, ceil_mode,
                     count_include_pad, divisor_override)


def adaptive_avg_pool2d(input, output_size):
    """PyTorch's adaptive average pooling: output row i averages input rows floor(i H /
    OH) to ceil((i + 1) H / OH), columns alike (an output size None keeps the input's).
    Where both output sizes divide the input's, that is an average pool with window =
    stride = H / OH (global pooling at (1, 1)); otherwise the windows differ in size and
    may overlap, and y = A_H x A_W^T, A (O, S) holding 1 / the window's size over each
    window: two products on nbdnn's linear (N C H W OW + N C OW H OH multiply-adds)."""
    if input.dim() not in (3, 4):
        raise ShapeError("nbdnn.torch.adaptive_avg_pool2d: input must be 4-d (N, C, H, W) "
                         f"or 3-d (C, H, W); got {input.dim()}-d")
    H, W = input.shape[-2:]
    sizes = (output_size, output_size) if isinstance(output_size, int) else tuple(output_size) \
        if isinstance(output_size, (tuple, list, torch.Size)) else ()
    if len(sizes) != 2 or not all(o is None or isinstance(o, int) and not isinstance(o, bool)
                                  for o in sizes):
        raise BadParamError("nbdnn.torch.adaptive_avg_pool2d: output_size must be an int or "
                            f"a pair of ints (or None); got {output_size!r}")
    OH, OW = (S if O is None else int(O) for S, O in zip((H, W), sizes))
    if OH < 1 or OW < 1:
        raise ShapeError(f"nbdnn.torch.adaptive_avg_pool2d: output_size {output_size} must "
                         "be positive")
    if H % OH == 0 and W % OW == 0:
        return _pool("adaptive_avg_pool2d", 2, input, [H // OH, W // OW], None, 0, 1, "avg",
                     False)
    (input,) = _autocast("adaptive_avg_pool2d", input)
    _check("adaptive_avg_pool2d", input)
    y = call(_linear, input, _averaging(W, OW, input), None)              # (.., H, OW)
    y = call(_linear, y.transpose(-1, -2), _averaging(H, OH, input), None)  # (.., OW, OH)
    last = not functorch() and _channels_last(input)  # (vmap cannot ask a batched tensor)
    return y.transpose(-1, -2).contiguous(
        memory_format=torch.channels_last if last else torch.contiguous_format)


def _averaging(S, O, like):
    """(O, S): row i is 1 / its window's size over input positions floor(i S / O) to
    ceil((i + 1) S / O) - 1, in like's dtype and device."""
    rows = []
    for i in range(O):
        lo, hi = i * S // O, -(-(i + 1) * S // O)
        rows.append([1.0 / (hi - lo) if lo <= j < hi else 0.0 for j in range(S)])
    return torch.tensor(rows, dtype=like.dtype, device=like.device).reshape(O, S)

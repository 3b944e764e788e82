"""torch.nn.functional's names, signatures and meaning, computed by nbdnn: CUDA tensors
on nbdnn's kernels (PyTorch's current stream), CPU tensors on nbdnn's CPU reference.
Each call is one torch.ops.nbdnn custom op (autograd, torch.compile, CUDA graphs see it).
Where nbdnn cannot give PyTorch's meaning the call is a NotSupportedError naming the
argument, never a silent difference; see nbdnn/torch/__init__.py for the list."""
import torch

from ..errors import BadParamError, DtypeError, ShapeError
from ..ops.activation import fused_coef
from ._bridge import DTYPES, call, advance as _advance, compiling, functorch, plain_eager
from ._args import any_autocast, autocast as _autocast, check as _check, \
    conv_geometry as _conv_geometry, positive_eps as _eps, ints as _tuple, normalized as _normalized, \
    ready as _ready, unsupported as _unsupported, in_place as _in_place
from ._ops_basic import activation, activation_in_place, linear as _linear, lrn, \
    softmax as _softmax
from ._ops_conv import conv, conv_transpose as _conv_transpose_op, \
    conv_transpose_shape as _conv_transpose_shape
from ._functional_pool import adaptive_avg_pool2d, avg_pool1d, avg_pool2d, avg_pool3d, \
    max_pool1d, max_pool2d, max_pool3d, one_sample as _one_sample  # noqa: F401 (the
# pooling functions are this module's too)
from ._ops_random import attention as _attention, draw_seed, dropout as _dropout, \
    paged_attention as _paged_attention
from ._ops_norm import batch_norm as _batch_norm, batch_norm_act as _batch_norm_act, \
    group_norm as _group_norm, layer_norm as _layer_norm, rms_norm as _rms_norm


def _act(fn, x, mode, coef, inplace=False):
    if any_autocast():  # (the checks inline where they pass: ~0.15 us a call)
        (x,) = _autocast(fn, x)
    if x.dtype not in DTYPES:
        _check(fn, x)
    if inplace:
        done = activation_in_place(x, mode, float(coef))
        return done if done is not None else \
            _in_place(x, lambda t: call(activation, t, mode, float(coef)))
    return call(activation, x, mode, float(coef))


def relu(input, inplace=False):
    return _act("relu", input, "relu", 0.0, inplace)


def leaky_relu(input, negative_slope=0.01, inplace=False):
    return _act("leaky_relu", input, "leaky_relu", negative_slope, inplace)


def elu(input, alpha=1.0, inplace=False):
    return _act("elu", input, "elu", alpha, inplace)


def gelu(input, approximate="none"):
    if approximate not in ("none", "tanh"):
        raise BadParamError(f"nbdnn.torch.gelu: approximate must be 'none' or 'tanh'; "
                            f"got {approximate!r}")
    return _act("gelu", input, "gelu" if approximate == "none" else "gelu_tanh", 0.0)


def silu(input, inplace=False):
    return _act("silu", input, "swish", 1.0, inplace)


def sigmoid(input):
    return _act("sigmoid", input, "sigmoid", 0.0)


def tanh(input):
    return _act("tanh", input, "tanh", 0.0)


def softplus(input, beta=1.0, threshold=20.0):
    """nbdnn's softplus is the exact stable form everywhere; PyTorch returns x where
    beta x > threshold. With the default threshold 20 the two differ by at most
    log1p(exp(-20)) / beta (2e-9 / beta: below float32's rounding of such x), and nbdnn's
    is returned; another threshold takes x there as PyTorch does (torch.where over
    nbdnn's softplus: the same values and, through where, the same gradient)."""
    y = _act("softplus", input, "softplus", beta)
    if threshold == 20.0:
        return y
    return torch.where(input * beta > threshold, input.to(y.dtype), y)


def hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False):
    """nbdnn's clipped_relu where min_val is 0, its clamp where min_val is -max_val (the
    default, -1 and 1); other bounds are a NotSupportedError."""
    if min_val > max_val:
        raise BadParamError(f"nbdnn.torch.hardtanh: max_val {max_val} must be >= min_val "
                            f"{min_val}")
    if min_val == 0.0:
        return _act("hardtanh", input, "clipped_relu", max_val, inplace)
    if min_val == -max_val:
        return _act("hardtanh", input, "clamp", max_val, inplace)
    _unsupported("hardtanh", f"min_val {min_val} with max_val {max_val} (nbdnn's clipped "
                 "relu and clamp: min_val 0, or -max_val)")


def relu6(input, inplace=False):
    return _act("relu6", input, "clipped_relu", 6.0, inplace)


def hardswish(input, inplace=False):
    return _act("hardswish", input, "hardswish", 0.0, inplace)


def hardsigmoid(input, inplace=False):
    return _act("hardsigmoid", input, "hardsigmoid", 0.0, inplace)


def _softmax_call(fn, input, dim, dtype, log):
    if dim is None:
        _unsupported(fn, "dim None (PyTorch's deprecated implicit choice): pass dim")
    if dtype is not None:
        input = input.to(dtype)
    (input,) = _autocast(fn, input)
    _check(fn, input)
    if input.dim() == 0:  # (a scalar: its one element, dim 0 or -1 as PyTorch takes)
        if dim not in (0, -1):
            raise BadParamError(f"nbdnn.torch.{fn}: dim {dim} out of range for a 0-d input "
                                "(0 or -1)")
        return call(_softmax, input.reshape(1), 0, log).reshape(())
    return call(_softmax, input, dim, log)


def softmax(input, dim=None, _stacklevel=3, dtype=None):
    return _softmax_call("softmax", input, dim, dtype, False)


def log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    return _softmax_call("log_softmax", input, dim, dtype, True)


def linear(input, weight, bias=None):
    input, weight, bias = _ready("linear", "linear", input, weight, bias)
    if input.dim() == 0 or weight.dim() not in (1, 2) or \
            input.shape[-1] != weight.shape[-1]:
        raise ShapeError(f"nbdnn.torch.linear: input (at least 1-d) and weight (1-d or 2-d) "
                         f"must share their last axis; got {tuple(input.shape)} and "
                         f"{tuple(weight.shape)}")
    if weight.dim() == 1:  # (F.linear: one output feature, its axis dropped)
        y = linear(input, weight.unsqueeze(0)).squeeze(-1)
        return y if bias is None else y + bias
    if input.shape[-1] == 0:  # (no input features: the sums are empty, y = bias)
        y = input.new_zeros(input.shape[:-1] + weight.shape[:1])
        return y if bias is None else y + bias
    if input.dim() == 1:
        return call(_linear, input.unsqueeze(0), weight, bias).squeeze(0)
    return call(_linear, input, weight, bias)


def linear_in_out(input, weight, bias=None):
    """input @ weight + bias with weight stored (in_features, out_features): transformers'
    Conv1D (GPT-2's projections, torch.addmm(bias, x, weight)); one GEMM reading the
    weight as stored, as linear's reads (out_features, in_features)."""
    input, weight, bias = _ready("linear_in_out", "linear", input, weight, bias)
    if input.dim() == 0 or weight.dim() != 2 or input.shape[-1] != weight.shape[0]:
        raise ShapeError(f"nbdnn.torch.linear_in_out: input (at least 1-d) must end in "
                         f"weight's first axis (weight 2-d, (in, out)); got "
                         f"{tuple(input.shape)} and {tuple(weight.shape)}")
    if input.shape[-1] == 0:  # (no input features: the sums are empty, y = bias)
        y = input.new_zeros(input.shape[:-1] + weight.shape[1:])
        return y if bias is None else y + bias
    if input.dim() == 1:
        return call(_linear, input.unsqueeze(0), weight, bias, True).squeeze(0)
    return call(_linear, input, weight, bias, True)


def matmul(input, other):
    """torch.matmul where other is a matrix (a layer's weight, (K, N)): input (..., K)
    @ other as one GEMM reading other as stored (linear_in_out's). A 1-d or batched
    other is a NotSupportedError: under functional_calls() PyTorch's own matmul runs it,
    counted native."""
    if not isinstance(other, torch.Tensor) or other.dim() != 2:
        _unsupported("matmul", f"other of {getattr(other, 'ndim', '?')} dims (nbdnn.torch's "
                     "matmul takes a matrix: a layer's weight)")
    _same_dtype("matmul", input, other)
    return linear_in_out(input, other)


def addmm(input, mat1, mat2, *, beta=1, alpha=1):
    """torch.addmm as a layer computes it (transformers' Conv1D, GPT-2's projections):
    mat1 (M, K) @ mat2 (K, N) + input, input a bias of N (or 1) elements, beta and
    alpha 1: one GEMM with its bias in the epilogue. Anything else is a
    NotSupportedError (under functional_calls(): PyTorch's addmm, counted native)."""
    if beta != 1 or alpha != 1 or not isinstance(input, torch.Tensor) or input.dim() > 1 or \
            mat1.dim() != 2 or mat2.dim() != 2:
        _unsupported("addmm", "other than a bias of N elements, mat1 and mat2 matrices, "
                     "beta and alpha 1")
    _same_dtype("addmm", input, mat1, mat2)
    bias = input.expand(mat2.shape[1]) if input.numel() == 1 and mat2.shape[1] != 1 else input
    return linear_in_out(mat1, mat2, bias.contiguous())


def _same_dtype(fn, *tensors):
    """PyTorch's products refuse mixed dtypes outside autocast (their own error, under
    functional_calls(): nbdnn declines, PyTorch's call raises it)."""
    if not any_autocast() and len({t.dtype for t in tensors}) > 1:
        raise DtypeError(f"nbdnn.torch.{fn}: operands of one dtype (as PyTorch's); got "
                         f"{[str(t.dtype) for t in tensors]}")


def local_response_norm(input, size, alpha=1e-4, beta=0.75, k=1.0):
    (input,) = _autocast("local_response_norm", input)
    _check("local_response_norm", input)
    if input.dim() < 3:
        raise ShapeError(f"nbdnn.torch.local_response_norm: input.dim() must be >= 3; "
                         f"got {input.dim()}")
    return call(lrn, input, size, alpha, beta, k)


def _conv_args(fn, nd, input, weight, bias):
    """(input, weight, bias) as autocast has a convolution see them, checked: dtypes,
    weight nd + 2 dimensions, input nd + 2 (batched) or nd + 1 (one sample, as PyTorch
    takes it), channels first."""
    input, weight, bias = _ready(fn, "conv", input, weight, bias)
    if weight.dim() != nd + 2 or input.dim() not in (nd + 1, nd + 2):
        raise ShapeError(f"nbdnn.torch.{fn}: input must be {nd + 2}-d (batched) or "
                         f"{nd + 1}-d (one sample) and weight {nd + 2}-d, channels first; "
                         f"got {input.dim()}-d and {weight.dim()}-d")
    return input, weight, bias


def _conv(fn, nd, input, weight, bias, stride, padding, dilation, groups):
    input, weight, bias = _conv_args(fn, nd, input, weight, bias)
    if compiling():  # (traced: dynamo would guard on the cache's keys, and the key this
        # very call adds fails that guard at once; PyTorch 2.13)
        geometry = _conv_geometry(fn, nd, weight, stride, padding, dilation)
    else:
        try:
            key = (nd, stride, padding, dilation, stride.__class__, padding.__class__,
                   dilation.__class__)
            geometry = _CONV_GEOMETRY.get(key)
        except TypeError:  # (lists: unhashable)
            key = geometry = None
        if geometry is None:
            geometry = _conv_geometry(fn, nd, weight, stride, padding, dilation)
            if key is not None and padding != "same" and len(_CONV_GEOMETRY) < 1024:
                _CONV_GEOMETRY[key] = geometry
    if input.dim() == nd + 1:  # (one sample: _one_sample, inline)
        return call(conv, input.unsqueeze(0), weight, bias, *geometry, groups).squeeze(0)
    return call(conv, input, weight, bias, *geometry, groups)


_CONV_GEOMETRY = {}  # (nd, stride, padding, dilation as given, their classes) ->
# _conv_geometry's (read only: shared between calls; ~0.7 us a call less on the CI
# host). Equal values of one class give equal ints, so the cache changes no
# answer (the classes keep a float stride, which _conv_geometry refuses, from an int's
# entry); "same" depends on the weight and is not cached; eager calls only


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _conv("conv1d", 1, input, weight, bias, stride, padding, dilation, groups)


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _conv("conv2d", 2, input, weight, bias, stride, padding, dilation, groups)


def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _conv("conv3d", 3, input, weight, bias, stride, padding, dilation, groups)


def _conv_transpose(fn, nd, input, weight, bias, stride, padding, output_padding, groups,
                    dilation):
    input, weight, bias = _conv_args(fn, nd, input, weight, bias)
    stride = _tuple(fn, "stride", stride, nd, low=1)
    dilation = _tuple(fn, "dilation", dilation, nd, low=1)
    output_padding = _tuple(fn, "output_padding", output_padding, nd)
    if any(op >= max(s, d) for op, s, d in zip(output_padding, stride, dilation)):
        raise BadParamError(f"nbdnn.torch.{fn}: output_padding {output_padding} must be "
                            f"smaller than stride {stride} or dilation {dilation}")
    pads = [p for v in _tuple(fn, "padding", padding, nd) for p in (v, v)]
    size = _conv_transpose_shape(input if input.dim() == nd + 2 else input.unsqueeze(0), weight,
                                 stride, pads, dilation, output_padding, groups)[2:]
    if min(size) < 1:
        raise ShapeError(f"nbdnn.torch.{fn}: the output size {tuple(size)} must be positive "
                         f"(input {tuple(input.shape[-nd:])}, padding {padding})")
    y = _one_sample(nd, _conv_transpose_op, input, weight, bias, stride, pads, dilation,
                    output_padding, groups)
    if nd == 2 and input.dim() == 4 and not functorch() and not input.is_contiguous() \
            and input.is_contiguous(memory_format=torch.channels_last):
        y = y.contiguous(memory_format=torch.channels_last)  # (PyTorch keeps the format)
    return y


def conv_transpose1d(input, weight, bias=None, stride=1, padding=0, output_padding=0,
                     groups=1, dilation=1):
    return _conv_transpose("conv_transpose1d", 1, input, weight, bias, stride, padding,
                           output_padding, groups, dilation)


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0,
                     groups=1, dilation=1):
    """The transpose (adjoint) of conv2d: nbdnn's conv_backward_data, its gradients conv2d
    and conv_backward_filter; weight (C_in, C_out / groups, kH, kW) as PyTorch's."""
    return _conv_transpose("conv_transpose2d", 2, input, weight, bias, stride, padding,
                           output_padding, groups, dilation)


def conv_transpose3d(input, weight, bias=None, stride=1, padding=0, output_padding=0,
                     groups=1, dilation=1):
    return _conv_transpose("conv_transpose3d", 3, input, weight, bias, stride, padding,
                           output_padding, groups, dilation)


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-5):
    input, weight, bias = _ready("batch_norm", "batch_norm", input, weight, bias)
    empty = _batch_norm_checks("batch_norm", input, running_mean, running_var, weight, bias,
                               training, momentum)
    if empty is not None:
        return empty
    outs = call(_batch_norm, input, weight, bias, running_mean, running_var, bool(training),
                float(momentum), _eps("batch_norm", eps))
    return _advanced(outs, running_mean, running_var, training)


def batch_norm_act(input, running_mean, running_var, weight=None, bias=None, training=False,
                   momentum=0.1, eps=1e-5, residual=None, activation="relu", coef=None):
    """activation(batch_norm(input, ...) + residual) in one pass (cuDNN's fused batch
    norm; no torch.nn.functional counterpart): batch_norm's arguments, residual (input's
    shape and dtype, or None) and one of nbdnn.activation's modes with its coef (None:
    the mode's default). Its backward is one pass too (in training; an inference-mode
    call that is differentiated runs the three ops apart)."""
    input, weight, bias = _ready("batch_norm_act", "batch_norm", input, weight, bias)
    if residual is not None and residual.shape != input.shape:
        raise ShapeError(f"nbdnn.torch.batch_norm_act: residual must have input's shape "
                         f"{tuple(input.shape)}; got {tuple(residual.shape)}")
    if residual is not None and residual.dtype != input.dtype:
        raise DtypeError(f"nbdnn.torch.batch_norm_act: residual must have input's dtype "
                         f"{input.dtype}; got {residual.dtype}")
    coef = float(fused_coef("batch_norm_act", activation, coef))
    grads = torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                            for t in (input, weight, bias, residual))
    if (not training and grads) or input.numel() == 0:  # (no fused backward there)
        y = batch_norm(input, running_mean, running_var, weight, bias, training, momentum,
                       eps)
        return _act("batch_norm_act", y if residual is None else y + residual, activation,
                    coef)
    _batch_norm_checks("batch_norm_act", input, running_mean, running_var, weight, bias,
                       training, momentum)
    outs = call(_batch_norm_act, input, weight, bias, running_mean, running_var, residual,
                bool(training), float(momentum), _eps("batch_norm_act", eps), activation,
                coef)
    return _advanced(outs, running_mean, running_var, training)


def _batch_norm_checks(fn, input, running_mean, running_var, weight, bias, training,
                       momentum):
    """PyTorch's refusals of a batch norm call (as F's); the result of an empty input
    (PyTorch: scaled and shifted by channel 0, which keeps the graph; the running
    statistics stay), else None."""
    if momentum is None:  # (F refuses it; the modules' None, a cumulative average, comes
        # here as the factor 1 / batches seen: modules.py)
        raise BadParamError(f"nbdnn.torch.{fn}: momentum must be a number; got None")
    if training and not 0.0 <= momentum <= 1.0:
        _unsupported(fn, f"momentum {momentum} (nbdnn's running averages take "
                     "momentum in [0, 1])")
    if not training and (running_mean is None or running_var is None):
        raise BadParamError(f"nbdnn.torch.{fn}: running_mean and running_var are "
                            "needed when not training")
    if input.numel() == 0:
        y = input.clone()
        y = y if weight is None else y * weight[0]
        return y if bias is None else y + bias[0]
    if input.dim() < 2:
        raise ShapeError(f"nbdnn.torch.{fn}: input must be at least 2-d (N, C, ...); "
                         f"got {tuple(input.shape)}")
    if training and input.numel() // input.shape[1] == 1:
        raise BadParamError(f"nbdnn.torch.{fn}: expected more than 1 value per channel "
                            f"when training, got input size {tuple(input.shape)}")
    return None


def _advanced(outs, running_mean, running_var, training):
    """A batch norm op's y, its running statistics advanced into the buffers (in place,
    as in PyTorch)."""
    y, _, _, new_mean, new_var = outs
    if training:
        with torch.no_grad():
            for buf, new in ((running_mean, new_mean), (running_var, new_var)):
                if buf is not None and not (plain_eager(new) and
                                            new.data_ptr() == buf.data_ptr()):  # (an eager
                    # call advanced the buffer itself: _ops_norm._batch_norm_eager)
                    _advance(buf, new)
    return y


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    input, weight, bias = _ready("layer_norm", "layer_norm", input, weight, bias)
    ndim = _normalized("layer_norm", input, normalized_shape)
    return call(_layer_norm, input, weight, bias, ndim, _eps("layer_norm", eps))[0]


def rms_norm(input, normalized_shape, weight=None, eps=None):
    input, weight, _ = _ready("rms_norm", "rms_norm", input, weight)
    ndim = _normalized("rms_norm", input, normalized_shape)
    eps = torch.finfo(input.dtype).eps if eps is None else eps  # (PyTorch's default)
    return call(_rms_norm, input, weight, ndim, _eps("rms_norm", eps))[0]


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    """A channels-last input gives a channels-last result on every device (PyTorch's CUDA
    kernel copies it to contiguous first; its CPU kernel keeps it): the values are
    F.group_norm's, the copy is saved."""
    input, weight, bias = _ready("group_norm", "group_norm", input, weight, bias)
    if input.dim() < 2:
        raise ShapeError(f"nbdnn.torch.group_norm: input must be at least 2-d (N, C, ...); "
                         f"got {tuple(input.shape)}")
    if not isinstance(num_groups, int) or num_groups < 1:
        raise BadParamError(f"nbdnn.torch.group_norm: num_groups must be an int >= 1; got "
                            f"{num_groups!r}")
    if input.shape[1] == 0 or 0 in input.shape[2:]:  # (as PyTorch refuses them)
        raise ShapeError(f"nbdnn.torch.group_norm: input must have channels and positions "
                         f"(N, C > 0, *spatial of size > 0); got {tuple(input.shape)}")
    if input.shape[1] % num_groups:
        raise ShapeError(f"nbdnn.torch.group_norm: {input.shape[1]} channels do not split "
                         f"into {num_groups} groups")
    if input.numel() == 0:  # (an empty batch: PyTorch returns it empty)
        return input.clone()
    return call(_group_norm, input, num_groups, weight, bias, _eps("group_norm", eps))[0]


def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None,
                  use_input_stats=True, momentum=0.1, eps=1e-5):
    """Each (sample, channel)'s own statistics: group norm with a group a channel. With
    use_input_stats False, the running statistics (batch norm's inference). Running
    statistics given with use_input_stats advance as PyTorch's do: by momentum towards
    the batch's average of the instances' means and unbiased variances (the variances
    from group norm's invstd: 1 / invstd^2 - eps, in the compute dtype)."""
    input, weight, bias = _ready("instance_norm", "instance_norm", input, weight, bias)
    if (running_mean is None) != (running_var is None):
        raise BadParamError("nbdnn.torch.instance_norm: running_mean and running_var must "
                            "both be None or neither")
    if not use_input_stats:
        return batch_norm(input, running_mean, running_var, weight, bias, False, momentum, eps)
    e = _eps("instance_norm", eps)
    y, mean, invstd = call(_group_norm, input, input.shape[1], weight, bias, e)
    if running_mean is not None:
        n = input[0, 0].numel()  # (the elements of one instance)
        if not 0.0 <= momentum <= 1.0:
            _unsupported("instance_norm", f"momentum {momentum} (nbdnn's running averages "
                         "take momentum in [0, 1])")
        with torch.no_grad():
            var = (invstd.double() ** -2 - e) * (n / max(n - 1, 1))  # (N, C), unbiased
            for buf, batch in ((running_mean, mean.double()), (running_var, var)):
                _advance(buf, (buf * (1.0 - momentum) + batch.mean(0) * momentum).to(buf.dtype))
    return y


def dropout(input, p=0.5, training=True, inplace=False):
    """Elements zeroed with probability p, the rest scaled by 1 / (1 - p); the mask from
    nbdnn's Philox stream, keyed by torch's generators (CUDA tensors: an offset drawn on
    the device, so each replay of a captured CUDA graph drops fresh elements)."""
    if not 0.0 <= p <= 1.0:
        raise BadParamError(f"nbdnn.torch.dropout: p must be in [0, 1]; got {p}")
    if not training or p == 0.0:
        return input
    if p == 1.0:
        _unsupported("dropout", "p 1 (nbdnn's dropout keeps p < 1)")
    _check("dropout", input)
    seed = draw_seed(input)
    if inplace:
        return _in_place(input, lambda t: call(_dropout, t, float(p), seed)[0])
    return call(_dropout, input, float(p), seed)[0]


def _causal_bias(attn_mask, is_causal, query, key):
    """(attn_mask, the attention op's causal code) for PyTorch's CausalBias masks
    (torch.nn.attention.bias.causal_upper_left / causal_lower_right: a tensor subclass
    whose elements are not the mask): upper-left is is_causal (code 1), lower-right (row
    i attends keys j <= i + Sk - Sq) the bottom-right alignment (code 2). Any other mask
    as given, with is_causal's code."""
    try:
        from torch.nn.attention.bias import CausalBias, CausalVariant
    except ImportError:  # (a PyTorch without them)
        return attn_mask, int(bool(is_causal))
    if not isinstance(attn_mask, CausalBias):
        return attn_mask, int(bool(is_causal))
    op = "nbdnn.torch.scaled_dot_product_attention"
    if is_causal:
        raise BadParamError(f"{op}: a CausalBias attn_mask with is_causal=True (as PyTorch, "
                            "one or the other)")
    Sq, Sk = int(query.shape[-2]), int(key.shape[-2])
    if (attn_mask.seq_len_q, attn_mask.seq_len_kv) != (Sq, Sk):
        raise ShapeError(f"{op}: the CausalBias is for {attn_mask.seq_len_q} queries and "
                         f"{attn_mask.seq_len_kv} keys; query and key have {Sq} and {Sk}")
    if attn_mask.variant == CausalVariant.UPPER_LEFT or Sq == Sk:
        return None, 1
    if attn_mask.variant != CausalVariant.LOWER_RIGHT:
        raise BadParamError(f"{op}: CausalBias variant {attn_mask.variant!r} unknown")
    return None, 2


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """PyTorch's SDPA on nbdnn's attention (flash kernels on the tensor cores for 16-bit
    q, k, v at head dims 64 and 128). q (N, H, L, E) or (N, L, E); a fully masked query
    row gives 0 (PyTorch's math backend: NaN); a float attn_mask that requires grad gets
    its gradient from PyTorch's math form (nbdnn/torch/_ops_random.py); PyTorch's
    CausalBias masks (causal_upper_left / causal_lower_right) as `_causal_bias` says."""
    query, key, value = _autocast("scaled_dot_product_attention", query, key, value)
    attn_mask, causal = _causal_bias(attn_mask, is_causal, query, key)
    if attn_mask is not None and attn_mask.is_floating_point():
        attn_mask = attn_mask.to(query.dtype)
    _check("scaled_dot_product_attention", query, key, value)
    if attn_mask is not None and causal:  # (PyTorch refuses the pair; nbdnn would
        # apply both)
        raise BadParamError("nbdnn.torch.scaled_dot_product_attention: attn_mask and "
                         "is_causal together (as PyTorch, one or the other)")
    if not enable_gqa and not query.shape[:-2] == key.shape[:-2] == value.shape[:-2]:
        # (PyTorch broadcasts the batch axes: a 3-d q against 4-d k, v)
        try:
            batch = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
        except RuntimeError:
            raise ShapeError(f"nbdnn.torch.scaled_dot_product_attention: the batch axes of "
                             f"query {tuple(query.shape)}, key {tuple(key.shape)} and value "
                             f"{tuple(value.shape)} do not broadcast") from None
        if len(batch) in (1, 2):
            query, key, value = (t.expand(*batch, *t.shape[-2:]) for t in (query, key, value))
    if enable_gqa and not query.dim() == key.dim() == value.dim():
        _unsupported("scaled_dot_product_attention", "enable_gqa with query, key and value of "
                     f"different ranks ({query.dim()}, {key.dim()}, {value.dim()}: PyTorch "
                     "broadcasts their batch axes into the heads)")
    three = query.dim() == 3
    q, k, v = (t.unsqueeze(1) if three else t for t in (query, key, value))
    if attn_mask is not None and three and attn_mask.dim() == 3:
        attn_mask = attn_mask.unsqueeze(1)
    seed = draw_seed() if dropout_p > 0 else torch.zeros((), dtype=torch.int64)
    o = call(_attention, q, k, v, attn_mask, float(dropout_p), causal,
             None if scale is None else float(scale), bool(enable_gqa), seed)[0]
    return o.squeeze(1) if three else o


def paged_attention(q, k_cache, v_cache, block_table, cache_seqlens, scale=None,
                    causal=False, window_size=(-1, -1), softcap=0.0):
    """Decoding against a paged KV cache (nbdnn.paged_attention), in FlashAttention's
    flash_attn_with_kvcache conventions: q (B, Sq, Hq, D); k_cache (pages, P, Hk, D) and
    v_cache (pages, P, Hk, Dv); block_table (B, W) int32 page numbers; cache_seqlens (B,)
    int32 lengths; causal aligns the Sq rows bottom-right (the sequence's last);
    window_size (left, right): a sliding window about that diagonal, -1 an open side;
    softcap > 0: scores capped as softcap tanh(s / softcap) (0: none). Returns
    o (B, Sq, Hq, Dv). The table and the lengths are read on the device only: a call
    inside a torch.cuda.graph capture replays with whatever they hold at replay.
    Gradients (decoding rarely asks) come from PyTorch's formula of it over the gathered
    pages (nbdnn/torch/_ops_random.py: paged_attention_math)."""
    q, k_cache, v_cache = _autocast("scaled_dot_product_attention", q, k_cache, v_cache)
    _check("paged_attention", q, k_cache, v_cache)
    if not (isinstance(window_size, (tuple, list)) and len(window_size) == 2 and all(
            isinstance(w, int) and not isinstance(w, bool) and w >= -1 for w in window_size)):
        raise BadParamError(f"nbdnn.torch.paged_attention: window_size must be (left, "
                            f"right), ints >= -1 (-1: open); got {window_size!r}")
    return call(_paged_attention, q, k_cache, v_cache, block_table, cache_seqlens,
                bool(causal), None if scale is None else float(scale), *window_size,
                float(softcap))[0]


__all__ = [n for n in dir() if not n.startswith("_") and n not in (
    "torch", "call", "activation", "conv", "lrn", "DTYPES", "draw_seed", "DtypeError",
    "NotSupportedError", "ShapeError", "BadParamError", "fused_coef",
    "activation_in_place", "plain_eager")]

"""torch.ops.nbdnn's convolution and pooling, channels first (NCW, NCHW, NCDHW), with
their backwards. Padding travels as per-side pairs flattened, (pre_0, post_0, pre_1, ...),
so PyTorch's padding="same" (more after than before for an odd total) is exact. The
convolution's backward keeps x and w (dx from dy and w, dw from dy and x, db from dy);
max pooling's keeps x (nbdnn finds each window's maximum again, PyTorch's first-maximum
rule; pool_indices names it, for return_indices), average pooling's keeps x too (only its shape is read)."""
from typing import Optional

import torch
from torch.library import custom_op

import nbdnn
from .._shapes import pool_out_size
from ._bridge import call, channels_last, direct, nchw, new, nhwc, register_autograd, \
    run, stream_of, CONV_TF32, FLOAT32

CONVS = {1: nbdnn.conv1d, 2: nbdnn.conv2d, 3: nbdnn.conv3d}
POOLS = {1: nbdnn.pool1d, 2: nbdnn.pool2d, 3: nbdnn.pool3d}


def pairs(padding):
    return tuple(zip(padding[0::2], padding[1::2]))


def conv_shape(x_shape, w_shape, stride, padding, dilation):
    """y's shape: (N, K, P...), P = (S + pre + post - d (R - 1) - 1) // s + 1."""
    P = [(S + a + b - d * (R - 1) - 1) // s + 1 for S, R, s, (a, b), d in
         zip(x_shape[2:], w_shape[2:], stride, pairs(padding), dilation)]
    return (x_shape[0], w_shape[0], *P)


_GEOMETRIES = {}  # (*stride, *padding, *dilation, groups) -> _geometry's keywords
# (the lengths, 2 nd + 2 nd + 1, tell the ranks apart; ~0.3 us a call against ~0.8)
_SEEN = {}  # id(padding) -> (padding, stride, dilation, groups, keywords) for tuples: a
# tuple of ints never changes and, held here, keeps its id, so the same three objects
# (nbdnn.torch.functional's cached geometry, every call of a layer) give the same
# keywords (~0.1 us against 0.27, CI host)


def _geometry(stride, padding, dilation, groups):
    """nbdnn's convolution keywords (read only: shared between calls), those at nbdnn's
    defaults left out, one int where every axis has the same value, symmetric padding
    per axis: every keyword, and every nested tuple most of all, is walked by the
    eager call plan's signature on each call (a 3x3 convolution's full set cost 1.3 us
    more than padding alone on the CI host)."""
    seen = _SEEN.get(id(padding))
    if seen is not None and seen[0] is padding and seen[1] is stride and \
            seen[2] is dilation and seen[3] == groups:
        return seen[4]
    key = (*stride, *padding, *dilation, groups)
    geo = _GEOMETRIES.get(key)
    if geo is None:
        geo, pads = {}, pairs(padding)
        if any(s != 1 for s in stride):
            geo["stride"] = _one(stride)
        if any(a != b for a, b in pads):
            geo["padding"] = pads
        elif any(a for a, _ in pads):
            geo["padding"] = _one([a for a, _ in pads])
        if any(d != 1 for d in dilation):
            geo["dilation"] = _one(dilation)
        if groups != 1:
            geo["groups"] = groups
        if len(_GEOMETRIES) < 1024:
            _GEOMETRIES[key] = geo
    if padding.__class__ is tuple and stride.__class__ is tuple and \
            dilation.__class__ is tuple:
        if len(_SEEN) >= 1024:  # (tuples made anew each call: padding="same", which
            _SEEN.clear()       # the functions do not cache, or the op called directly)
        _SEEN[id(padding)] = padding, stride, dilation, groups, geo
    return geo


def _one(values):
    """values as nbdnn takes them: one int when all are equal, else a tuple."""
    return values[0] if len(set(values)) == 1 else tuple(values)


@custom_op("nbdnn::conv", mutates_args=())
def conv(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor], stride: list[int],
         padding: list[int], dilation: list[int], groups: int) -> torch.Tensor:
    """Cross-correlation (PyTorch's convolution), 1-3 spatial axes by w's rank; a
    channels-last x runs as NHWC (w (K, R, S, C)) and y comes back channels-last."""
    geo = _geometry(stride, padding, dilation, groups)
    if channels_last(x):
        return nchw(run(nbdnn.conv2d, x, nhwc(x), nhwc(w), b, layout="NHWC", **geo))
    return run(CONVS[w.dim() - 2], x, x, w, b, **geo)


@custom_op("nbdnn::conv_backward", mutates_args=())
def conv_backward(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, stride: list[int],
                  padding: list[int], dilation: list[int], groups: int,
                  output_mask: list[bool]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dw, db), each empty where output_mask says it is not wanted."""
    geo = _geometry(stride, padding, dilation, groups)
    want_x, want_w, want_b = output_mask
    if channels_last(x):  # (all NHWC; dx and dw back channels-last)
        dyl, xl, wl = nhwc(dy), nhwc(x), nhwc(w)
        dx = nchw(run(nbdnn.conv_backward_data, x, dyl, wl, tuple(xl.shape), layout="NHWC",
                      **geo)) if want_x else x.new_empty(0)
        dw = nchw(run(nbdnn.conv_backward_filter, x, dyl, xl, tuple(wl.shape), layout="NHWC",
                      **geo)) if want_w else w.new_empty(0)
        db = run(nbdnn.conv_backward_bias, x, dyl, layout="NHWC") if want_b else w.new_empty(0)
        return dx, dw, db
    dx = run(nbdnn.conv_backward_data, x, dy, w, tuple(x.shape), **geo) if want_x \
        else x.new_empty(0)
    dw = run(nbdnn.conv_backward_filter, x, dy, x, tuple(w.shape), **geo) if want_w \
        else w.new_empty(0)
    db = run(nbdnn.conv_backward_bias, x, dy) if want_b else w.new_empty(0)
    return dx, dw, db


@direct(conv)
def _(x, w, b, stride, padding, dilation, groups):
    s = stream_of(x)
    if s is None:
        return conv._init_fn(x, w, b, stride, padding, dilation, groups)
    if x.requires_grad:
        x = x.data
    w = w.data if w.requires_grad else w
    if b is not None:
        b = (b.data if b.requires_grad else b).contiguous()
    if x.is_contiguous():
        fn, last, kw = CONVS[w.dim() - 2], False, {**_geometry(stride, padding, dilation, groups)}
        w = w.contiguous()
    elif channels_last(x):
        fn, last = nbdnn.conv2d, True
        kw = {"layout": "NHWC", **_geometry(stride, padding, dilation, groups)}
        x, w = nhwc(x), nhwc(w).contiguous()
    else:
        return conv._init_fn(x, w, b, stride, padding, dilation, groups)
    if s:
        kw["stream"] = s
    if x.dtype is FLOAT32 and CONV_TF32():
        kw["math"] = "tf32"
    y = fn(x, w, b, **kw)
    return nchw(y) if last else y


@conv.register_fake
def _(x, w, b, stride, padding, dilation, groups):
    return new(x, conv_shape(x.shape, w.shape, stride, padding, dilation), channels_last(x))


@conv_backward.register_fake
def _(dy, x, w, stride, padding, dilation, groups, output_mask):
    want_x, want_w, want_b = output_mask
    last = channels_last(x)
    return (new(x, x.shape, last) if want_x else x.new_empty(0),
            new(w, w.shape, last) if want_w else w.new_empty(0),
            w.new_empty(w.shape[0] if want_b else 0))


def _conv_setup(ctx, inputs, output):
    x, w, b = inputs[:3]
    ctx.save_for_backward(x, w)
    ctx.geo, ctx.has_bias = inputs[3:], b is not None


def _conv_grad(ctx, dy):
    x, w = ctx.saved_tensors
    want = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and
            ctx.needs_input_grad[2]]
    grads = call(conv_backward, dy, x, w, *ctx.geo, want)
    return tuple(g if ok else None for g, ok in zip(grads, want)) + (None,) * 4


register_autograd(conv, _conv_grad, _conv_setup)


# transposed convolution: y = conv_backward_data(x, w) for the output shape asked
# (x plays dy, y plays dx); its gradients are the adjoints: dx = conv(dy, w), dw =
# conv_backward_filter(x as dy, dy as x), db = the sum of dy over all axes but C.
# w: (C_in, C_out / groups, R...) as PyTorch lays ConvTranspose's weight
def conv_transpose_shape(x, w, stride, padding, dilation, output_padding, groups):
    P = [(S - 1) * s - a - b + d * (R - 1) + op + 1 for S, R, s, (a, b), d, op in
         zip(x.shape[2:], w.shape[2:], stride, pairs(padding), dilation, output_padding)]
    return (x.shape[0], w.shape[1] * groups, *P)


def grown(t, shape):
    """t zero-padded at the end of its spatial axes to shape's. An output_padding of a
    stride or more (PyTorch allows up to the dilation) leaves output rows that no
    stride reaches: y is then the adjoint of the convolution of y's shape, whose
    Q = S + output_padding // stride outputs exceed x's S, with x zero-padded to Q."""
    pads = [p for T, Q in zip(reversed(t.shape[2:]), reversed(shape[2:])) for p in (0, Q - T)]
    return t if not any(pads) else torch.nn.functional.pad(t, pads)


@custom_op("nbdnn::conv_transpose", mutates_args=())
def conv_transpose(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor],
                   stride: list[int], padding: list[int], dilation: list[int],
                   output_padding: list[int], groups: int) -> torch.Tensor:
    shape = conv_transpose_shape(x, w, stride, padding, dilation, output_padding, groups)
    x = grown(x, conv_shape(shape, w.shape, stride, padding, dilation))
    y = run(nbdnn.conv_backward_data, x, x, w, shape,
            **_geometry(stride, padding, dilation, groups))
    if b is not None:  # (+ b a channel, in place: cudnnAddTensor's broadcast)
        y = run(nbdnn.add_tensor, x, b.reshape(1, -1, *([1] * (y.dim() - 2))), y, out=y)
    return y


@custom_op("nbdnn::conv_transpose_backward", mutates_args=())
def conv_transpose_backward(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
                            stride: list[int], padding: list[int], dilation: list[int],
                            groups: int, output_mask: list[bool]
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    geo = _geometry(stride, padding, dilation, groups)
    want_x, want_w, want_b = output_mask
    Q = conv_shape(dy.shape, w.shape, stride, padding, dilation)  # (x's shape but where
    # grown())
    dx = run(CONVS[w.dim() - 2], x, dy, w, None, **geo) if want_x else x.new_empty(0)
    if want_x and Q != tuple(x.shape):
        dx = dx[(slice(None), slice(None)) + tuple(slice(S) for S in x.shape[2:])].contiguous()
    dw = run(nbdnn.conv_backward_filter, x, grown(x, Q), dy, tuple(w.shape), **geo) \
        if want_w else w.new_empty(0)
    db = run(nbdnn.conv_backward_bias, x, dy) if want_b else w.new_empty(0)
    return dx, dw, db


@conv_transpose.register_fake
def _(x, w, b, stride, padding, dilation, output_padding, groups):
    return x.new_empty(conv_transpose_shape(x, w, stride, padding, dilation, output_padding,
                                            groups))


@conv_transpose_backward.register_fake
def _(dy, x, w, stride, padding, dilation, groups, output_mask):
    want_x, want_w, want_b = output_mask
    return (x.new_empty(x.shape if want_x else (0,)), w.new_empty(w.shape if want_w else (0,)),
            w.new_empty(dy.shape[1] if want_b else 0))


def _conv_transpose_setup(ctx, inputs, output):
    x, w, b = inputs[:3]
    ctx.save_for_backward(x, w)
    ctx.geo, ctx.groups, ctx.has_bias = inputs[3:6], inputs[7], b is not None


def _conv_transpose_grad(ctx, dy):
    x, w = ctx.saved_tensors
    want = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and
            ctx.needs_input_grad[2]]
    grads = call(conv_transpose_backward, dy, x, w, *ctx.geo, ctx.groups, want)
    return tuple(g if ok else None for g, ok in zip(grads, want)) + (None,) * 5


register_autograd(conv_transpose, _conv_transpose_grad, _conv_transpose_setup)


def pool_shape(x, kernel, stride, padding, dilation, ceil_mode):
    return (*x.shape[:2], *(pool_out_size(S, k, s, d, a, b, ceil_mode) for S, k, s, d, (a, b)
                            in zip(x.shape[2:], kernel, stride, dilation, pairs(padding))))


def _pool_kw(stride, padding, dilation, mode, ceil_mode, divisor=0):
    return dict(stride=tuple(stride), padding=pairs(padding), dilation=tuple(dilation),
                mode=mode, ceil_mode=ceil_mode, divisor=divisor or None)


@custom_op("nbdnn::pool", mutates_args=())
def pool(x: torch.Tensor, kernel: list[int], stride: list[int], padding: list[int],
         dilation: list[int], mode: str, ceil_mode: bool, divisor: int = 0) -> torch.Tensor:
    """mode "max", "avg" (padding counted: count_include_pad) or "avg_exclude_pad";
    divisor: the averages' (divisor_override), 0 for each window's count."""
    kw = _pool_kw(stride, padding, dilation, mode, ceil_mode, divisor)
    if channels_last(x):
        return nchw(run(nbdnn.pool2d, x, nhwc(x), tuple(kernel), layout="NHWC", **kw))
    return run(POOLS[len(kernel)], x, x, tuple(kernel), **kw)


@custom_op("nbdnn::pool_backward", mutates_args=())
def pool_backward(dy: torch.Tensor, x: torch.Tensor, kernel: list[int], stride: list[int],
                  padding: list[int], dilation: list[int], mode: str, ceil_mode: bool,
                  divisor: int = 0) -> torch.Tensor:
    kw = _pool_kw(stride, padding, dilation, mode, ceil_mode, divisor)
    if channels_last(x):
        return nchw(run(nbdnn.pool_backward, x, nhwc(dy), nhwc(x), tuple(kernel),
                        layout="NHWC", **kw))
    return run(nbdnn.pool_backward, x, dy, x, tuple(kernel), **kw)


@pool.register_fake
def _(x, kernel, stride, padding, dilation, mode, ceil_mode, divisor=0):
    return new(x, pool_shape(x, kernel, stride, padding, dilation, ceil_mode), channels_last(x))


@pool_backward.register_fake
def _(dy, x, kernel, stride, padding, dilation, mode, ceil_mode, divisor=0):
    return new(x, x.shape, channels_last(x))


def _pool_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.params = inputs[1:]


def _pool_grad(ctx, dy):
    (x,) = ctx.saved_tensors
    return (call(pool_backward, dy, x, *ctx.params),) + (None,) * len(ctx.params)


register_autograd(pool, _pool_grad, _pool_setup)


@custom_op("nbdnn::pool_indices", mutates_args=())
def pool_indices(x: torch.Tensor, kernel: list[int], stride: list[int], padding: list[int],
                 dilation: list[int], ceil_mode: bool) -> torch.Tensor:
    """int64: each max window's first maximal element, its flat index in its (n, c)
    plane (max_pool's return_indices; not differentiable)."""
    kw = _pool_kw(stride, padding, dilation, "max", ceil_mode)
    del kw["mode"], kw["divisor"]
    if channels_last(x):
        return nchw(run(nbdnn.pool_indices, x, nhwc(x), tuple(kernel), layout="NHWC", **kw))
    return run(nbdnn.pool_indices, x, x, tuple(kernel), **kw)


@pool_indices.register_fake
def _(x, kernel, stride, padding, dilation, ceil_mode):
    return new(x, pool_shape(x, kernel, stride, padding, dilation, ceil_mode), channels_last(x),
               torch.int64)


register_autograd(pool_indices, lambda ctx, di: (None,) * 6,  # (integers: no gradient)
                  lambda ctx, inputs, output: None)

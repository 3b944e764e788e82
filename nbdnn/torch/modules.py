"""nbdnn-backed torch.nn modules: each a subclass of the torch module it replaces whose
forward calls nbdnn.torch's functions. nbdnn.torch.convert swaps a module's class for
its subclass, so parameters, buffers, hooks and state_dict keys stay the module's own
(state_dict moves both ways unchanged), and `type(m).__name__` still reads "Conv2d".

`native_reason(m)` says why a module of a supported type stays native (a configuration
nbdnn cannot compute with PyTorch's meaning), or None."""
import torch
from torch import nn

from . import functional as nf
from ._bridge import DTYPES


def _params_ok(m):
    for name, t in list(m.named_parameters(recurse=False)) + list(m.named_buffers(recurse=False)):
        if t is not None and (t.is_floating_point() or t.is_complex()) and t.dtype not in DTYPES:
            return f"{name} is {t.dtype}"
    return None


class _Conv:
    def _conv_forward(self, input, weight, bias):
        fn = (nf.conv1d, nf.conv2d, nf.conv3d)[weight.dim() - 3]
        return fn(input, weight, bias, self.stride, self.padding, self.dilation, self.groups)


class Conv1d(_Conv, nn.Conv1d):
    pass


class Conv2d(_Conv, nn.Conv2d):
    pass


class Conv3d(_Conv, nn.Conv3d):
    pass


class _ConvTranspose:
    def forward(self, input, output_size=None):
        nd = self.weight.dim() - 2
        output_padding = self._output_padding(input, output_size, self.stride, self.padding,
                                              self.kernel_size, nd, self.dilation)
        fn = (nf.conv_transpose1d, nf.conv_transpose2d, nf.conv_transpose3d)[nd - 1]
        return fn(input, self.weight, self.bias, self.stride, self.padding, output_padding,
                  self.groups, self.dilation)


class ConvTranspose1d(_ConvTranspose, nn.ConvTranspose1d):
    pass


class ConvTranspose2d(_ConvTranspose, nn.ConvTranspose2d):
    pass


class ConvTranspose3d(_ConvTranspose, nn.ConvTranspose3d):
    pass


class Linear(nn.Linear):
    def forward(self, input):
        return nf.linear(input, self.weight, self.bias)


def batch_norm(m, input, residual=None, activation=None, coef=None):
    """A batch norm module m's forward on nbdnn: torch's _BatchNorm.forward, its
    statistics logic (the running statistics' factor, which statistics normalise);
    with an activation, act(m(input) + residual) in one pass (nf.batch_norm_act)."""
    m._check_input_dim(input)
    factor = 0.0 if m.momentum is None else m.momentum
    if m.training and m.track_running_stats and m.num_batches_tracked is not None:
        m.num_batches_tracked.add_(1)
        factor = 1.0 / float(m.num_batches_tracked) if m.momentum is None else m.momentum
    use_batch = m.training or (m.running_mean is None and m.running_var is None)
    keep = not m.training or m.track_running_stats
    stats = (m.running_mean if keep else None, m.running_var if keep else None)
    if activation is None:
        return nf.batch_norm(input, *stats, m.weight, m.bias, use_batch, factor, m.eps)
    return nf.batch_norm_act(input, *stats, m.weight, m.bias, use_batch, factor, m.eps,
                             residual=residual, activation=activation, coef=coef)


class _BatchNorm:
    def forward(self, input):
        return batch_norm(self, input)


class BatchNorm1d(_BatchNorm, nn.BatchNorm1d):
    pass


class BatchNorm2d(_BatchNorm, nn.BatchNorm2d):
    pass


class BatchNorm3d(_BatchNorm, nn.BatchNorm3d):
    pass


class LayerNorm(nn.LayerNorm):
    def forward(self, input):
        return nf.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)


class RMSNorm(nn.RMSNorm):
    def forward(self, x):
        return nf.rms_norm(x, self.normalized_shape, self.weight, self.eps)


class GroupNorm(nn.GroupNorm):
    def forward(self, input):
        return nf.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)


class _InstanceNorm:
    def forward(self, input):
        if input.dim() == self._get_no_batch_dim():  # (unbatched: as torch, a batch of 1)
            return self.forward(input.unsqueeze(0)).squeeze(0)
        use_input_stats = self.training or not self.track_running_stats
        return nf.instance_norm(input, self.running_mean, self.running_var, self.weight,
                                self.bias, use_input_stats, self.momentum, self.eps)


class InstanceNorm1d(_InstanceNorm, nn.InstanceNorm1d):
    pass


class InstanceNorm2d(_InstanceNorm, nn.InstanceNorm2d):
    pass


class InstanceNorm3d(_InstanceNorm, nn.InstanceNorm3d):
    pass


class LocalResponseNorm(nn.LocalResponseNorm):
    def forward(self, input):
        return nf.local_response_norm(input, self.size, self.alpha, self.beta, self.k)


def _act(base, fn, *attrs):
    """A subclass of activation module `base` whose forward is fn(input, *its attrs)."""
    def forward(self, input):
        return fn(input, *(getattr(self, a) for a in attrs))
    return type(base.__name__, (base,), {"forward": forward, "__module__": __name__})


ReLU = _act(nn.ReLU, nf.relu, "inplace")
LeakyReLU = _act(nn.LeakyReLU, nf.leaky_relu, "negative_slope", "inplace")
ELU = _act(nn.ELU, nf.elu, "alpha", "inplace")
GELU = _act(nn.GELU, nf.gelu, "approximate")
SiLU = _act(nn.SiLU, nf.silu, "inplace")
Sigmoid = _act(nn.Sigmoid, nf.sigmoid)
Tanh = _act(nn.Tanh, nf.tanh)
Softplus = _act(nn.Softplus, nf.softplus, "beta", "threshold")
Hardtanh = _act(nn.Hardtanh, nf.hardtanh, "min_val", "max_val", "inplace")
ReLU6 = _act(nn.ReLU6, nf.relu6, "inplace")
Hardswish = _act(nn.Hardswish, nf.hardswish, "inplace")
Hardsigmoid = _act(nn.Hardsigmoid, nf.hardsigmoid, "inplace")
Softmax = _act(nn.Softmax, nf.softmax, "dim")
LogSoftmax = _act(nn.LogSoftmax, nf.log_softmax, "dim")


class _MaxPool:
    def forward(self, input):  # (the class's rank, not the input's: one sample has no
        # batch axis)
        return self.pool(input, self.kernel_size, self.stride, self.padding, self.dilation,
                         self.ceil_mode, self.return_indices)


class MaxPool1d(_MaxPool, nn.MaxPool1d):
    pool = staticmethod(nf.max_pool1d)


class MaxPool2d(_MaxPool, nn.MaxPool2d):
    pool = staticmethod(nf.max_pool2d)


class MaxPool3d(_MaxPool, nn.MaxPool3d):
    pool = staticmethod(nf.max_pool3d)


class AvgPool1d(nn.AvgPool1d):
    def forward(self, input):
        return nf.avg_pool1d(input, self.kernel_size, self.stride, self.padding,
                             self.ceil_mode, self.count_include_pad)


class AvgPool2d(nn.AvgPool2d):
    def forward(self, input):
        return nf.avg_pool2d(input, self.kernel_size, self.stride, self.padding,
                             self.ceil_mode, self.count_include_pad, self.divisor_override)


class AvgPool3d(nn.AvgPool3d):
    def forward(self, input):
        return nf.avg_pool3d(input, self.kernel_size, self.stride, self.padding,
                             self.ceil_mode, self.count_include_pad, self.divisor_override)


class AdaptiveAvgPool2d(nn.AdaptiveAvgPool2d):
    def forward(self, input):
        return nf.adaptive_avg_pool2d(input, self.output_size)


class Dropout(nn.Dropout):
    def forward(self, input):
        return nf.dropout(input, self.p, self.training, self.inplace)


MHA_NATIVE_CALLS = ("calls with need_weights=True (PyTorch's default), unbatched calls and "
                    "the add_zero_attn / bias_k variants run PyTorch's forward")


class MultiheadAttention(nn.MultiheadAttention):
    """Batched calls with need_weights=False (torchvision's ViT, nn.TransformerEncoder's
    fast path) run nbdnn: the in-projection (one linear for self-attention), attention
    (nbdnn.torch.scaled_dot_product_attention; masks as PyTorch's MHA reads them: a True
    in a boolean mask removes the pair), the out-projection. Calls that want the
    attention weights, unbatched calls, and the add_zero_attn / bias_k variants run
    PyTorch's own forward."""

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True,
                attn_mask=None, average_attn_weights=True, is_causal=False):
        if need_weights or query.dim() != 3 or not self._qkv_same_embed_dim or \
                self.bias_k is not None or self.add_zero_attn:
            return super().forward(query, key, value, key_padding_mask, need_weights,
                                   attn_mask, average_attn_weights, is_causal)
        if is_causal and attn_mask is None:
            raise RuntimeError("Need attn_mask if specifying the is_causal hint.")
        same = query is key and key is value
        if not self.batch_first:  # (L, N, E) -> (N, L, E)
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        N, L, E = query.shape
        S, H = key.shape[1], self.num_heads
        w, b = self.in_proj_weight, self.in_proj_bias
        if same:  # one projection of the sequence: (N, L, 3E)
            q, k, v = nf.linear(query, w, b).chunk(3, dim=-1)
        else:
            ws, bs = w.chunk(3), b.chunk(3) if b is not None else (None,) * 3
            q, k, v = (nf.linear(t, wi, bi) for t, wi, bi in zip((query, key, value), ws, bs))
        q, k, v = (t.reshape(N, n, H, E // H).transpose(1, 2) for t, n in ((q, L), (k, S), (v, S)))
        mask = None if is_causal and key_padding_mask is None else \
            _mha_mask(attn_mask, key_padding_mask, N, H, L, S, q.dtype)
        o = nf.scaled_dot_product_attention(q, k, v, mask, self.dropout if self.training else 0.0,
                                            is_causal and mask is None)
        out = nf.linear(o.transpose(1, 2).reshape(N, L, E), self.out_proj.weight,
                        self.out_proj.bias)
        return (out if self.batch_first else out.transpose(0, 1)), None


def _mha_mask(attn_mask, key_padding_mask, N, H, L, S, dtype):
    """MHA's masks (boolean: True removes the pair; float: added) as one SDPA mask
    broadcastable to (N, H, L, S): boolean (True attends) when both are boolean or one
    is absent, else additive."""
    parts = []
    if attn_mask is not None:  # (L, S) or (N H, L, S)
        parts.append(attn_mask.reshape(N, H, L, S) if attn_mask.dim() == 3 else attn_mask)
    if key_padding_mask is not None:  # (N, S)
        parts.append(key_padding_mask.reshape(N, 1, 1, S))
    if not parts:
        return None
    if all(p.dtype == torch.bool for p in parts):
        keep = ~parts[0]
        for p in parts[1:]:
            keep = keep & ~p
        return keep
    add = torch.zeros((), dtype=dtype, device=parts[0].device)
    for p in parts:
        add = add + (torch.zeros((), dtype=dtype, device=p.device).masked_fill(p, float("-inf"))
                     if p.dtype == torch.bool else p.to(dtype))
    return add


def native_reason(m):
    """Why module m (of a type in REPLACEMENTS) stays native, or None."""
    why = _params_ok(m)
    if why:
        return why
    if isinstance(m, nn.modules.conv._ConvNd) and m.padding_mode != "zeros":
        return f"padding_mode {m.padding_mode!r}"
    if isinstance(m, nn.Hardtanh) and not isinstance(m, nn.ReLU6) and m.min_val != 0 and \
            m.min_val != -m.max_val:
        return f"min_val {m.min_val} with max_val {m.max_val} (nbdnn: min_val 0 or -max_val)"
    if isinstance(m, (nn.Softmax, nn.LogSoftmax)) and m.dim is None:
        return "dim None"
    return None


REPLACEMENTS = {next(b for b in sub.__mro__[1:] if b.__module__.startswith("torch.")): sub
                for sub in (Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d,
                            ConvTranspose3d, Linear, BatchNorm1d, BatchNorm2d,
                            BatchNorm3d, LayerNorm, RMSNorm, GroupNorm, InstanceNorm1d,
                            InstanceNorm2d, InstanceNorm3d, LocalResponseNorm, ReLU, LeakyReLU,
                            ELU, GELU, SiLU, Sigmoid, Tanh, Softplus, Hardtanh, ReLU6,
                            Hardswish, Hardsigmoid, Softmax,
                            LogSoftmax, MaxPool1d, MaxPool2d, MaxPool3d, AvgPool1d, AvgPool2d,
                            AvgPool3d, AdaptiveAvgPool2d, Dropout,
                            MultiheadAttention)}  # torch's class -> ours

"""Transformer layers for nbdnn.nn (re-exported there): LayerNorm,
MultiheadAttention (self-attention with a fused QKV projection, causal or not),
TransformerBlock (pre-norm: attention and a GELU MLP, each with its residual),
PositionalEmbedding (learned) and SequenceMean (the mean over the sequence, for a
classifier head). Activations are
(B, S, E) tensors; everything is nbdnn ops, so both backends run it and GraphedSteps
captures it.

MultiheadAttention's projection is one batched GEMM: W_qkv (3E, E) seen as three (E, E)
matrices, x (B S, E) against all three at once gives Y (3, B S, E), whose three
matrices are q, k and v in layout "BSHD" ((B, S, H, E / H) each, contiguous) with no
transpose. The backward writes dq, dk, dv into the three matrices of one (3, B S, E)
buffer, so dW_qkv (3, E, E) = G^T x and dx = sum_i G_i W_i are batched GEMMs too.
"""
import numpy as np

import nbdnn

from .layers import Activation, Layer, Linear


class LayerNorm(Layer):
    """y = (x - mean) / sqrt(var + eps) * scale + bias over the last axis (E); scale
    ones, bias zeros, in dtype."""

    def __init__(self, E, *, eps=1e-5, dtype=np.float32):
        super().__init__()
        self.params.update(scale=np.ones(E, dtype), bias=np.zeros(E, dtype))
        self.eps = eps

    def forward(self, x, train=False):
        self.x = x
        y, self.mean, self.invstd = nbdnn.layer_norm(x, self.params["scale"],
                                                     self.params["bias"], eps=self.eps)
        return y

    def backward(self, dy, need_dx=True):
        dx, self.grads["scale"], self.grads["bias"] = nbdnn.layer_norm_backward(
            dy, self.x, self.mean, self.invstd, self.params["scale"])
        return dx


class MultiheadAttention(Layer):
    """Self-attention over x (B, S, E) with `heads` heads of E / heads: q, k, v = x
    W_qkv^T + b_qkv (one batched GEMM, module docstring), o = softmax(q k^T / sqrt(E /
    heads)) v per head (causal: each position sees itself and those before), y = o
    W_o^T + b_o. W_qkv, W_o ~ N(0, 1 / E), biases zero."""

    def __init__(self, E, heads, *, causal=False, seed=0, dtype=np.float32):
        super().__init__()
        if E % heads:
            raise nbdnn.BadParamError(f"MultiheadAttention: E = {E} must be a multiple of "
                                      f"heads = {heads}")
        rng = np.random.default_rng(seed)
        self.params["w_qkv"] = (rng.standard_normal((3 * E, E)) / np.sqrt(E)).astype(dtype)
        self.params["b_qkv"] = np.zeros(3 * E, dtype)
        self.out = Linear(E, E, seed=seed + 1, dtype=dtype)
        self.out.params["w"] = (rng.standard_normal((E, E)) / np.sqrt(E)).astype(dtype)
        self.E, self.heads, self.causal = E, heads, causal

    def layers(self):
        return [self] + self.out.layers()

    def forward(self, x, train=False):
        B, S, E = (int(n) for n in x.shape)
        self.x2 = x.reshape(B * S, E)
        w3 = self.params["w_qkv"].reshape(3, E, E)
        y = nbdnn.matmul(self.x2, w3, trans_b=True)                      # (3, B S, E)
        self.y = nbdnn.add_tensor(self.params["b_qkv"].reshape(3, 1, E), y, out=y)
        self.qkv = tuple(self.y[i].reshape(B, S, self.heads, E // self.heads)
                         for i in range(3))
        self.o, self.lse = nbdnn.scaled_dot_product_attention(
            *self.qkv, is_causal=self.causal, layout="BSHD")
        return self.out.forward(self.o.reshape(B, S, E), train)

    def backward(self, dy, need_dx=True):
        B, S, E = (int(n) for n in dy.shape)
        do = self.out.backward(dy).reshape(self.o.shape)
        g = nbdnn.scale_tensor(self.y, 0.0)  # (3, B S, E): dq, dk, dv's buffer
        nbdnn.scaled_dot_product_attention_backward(
            do, *self.qkv, self.o, self.lse, is_causal=self.causal, layout="BSHD",
            out=tuple(g[i].reshape(self.qkv[i].shape) for i in range(3)))
        self.grads["w_qkv"] = nbdnn.matmul(g, self.x2, trans_a=True).reshape(3 * E, E)
        self.grads["b_qkv"] = nbdnn.reduce_tensor(g, "add", axes=1,
                                                  keepdims=False).reshape(3 * E)
        if not need_dx:
            return None
        parts = nbdnn.matmul(g, self.params["w_qkv"].reshape(3, E, E))  # (3, B S, E)
        return nbdnn.reduce_tensor(parts, "add", axes=0, keepdims=False).reshape(B, S, E)


class TransformerBlock(Layer):
    """Pre-norm block: h = x + attn(ln1(x)), y = h + fc2(gelu(fc1(ln2(h)))), the MLP
    E -> mlp E -> E."""

    def __init__(self, E, heads, *, mlp=4, causal=False, seed=0, dtype=np.float32):
        super().__init__()
        self.ln1, self.ln2 = LayerNorm(E, dtype=dtype), LayerNorm(E, dtype=dtype)
        self.attn = MultiheadAttention(E, heads, causal=causal, seed=seed, dtype=dtype)
        self.fc1 = Linear(E, mlp * E, seed=seed + 2, dtype=dtype)
        self.fc2 = Linear(mlp * E, E, seed=seed + 3, dtype=dtype)
        self.act = Activation("gelu")

    def layers(self):
        return [self] + [m for part in (self.ln1, self.attn, self.ln2, self.fc1, self.act,
                                        self.fc2) for m in part.layers()]

    def forward(self, x, train=False):
        h = nbdnn.add_tensor(x, self.attn.forward(self.ln1.forward(x, train), train))
        mlp = self.fc2.forward(self.act.forward(self.fc1.forward(
            self.ln2.forward(h, train), train), train), train)
        return nbdnn.add_tensor(h, mlp)

    def backward(self, dy, need_dx=True):
        dh = nbdnn.add_tensor(dy, self.ln2.backward(self.fc1.backward(
            self.act.backward(self.fc2.backward(dy)))))
        dx = self.ln1.backward(self.attn.backward(dh))
        return nbdnn.add_tensor(dh, dx) if need_dx else None


class PositionalEmbedding(Layer):
    """y = x + pos: a learned (S, E) embedding of each position, added to every batch
    entry of x (B, S, E); pos ~ N(0, 0.02^2)."""

    def __init__(self, S, E, *, seed=0, dtype=np.float32):
        super().__init__()
        self.params["pos"] = (np.random.default_rng(seed).standard_normal((S, E)) *
                              0.02).astype(dtype)

    def forward(self, x, train=False):
        return nbdnn.add_tensor(self.params["pos"], x)

    def backward(self, dy, need_dx=True):
        self.grads["pos"] = nbdnn.reduce_tensor(dy, "add", axes=0, keepdims=False)
        return dy


class SequenceMean(Layer):
    """(B, S, E) -> (B, E): the mean over the sequence (a classifier's pooling)."""

    def forward(self, x, train=False):
        self.x = x
        return nbdnn.reduce_tensor(x, "avg", axes=1, keepdims=False)

    def backward(self, dy, need_dx=True):
        """dy / S on every position (beta 0: x lends only its shape, it is not read)."""
        B, S, E = (int(n) for n in self.x.shape)
        return nbdnn.add_tensor(dy.reshape(B, 1, E), self.x, alpha=1.0 / S, beta=0.0)

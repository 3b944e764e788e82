"""Size formulas that the front end (shape inference, workspace limits) and the
backends share: one definition each. The tests check them against independent truth
(PyTorch, enumerated windows), never against themselves."""


def pool_out_size(S, k, s, d, pre, post, ceil_mode):
    """Output length of one pooled axis, PyTorch's pooling_output_shape: floor(span / s) +
    1, span = S + pre + post - d (k - 1) - 1; ceil_mode rounds up (floor((span + s - 1) /
    s) + 1), less one when the last window would start past the input and its
    pre-padding, so every window starts inside. None when that leaves no output: the
    dilated window outgrows the padded input (in ceil mode, by s or more)."""
    span = S + pre + post - d * (k - 1) - 1
    if not ceil_mode:
        P = span // s + 1
    else:
        P = (span + s - 1) // s + 1
        P = P - 1 if (P - 1) * s >= S + pre else P
    return P if P >= 1 else None


def winograd_workspace(N, C, K, groups, P, m):
    """Elements of winograd's scratch memory for outputs P = (P, Q), m outputs a tile
    side: (m+2)^2 * (K*C/g transformed filters + C*T input tiles + K*T products), T =
    N * ceil(P/m) * ceil(Q/m) tiles."""
    tiles = N * -(-P[0] // m) * -(-P[1] // m)
    return (m + 2) ** 2 * (K * (C // groups) + C * tiles + K * tiles)

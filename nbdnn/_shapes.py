"""Size formulas that the front end (shape inference, workspace limits) and the
backends share: one definition each. The tests check them against independent truth
(PyTorch, enumerated windows), never against themselves."""


def pool_out_size(S, k, s, d, pre, post, ceil_mode):
    """Output length of one pooled axis; None when the dilated window outgrows the
    padded input. ceil_mode rounds up, less one when the last window would start past
    the input and its pre-padding (PyTorch's rule), so every window starts inside."""
    span = S + pre + post - d * (k - 1) - 1
    if span < 0:
        return None
    if not ceil_mode:
        return span // s + 1
    P = -(-span // s) + 1
    return P - 1 if (P - 1) * s >= S + pre else P


def winograd_workspace(N, C, K, groups, P, m):
    """Elements of winograd's scratch memory for outputs P = (P, Q), m outputs a tile
    side: (m+2)^2 * (K*C/g transformed filters + C*T input tiles + K*T products), T =
    N * ceil(P/m) * ceil(Q/m) tiles."""
    tiles = N * -(-P[0] // m) * -(-P[1] // m)
    return (m + 2) ** 2 * (K * (C // groups) + C * tiles + K * tiles)

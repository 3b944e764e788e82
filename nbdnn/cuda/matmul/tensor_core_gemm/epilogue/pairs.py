"""The tensor-core GEMMs' epilogue, written out as source lines (wgmma_gemm.py,
mma_gemm.py): both hold their float32 accumulators as column pairs, a thread owning
C[r, col] and C[r, col + 1] for a few rows r of one column pair (wgmma's and
mma.sync's D fragments: c0, c1 / c2, c3 = rows g and g + 8, columns 2t, 2t + 1).

    c[r, col:col+2] = alpha * act(acc + bias[col:col+2]) + beta * c[r, col:col+2]

16-bit C is addressed as uint32 pairs (`cvt` packs two rounded values; N even, so a
pair never straddles a row); with `odd` (N odd, or C not 4-byte aligned: a GPT-2 LM
head's 50,257 columns) as uint16 elements, the pair's two halves stored apart, the
second guarded; float32 C (tf32) one element a store, the second column guarded (N
may be odd). `partial` (split-K's chunks): the raw float32 sums, no epilogue.
Names the generated kernel must bind: M, N, c, bias, coff (the matrix's first element
of C), a / bt / cf (alpha, beta, coef as float32), F32, widen, act_f, unpack, cvt.

A convolution's order (conv_pair_lines; cuDNN's fused convolution, 16-bit C):

    c[r, col:col+2] = act(alpha * acc + beta * z[r, col:col+2] + bias[col:col+2])

z a second array of C's shape (`zin`: the residual, or C itself for a blend), read
only with z.
"""


def pair_lines(col, rows, f32, bias, act, beta, partial=False, odd=False):
    """Lines storing the pairs of column `col` (an expression) for rows = [(row
    expression, first value, second value)]: bias loaded once for them all; odd: 16-bit
    C as uint16 elements (module docstring)."""
    E = []
    if partial:  # the chunk's float32 sums, to the workspace slice (chunk, matrix)
        for rr, v0, v1 in rows:
            E += [f"if {rr} < M and {col} < N:", f"    at = coff + {rr} * N + {col}",
                  f"    c[at] = {v0}"] + \
                ([f"    if {col} + 1 < N:", f"        c[at + 1] = {v1}"] if f32 else
                 [f"    c[at + 1] = {v1}"])
        return E
    E += bias_lines(col, f32 or odd, not f32) if bias else []
    for rr, v0, v1 in rows:
        E += [f"if {rr} < M and {col} < N:"] + ["    " + x for x in value_lines(v0, v1, bias, act)]
        if odd:  # 16-bit C, one element a store: the pair packed, then split
            E += [f"    at = coff + {rr} * N + {col}",
                  f"    v0 = a * v0{' + bt * widen(c[at])' if beta else ''}",
                  "    v1 = a * v1"] + \
                ([f"    if {col} + 1 < N:", "        v1 += bt * widen(c[at + 1])"]
                 if beta else []) + \
                ["    pk = cvt(v0, v1)", "    c[at] = U16(pk & U32(0xFFFF))",
                 f"    if {col} + 1 < N:", "        c[at + 1] = U16(pk >> U32(16))"]
            continue
        if f32:  # float32 C: one element a store
            E += [f"    at = coff + {rr} * N + {col}",
                  f"    c[at] = a * v0{' + bt * c[at]' if beta else ''}",
                  f"    if {col} + 1 < N:",
                  f"        c[at + 1] = a * v1{' + bt * c[at + 1]' if beta else ''}"]
            continue
        E += [f"    at = (coff + {rr} * N + {col}) // 2"]
        if beta:
            E += ["    o0, o1 = unpack(c[at])", "    v0 = a * v0 + bt * o0",
                  "    v1 = a * v1 + bt * o1"]
        else:
            E += ["    v0 = a * v0", "    v1 = a * v1"]
        E += ["    c[at] = cvt(v0, v1)"]
    return E


def bias_lines(col, guard=False, bits=False):
    """b0, b1 = bias[col], bias[col + 1] (zeros past N). guard: N may be odd (tf32, or
    16-bit C stored an element at a time), so the second column has its own guard;
    bits: the guarded bias is 16-bit (widened), not float32."""
    b1 = f"widen(bias[{col} + 1])" if bits or not guard else f"bias[{col} + 1]"
    return ["b0 = F32(0)", "b1 = F32(0)", f"if {col} < N:", f"    b0 = widen(bias[{col}])"] + \
        ([f"if {col} + 1 < N:", f"    b1 = {b1}"] if guard else [f"    b1 = {b1}"])


def value_lines(v0, v1, bias, act):
    """v0, v1 = act(accumulators v0, v1 + bias) (alpha and beta follow at the store)."""
    E = [f"v0 = {v0}{' + b0' if bias else ''}", f"v1 = {v1}{' + b1' if bias else ''}"]
    return E + (["v0 = act_f(v0, cf)", "v1 = act_f(v1, cf)"] if act else [])


def conv_pair_lines(col, rows, bias, act, z):
    """pair_lines in a convolution's order (module docstring): alpha and beta before the
    activation, beta's z from `zin`; 16-bit C."""
    E = bias_lines(col) if bias else []
    for rr, v0, v1 in rows:
        E += [f"if {rr} < M and {col} < N:", f"    at = (coff + {rr} * N + {col}) // 2"] + \
            (["    z0, z1 = unpack(zin[at])"] if z else []) + \
            ["    " + x for x in conv_value_lines(v0, v1, bias, act, z)] + \
            ["    c[at] = cvt(v0, v1)"]
    return E


def conv_value_lines(v0, v1, bias, act, z):
    """v0, v1 = act(alpha * accumulators + beta * (z0, z1) + bias) (a convolution's order;
    with z, z0 and z1 already loaded)."""
    E = [f"v0 = a * {v0}{' + bt * z0' if z else ''}{' + b0' if bias else ''}",
         f"v1 = a * {v1}{' + bt * z1' if z else ''}{' + b1' if bias else ''}"]
    return E + (["v0 = act_f(v0, cf)", "v1 = act_f(v1, cf)"] if act else [])

"""layer_norm / rms_norm over contiguous rows: the row kept in registers forward and
backward (dx), and the backward parameter sums as chunk partials (norm.py picks them
for layer/rms norm).

Forward (generated, the layout of softmax kernel 1, softmax/rows.py): G lanes a row,
4*V values a lane as named scalars; mean (layer_norm) and the sum of squared
deviations come from the registers, so x is read once and y written once: 8 B an
element (float32) against 16 B for norm.py's three-pass block kernel. Shapes and
register caps come from softmax's `rows_config` (rows up to 32768 elements). Backward
dx holds dy and x (softmax backward's shapes, rows up to 16384): 12 B an element.

Backward parameters: dscale[l] = sum_r dy*xhat, dbias[l] = sum_r dy over the rows r.
A block of CX columns x CY row groups sums R rows a thread for one chunk of CY*R rows
(coalesced along the row), the chunk partials are then summed in chunk order
(deterministic, no atomics): dy and x read once more, 8 B an element.
"""
from numba import cuda

from ..runtime.simulator import SIMULATOR
from ..softmax.rows import load_lines, prologue, store_lines
from ..runtime.device_code.intrinsics import narrow, widen
from ..runtime.launch.codegen import compile_source

CX, CY = (8, 4) if SIMULATOR else (32, 8)
R = 4 if SIMULATOR else 16
CXY = CX * CY


def _valid(k, j, aligned):
    return f"lane + {k} * G < L4" if aligned else f"lane + {4 * k + j} * G < L"


def _affine_store_lines(V):
    """y = v * inv * scale + bias on the live slots, each vector stored as soon as it is
    computed (scale/bias indexed by column; storing early frees the slot's registers
    for the next vector's scale and bias)."""
    src = ["    if live:", "        if aligned != 0:"]
    for k in range(V):
        src += [f"            if {_valid(k, 0, True)}:",
                "                c0 = c1 = c2 = c3 = inv",
                "                b0 = b1 = b2 = b3 = ZERO",
                "                if has_scale:",
                f"                    a0, a1, a2, a3 = load4(scale, lane + {k} * G)",
                "                    c0, c1, c2, c3 = inv * widen(a0), inv * widen(a1), "
                "inv * widen(a2), inv * widen(a3)",
                "                if has_bias:",
                f"                    a0, a1, a2, a3 = load4(bias, lane + {k} * G)",
                "                    b0, b1, b2, b3 = widen(a0), widen(a1), widen(a2), widen(a3)"]
        vals = ", ".join(f"narrow(v{k}_{j} * c{j} + b{j}, y)" for j in range(4))
        src.append(f"                store4(y, q + {k} * G, ({vals}))")
    src.append("        else:")
    for k in range(V):
        for j in range(4):
            i = f"lane + {4 * k + j} * G"
            src += [f"            if {i} < L:",
                    f"                y[base + {i}] = narrow(v{k}_{j} * (inv * widen(scale[{i}]) "
                    f"if has_scale else inv) + (widen(bias[{i}]) if has_bias else ZERO), y)"]
    return src


def forward_source(V):
    slots = [(k, j) for k in range(V) for j in range(4)]
    name = f"norm_rows_fwd_v{V}"
    src = prologue(name, "x, y, scale, bias, st1, st2, nrows, L, G, eps, centred, has_scale, "
                   "has_bias, aligned", V)
    src += load_lines(["v"], ["x"], V, "ZERO")
    src += [f"    s{j} = ZERO" for j in range(4)]
    src += ["    mean = ZERO", "    if centred:"]
    src += [f"        s{j} += v{k}_{j}" for k, j in slots]
    src += ["        mean = grp_sum((s0 + s1) + (s2 + s3), G, shm) / CT(L)"]
    src += [f"    s{j} = ZERO" for j in range(4)]
    # deviations on the live slots only (the padding stays 0 and adds nothing)
    src.append("    if aligned != 0:")
    for k in range(V):
        src.append(f"        if {_valid(k, 0, True)}:")
        for j in range(4):
            src += [f"            v{k}_{j} -= mean", f"            s{j} += v{k}_{j} * v{k}_{j}"]
    src.append("    else:")
    for k, j in slots:
        src += [f"        if {_valid(k, j, False)}:", f"            v{k}_{j} -= mean",
                f"            s{j} += v{k}_{j} * v{k}_{j}"]
    src += ["    inv = ONE / math.sqrt(grp_sum((s0 + s1) + (s2 + s3), G, shm) / CT(L) + eps)",
            "    if live and lane == 0:",
            "        st1[row] = mean if centred else inv",
            "        st2[row] = inv"]
    src += _affine_store_lines(V)
    return name, "\n".join(src) + "\n"


def _slot_columns(V, aligned):
    """(valid condition, column, shared index) of each slot (k, j): the columns a lane
    owns, and where its partial sums sit in shared memory: j-major on the vector path,
    so that a warp's lanes hit consecutive banks (column-major would be 4-way)."""
    if aligned:
        return [(_valid(k, 0, True), f"4 * (lane + {k} * G) + {j}",
                 f"lane + {k} * G + {j} * PLMAX4") for k in range(V) for j in range(4)]
    return [(_valid(k, j, False), f"lane + {4 * k + j} * G", f"lane + {4 * k + j} * G")
            for k in range(V) for j in range(4)]


def _sums(sh):
    """The shared slots of one column's dscale and dbias partials (unsigned indices:
    numba adds no negative-index wraparound)."""
    return f"pacc[U({sh})]", f"pacc[U({sh} + PLMAX)]"


def _per_slot(V, lines_of, ind):
    """lines_of(k, j, column, shared index) under each slot's validity test, for both
    layouts (the aligned flag picks one at run time)."""
    p = " " * ind
    src = [f"{p}if aligned != 0:"]
    for branch in (True, False):
        if not branch:
            src.append(f"{p}else:")
        for (valid, col, sh), (k, j) in zip(_slot_columns(V, branch),
                                            [(k, j) for k in range(V) for j in range(4)]):
            src.append(f"{p}    if {valid}:")
            src += [f"{p}        {line}" for line in lines_of(k, j, col, sh)]
    return src


def backward_source(V, G=None):
    """dx = (g - xhat*mean(g*xhat) - mean(g)) * inv, g = dy*scale, with dy and x held
    in registers (rms norm: mean 0 and no mean(g) term): 12 B an element.

    G given (variant 2, a block of G lanes a row, L <= PLMAX): the block loops over
    rows r = blockIdx.x, + gridDim.x, ... and also sums dscale = dy*xhat and dbias = dy
    for its rows into shared memory, each lane over the columns it owns (no atomics,
    no barrier), then writes its partial row of each to p1/p2[blockIdx.x, :]: dy and
    x are read once for all three results, 12 B an element instead of 20. G is a
    constant here: with a run-time G the compiler hoists every slot's column offset
    out of the row loop and the kernel needed 198-252 registers."""
    fused = G is not None
    slots = [(k, j) for k in range(V) for j in range(4)]
    name = f"norm_rows_bwdp_v{V}_g{G}" if fused else f"norm_rows_bwd_v{V}"
    src = prologue(name, "dy, x, st1, st2, scale, dx, nrows, L, G, centred, has_scale, "
                   "aligned" + (", p1, p2" if fused else ""), V)
    if fused:
        src[0] = src[0].replace(", G, ", ", G_, ")
        src.insert(1, f"    G = {G}")

    def sums(k, j, aligned):  # the fused kernel's partial sums of slot (k, j)
        if not fused:
            return []
        a, b = _sums(_slot_columns(V, aligned)[4 * k + j][2])
        return [f"{a} += d{k}_{j} * v{k}_{j}", f"{b} += d{k}_{j}"]
    body = load_lines(["d", "v"], ["dy", "x"], V, "ZERO")
    body += ["    r = row if live else 0",
             "    mean = st1[r] if centred else ZERO",
             "    inv = st2[r]",
             "    if live:",
             "        if aligned != 0:"]
    for k in range(V):  # the padding stays 0 (d = 0 adds nothing below)
        body += [f"            if {_valid(k, 0, True)}:"]
        body += [f"                v{k}_{j} = (v{k}_{j} - mean) * inv" for j in range(4)]
        body += [f"                {a}" for j in range(4) for a in sums(k, j, True)]
        body += ["                if has_scale:",
                 f"                    a0, a1, a2, a3 = load4(scale, lane + {k} * G)"]
        body += [f"                    d{k}_{j} *= widen(a{j})" for j in range(4)]
    body.append("        else:")
    for k, j in slots:
        i = f"lane + {4 * k + j} * G"
        body += [f"            if {i} < L:",
                 f"                v{k}_{j} = (v{k}_{j} - mean) * inv"]
        body += [f"                {a}" for a in sums(k, j, False)]
        body += [f"                d{k}_{j} *= widen(scale[{i}]) if has_scale else ONE"]
    body += [f"    s{j} = ZERO" for j in range(4)] + [f"    t{j} = ZERO" for j in range(4)]
    body += [f"    s{j} += d{k}_{j}" for k, j in slots]
    body += [f"    t{j} += d{k}_{j} * v{k}_{j}" for k, j in slots]
    body += ["    sg = grp_sum((s0 + s1) + (s2 + s3), G, shm) / CT(L)",
             "    sgx = grp_sum((t0 + t1) + (t2 + t3), G, shm) / CT(L)",
             "    if not centred:",
             "        sg = ZERO"]
    body += [f"    d{k}_{j} = (d{k}_{j} - v{k}_{j} * sgx - sg) * inv" for k, j in slots]
    body += store_lines("d", "dx", V, blend=False)
    if not fused:
        return name, "\n".join(src + body) + "\n"
    src += ["    pacc = cuda.shared.array(PSHM, CT)"]
    src += _per_slot(V, lambda k, j, c, sh: [f"{a} = ZERO" for a in _sums(sh)], 4)
    src += ["    while row < nrows:"] + ["    " + line for line in body]
    src += ["        row += cuda.gridDim.x", "        live = row < nrows",
            "        base = row * L", "        q = base // 4 + lane",
            "    o = U(cuda.blockIdx.x * L)"]
    src += _per_slot(V, lambda k, j, c, sh: [f"p{i + 1}[o + U({c})] = {a}"
                                             for i, a in enumerate(_sums(sh))], 4)
    return name, "\n".join(src) + "\n"


def row_kernel(V, backward, ns, G=None):
    """The generated row kernel, exec'd in ns; G: backward variant 2's lane count."""
    name, src = backward_source(V, G) if backward else forward_source(V)
    return compile_source(name, src, ns, about={
        "config": f"{'backward' if backward else 'forward'}, {V} 4-element vectors a lane"
                  + (f", {G} lanes a row" if G else ""),
        "why": "layer/rms norm rows held in registers (module docstring)"})


def param_kernels(CT):
    """(partials, final): dscale/dbias chunk partials of (rows, L) and their sum."""
    ZERO = CT(0)

    def partials(dy, x, st1, st2, p1, p2, rows, L, centred):
        shm = cuda.shared.array(CXY, CT)
        t = cuda.threadIdx.x
        tx, ty = t % CX, t // CX
        c = cuda.blockIdx.x * CX + tx
        j = cuda.blockIdx.y
        while j * CY * R < rows:
            a, b = ZERO, ZERO
            if c < L:
                r = j * CY * R + ty
                for _ in range(R):
                    if r < rows:
                        d = widen(dy[r * L + c])
                        mean = st1[r] if centred else ZERO
                        a += d * (widen(x[r * L + c]) - mean) * st2[r]
                        b += d
                    r += CY
            for k in range(2):  # a then b over the CY threads of the column, in order
                shm[t] = a if k == 0 else b
                cuda.syncthreads()
                if ty == 0 and c < L:
                    s = shm[tx]
                    for i in range(1, CY):
                        s += shm[tx + i * CX]
                    if k == 0:
                        p1[j * L + c] = s
                    else:
                        p2[j * L + c] = s
                cuda.syncthreads()
            j += cuda.gridDim.y

    def final(p1, p2, dscale, dbias, nch, L):
        # column c of the nch chunk partials, summed in chunk order
        c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if c < L:
            a, b = ZERO, ZERO
            for j in range(nch):
                a += p1[j * L + c]
                b += p2[j * L + c]
            dscale[c] = narrow(a, dscale)
            dbias[c] = narrow(b, dbias)

    return partials, final

"""Generated source of softmax kernel 1 (nbdnn.cuda.softmax's docstring describes it):
the row held in registers, 4*V values a lane as named scalars, so that every slot has
a compile-time name and nothing goes to local memory. `rows_kernel(V, backward, ns)`
builds it in `ns` (the device functions and constants the source names) through
runtime/launch/codegen.py."""
from ..runtime.launch.codegen import compile_source


def _rows_source(V, backward):
    """Source of the row kernel with 4*V cached values per lane (per array). Slot (k, j)
    holds element 4*(lane + k*G) + j (vector path) or lane + G*(4k + j) (scalar path,
    coalesced)."""
    slots = [(k, j) for k in range(V) for j in range(4)]
    ins = ["d", "w"] if backward else ["v"]          # dy, y  |  x
    arrs = ["dy", "y"] if backward else ["x"]
    dst = "dx" if backward else "y"
    name = f"softmax_rows_{'bwd' if backward else 'fwd'}_v{V}"
    src = prologue(name, f"{', '.join(arrs)}, {dst}, nrows, L, G, algo, alpha, beta, aligned",
                   V)
    src += load_lines(ins, arrs, V, "ZERO" if backward else "NEG_INF")
    acc = lambda j: f"s{j}"  # four partial sums for ILP
    src += [f"    s{j} = ZERO" for j in range(4)]
    if backward:
        src.append("    if algo == LOG:")
        src += [f"        s{j} += d{k}_{j}" for k, j in slots]
        src.append("    else:")
        src += [f"        s{j} += d{k}_{j} * w{k}_{j}" for k, j in slots]
        src += ["    s = grp_sum((s0 + s1) + (s2 + s3), G, shm)", "    if algo == LOG:"]
        src += [f"        d{k}_{j} = (d{k}_{j} - math.exp(w{k}_{j}) * s) * alpha"
                for k, j in slots]
        src.append("    else:")
        src += [f"        d{k}_{j} = w{k}_{j} * (d{k}_{j} - s) * alpha" for k, j in slots]
        out = "d"
    else:
        src += ["    m = ZERO", "    if algo != FAST:"]
        src += [f"        m{j} = NEG_INF" for j in range(4)]
        src += [f"        m{j} = v{k}_{j} if v{k}_{j} > m{j} else m{j}" for k, j in slots]
        src += ["        m0 = m1 if m1 > m0 else m0", "        m2 = m3 if m3 > m2 else m2",
                "        m = grp_max(m2 if m2 > m0 else m0, G, shm)",
                # a row past nrows (whole lane group) would compute -inf - -inf: harmless
                # on the GPU, a warning per thread under the simulator
                "        if not live:", "            m = ZERO", "    if algo == LOG:"]
        src += [f"        {acc(j)} += math.exp(v{k}_{j} - m)" for k, j in slots]
        src.append("    else:")
        for k, j in slots:
            src += [f"        v{k}_{j} = math.exp(v{k}_{j} - m)", f"        s{j} += v{k}_{j}"]
        src += ["    s = grp_sum((s0 + s1) + (s2 + s3), G, shm)", "    if not live:",
                "        s = ONE", "    if algo == LOG:", "        c = math.log(s)"]
        src += [f"        v{k}_{j} = (v{k}_{j} - m - c) * alpha" for k, j in slots]
        src += ["    else:", "        c = alpha / s"]
        src += [f"        v{k}_{j} = v{k}_{j} * c" for k, j in slots]
        out = "v"
    return name, "\n".join(src + store_lines(out, dst, V, blend=True)) + "\n"


def prologue(name, args, V):
    """Lane, row and base offsets of the row kernels (G lanes a row)."""
    return [f"def {name}({args}):",
            "    t = cuda.threadIdx.x",
            "    lane = t % G",
            "    row = cuda.blockIdx.x * (cuda.blockDim.x // G) + t // G",
            "    live = row < nrows",
            "    base = row * L",
            "    L4 = L // 4",
            "    q = base // 4 + lane",
            "    shm = cuda.shared.array(SHM, CT)"]


def load_lines(ins, arrs, V, fill):
    """Slots p<k>_<j> of each array in `arrs` (names `ins`), `fill` past the row's end:
    16-byte loads when aligned, coalesced scalars otherwise."""
    slots = [(k, j) for k in range(V) for j in range(4)]
    src = [f"    {p}{k}_{j} = {fill}" for p in ins for k, j in slots]
    src += ["    if live:", "        if aligned != 0:"]
    for k in range(V):
        src.append(f"            if lane + {k} * G < L4:")
        for p, a in zip(ins, arrs):
            src.append(f"                a0, a1, a2, a3 = load4({a}, q + {k} * G)")
            src += [f"                {p}{k}_{j} = widen(a{j})" for j in range(4)]
    src.append("        else:")
    for k, j in slots:
        src.append(f"            if lane + {4 * k + j} * G < L:")
        for p, a in zip(ins, arrs):
            src.append(f"                {p}{k}_{j} = widen({a}[base + lane + {4 * k + j} * G])")
    return src


def store_lines(out, dst, V, blend):
    """Store slots out<k>_<j> to dst (blend: += beta * dst first)."""
    src = ["    if live:", "        if aligned != 0:"]
    for k in range(V):
        src.append(f"            if lane + {k} * G < L4:")
        if blend:
            src += ["                if beta != ZERO:",
                    f"                    b0, b1, b2, b3 = load4({dst}, q + {k} * G)"]
            src += [f"                    {out}{k}_{j} += beta * widen(b{j})" for j in range(4)]
        vals = ", ".join(f"narrow({out}{k}_{j}, {dst})" for j in range(4))
        src.append(f"                store4({dst}, q + {k} * G, ({vals}))")
    src.append("        else:")
    for k in range(V):
        for j in range(4):
            e = f"base + lane + {4 * k + j} * G"
            src.append(f"            if lane + {4 * k + j} * G < L:")
            if blend:
                src += ["                if beta != ZERO:",
                        f"                    {out}{k}_{j} += beta * widen({dst}[{e}])"]
            src.append(f"                {dst}[{e}] = narrow({out}{k}_{j}, {dst})")
    return src


def rows_kernel(V, backward, ns):
    name, src = _rows_source(V, backward)
    return compile_source(name, src, ns, about={
        "config": f"{'backward' if backward else 'forward'}, {V} 4-element vectors a lane",
        "why": "a row held in registers (module docstring): x read once, y written once"})

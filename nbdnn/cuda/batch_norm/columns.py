"""Batch norm for channels-last tensors (NHWC, ...) whose channels are a multiple of 8,
every array 16-byte aligned: a thread owns 8 channels and walks rows. Apply and the
partial sums (statistics; backward sums); dx stays on the general kernel, which the
columns form of it did not beat (docs/decisions.md, "bn_columns_ab").

x is (rows, C), rows = N * L, element (r, c) at r*C + c. The general kernels
(batch_norm/__init__.py, batch_norm/sums.py) take 4 consecutive elements a thread (or
one element of one channel, for the sums), find their channel with a 64-bit `e % C` and
load the 4 channels' 3 (apply) or 6 (dx) terms: 12-24 scalar loads and a division for
every 4 elements, with 8-byte (or 2-byte) accesses for 16-bit storage. In ResNet-50's
bf16 training step (its profile) bn_apply took 1.26 ms, bn_bwd_dx 2.27 ms, the
statistics' and backward sums' partials 1.51 and 1.15 ms, over 53 calls each.

Here thread (tx, ty) of block (bx, by) owns the channel group cg = bx*TX + tx
(channels 8cg .. 8cg+7: one 16-byte vector of 16-bit storage, two of float32) and loads
its channels' terms once, into registers; it then takes rows by*TY*RPT + ty + k*TY
(k < RPT), strided by the grid. A row costs one vector access an array, every load of
the RPT rows issued before any arithmetic, and no index arithmetic but a multiply-add.

    row r:  | cg 0 (8 ch) | cg 1 | ... | cg C/8-1 |     TX = min(C/8, 32) lanes across,
            |  lane 0     | lane 1 | ...           |     TY = 256 / TX rows down a block

A warp covers 32 consecutive vectors of a row (C >= 256), or whole rows of 8..31
vectors (C = 64: 4 rows of 128 bytes in bf16): every access coalesced.
Traffic an element (bf16): apply reads x (and z, and y when beta != 0), writes y: 4 B;
dx reads dy and x (and z), writes dx (and dz): 6 B; statistics read x: 2 B; backward
sums read dy and x (and z): 4-6 B.
H200 (docs/decisions.md "bn_columns_ab", ResNet-50's nine bf16 shapes, graph
replay): training (statistics + apply) 1.05-2.11x the general kernels' speed on all
but the two smallest maps (14x14x256, 7x7x512: 0.74-0.89x), backward (sums + dx)
0.75-1.56x; the nine shapes' 18 passes 1487 us against 1950 (PyTorch: 1420).
"""
from numba import cuda, int64

from ..runtime.simulator import SIMULATOR
from ..runtime.memory.arrays import vector_aligned
from ..runtime.device_code.intrinsics import load8, narrow, store8, widen
from ..runtime.launch.codegen import compile_source

THREADS = 32 if SIMULATOR else 256
RPT = 2  # rows a thread an iteration (dx holds 48 terms and 2 x 24 loaded values)
MAX_GRID_Y = 65535
# batch norm's variant "columns" (batch_norm/__init__.py's APPLY and PARTIALS; "general"
# forced runs the others). docs/decisions.md "bn_columns_ab" times the two. A profile of
# ResNet-50's bf16 training step (53 calls each): apply 1.26 -> 0.89 ms, statistics'
# partials 1.51 -> 0.73, backward sums 1.15 -> 0.80, but dx 2.27 -> 2.43 ms (128
# registers: two blocks an SM, two rows of three arrays in flight a thread; the
# residual layers store dz too): dx keeps the general kernel.


def usable(geo, dtype, arrays):
    """Channels-last (columns), C % 8 == 0, 16- or 32-bit storage (float64 keeps the
    general kernels: 8 channels' terms and values would not fit the registers), every
    array 16-byte aligned."""
    N, C, L, columns = geo
    return columns and C % 8 == 0 and dtype != "float64" and \
        vector_aligned(*arrays, alignment=16)


def launch_shape(rows, C):
    """(grid, block): TX lanes across the C/8 channel groups, TY rows down."""
    C8 = C // 8
    tx = min(C8, 32)
    ty = max(1, THREADS // tx)
    gy = min(MAX_GRID_Y, -(-rows // (ty * RPT)))
    return (-(-C8 // tx), gy, 1), (tx, ty, 1)


def _source():
    """apply_columns: the 8 channels' terms once, then rows."""
    head = "def apply_columns(x, out, z, cb, rows, C8, has_z, act, coef, alpha, beta):"
    nt, loads = 3, ("x", "z", "out")
    body = ["cg = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x",
            "if cg < C8:",
            f"    t0 = {8 * nt} * cg"]
    body += [f"    c{j}_{t} = cb[t0 + {nt * j + t}]" for j in range(8) for t in range(nt)]
    body += ["    ty = cuda.blockDim.y",
             "    r = cuda.blockIdx.y * ty * RPT + cuda.threadIdx.y",
             "    step = cuda.gridDim.y * ty * RPT",
             "    while r < rows:"]
    loop = []
    for k in range(RPT):
        loop += [f"r{k} = r + {k} * ty", f"ok{k} = r{k} < rows",
                 f"g{k} = (r{k} if ok{k} else r) * C8 + cg"]
        for a in loads:
            if a == "out":  # y's old values only when beta blends them in
                loop.append(f"out{k} = load8(out, g{k}) if beta != ZERO else x{k}")
            else:
                loop.append(f"{a}{k} = load8({a}, g{k})")
    for k in range(RPT):
        vals = ", ".join(f"narrow(out_value(x{k}[{j}], z{k}[{j}], out{k}[{j}], c{j}_0, "
                         f"c{j}_1, c{j}_2, has_z, act, coef, alpha, beta), out)"
                         for j in range(8))
        loop += [f"if ok{k}:", f"    store8(out, g{k}, ({vals}))"]
    loop.append("r += step")
    body += ["        " + ln for ln in loop]
    return head + "\n" + "\n".join("    " + ln for ln in body) + "\n"


# The partial sums (statistics; backward sums, with or without the activation's
# derivative) over chunks of E rows: block (bx, by) reduces chunk by (and by + G, ...)
# of its TX channel groups. Each iteration a thread takes SUM_ROWS[kind] rows
# (ty + k*TY), every load issued first; statistics take the exact (mean, M2) of those
# rows' values (shifted by the channel's first element, as _bn_sums' kernels) and merge
# them into the thread's running pair by Chan's formula, whose two factors the 8
# channels share; the backward sums add. Then the TY threads of a channel group merge
# in a fixed tree in shared memory (deterministic) and ty = 0 writes the chunk's
# partials in _bn_sums' format, which its finals read. Chunks are ITER iterations long,
# ITER chosen so that about BLOCKS_AN_SM blocks an SM run (the finals merge few
# partials) within the grid's 65535 rows of blocks.
SUM_ROWS = {"stats": 4, "bwd": 4, "bwd_act": 2}
BLOCKS_AN_SM = 4


def sum_shape(rows, C, kind, sm_count):
    """(grid, block, E rows a chunk, ITER iterations a chunk) of kind's partials."""
    (gx, _, _), block = launch_shape(rows, C)
    per_iter = SUM_ROWS[kind] * block[1]
    steps = -(-rows // per_iter)  # iterations over all rows
    chunks = max(1, min(steps, -(-BLOCKS_AN_SM * sm_count // gx)))
    it = max(-(-steps // chunks), -(-steps // MAX_GRID_Y))
    E = it * per_iter
    return (gx, -(-rows // E), 1), block, E, it


def _sums_source(kind):
    """stats_columns8 / bwd_columns8 / bwd_act_columns8: kind's partials of a chunk."""
    stats, act = kind == "stats", kind == "bwd_act"
    rs = SUM_ROWS[kind]
    name = f"{kind}_columns8"
    loads = ("x",) if stats else (("dy", "x", "z") if act else ("dy", "x"))
    head = (f"def {name}(x, dy, z, scale, bias, mean, invstd, p1, p2, rows, C8, it, has_scale, "
            "has_bias, has_z, act, coef):")
    b = ["tx, ty, T = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockDim.y",
         "cg = cuda.blockIdx.x * cuda.blockDim.x + tx",
         "ok = cg < C8", "cg = cg if ok else 0", "C = 8 * C8", "c = 8 * cg",
         "s1 = cuda.shared.array(SHM, CT)", "s2 = cuda.shared.array(SHM, CT)",
         "sn = cuda.shared.array(THREADS, int64)", "me = ty * cuda.blockDim.x + tx"]
    if stats:  # the shift: the channel's first element (0 when it is not finite)
        b += [f"h{j} = widen(x[c + {j}])" for j in range(8)]
        b += [f"h{j} = h{j} if h{j} - h{j} == ZERO else ZERO" for j in range(8)]
    else:
        b += [f"m{j}, i{j} = mean[c + {j}], invstd[c + {j}]" for j in range(8)]
        if act:
            b += [f"k{j} = widen(scale[c + {j}]) if has_scale else ONE" for j in range(8)]
            b += [f"b{j} = widen(bias[c + {j}]) if has_bias else ZERO" for j in range(8)]
    b += ["E = it * T * RS", "j = cuda.blockIdx.y", "while j * E < rows:",
          "    lo, hi = j * E, min(rows, j * E + E)", "    na = 0"]
    b += [f"    u{q}, w{q} = ZERO, ZERO" for q in range(8)]
    b += ["    r = lo + ty", "    for _ in range(it):"]
    lp = []
    for k in range(rs):
        lp += [f"r{k} = r + {k} * T", f"f{k} = r{k} < hi",
               f"g{k} = (r{k} if f{k} else lo) * C8 + cg"]
        lp += [f"{a}{k} = load8({a}, g{k})" for a in loads]
    if stats:
        lp.append("nb = " + " + ".join(f"(1 if f{k} else 0)" for k in range(rs)))
        lp += ["if nb > 0:", "    inb = ONE / CT(nb)", "    n = na + nb",
               "    fb = CT(nb) / CT(n)", "    gb = CT(na) * fb", "    na = n"]
        for q in range(8):
            vals = [f"(widen(x{k}[{q}]) - h{q})" for k in range(rs)]
            lp += [f"    v{k}_{q} = {vals[k]} if f{k} else ZERO" for k in range(rs)]
            lp.append(f"    mb = ({' + '.join(f'v{k}_{q}' for k in range(rs))}) * inb")
            lp.append("    qb = " + " + ".join(
                f"((v{k}_{q} - mb) * (v{k}_{q} - mb) if f{k} else ZERO)" for k in range(rs)))
            lp.append(f"    u{q}, w{q} = merge(u{q}, w{q}, mb, qb, fb, gb)")
    else:
        for k in range(rs):
            lp.append(f"if f{k}:")
            for q in range(8):
                xh = f"(widen(x{k}[{q}]) - m{q}) * i{q}"
                if act:
                    lp += [f"    e = {xh}",
                           f"    g = widen(dy{k}[{q}]) * act_grad(e * k{q} + b{q} + "
                           f"(widen(z{k}[{q}]) if has_z else ZERO), act, coef)",
                           f"    u{q} += g", f"    w{q} += g * e"]
                else:
                    lp += [f"    g = widen(dy{k}[{q}])", f"    u{q} += g",
                           f"    w{q} += g * ({xh})"]
    lp.append(f"r += {rs} * T")
    b += ["        " + ln for ln in lp]
    # the TY threads of a channel group: a fixed tree (Chan's merge, or sums)
    b += ["    sn[me] = na"] + [f"    s1[8 * me + {q}], s2[8 * me + {q}] = u{q}, w{q}"
                                 for q in range(8)]
    b += ["    cuda.syncthreads()", "    h = 1", "    while h < T:", "        h *= 2",
          "    h //= 2", "    while h > 0:", "        o = me + h * cuda.blockDim.x",
          "        if ty < h and ty + h < T:"]
    if stats:
        b += ["            nb = sn[o]"]
        b += [f"            n{q}, u{q}, w{q} = chan(na, u{q}, w{q}, nb, s1[8 * o + {q}], "
              f"s2[8 * o + {q}])" for q in range(8)]
        b += ["            na = n0", "            sn[me] = na"]
    else:
        b += [f"            u{q} += s1[8 * o + {q}]" for q in range(8)]
        b += [f"            w{q} += s2[8 * o + {q}]" for q in range(8)]
    b += [f"            s1[8 * me + {q}], s2[8 * me + {q}] = u{q}, w{q}" for q in range(8)]
    b += ["        cuda.syncthreads()", "        h //= 2", "    if ty == 0 and ok:"]
    b += [f"        p1[j * C + c + {q}], p2[j * C + c + {q}] = u{q}, w{q}" for q in range(8)]
    b += ["    cuda.syncthreads()", "    j += cuda.gridDim.y"]
    return head + "\n" + "\n".join("    " + ln for ln in b) + "\n"


def kernels(CT, out_value, act_grad, chan):
    """Python kernels apply_columns and the partials {kind}_columns8 (out_value: batch
    norm's element formula; act_grad: the activations' derivatives; chan: _bn_sums'
    merge of (count, mean, M2) triples)."""
    ZERO = CT(0)

    @cuda.jit(device=True)
    def merge(mu, m2, mb, m2b, fb, gb):
        """Chan's merge with the counts' factors fb = nb/n, gb = na*nb/n given (a
        thread's 8 channels share them); an infinite or NaN side as chan has it."""
        d = mb - mu
        if d - d != ZERO:
            return mu + mb, m2 + m2b + d * ZERO
        return mu + d * fb, m2 + m2b + d * d * gb

    ns = {"cuda": cuda, "CT": CT, "ZERO": ZERO, "ONE": CT(1), "RPT": RPT, "load8": load8,
          "store8": store8, "narrow": narrow, "widen": widen, "out_value": out_value,
          "act_grad": act_grad, "chan": chan, "merge": merge,
          "int64": int64, "SHM": 8 * THREADS, "THREADS": THREADS}
    out = {}
    out["apply_columns"] = compile_source("apply_columns", _source(), ns, about={
        "what": "batch norm apply over channels-last rows, 8 channels a thread",
        "traffic": "x (z, y) read, y written: 4 B an element in bf16",
        "config": f"{RPT} rows a thread an iteration, {THREADS} threads a block"})
    for kind, rs in SUM_ROWS.items():
        name = f"{kind}_columns8"
        ns["RS"] = rs
        out[name] = compile_source(name, _sums_source(kind), dict(ns), about={
            "what": f"batch norm {kind} partials over channels-last rows, 8 channels a "
                    "thread, a chunk of E rows a block",
            "traffic": "x read once (2 B an element in bf16)" if kind == "stats" else
                       "dy, x (and z) read once",
            "config": f"{rs} rows a thread an iteration, {THREADS} threads a block"})
    return out

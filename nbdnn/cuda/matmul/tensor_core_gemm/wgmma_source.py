"""The wgmma GEMM kernel's generated source (wgmma_gemm.py documents the kernel, its
variants and its switches; wgmma_gemm.kernel compiles what `source` writes). Pieces
come from wgmma_stage.py (the stage's layout, loads, descriptors), tile_order.py (the
tile schedule), epilogue/pairs.py and epilogue/staged_store.py (the two stores),
wgmma_im2col.py (a convolution's operands) and wgmma_params.py (the own-maps
prologue)."""
from .epilogue import staged_store as staged
from . import wgmma_im2col as im2col, wgmma_stage as ws
from .epilogue.pairs import conv_pair_lines, pair_lines
from .tile_order import batch_lines, chunk_lines, helper_lines
from .wgmma_params import map_lines, own_maps_lines
from .wgmma_stage import BK

BM, TILE = 128, (256, 4)  # the default tile (wgmma_gemm.TILE's shipped value)
BK_OF = {"f16": BK, "bf16": BK, "tf32": BK // 2}  # a k-tile is 128 B of K in every kind


def source(kind, a_k, b_k, bias, act, beta, partial=False, own_maps=False, tile=None,
           store=False, lean=False, conv=False, promote=False, odd=False):
    """(name, source) of the kernel for kind "f16"/"bf16", operand majors (a_k, b_k:
    K-major or not) and the epilogue (bias: add bias[n]; act: an activation mode or
    None; beta: blend the old C; partial: split-K, c is the float32 workspace of the
    chunks' sums, no epilogue); own_maps: each block makes its tensor maps from
    templates and a's and b's addresses (OWN_MAPS). Accumulator j of a thread is a
    literal index in the written-out epilogue, so the 128 stay in registers. tile: (BN,
    STAGES), TILE's default (a name suffix otherwise). store: C through shared memory
    and TMA stores (staged_store.py). lean: the lean tile setup (tile_order.py). conv: A
    and B a convolution's (wgmma_im2col.py: im2col loads, offs its geometry); 1 with
    the GEMM's epilogue (alpha after the activation: the same where alpha is 1 and no z
    is read), 2 in a convolution's order (epilogue/pairs.conv_pair_lines; beta: z read
    from a parameter `zin` after c; "_co" in the name), 3 a filter gradient's (dy^T and
    im2col(x), both MN-major; wgmma_im2col.filter_tile_lines; "wgmma_convdw"). With
    conv 1 or 2, b_k False reads B MN-major (a data gradient's filter as stored,
    wgmma_im2col.load_lines; "_wn"). promote (tf32): each k-tile's product starts a fresh
    tensor-core accumulator (scale_d 0) and is added into d by the CUDA cores, rounding
    to nearest (add_acc; "_pr"): the tensor cores' own float32 accumulation truncates
    toward zero at every wgmma, a bias that grows with K (perf/RESULTS.md, "3xtf32's lost
    accuracy"); it needs nw / 2 more registers a thread (nw <= 128). odd: 16-bit C stored
    an element at a time (epilogue/pairs.py; "_odd"): any N, C 2-byte aligned."""
    bk, f32 = BK_OF[kind], kind == "tf32"
    bn, stages, bm = (tuple(tile or TILE) + (BM,))[:3]
    nw = ws.consumer_columns(bn, bm)
    sb_bytes = ws.stage_bytes(bn, bm)
    epi = ("_b" if bias else "") + (f"_{act}" if act else "") + ("_beta" if beta else "") + \
        ("_partial" if partial else "") + ("_om" if own_maps else "") + \
        ("_ts" if store else "") + ("_ls" if lean else "") + \
        ("_co" if conv == 2 else "") + ("_wn" if conv in (1, 2) and not b_k else "") + \
        ("_pr" if promote else "") + ("_odd" if odd else "") + \
        ("" if (bn, stages, bm) == (256, 4, 128) else
         f"_n{bn}s{stages}" if bm == 128 else f"_m{bm}n{bn}s{stages}")
    maps = ("tmpl_a, tmpl_b, tmpl_c, a, b, slots" if store else "tmpl_a, tmpl_b, a, b, slots") \
        if own_maps else ("map_a, map_b, map_c" if store else "map_a, map_b")
    cz = "c, zin" if conv == 2 and beta and not partial else "c"  # (a convolution's z)
    name = f"wgmma_convdw_{kind}{epi}" if conv == 3 else f"wgmma_conv_{kind}{epi}" if conv else \
        f"wgmma_gemm_{kind}_{'k' if a_k else 'm'}{'k' if b_k else 'm'}{epi}"
    L = helper_lines(bm, bn, lean, nw) + (promote_lines(nw) if promote else []) + [
         f"def {name}({maps}, {cz}, bias, offs, M, N, K, nz, group, alpha, beta, coef, ksplit):",
         "    smem = cuda.shared.array(0, types.uint8)",
         f"    bars = cuda.shared.array({2 * stages}, types.uint64, alignment=8)",
         "    tid = cuda.threadIdx.x"] + (own_maps_lines(store) if own_maps else []) + [
         "    wg = tid // 128",
         "    base = (I(smem_address(smem, 0)) + 1023) & ~1023  # the swizzle atom's alignment",
         ] + ([f"    ebase = base + {stages * sb_bytes}  # C's staging tiles"] if store else []) + [
         "    full0 = I(smem_address(bars, 0))             # full[s] at +8 s, empty[s] at +8 (S + s)",
         f"    empty0 = full0 + {8 * stages}",
         f"    tm = (M + {bm - 1}) // {bm}",
         f"    tn = (N + {bn - 1}) // {bn}",
         "    total = tm * tn * nz * ((K + ksplit - 1) // ksplit)  # x split-K chunks",
         "    if tid == 0:"] + map_lines(own_maps, "        ", store) + [
         "        fence_proxy_tensormap_acquire(map_a)",
         "        fence_proxy_tensormap_acquire(map_b)",
         f"        for s in range({stages}):",
         "            mbarrier_init(U32(full0 + 8 * s), 1)",
         "            mbarrier_init(U32(empty0 + 8 * s), 2)",
         "        fence_proxy_async()  # the initialised barriers, visible to TMA",
         "    cuda.syncthreads()",
         # one k-tile count `it` runs on across this block's tiles: stage it % S, phase
         # (it // S) & 1 (a persistent block's producer fills the next tile's stages
         # while the consumers run the epilogue)
         "    if wg == 0:",
         "        setmaxnreg_dec(40)",
         "        if tid == 0:"] + map_lines(own_maps, "            ", store) + [
         "            it = 0"] + (im2col.geometry_lines(" " * 12)
                                 if conv in (1, 2) else []) + [
         "            for t in range(cuda.blockIdx.x, total, cuda.gridDim.x):",
         "                zk, m0, n0 = tile_of(t, tm, tn, group)"] + \
        chunk_lines(" " * 16, lean) + [
         f"                ktiles = (min(K, k0 + ksplit) - k0 + {bk - 1}) // {bk}"] + \
        (im2col.filter_tile_lines(" " * 16, bn) if conv == 3 else
         im2col.tile_lines(" " * 16, bk) if conv else batch_lines(" " * 16, lean)) + [
         "                for kt in range(ktiles):",
         f"                    s = it % {stages}",
         f"                    ph = (it // {stages}) & 1",
         "                    while mbarrier_try_wait_parity(U32(empty0 + 8 * s), U32(ph ^ 1)) == 0:",
         "                        pass",
         f"                    mbarrier_arrive_expect_tx(U32(full0 + 8 * s), {sb_bytes})",
         f"                    sa = base + s * {sb_bytes}",
         f"                    sb = sa + {ws.a_bytes(bm)}"]
    L += im2col.filter_load_lines(" " * 20, bk, bm, bn) if conv == 3 else \
        im2col.load_lines(" " * 20, bk, b_k, bn) if conv else \
        ["    " + x for x in ws.loads("a", a_k, bk, bm) + ws.loads("b", b_k, bk, bn)]
    L += ["                    it += 1",
          "    else:",
          "        setmaxnreg_inc(232)",
          "        w = wg - 1",
          "        i = tid % 128",
          "        a = F32(alpha)",
          "        bt = F32(beta)",
          "        cf = F32(coef)",
          "        it = 0"] + (
            map_lines(own_maps, "        ", store, ("map_c",)) +
            staged.prologue_lines("        ") if store else []) + [
          "        for t in range(cuda.blockIdx.x, total, cuda.gridDim.x):",
          "            zk, m0, n0 = tile_of(t, tm, tn, group)"] + \
        chunk_lines(" " * 12, lean, matrix=False) + [
          f"            ktiles = (min(K, k0 + ksplit) - k0 + {bk - 1}) // {bk}",
          "            d = zero_acc()"] + (["            p = zero_acc()"] if promote else []) + [
          "            for kt in range(ktiles):",
          f"                s = it % {stages}",
          f"                ph = (it // {stages}) & 1",
          "                while mbarrier_try_wait_parity(U32(full0 + 8 * s), U32(ph)) == 0:",
          "                    pass",
          ] + ws.operand_lines(bm, bn, sb_bytes) + [
          "                wgmma_fence()"]
    for ks in range(BK // 16):
        acc, scale = ("p", int(ks > 0)) if promote else ("d", 1)
        L += [f"                {acc} = mma({ws.descriptor('sa', a_k, ks)}, "
              f"{ws.descriptor('sb', b_k, ks)}, {acc}, {scale})"]
    L += ["                wgmma_commit()",
          "                wgmma_wait(0)",
          "                if i == 0:", "                    mbarrier_arrive(U32(empty0 + 8 * s))"] + \
        (["                d = add_acc(d, p)  # (the stage is free: registers only)"]
         if promote else []) + [
          "                it += 1"] + ws.place_lines(bm, bn) + [
          "            coff = zk * M * N"]
    zord = bool(beta) if conv == 2 and not partial else None  # (a convolution's order)
    E = staged.tile_lines(nw, bias, act, f32, partial, *(
        ("m0 + w * 64", "n0") if bm == 128 else ("m0", f"n0 + w * {nw}")), conv=zord) \
        if store else []
    for j in range(0 if store else nw // 8):  # thread i's pair j: rows r, r + 8
        rows = [("r", f"d[{4 * j}]", f"d[{4 * j + 1}]"),
                ("(r + 8)", f"d[{4 * j + 2}]", f"d[{4 * j + 3}]")]
        E += conv_pair_lines(f"cb + {8 * j}", rows, bias, act, zord) if zord is not None \
            else pair_lines(f"cb + {8 * j}", rows, f32, bias, act, beta, partial, odd)
    L += ["            " + x for x in E] + (staged.final_lines("        ") if store else [])
    return name, "\n".join(L) + "\n"


def promote_lines(nw):
    """add_acc(d, p): the nw / 2 float32 accumulators of a consumer's tile added on the
    CUDA cores (fadd.rn), a device function of its own as zero_acc is."""
    n = nw // 2
    return ["@cuda.jit(device=True)", "def add_acc(d, p):",
            "    return (" + "".join(f"d[{j}] + p[{j}], " for j in range(n)) + ")", "", ""]

"""The wgmma GEMM kernel's parameters (wgmma_gemm.py): its signatures, and the prologue
of blocks that make their own tensor maps (wgmma_gemm.OWN_MAPS).

Own maps: the host encodes each operand's tensor map once per geometry at a stand-in
address (a template); the kernel takes the two templates, a and b, and a workspace of
two 128-byte slots a block. Warp 0 of each block copies the templates to shared
memory, sets their base addresses (tensormap.replace), and copies them to its slots
released to the tensor-map proxy (tensormap.cp_fenceproxy); the producer acquires them
(fence.proxy.tensormap) before its first TMA copy. So a call with new tensors encodes
and uploads nothing, and an eager call plan can replay it (its pointers move; host-
encoded maps hold addresses, which made those calls unplannable).
"""

SIG = ("void(uint64, uint64, uint32[::1], uint16[::1], int32[::1], int64, int64, int64, "
       "int64, int64, float32, float32, float32, int64)")
SIG_PARTIAL = SIG.replace("uint32[::1]", "float32[::1]")
SIG_TF32 = SIG_PARTIAL.replace("uint16[::1]", "float32[::1]")  # (c and bias float32)


def signature(kind, partial, own_maps=False):
    """The kernel's one signature: c packed 16-bit pairs (uint32), bias 16-bit bits;
    partial (split-K's chunks) and tf32: c float32; tf32: bias float32. own_maps: the
    two map addresses become the two templates, a, b and the blocks' map slots."""
    sig = SIG_TF32 if kind == "tf32" else SIG_PARTIAL if partial else SIG
    if own_maps:
        t = "float32" if kind == "tf32" else "uint16"
        sig = sig.replace("void(uint64, uint64, ", f"void(uint64[::1], uint64[::1], {t}[::1], "
                          f"{t}[::1], int64[::1], ")
    return sig


def own_maps_lines():
    """Own maps' prologue: warp 0 copies the two templates (16 x 8 B each) to shared
    memory, lane 0 sets their base addresses to a's and b's, and the warp copies them
    to this block's slot pair, released to the tensor-map proxy (map_a, map_b: their
    global addresses; the producer acquires them below)."""
    return ["    own = cuda.shared.array(32, types.uint64, alignment=128)",
            "    if tid < 32:",
            "        own[tid] = tmpl_a[tid] if tid < 16 else tmpl_b[tid - 16]",
            "        cuda.syncwarp()",
            "        if tid == 0:",
            "            tensormap_replace_address(smem_address(own, 0), gmem_address(a, 0))",
            "            tensormap_replace_address(smem_address(own, 16), gmem_address(b, 0))",
            "        cuda.syncwarp()",
            "        slot = gmem_address(slots, 32 * cuda.blockIdx.x)",
            "        tensormap_copy_release(slot, smem_address(own, 0))",
            "        tensormap_copy_release(slot + 128, smem_address(own, 16))"]


def map_lines(own_maps, indent):
    """Own maps: the thread about to use map_a / map_b computes them (no other thread
    keeps them live)."""
    return [indent + "map_a = gmem_address(slots, 32 * cuda.blockIdx.x)",
            indent + "map_b = map_a + 128"] if own_maps else []

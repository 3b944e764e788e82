"""Warpgroup matrix multiply (sm_90a): wgmma.mma_async with both operands in shared
memory, described by 64-bit matrix descriptors.

A warpgroup is 4 consecutive warps (128 threads, the first warp's index a multiple of
4). `wgmma(N, kind)` returns the intrinsic for D(64xN, float32) = A(64xK) @ B(KxN) +
scale_d * D with K = 16 (f16, bf16) or 8 (tf32), N a multiple of 8 up to 256. D lives
in registers, N/2 float32 a thread, in this layout (thread i of the warpgroup: warp
w = i // 32, lane l; row r = 16w + l // 4, column c = 8j + 2(l % 4), j < N/8):

    d[4j] = D[r, c]   d[4j+1] = D[r, c+1]   d[4j+2] = D[r+8, c]   d[4j+3] = D[r+8, c+1]

Ordering (PTX ISA 9.7.15): wgmma_fence() before the first wgmma that reads registers
written since, wgmma_commit() after a batch, wgmma_wait(n) before reading D (n: batches
left in flight). Shared memory written by ordinary stores needs fence_proxy_async()
(tma.py) in the writing threads and a barrier before a wgmma reads it.

Shared-memory layout: 8 rows x 16 bytes make a "core matrix" (8x8 f16/bf16, 8x4 tf32).
Without swizzle a K-major operand is stored as core matrices, rows contiguous inside
one; the descriptor gives the byte distance between core matrices adjacent along K
(leading byte offset) and along M/N (stride byte offset). With the 128-byte swizzle
(what TMA writes with CU_TENSOR_MAP_SWIZZLE_128B) a row is 128 bytes along K (64
f16), the 16-byte chunks of row r XOR-permuted by r % 8, 8 rows a 1024-byte atom; the
stride byte offset is then the distance between 8-row groups (1024 B) and the leading
offset is unused for K-major. MN-major with the 128-byte swizzle (CuTe's canonical
((8,8,m),(8,k)) : ((1,8,LBO),(64,SBO)) in 16-bit elements): a 128-byte row holds 64
consecutive M (or N) values of one k, 8 k-rows make a 1024-byte atom; SBO is the
distance between atoms along K (1024 B when the k-rows follow each other), LBO the
distance between 64-wide blocks along M/N (a TMA box of 64 x BK each). The issue ceilings measured on the H200 from numba
(../shared/tensorcore/wgmma_peak.py): m64n256k16 f16 692 / 788 / 835 TFLOP/s with 1 / 2
/ 4 warpgroups an SM.
"""
import functools

from llvmlite import ir
from numba import cuda, types, uint64
from numba.cuda.extending import intrinsic

from .asm import F32, inline_asm, literal_statement, statement, values

SWIZZLE = {"none": 0, "128B": 1, "64B": 2, "32B": 3}  # descriptor bits 62-63
K_OF = {"f16": 16, "bf16": 16, "tf32": 8}


@cuda.jit(device=True, inline=True)
def descriptor(address, leading_bytes, stride_bytes, swizzle):
    """The 64-bit shared-memory matrix descriptor: bits 0-13 the .shared address >> 4,
    16-29 the leading byte offset >> 4, 32-45 the stride byte offset >> 4, 62-63 the
    swizzle mode (SWIZZLE); base offset 0 (atoms 1024-byte aligned)."""
    return (uint64((address & 0x3FFFF) >> 4) |
            (uint64((leading_bytes >> 4) & 0x3FFF) << uint64(16)) |
            (uint64((stride_bytes >> 4) & 0x3FFF) << uint64(32)) |
            (uint64(swizzle) << uint64(62)))


wgmma_fence = statement("wgmma.fence.sync.aligned;",
                        "Order register writes before the wgmma that reads them.")
wgmma_commit = statement("wgmma.commit_group.sync.aligned;",
                         "Close the batch of wgmma issued so far.")
wgmma_wait = literal_statement("wgmma.wait_group.sync.aligned %d;",
                               "Wait until at most N batches are in flight.")


def _mma_asm(N, shape, ops_text, ops_cons, tail):
    """(text, constraints) of one wgmma m64{shape} with N/2 accumulators: $0.. the
    results, then the k operands (ops_text numbers them from $N/2, ops_cons their
    letters), the accumulators' inputs tied to the results, then scale_d."""
    n, k = N // 2, len(ops_cons)
    d = "{" + ",".join(f"${i}" for i in range(n)) + "}"
    text = ("{\n.reg .pred p;\n" f"setp.ne.b32 p, ${2 * n + k}, 0;\n"
            f"wgmma.mma_async.sync.aligned.m64{shape} {d}, {ops_text}, {tail};\n}}")
    cons = ",".join(["=f"] * n + list(ops_cons) + [str(i) for i in range(n)]) + ",r,~{memory}"
    return text, cons


def _mma_codegen(n, k, text, cons):
    """The codegen of f(k operands, d, scale_d) -> d: d's n values in and out."""
    def codegen(context, builder, sig, args):
        ops = list(args[:k]) + [builder.extract_value(args[k], i) for i in range(n)] + \
            [args[k + 1]]
        st = inline_asm(builder, ir.LiteralStructType([F32] * n), ops, text, cons)
        return values(context, builder, sig, st, n)
    return codegen


@functools.lru_cache(maxsize=None)
def wgmma(N, kind, trans_b=0, trans_a=0):
    """The intrinsic f(desc_a, desc_b, d, scale_d) -> d for m64nNk{16|8}, kind "f16",
    "bf16" or "tf32"; d a UniTuple(float32, N // 2); scale_d 0 ignores d's input
    (the first product of a tile). trans_b = 1 / trans_a = 1: B / A is MN-major in
    shared memory (16-bit kinds only; tf32 operands are always K-major)."""
    if N % 8 or not 8 <= N <= 256 or kind not in K_OF or \
            ((trans_a or trans_b) and kind == "tf32"):
        raise ValueError(f"no wgmma m64n{N}k{K_OF.get(kind)} {kind} trans_a={trans_a} "
                         f"trans_b={trans_b}")
    n = N // 2
    text, cons = _mma_asm(N, f"n{N}k{K_OF[kind]}.f32.{kind}.{kind}", f"${n}, ${n + 1}", "ll",
                          f"p, 1, 1, {trans_a}, {trans_b}" if kind != "tf32" else "p, 1, 1")
    acc = types.UniTuple(types.float32, n)

    @intrinsic
    def mma(typingctx, desc_a, desc_b, d, scale_d):
        return acc(types.uint64, types.uint64, acc, types.int32), _mma_codegen(n, 2, text, cons)
    mma.__doc__ = f"D(64x{N}) = A @ B + scale_d * D, {kind}.\n\nPTX: `{text}`"
    return mma


@functools.lru_cache(maxsize=None)
def wgmma_rs(N, kind, trans_b=0):
    """The intrinsic f(a0, a1, a2, a3, desc_b, d, scale_d) -> d for m64nNk16 with A in
    registers ("f16" or "bf16"): a thread holds four .b32 of packed pairs in the layout
    of the accumulator's 16 columns (warp w, lane l: row r = 16w + l // 4, column c =
    2(l % 4)): a0 = A[r, c:c+2], a1 = A[r+8, c:c+2], a2 = A[r, c+8:c+10], a3 = A[r+8,
    c+8:c+10]. So accumulators d[8k..8k+7] of an m64n* product, packed in pairs, are
    the A operand of k-step k of the next product (flash attention's P = softmax(S)
    multiplying V). trans_b = 1: B MN-major in shared memory."""
    if N % 8 or not 8 <= N <= 256 or kind not in ("f16", "bf16"):
        raise ValueError(f"no wgmma m64n{N}k16 {kind} with A in registers")
    n = N // 2
    a = "{" + ",".join(f"${n + i}" for i in range(4)) + "}"
    text, cons = _mma_asm(N, f"n{N}k16.f32.{kind}.{kind}", f"{a}, ${n + 4}", "rrrrl",
                          f"p, 1, 1, {trans_b}")
    acc, u32 = types.UniTuple(types.float32, n), types.uint32

    @intrinsic
    def mma(typingctx, a0, a1, a2, a3, desc_b, d, scale_d):
        return acc(u32, u32, u32, u32, types.uint64, acc, types.int32), \
            _mma_codegen(n, 5, text, cons)
    mma.__doc__ = f"D(64x{N}) = A(registers) @ B + scale_d * D, {kind}.\n\nPTX: `{text}`"
    return mma

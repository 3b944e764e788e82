"""Warp-level tensor-core instructions (sm_80 and later): mma.sync, ldmatrix,
stmatrix (sm_90), and the conversions that feed them.

Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"); lane = 0..31,
g = lane >> 2 (the row group), t = lane & 3 (the thread in the group):

    A 16x16, row-major, 4 x .b32 (two 16-bit values each, low half first):
        a0 = A[g,   2t:2t+2]   a1 = A[g+8, 2t:2t+2]
        a2 = A[g,   2t+8:+2]   a3 = A[g+8, 2t+8:+2]
    B 16x8, "col" (B^T row-major), 2 x .b32:
        b0 = B[2t:2t+2, g]     b1 = B[2t+8:+2, g]
    C, D 16x8 float32, 4 registers:
        c0, c1 = C[g, 2t], C[g, 2t+1]      c2, c3 = C[g+8, 2t], C[g+8, 2t+1]

    tf32 m16n8k8 (one 32-bit value a register):
        a0 = A[g, t]  a1 = A[g+8, t]  a2 = A[g, t+4]  a3 = A[g+8, t+4]
        b0 = B[t, g]  b1 = B[t+4, g]; C and D as above.

ldmatrix.x4 loads four 8x8 16-bit matrices from shared memory, lanes 8i..8i+7 giving
the row addresses of matrix i: with A's 16x16 tile as matrices (rows 0-7, cols 0-7),
(8-15, 0-7), (0-7, 8-15), (8-15, 8-15) the four results are a0..a3 above; `.trans`
delivers the transposed matrices (B from a K-major-in-rows tile). stmatrix is the store.
Measured issue ceilings on the H200 (../shared/tensorcore, registers only):
mma.sync f16 579, bf16 597, tf32 305 TFLOP/s, under wgmma's 692-835.
"""
from llvmlite import ir
from numba import types
from numba.cuda.extending import intrinsic
from numba.cuda.types import bfloat16

from .asm import F32, I32, element_pointer, inline_asm, instruction, shared_address, values


def _mma(shape, ab, nregs_a, nregs_b):
    text = (f"mma.sync.aligned.{shape}.row.col.f32.{ab}.{ab}.f32 "
            "{$0,$1,$2,$3}, {" + ",".join(f"${4 + i}" for i in range(nregs_a)) + "}, {" +
            ",".join(f"${4 + nregs_a + i}" for i in range(nregs_b)) + "}, "
            "{" + ",".join(f"${4 + nregs_a + nregs_b + i}" for i in range(4)) + "};")
    cons = "=f,=f,=f,=f," + ",".join(["r"] * (nregs_a + nregs_b)) + ",0,1,2,3"

    @intrinsic
    def mma(typingctx, a, b, c):
        """a: UniTuple(uint32, 4), b: UniTuple(uint32, 2), c: UniTuple(float32, 4) ->
        d = a @ b + c (float32)."""
        f4 = types.UniTuple(types.float32, 4)

        def codegen(context, builder, sig, args):
            ops = [builder.extract_value(args[i], j)
                   for i, n in ((0, nregs_a), (1, nregs_b), (2, 4)) for j in range(n)]
            st = inline_asm(builder, ir.LiteralStructType([F32] * 4), ops, text, cons)
            return values(context, builder, sig, st, 4)
        return f4(types.UniTuple(types.uint32, nregs_a), types.UniTuple(types.uint32, nregs_b),
                  f4), codegen
    mma.__doc__ = f"D(f32, 16x8) = A @ B + C on {ab} operands.\n\nPTX: `{text}`"
    return mma


mma_f16 = _mma("m16n8k16", "f16", 4, 2)     # A 16x16, B 16x8 float16
mma_bf16 = _mma("m16n8k16", "bf16", 4, 2)   # A 16x16, B 16x8 bfloat16
mma_tf32 = _mma("m16n8k8", "tf32", 4, 2)    # A 16x8, B 8x8 tf32 (cvt_tf32 bits)


def _ldmatrix(n, trans):
    outs = ",".join(f"${i}" for i in range(n))
    text = f"ldmatrix.sync.aligned.m8n8.x{n}{'.trans' if trans else ''}.shared.b16 {{{outs}}}, [${n}];"

    @intrinsic
    def ldmatrix(typingctx, smem, idx):
        def codegen(context, builder, sig, args):
            addr = shared_address(builder, element_pointer(context, builder, sig.args[0], *args))
            st = inline_asm(builder, ir.LiteralStructType([I32] * n), [addr], text,
                            ",".join(["=r"] * n) + ",r,~{memory}")
            return values(context, builder, sig, st, n)
        return types.UniTuple(types.uint32, n)(smem, types.intp), codegen
    ldmatrix.__doc__ = (f"{n} 8x8 16-bit matrices{' transposed' if trans else ''} from shared "
                        f"memory; idx: this lane's row start (16-byte aligned; lanes 8i..8i+7 "
                        f"address matrix i). Returns {n} x uint32.\n\nPTX: `{text}`")
    return ldmatrix


ldmatrix_x1, ldmatrix_x2, ldmatrix_x4 = (_ldmatrix(n, False) for n in (1, 2, 4))
ldmatrix_x1_trans, ldmatrix_x2_trans, ldmatrix_x4_trans = (_ldmatrix(n, True) for n in (1, 2, 4))


def _stmatrix(n):
    text = (f"stmatrix.sync.aligned.m8n8.x{n}.shared.b16 [$0], {{" +
            ",".join(f"${1 + i}" for i in range(n)) + "};")

    @intrinsic
    def stmatrix(typingctx, smem, idx, regs):
        def codegen(context, builder, sig, args):
            addr = shared_address(builder, element_pointer(context, builder, sig.args[0],
                                                           args[0], args[1]))
            ops = [addr] + [builder.extract_value(args[2], i) for i in range(n)]
            inline_asm(builder, ir.VoidType(), ops, text, "r," + ",".join(["r"] * n) +
                       ",~{memory}")
        return types.void(smem, types.intp, types.UniTuple(types.uint32, n)), codegen
    stmatrix.__doc__ = (f"Store {n} 8x8 16-bit matrices to shared memory (sm_90): the "
                        f"inverse of ldmatrix_x{n}.\n\nPTX: `{text}`")
    return stmatrix


stmatrix_x1, stmatrix_x2, stmatrix_x4 = (_stmatrix(n) for n in (1, 2, 4))


cvt_tf32 = instruction("cvt.rna.tf32.f32 $0, $1;", types.uint32, types.float32,
                       "float32 -> tf32 (round to nearest, ties away), as the .b32 bits "
                       "mma_tf32 takes.")


def _cvt_x2(kind):
    text = f"cvt.rn.{kind}.f32 $0, $1, $2;"  # $1 -> the upper half, $2 -> the lower

    @intrinsic
    def cvt(typingctx, lo, hi):
        def codegen(context, builder, sig, args):
            return inline_asm(builder, I32, [args[1], args[0]], text, "=r,f,f")
        return types.uint32(types.float32, types.float32), codegen
    cvt.__doc__ = (f"Two float32 -> one .b32 holding {{lo, hi}} as {kind} (one instruction): "
                   f"an mma operand from float32 values.\n\nPTX: `{text}`")
    return cvt


cvt_bf16x2 = _cvt_x2("bf16x2")
cvt_f16x2 = _cvt_x2("f16x2")


def _widen(kind):
    """The intrinsic u16 bits of one `kind` value ("f16" or "bf16") -> float32 (exact)."""
    text = "{\n.reg .b16 h;\nmov.b16 h, $1;\n" f"cvt.f32.{kind} $0, h;\n}}"

    @intrinsic
    def widen(typingctx, bits):
        if bits != types.uint16:
            return None

        def codegen(context, builder, sig, args):
            return inline_asm(builder, F32, list(args), text, "=f,h")
        return types.float32(types.uint16), codegen
    widen.__doc__ = f"The {kind} value in 16 bits -> float32.\n\nPTX: `{text}`"
    return widen


def _unpack_x2(kind):
    """The intrinsic u32 {lo, hi} of two `kind` values -> (float32 lo, float32 hi)."""
    text = ("{\n.reg .b16 l, h;\nmov.b32 {l, h}, $2;\n"
            f"cvt.f32.{kind} $0, l;\ncvt.f32.{kind} $1, h;\n}}")

    @intrinsic
    def unpack(typingctx, pair):
        def codegen(context, builder, sig, args):
            st = inline_asm(builder, ir.LiteralStructType([F32, F32]), list(args), text,
                            "=f,=f,r")
            return values(context, builder, sig, st, 2)
        return types.UniTuple(types.float32, 2)(types.uint32), codegen
    unpack.__doc__ = f"One .b32 of two {kind} values -> two float32.\n\nPTX: `{text}`"
    return unpack


widen_f16, widen_bf16 = _widen("f16"), _widen("bf16")
unpack_f16x2, unpack_bf16x2 = _unpack_x2("f16"), _unpack_x2("bf16")


@intrinsic
def pack_b16(typingctx, lo, hi):
    """Two float16 (or two bfloat16) values -> one .b32 {lo, hi}.

    PTX: `mov.b32 $0, {$1, $2};`"""
    if lo != hi or lo not in (types.float16, bfloat16):
        return None

    def codegen(context, builder, sig, args):
        return inline_asm(builder, I32, list(args), "mov.b32 $0, {$1, $2};", "=r,h,h")
    return types.uint32(lo, hi), codegen

"""Inline PTX from numba: the llvmlite pieces every tensor-core intrinsic is built of.

numba-cuda 0.30 has no tensor-core API. An `@intrinsic` types a call and, in its
codegen, emits an `ir.InlineAsm` with the PTX text and constraint letters: `r` a .b32
register, `l` .b64, `f` .f32, `h` .b16; `=` marks an output, a digit ties an input to
that output (the accumulator of an mma is read and written), `~{memory}` keeps the
compiler from moving memory operations across the instruction. Every intrinsic here is
`side_effect=True`: numba must neither drop nor reorder them.

Shared memory addresses: ldmatrix, cp.async, mbarrier, TMA and the wgmma descriptors
take a 32-bit `.shared` address. numba hands us a generic pointer; `addrspacecast` to
address space 3 lowers to `cvta.to.shared` (or folds away when the base is a
`cuda.shared.array`), then ptrtoint and truncation give the u32.
"""
from llvmlite import ir
from numba import types
from numba.cuda import cgutils
from numba.cuda.extending import intrinsic

I16, I32, I64, F32 = ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()


def inline_asm(builder, ret, args, text, constraints):
    """Emit one inline-PTX statement (side effects on) and return its value."""
    fnty = ir.FunctionType(ret, [a.type for a in args])
    return builder.call(ir.InlineAsm(fnty, text, constraints, side_effect=True), args)


def element_pointer(context, builder, arrty, arr, idx):
    """Generic pointer to arr[idx] of a 1-D numba array (no wraparound, no bounds)."""
    ary = context.make_array(arrty)(context, builder, arr)
    return cgutils.get_item_pointer(context, builder, arrty, ary, [idx], wraparound=False)


def shared_address(builder, pointer):
    """Generic pointer into shared memory -> its 32-bit .shared address."""
    shared = builder.addrspacecast(pointer, ir.PointerType(pointer.type.pointee, addrspace=3))
    return builder.trunc(builder.ptrtoint(shared, I64), I32)


def global_address(builder, pointer):
    """Generic pointer into global memory -> its 64-bit .global address (cvta.to.global)."""
    glob = builder.addrspacecast(pointer, ir.PointerType(pointer.type.pointee, addrspace=1))
    return builder.ptrtoint(glob, I64)


def values(context, builder, sig, struct, n):
    """The n results of an asm statement returning a struct, as the signature's tuple."""
    return context.make_tuple(builder, sig.return_type,
                              [builder.extract_value(struct, i) for i in range(n)])


def statement(text, doc):
    """An intrinsic `name()` that emits `text` (no operands) and returns nothing."""
    @intrinsic
    def emit(typingctx):
        def codegen(context, builder, sig, args):
            inline_asm(builder, ir.VoidType(), [], text, "~{memory}")
        return types.void(), codegen
    emit.__doc__ = f"{doc}\n\nPTX: `{text}`"
    return emit


def literal_statement(template, doc):
    """An intrinsic `name(n)` emitting template % n; n must be a compile-time integer
    (the count of a wait_group, the register count of setmaxnreg)."""
    @intrinsic
    def emit(typingctx, n):
        if not isinstance(n, types.IntegerLiteral):
            return None

        def codegen(context, builder, sig, args):
            inline_asm(builder, ir.VoidType(), [], template % n.literal_value, "~{memory}")
        return types.void(n), codegen
    emit.__doc__ = f"{doc}\n\nPTX: `{template.replace('%d', 'N')}`"
    return emit


_OPERAND = {types.float32: (F32, "f"), types.uint32: (I32, "r")}


def instruction(text, ret, arg, doc):
    """An intrinsic `name(x)` emitting the one-operand PTX `text` ($0 its result of numba
    type `ret`, $1 x of type `arg`: float32 or uint32)."""
    (lret, cret), (_, carg) = _OPERAND[ret], _OPERAND[arg]

    @intrinsic
    def emit(typingctx, x):
        def codegen(context, builder, sig, args):
            return inline_asm(builder, lret, list(args), text, f"={cret},{carg}")
        return ret(arg), codegen
    emit.__doc__ = f"{doc}\n\nPTX: `{text}`"
    return emit


@intrinsic
def smem_address(typingctx, smem, idx):
    """32-bit .shared address of smem[idx] (descriptors, mbarriers, TMA destinations)."""
    def codegen(context, builder, sig, args):
        return shared_address(builder, element_pointer(context, builder, sig.args[0], *args))
    return types.uint32(smem, types.intp), codegen


@intrinsic
def gmem_address(typingctx, arr, idx):
    """64-bit .global address of arr[idx] (a tensor map's new base, a map's own slot)."""
    def codegen(context, builder, sig, args):
        return global_address(builder, element_pointer(context, builder, sig.args[0], *args))
    return types.uint64(arr, types.intp), codegen

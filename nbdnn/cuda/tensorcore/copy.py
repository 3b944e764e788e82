"""Asynchronous global -> shared copies (sm_80 and later): cp.async.

A thread issues 16-byte copies that bypass the registers (and L1, `.cg`), groups them
with commit_group and waits for all but the N most recent groups with wait_group N:
the multi-stage pipeline of an mma.sync GEMM (stage s loads while stage s - 1
computes). Both addresses must be 16-byte aligned. The zero-fill form reads only
`src_bytes` (0..16) and writes zeros for the rest: a tile's out-of-bounds rows load as
zeros without a branch.
"""
from llvmlite import ir
from numba import types
from numba.cuda.extending import intrinsic

from .asm import element_pointer, global_address, inline_asm, literal_statement, \
    shared_address, statement


@intrinsic
def cp_async_16(typingctx, smem, sidx, gmem, gidx):
    """smem[sidx:] <- 16 bytes of gmem[gidx:].

    PTX: `cp.async.cg.shared.global [$0], [$1], 16;`"""
    def codegen(context, builder, sig, args):
        s = shared_address(builder, element_pointer(context, builder, sig.args[0], args[0],
                                                    args[1]))
        g = global_address(builder, element_pointer(context, builder, sig.args[2], args[2],
                                                    args[3]))
        inline_asm(builder, ir.VoidType(), [s, g], "cp.async.cg.shared.global [$0], [$1], 16;",
                   "r,l,~{memory}")
    return types.void(smem, types.intp, gmem, types.intp), codegen


@intrinsic
def cp_async_16_zfill(typingctx, smem, sidx, gmem, gidx, src_bytes):
    """smem[sidx:] <- src_bytes of gmem[gidx:], zeros after them (src_bytes 0: 16 zero
    bytes; gmem[gidx] must still be a valid address).

    PTX: `cp.async.cg.shared.global [$0], [$1], 16, $2;`"""
    def codegen(context, builder, sig, args):
        s = shared_address(builder, element_pointer(context, builder, sig.args[0], args[0],
                                                    args[1]))
        g = global_address(builder, element_pointer(context, builder, sig.args[2], args[2],
                                                    args[3]))
        inline_asm(builder, ir.VoidType(), [s, g, args[4]],
                   "cp.async.cg.shared.global [$0], [$1], 16, $2;", "r,l,r,~{memory}")
    return types.void(smem, types.intp, gmem, types.intp, types.uint32), codegen


cp_async_commit = statement("cp.async.commit_group;", "Close the group of copies issued so far.")
cp_async_wait = literal_statement("cp.async.wait_group %d;",
                                  "Wait until at most N committed groups are in flight.")
cp_async_wait_all = statement("cp.async.wait_all;", "Wait for every copy issued.")

"""Hardware intrinsics with plain fallbacks for numba's simulator.

- `load4(a, g)` / `store4(a, g, (v0, v1, v2, v3))`: elements 4g..4g+3 of a 1-D array
  as one vector access (`ld.global.v4.f32` for float32: 16 bytes; two `v2.f64` for
  float64; `v4.u16` for float16). `load8` / `store8`: elements 8g..8g+7, 16-byte
  accesses (one for 16-bit storage, two for float32), the base aligned to 16 bytes.
  numba emits only scalar loads from plain indexing because global arrays only
  promise element alignment; the caller must know the base pointer is aligned to
  `vector_alignment(itemsize)` bytes (16 for load8).
- `load4_lu` / `store4_cs`: the same accesses with PTX cache hints, "last use" loads
  and "streaming" (evict-first) stores, for data that will not be read again soon: a
  kernel that re-reads its input from L2 keeps more of it there when its own output
  and second reads leave first (inline PTX; float16/32/64).
- `round_tf32(x)`: float32 x rounded to TF32 (10 mantissa bits, to nearest, ties to
  even, as TMA rounds into a TFLOAT32 tensor map), as a float32; NaN and infinities
  unchanged. Integer operations on the bits (`cvt.rn.tf32.f32` needs sm_90, `cvt.rna`
  rounds ties away). The math modes' operands (nbdnn/cpu/matmul.py's tf32() is the
  same rounding in NumPy).
- `bf16_load(v)` / `bf16_store(x)`: bfloat16 storage. On the GPU a bfloat16 array is
  passed as uint16 (its bits: numba's arrays have no bfloat16 dtype); bf16_load widens
  the bits to float32 (exact: a shift into the high half), bf16_store rounds float32
  to the nearest-even bfloat16 bits (`cvt.rn.bf16.f32`, NaN kept). The simulator's
  launch passes the same uint16 bits (arrays.flat) and converts them the same way.
- `widen(v)` / `narrow(x, arr)`: one kernel source for every storage dtype (a kernel
  loads through widen and stores through narrow; reduce's signatures even mix input
  and output dtypes): widen takes a stored element to its compute type (float16,
  float32 and bfloat16 bits to float32; float64 stays), narrow rounds x to what `arr`
  stores (bfloat16: bf16_store's bits). Under
  the simulator NumPy converts the other dtypes (float64 stays, the rest become float32
  on load).
  `narrow4(v, arr)` narrows a 4-tuple (store4's values) the same way.
- `array_type(dtype)`: the element type a kernel signature names for arrays of a
  storage dtype: "uint16" for bfloat16 (its bits), the dtype's own name otherwise.
- `HAS_WARP`: warp shuffles exist (False under the simulator, which lacks them):
  kernels branch on it to reduce through shared memory instead.
"""
from ..simulator import SIMULATOR

HAS_WARP = not SIMULATOR


def vector_alignment(itemsize):
    """Bytes of alignment load4/store4 need for arrays of this itemsize."""
    return min(16, 4 * itemsize)


if SIMULATOR:
    def load4(a, g):
        i = 4 * g
        return a[i], a[i + 1], a[i + 2], a[i + 3]

    def store4(a, g, v):
        i = 4 * g
        a[i], a[i + 1], a[i + 2], a[i + 3] = v

    def load8(a, g):
        i = 8 * g
        return tuple(a[i + k] for k in range(8))

    def store8(a, g, v):
        i = 8 * g
        for k in range(8):
            a[i + k] = v[k]

    load4_lu, store4_cs = load4, store4

    def round_tf32(x):
        import numpy as np
        u = int(np.float32(x).view(np.uint32))
        if u & 0x7F800000 == 0x7F800000:
            return np.float32(x)
        return np.uint32((u + 0xFFF + ((u >> 13) & 1)) & 0xFFFFE000).view(np.float32)

    def bf16_load(v):
        import numpy as np
        return (np.uint32(v) << np.uint32(16)).view(np.float32)

    def bf16_store(x):
        import ml_dtypes
        import numpy as np
        return np.float32(x).astype(ml_dtypes.bfloat16).view(np.uint16)

    def widen(v):
        import numpy as np
        if isinstance(v, np.uint16):
            return bf16_load(v)
        return v if isinstance(v, np.float64) else np.float32(v)

    def narrow(x, arr):
        import numpy as np
        return bf16_store(x) if arr.dtype == np.uint16 else x  # (NumPy rounds the rest)
else:
    from llvmlite import ir
    from numba.cuda import cgutils, types
    from numba.cuda.extending import intrinsic

    def _vector_ptr(context, builder, arrty, arr, g, n):
        data = cgutils.create_struct_proxy(arrty)(context, builder, value=arr).data
        vty = ir.VectorType(context.get_data_type(arrty.dtype), n)
        first = builder.mul(g, ir.Constant(g.type, n))
        return builder.bitcast(builder.gep(data, [first]), vty.as_pointer()), vty

    def _vector_load(n):
        """load4 / load8: elements n*g .. n*g + n-1 as one LLVM vector load (split by
        the backend into 16-byte accesses at most, aligned to min(16, n * itemsize))."""
        def load(typingctx, a, g):
            sig = types.UniTuple(a.dtype, n)(a, g)

            def codegen(context, builder, sig, args):
                p, _ = _vector_ptr(context, builder, sig.args[0], args[0], args[1], n)
                v = builder.load(p, align=min(16, n * (sig.args[0].dtype.bitwidth // 8)))
                vals = [builder.extract_element(v, ir.Constant(ir.IntType(32), k))
                        for k in range(n)]
                return context.make_tuple(builder, sig.return_type, vals)
            return sig, codegen
        return intrinsic(load)

    def _vector_store(n):
        def store(typingctx, a, g, v):
            sig = types.void(a, g, v)

            def codegen(context, builder, sig, args):
                arrty, _, tupty = sig.args
                p, vty = _vector_ptr(context, builder, arrty, args[0], args[1], n)
                vec = ir.Constant(vty, ir.Undefined)
                for k in range(n):
                    e = context.cast(builder, builder.extract_value(args[2], k), tupty[k],
                                     arrty.dtype)
                    vec = builder.insert_element(vec, e, ir.Constant(ir.IntType(32), k))
                builder.store(vec, p, align=min(16, n * (arrty.dtype.bitwidth // 8)))
            return sig, codegen
        return intrinsic(store)

    load4, store4 = _vector_load(4), _vector_store(4)
    load8, store8 = _vector_load(8), _vector_store(8)

    # PTX per element type: (vector access text, register constraint, LLVM type to pass)
    def _ptx_vector(dtype, context):
        name = str(dtype)
        if name == "float32":
            return [("v4.f32", 0, 4)], "f", context.get_data_type(dtype)
        if name == "float64":
            return [("v2.f64", 0, 2), ("v2.f64", 16, 2)], "d", context.get_data_type(dtype)
        return [("v4.b16", 0, 4)], "h", ir.IntType(16)

    def _regs(first, n):
        return "{" + ", ".join(f"${first + k}" for k in range(n)) + "}"

    @intrinsic
    def load4_lu(typingctx, a, g):
        sig = types.UniTuple(a.dtype, 4)(a, g)

        def codegen(context, builder, sig, args):
            arrty = sig.args[0]
            p, _ = _vector_ptr(context, builder, arrty, args[0], args[1], 4)
            parts, con, ty = _ptx_vector(arrty.dtype, context)
            text, first = [], 0
            for op, off, n in parts:
                text.append(f"ld.global.lu.{op} {_regs(first, n)}, [$4+{off}];")
                first += n
            fnty = ir.FunctionType(ir.LiteralStructType([ty] * 4), [ir.IntType(64)])
            asm = ir.InlineAsm(fnty, "\n\t".join(text), ",".join([f"={con}"] * 4 + ["l"]),
                               side_effect=True)
            res = builder.call(asm, [builder.ptrtoint(p, ir.IntType(64))])
            elt = context.get_data_type(arrty.dtype)
            vals = [builder.bitcast(builder.extract_value(res, k), elt) for k in range(4)]
            return context.make_tuple(builder, sig.return_type, vals)
        return sig, codegen

    @intrinsic
    def store4_cs(typingctx, a, g, v):
        sig = types.void(a, g, v)

        def codegen(context, builder, sig, args):
            arrty, _, tupty = sig.args
            p, _ = _vector_ptr(context, builder, arrty, args[0], args[1], 4)
            parts, con, ty = _ptx_vector(arrty.dtype, context)
            vals = [builder.bitcast(context.cast(builder, builder.extract_value(args[2], k),
                                                 tupty[k], arrty.dtype), ty)
                    for k in range(4)]
            text, first = [], 1
            for op, off, n in parts:
                text.append(f"st.global.cs.{op} [$0+{off}], {_regs(first, n)};")
                first += n
            fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(64)] + [ty] * 4)
            asm = ir.InlineAsm(fnty, "\n\t".join(text), ",".join(["l"] + [con] * 4),
                               side_effect=True)
            builder.call(asm, [builder.ptrtoint(p, ir.IntType(64))] + vals)
        return sig, codegen

    @intrinsic
    def round_tf32(typingctx, x):
        if x != types.float32:
            return None

        def codegen(context, builder, sig, args):
            i32 = ir.IntType(32)
            u = builder.bitcast(args[0], i32)
            odd = builder.and_(builder.lshr(u, ir.Constant(i32, 13)), ir.Constant(i32, 1))
            r = builder.and_(builder.add(u, builder.add(odd, ir.Constant(i32, 0xFFF))),
                             ir.Constant(i32, 0xFFFFE000))
            exp = builder.and_(u, ir.Constant(i32, 0x7F800000))
            finite = builder.icmp_unsigned("!=", exp, ir.Constant(i32, 0x7F800000))
            return builder.bitcast(builder.select(finite, r, u), ir.FloatType())
        return types.float32(types.float32), codegen

    def _bf16_load(typingctx, v):
        if v != types.uint16:
            return None

        def codegen(context, builder, sig, args):
            wide = builder.shl(builder.zext(args[0], ir.IntType(32)),
                               ir.Constant(ir.IntType(32), 16))
            return builder.bitcast(wide, ir.FloatType())
        return types.float32(types.uint16), codegen

    def _bf16_store(typingctx, x):
        if x != types.float32:
            return None

        def codegen(context, builder, sig, args):
            fnty = ir.FunctionType(ir.IntType(16), [ir.FloatType()])
            asm = ir.InlineAsm(fnty, "cvt.rn.bf16.f32 $0, $1;", "=h,f")
            return builder.call(asm, [args[0]])
        return types.uint16(types.float32), codegen

    bf16_load, bf16_store = intrinsic(_bf16_load), intrinsic(_bf16_store)


def array_type(dtype):
    return "uint16" if str(dtype) == "bfloat16" else str(dtype)


if not SIMULATOR:
    from numba import cuda as _cuda

    @intrinsic
    def widen(typingctx, v):
        if v == types.uint16:
            return _bf16_load(typingctx, v)
        if v not in (types.float16, types.float32, types.float64):
            return None
        ct = types.float64 if v == types.float64 else types.float32

        def codegen(context, builder, sig, args):
            return context.cast(builder, args[0], sig.args[0], ct)
        return ct(v), codegen

    @intrinsic
    def narrow(typingctx, x, arr):
        dt = arr.dtype
        if dt == types.uint16:  # bfloat16 bits, from float32
            sig, gen = _bf16_store(typingctx, types.float32)

            def codegen(context, builder, sig_, args):
                v = context.cast(builder, args[0], sig_.args[0], types.float32)
                return gen(context, builder, sig, [v])
            return types.uint16(x, arr), codegen

        def codegen(context, builder, sig, args):
            return context.cast(builder, args[0], sig.args[0], dt)
        return dt(x, arr), codegen


def narrow4(v, arr):
    return narrow(v[0], arr), narrow(v[1], arr), narrow(v[2], arr), narrow(v[3], arr)


if not SIMULATOR:
    narrow4 = _cuda.jit(device=True, inline=True)(narrow4)

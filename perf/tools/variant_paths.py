"""Every declared kernel variant forced once, small, each checked against the CPU
reference: pooling's paths (indices, divisors), attention's variants, and each
variant of the tables of conv, matmul, norm, batch norm and pool. The target
compute-sanitizer runs over (memcheck, racecheck) when these kernels change; on a GPU
of sm_90 every variant must take its case (a NotSupportedError is a failure: the case
or the table is wrong). Exits 1 on a mismatch.

    python3 perf/run.py sanitize perf/tools/variant_paths.py [pools|attention|paged|tables]
"""
import contextlib
import sys

import ml_dtypes
import numpy as np

import nbdnn
from nbdnn.cuda import attention as A, batch_norm as BN, conv as CV, matmul as MM, \
    norm as NM, pool as PL
from nbdnn.cuda.matmul import tensor_cores
from nbdnn.cuda.runtime import variants
from nbdnn.errors import NotSupportedError

rng = np.random.default_rng(0)
bad = 0


def close(name, got, ref, tol):
    global bad
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    ok = got.shape == ref.shape and np.allclose(got, ref, atol=tol, rtol=tol, equal_nan=True)
    if not ok:
        bad += 1
        print("MISMATCH", name, got.shape, ref.shape,
              np.nanmax(np.abs(got - ref)) if got.shape == ref.shape else "")


def pools():
    """pool_indices and the averages with a divisor (forward and backward): 1-, 2- and
    3-d windows, three dtypes, both layouts, ties planted."""
    for nd, shape, kern in [(1, (2, 3, 17), 3), (2, (2, 3, 9, 11), (3, 2)),
                            (3, (1, 2, 5, 6, 7), 2)]:
        for dt, tol in [(np.float32, 1e-6), (np.float16, 2e-3), (ml_dtypes.bfloat16, 2e-2)]:
            x = rng.normal(size=shape).astype(dt)
            x.flat[::7] = x.flat[1]  # ties
            for layout in ("NCHW", "NHWC"):
                xs = x if layout == "NCHW" else np.ascontiguousarray(np.moveaxis(x, 1, -1))
                kw = dict(stride=2, padding=1, ceil_mode=True, layout=layout)
                ig = nbdnn.pool_indices(xs, kern, backend="cuda", **kw)
                ir = nbdnn.pool_indices(xs, kern, backend="cpu", **kw)
                close(f"indices {nd}d {dt.__name__} {layout}", ig, ir, 0)
                pool = getattr(nbdnn, f"pool{nd}d")
                for divisor in (None, 3, -2):
                    akw = dict(kw, mode="avg", divisor=divisor)
                    yg = pool(xs, kern, backend="cuda", **akw)
                    yr = pool(xs.astype(np.float64), kern, backend="cpu", **akw)
                    close(f"avg {nd}d {divisor} {layout}", yg, yr, tol)
                    dy = rng.normal(size=np.shape(yr)).astype(dt)
                    dg = nbdnn.pool_backward(dy, xs, kern, backend="cuda", **akw)
                    dr = nbdnn.pool_backward(dy.astype(np.float64), xs.astype(np.float64),
                                             kern, backend="cpu", **akw)
                    close(f"avg bwd {nd}d {divisor} {layout}", dg, dr, tol)


def attention():
    """Each forward variant forced (and the backward's flash and gemm), causal; flash
    also with a boolean mask and dropout, and with an additive mask (their kernels)."""
    bf = ml_dtypes.bfloat16
    cases = [("flash", bf, 64, 1, 70, 90, None, None, 0.0),
             ("flash", np.float16, 128, 1, 33, 200, None, None, 0.0),
             ("flash", bf, 64, 1, 40, 132, None, "bool", 0.2),
             ("flash", np.float16, 128, 1, 70, 96, None, "additive", 0.0),
             ("flash_tf32", np.float32, 64, 1, 40, 100, "tf32", None, 0.0),
             ("decode_split", bf, 64, 2, 3, 1500, None, None, 0.0),
             ("gemm", np.float32, 96, 1, 64, 130, "3xtf32", None, 0.0)]
    for name, dt, D, B, Sq, Sk, math, masked, p in cases:
        q, k, v = (rng.normal(size=(B, 2, S, D)).astype(dt) for S in (Sq, Sk, Sk))
        mask = None if masked is None else rng.random((B, 1, Sq, Sk)) > 0.2
        if masked == "additive":
            mask = np.where(mask, rng.uniform(-1, 1, mask.shape), -np.inf).astype(dt)
        kw = dict(is_causal=masked is None, attn_mask=mask, dropout_p=p, seed=4, offset=8)
        kw64 = dict(kw, attn_mask=mask.astype(np.float64) if masked == "additive" else mask)
        mode = (lambda: nbdnn.math_mode(math)) if math else contextlib.nullcontext
        with mode(), A.forced(name):
            o, lse = nbdnn.scaled_dot_product_attention(q, k, v, backend="cuda", **kw)
        q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
        o_r, lse_r = nbdnn.scaled_dot_product_attention(q64, k64, v64, backend="cpu", **kw64)
        close(f"attention {name} {masked} {p}", o, o_r, 2e-2)
        if name in ("flash", "gemm"):
            do = rng.normal(size=o_r.shape).astype(dt)
            with mode(), A.forced(name):
                g = nbdnn.scaled_dot_product_attention_backward(do, q, k, v, o, lse,
                                                                backend="cuda", **kw)
            r = nbdnn.scaled_dot_product_attention_backward(do.astype(np.float64), q64, k64,
                                                            v64, o_r, lse_r, backend="cpu",
                                                            **kw64)
            for a, b in zip(g, r):
                close(f"attention bwd {name} {masked} {p}", a, b, 5e-2)




def paged():
    """paged_attention, each part kernel forced: keys through a shuffled block table
    (page size 16), bottom-right causal rows, a sequence without keys, GQA R = 8."""
    bf = ml_dtypes.bfloat16
    for name, dt, D, Sq in (("decode_split", bf, 64, 2), ("decode", np.float32, 40, 3)):
        B, Hq, Hk, P, W = 3, 8, 2, 16, 100
        lens = np.array([1500, 0, 777])
        pages = int(sum(-(-lens // P))) + 2
        used = np.arange(W)[None, :] < -(-lens[:, None] // P)
        order = iter(rng.permutation(pages))
        table = np.where(used, 0, -1).astype(np.int32)
        for b, w in zip(*np.nonzero(used)):
            table[b, w] = next(order)
        q = rng.normal(size=(B, Sq, Hq, D)).astype(dt)
        kc, vc = (rng.normal(size=(pages, P, Hk, D)).astype(dt) for _ in range(2))
        with A.forced(name):
            o, lse = nbdnn.paged_attention(q, kc, vc, table, lens, is_causal=True,
                                           backend="cuda")
        o_r, lse_r = nbdnn.paged_attention(*(a.astype(np.float64) for a in (q, kc, vc)),
                                           table, lens, is_causal=True, backend="cpu")
        close(f"paged_attention {name}", o, o_r, 2e-2)


BF = ml_dtypes.bfloat16


def _t(shape, dt, fan_in=1):
    return (rng.normal(size=shape) / np.sqrt(fan_in)).astype(dt)


def _conv(dt, layout, C, K, R, stride=1, groups=1, N=2, H=9, algo="auto"):
    """(x, w, kw) of a 2-d convolution case."""
    last = layout == "NHWC"
    x = _t((N, H, H, C) if last else (N, C, H, H), dt)
    w = _t((K, R, R, C // groups) if last else (K, C // groups, R, R), dt, R * R * C // groups)
    return x, w, dict(stride=stride, padding=R // 2, groups=groups, layout=layout, algo=algo)


def _f64(a):
    return np.asarray(a).astype(np.float64)


def _forward(x, w, kw, math=None):
    mode = nbdnn.math_mode(math) if math else contextlib.nullcontext()
    with mode:
        got = nbdnn.conv2d(x, w, backend="cuda", **kw)
    return got, nbdnn.conv2d(_f64(x), _f64(w), backend="cpu", **kw)


def _data(x, w, kw, math=None):
    ref = nbdnn.conv2d(_f64(x), _f64(w), backend="cpu", **kw)
    dy = _t(ref.shape, x.dtype)
    mode = nbdnn.math_mode(math) if math else contextlib.nullcontext()
    with mode:
        got = nbdnn.conv_backward_data(dy, w, x.shape, backend="cuda", **kw)
    return got, nbdnn.conv_backward_data(_f64(dy), _f64(w), x.shape, backend="cpu", **kw)


def _filter(x, w, kw, math=None):
    ref = nbdnn.conv2d(_f64(x), _f64(w), backend="cpu", **kw)
    dy = _t(ref.shape, x.dtype, np.prod(ref.shape[:-1] if kw["layout"] == "NHWC" else
                                         (ref.shape[0],) + ref.shape[2:]))
    mode = nbdnn.math_mode(math) if math else contextlib.nullcontext()
    with mode:
        got = nbdnn.conv_backward_filter(dy, x, w.shape, backend="cuda", **kw)
    return got, nbdnn.conv_backward_filter(_f64(dy), _f64(x), w.shape, backend="cpu", **kw)


def _gemm(dt, k=96):
    a, b = _t((70, k), dt, 96), _t((k, 136), dt)
    return nbdnn.matmul(a, b, backend="cuda"), nbdnn.matmul(_f64(a), _f64(b), backend="cpu")


def _norm(op, shape, **kw):
    x = _t(shape, np.float32)
    got = getattr(nbdnn, op)(x, **kw, backend="cuda")
    ref = getattr(nbdnn, op)(_f64(x), **kw, backend="cpu")
    dy = _t(shape, np.float32)
    stats = [np.asarray(s) for s in ref[1:]]
    bwd = getattr(nbdnn, op + "_backward")
    gb = bwd(dy, x, *[s.astype(np.float32) for s in stats], None, backend="cuda", **kw)
    rb = bwd(_f64(dy), _f64(x), *stats, None, backend="cpu", **kw)
    return (got[0], gb[0]), (ref[0], rb[0])


def _batch_norm(layout, C, dt=np.float32, act="relu"):
    """float32 x and parameters, or 16-bit x (dt) beside float32 parameters, with a relu
    (the backward's sums then read the parameters) unless act is None (the planes
    variant's partials take no activation)."""
    shape = (4, 9, 10, C) if layout == "NHWC" else (4, C, 8, 12)
    x, dy = _t(shape, dt), _t(shape, dt)
    scale, bias = _t((C,), np.float32), _t((C,), np.float32)
    kw = dict(layout=layout, activation=act)
    y, mean, invstd = nbdnn.batch_norm_train(x, scale, bias, backend="cuda", **kw)
    yr, mr, ir = nbdnn.batch_norm_train(_f64(x), _f64(scale), _f64(bias), backend="cpu", **kw)
    g = nbdnn.batch_norm_backward(dy, x, scale, np.asarray(mr, np.float32),
                                  np.asarray(ir, np.float32), bias=bias, backend="cuda", **kw)
    r = nbdnn.batch_norm_backward(_f64(dy), _f64(x), _f64(scale), mr, ir, bias=_f64(bias),
                                  backend="cpu", **kw)
    return (y, g[0], g[1]), (yr, r[0], r[1])


def _pool(mode):
    x = _t((2, 3, 9, 11), np.float32)
    kw = dict(stride=2, padding=1, mode=mode)
    y = nbdnn.pool2d(x, 3, backend="cuda", **kw)
    yr = nbdnn.pool2d(_f64(x), 3, backend="cpu", **kw)
    dy = _t(np.shape(yr), np.float32)
    return (y, nbdnn.pool_backward(dy, x, 3, backend="cuda", **kw)), \
        (yr, nbdnn.pool_backward(_f64(dy), _f64(x), 3, backend="cpu", **kw))


F32, F16 = np.float32, np.float16
TC = True  # the case needs sm_90's tensor cores (the simulator runs no inline PTX)
TABLES = [  # (family module, variant, case: () -> (GPU results, CPU results), tolerance, TC)
    (CV, "tf32_tensor_cores", lambda: _forward(*_conv(F32, "NHWC", 16, 16, 3), math="tf32"),
     2e-2, TC),
    (CV, "tf32_channels_first_copies",
     lambda: _forward(*_conv(F32, "NCHW", 16, 16, 3), math="tf32"), 2e-2, TC),
    (CV, "channels_first_copies", lambda: _forward(*_conv(BF, "NCHW", 64, 64, 3)), 3e-2, TC),
    (CV, "stem_words", lambda: _forward(*_conv(BF, "NHWC", 3, 16, 7, stride=2, H=20)), 3e-2,
     TC),
    (CV, "gemm_1x1", lambda: _forward(*_conv(BF, "NHWC", 16, 32, 1)), 3e-2, TC),
    (CV, "tensor_cores", lambda: _forward(*_conv(BF, "NHWC", 16, 32, 3)), 3e-2, TC),
    (CV, "depthwise", lambda: _forward(*_conv(F32, "NCHW", 6, 6, 3, groups=6)), 1e-5, False),
    (CV, "winograd4", lambda: _forward(*_conv(F32, "NCHW", 8, 8, 3)), 1e-4, False),
    (CV, "winograd", lambda: _forward(*_conv(F32, "NHWC", 8, 8, 3)), 1e-4, False),
    (CV, "implicit_gemm", lambda: _forward(*_conv(F32, "NHWC", 8, 8, 3)), 1e-5, False),
    (CV, "gemm_1x1_channels_first",
     lambda: _forward(*_conv(F32, "NCHW", 16, 24, 1), math="tf32"), 3e-3, False),
    (CV, "gemm_positions",
     lambda: _forward(*_conv(F32, "NCHW", 3, 16, 7, stride=2, H=20), math="tf32"), 3e-3,
     False),
    (CV, "gemm", lambda: _forward(*_conv(F32, "NCHW", 8, 8, 3, stride=2)), 1e-5, False),
    (CV, "direct", lambda: _forward(*_conv(F32, "NHWC", 8, 8, 3)), 1e-5, False),
    (CV, "gemm_1x1", lambda: _data(*_conv(F32, "NHWC", 8, 8, 1)), 1e-5, False),
    (CV, "filter_as_stored", lambda: _data(*_conv(BF, "NHWC", 16, 16, 3)), 3e-2, TC),
    (CV, "as_forward", lambda: _data(*_conv(F32, "NCHW", 8, 8, 3)), 1e-5, False),
    (CV, "tf32_as_forward", lambda: _data(*_conv(F32, "NCHW", 8, 8, 3), math="tf32"), 3e-3,
     False),
    (CV, "depthwise", lambda: _data(*_conv(F32, "NCHW", 6, 6, 3, groups=6)), 1e-5, False),
    (CV, "gemm_1x1_channels_first",
     lambda: _data(*_conv(F32, "NCHW", 24, 16, 1, groups=2), math="tf32"), 3e-3, False),
    (CV, "gemm_positions",
     lambda: _data(*_conv(F32, "NCHW", 8, 16, 3, stride=2, H=17), math="tf32"), 3e-3, False),
    (CV, "gemm", lambda: _data(*_conv(F32, "NCHW", 8, 8, 3, stride=2)), 1e-5, False),
    (CV, "direct", lambda: _data(*_conv(F32, "NHWC", 8, 8, 3, stride=2)), 1e-5, False),
    (CV, "gemm_1x1", lambda: _filter(*_conv(BF, "NHWC", 16, 16, 1)), 3e-2, False),
    (CV, "tensor_cores", lambda: _filter(*_conv(BF, "NHWC", 64, 16, 3)), 3e-2, TC),
    (CV, "depthwise", lambda: _filter(*_conv(F32, "NCHW", 6, 6, 3, groups=6)), 1e-5, False),
    (CV, "gemm_positions",
     lambda: _filter(*_conv(F32, "NCHW", 8, 16, 3, stride=2, H=24), math="tf32"), 3e-3,
     False),
    (CV, "gemm_positions",  # (the joint form: few positions, many columns)
     lambda: _filter(*_conv(F32, "NCHW", 32, 16, 3, stride=2, H=8), math="tf32"), 3e-3,
     False),
    (CV, "gemm", lambda: _filter(*_conv(F32, "NCHW", 8, 8, 3, stride=2)), 1e-5, False),
    (CV, "direct", lambda: _filter(*_conv(F32, "NHWC", 8, 8, 3)), 1e-5, False),
    (CV, "im2col_rows", lambda: _forward(*_conv(F16, "NHWC", 3, 8, 3, algo="gemm")), 4e-3,
     False),
    (CV, "im2col_words", lambda: _filter(*_conv(F16, "NHWC", 8, 8, 3, algo="gemm")), 8e-3,
     False),
    (CV, "im2col", lambda: _filter(*_conv(F32, "NCHW", 8, 8, 3, algo="gemm")), 1e-5, False),
    (CV, "col2im_rows", lambda: _data(*_conv(F32, "NHWC", 3, 8, 3, 2, algo="gemm")), 1e-5,
     False),
    (CV, "col2im_quads", lambda: _data(*_conv(F32, "NHWC", 8, 8, 3, 2, algo="gemm")), 1e-5,
     False),
    (CV, "col2im", lambda: _data(*_conv(F32, "NCHW", 8, 8, 3, 2, algo="gemm")), 1e-5, False),
    (CV, "depthwise_rows", lambda: _forward(*_conv(F32, "NCHW", 6, 6, 3, groups=6)), 1e-5,
     False),
    (CV, "depthwise_tiles", lambda: _forward(*_conv(F32, "NHWC", 6, 6, 3, groups=6)), 1e-5,
     False),
    (CV, "depthwise_strips", lambda: _forward(*_conv(F32, "NCHW", 6, 6, 5, groups=6)), 1e-5,
     False),
    (MM, "wgmma", lambda: _gemm(BF), 3e-2, TC),
    (MM, "wgmma_padded", lambda: _gemm(BF, 93), 3e-2, TC),
    (MM, "mma_sync", lambda: _gemm(F16), 4e-3, TC),
    (MM, "simt", lambda: _gemm(F32), 1e-5, False),
    (NM, "rows", lambda: _norm("layer_norm", (6, 40)), 1e-4, False),
    (NM, "rows_fused", lambda: _norm("layer_norm", (6, 1030)), 1e-4, False),
    (NM, "block_a_row", lambda: _norm("layer_norm", (6, 40)), 1e-4, False),
    (NM, "group_planes", lambda: _norm("group_norm", (2, 6, 4, 4), groups=3), 1e-4, False),
    (BN, "planes", lambda: _batch_norm("NCHW", 5, act=None), 1e-4, False),
    (BN, "columns", lambda: _batch_norm("NHWC", 16), 1e-4, False),
    (BN, "general", lambda: _batch_norm("NHWC", 16), 1e-4, False),
    (BN, "columns", lambda: _batch_norm("NHWC", 16, BF), 3e-2, False),  # (float32 params)
    (BN, "planes", lambda: _batch_norm("NCHW", 8, np.float16, act=None), 3e-2, False),
    (PL, "fast", lambda: _pool("max"), 1e-6, False),
    (PL, "general", lambda: _pool("avg"), 1e-6, False),
]


def tables():
    """Each variant of each table forced on its case (the calls inside the case that
    its table does not hold run the choice); the variant must have run."""
    global bad
    tc = tensor_cores()
    for module, name, case, tol, needs_tc in TABLES:
        family = module.__name__.rsplit(".", 1)[1]
        label = f"{family} {name}"
        if needs_tc and not tc:
            print("skipped (no sm_90 tensor cores):", label)
            continue
        try:
            with variants.chosen() as ran, module.forced(name):
                got, ref = case()
        except NotSupportedError as e:
            bad += 1
            print("NOT USABLE", label, str(e).splitlines()[0][:120])
            continue
        if (family, name) not in ran:
            bad += 1
            print("NOT RUN", label, sorted(set(ran)))
        for i, (g, r) in enumerate(zip(got, ref) if isinstance(got, tuple) else [(got, ref)]):
            close(f"{label} [{i}]", g, r, tol)
    print(f"tables: {len(TABLES)} forced variants")


if __name__ == "__main__":
    parts = [p for p in ("pools", "attention", "paged", "tables") if p in sys.argv[1:]] or \
        ["pools", "attention", "paged", "tables"]
    for part in parts:
        globals()[part]()
    print("variant_paths:", "OK" if not bad else f"{bad} mismatches")
    sys.exit(1 if bad else 0)

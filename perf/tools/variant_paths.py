"""Every pooling kernel path and every attention variant once, small, each checked
against the CPU reference: the target compute-sanitizer runs over (memcheck, racecheck)
when these kernels change. Exits 1 on a mismatch.

    python3 perf/run.py sanitize perf/tools/variant_paths.py [pools]
"""
import contextlib
import sys

import ml_dtypes
import numpy as np

import nbdnn
from nbdnn.cuda import attention as A

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
    """Each forward variant forced (and the backward's flash and gemm), causal."""
    bf = ml_dtypes.bfloat16
    cases = [("flash", bf, 64, 1, 70, 90, None), ("flash", np.float16, 128, 1, 33, 200, None),
             ("flash_tf32", np.float32, 64, 1, 40, 100, "tf32"),
             ("decode_split", bf, 64, 2, 3, 1500, None),
             ("gemm", np.float32, 96, 1, 64, 130, "3xtf32")]
    for name, dt, D, B, Sq, Sk, math in cases:
        q, k, v = (rng.normal(size=(B, 2, S, D)).astype(dt) for S in (Sq, Sk, Sk))
        mode = (lambda: nbdnn.math_mode(math)) if math else contextlib.nullcontext
        with mode(), A.forced(name):
            o, lse = nbdnn.scaled_dot_product_attention(q, k, v, is_causal=True, backend="cuda")
        q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
        o_r, lse_r = nbdnn.scaled_dot_product_attention(q64, k64, v64, is_causal=True,
                                                        backend="cpu")
        close(f"attention {name}", o, o_r, 2e-2)
        if name in ("flash", "gemm"):
            do = rng.normal(size=o_r.shape).astype(dt)
            with mode(), A.forced(name):
                g = nbdnn.scaled_dot_product_attention_backward(do, q, k, v, o, lse,
                                                                is_causal=True, backend="cuda")
            r = nbdnn.scaled_dot_product_attention_backward(do.astype(np.float64), q64, k64,
                                                            v64, o_r, lse_r, is_causal=True,
                                                            backend="cpu")
            for a, b in zip(g, r):
                close(f"attention bwd {name}", a, b, 5e-2)


if __name__ == "__main__":
    pools()
    if "pools" not in sys.argv:
        attention()
    print("variant_paths:", "OK" if not bad else f"{bad} mismatches")
    sys.exit(1 if bad else 0)

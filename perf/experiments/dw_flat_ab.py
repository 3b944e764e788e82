"""Experiment (not in the library): a depthwise 3x3/1 kernel for small planes that maps
threads along the flattened tensor, for the 7x7 and 14x14 MobileNet layers where the
row kernel (nbdnn/cuda/conv/depthwise_rows.py) misses 2x cuDNN (perf/history/runs.md runs
U and V: 1024@7 170%, 512@14 194%).

Why: under Nsight Compute the row kernel at 1024@7 issues ~100 thread instructions an
output and 47% of its L2 sectors are excess, because a warp's lanes cover 7-wide rows
of 2-3 planes and each load touches 4-5 short segments. Channels-first planes of a
depthwise layer with K == C are one contiguous run, so output f of the flat tensor
reads x[f + dr*W + dc] for the 9 taps (dr, dc in -1..1, masked at the plane's edges).
Here thread t owns the 4 outputs 4t..4t+3: their 36 taps lie in x[4t - W - 1 ..
4t + W + 4], which 16-byte loads at groups t + g cover (g from floor((-W-1)/4) to
floor((W+4)/4): 5 loads at W = 7, 9 at W = 14), each one warp-wide 512 contiguous
bytes; one 16-byte store. Which register holds a tap is known when the source is
generated (4t + j + dr*W + dc); only the masks (row and column of each output) and the
channel (two planes at most) are computed at run time. The plane size is compiled
in, so f // (H*W) and // W are multiplications.

Outcome (run W, perf/history/runs.md): correct, and slower than the row kernel on every
layer (1024@7 11.9-14.2 us against 11.0; 512@14 21.6-23.9 against 17.3): the
per-output masks and channel terms cost more than the cleaner loads save. Kept as
the record of the experiment; the library does not use it.

Padding 1, stride 1, dilation 1, K == C, N*C*H*W a multiple of 4, x and y 16-byte
aligned, no epilogue but the bias (the library's plain path).

    PYTHONPATH=. python perf/experiments/dw_flat_ab.py            # H200: check, then A/B (graphs)
    NUMBA_ENABLE_CUDASIM=1 PYTHONPATH=. python perf/experiments/dw_flat_ab.py --check-only
"""
import argparse
import functools

import numpy as np
from numba import cuda

import nbdnn
from nbdnn.cuda import SIMULATOR
from nbdnn.cuda.runtime.intrinsics import load4, store4
from nbdnn.cuda.runtime.launch import Kernel

BLOCK = 32 if SIMULATOR else 128


def source(H, W, V=4):
    """Thread t computes the V (4 or 8) outputs V*t .. V*t + V - 1 of the flat tensor."""
    lo, hi = (-W - 1) // 4, (V + W) // 4
    lines = ["def dw_flat(x, w, y, bias, n4, C, has_bias):",
             "    t = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x",
             f"    if t >= n4 // {V // 4}:", "        return",
             f"    b4 = t * {V // 4}"]
    for g in range(lo, hi + 1):  # clamped group index: masked taps never use it
        lines += [f"    q = b4 + {g}", "    q = 0 if q < 0 else (n4 - 1 if q >= n4 else q)",
                  f"    a{g - lo}_0, a{g - lo}_1, a{g - lo}_2, a{g - lo}_3 = load4(x, q)"]
    lines += [f"    p = (4 * b4) // {H * W}", f"    o = 4 * b4 - p * {H * W}",
              f"    r = o // {W}", f"    c = o - r * {W}",
              "    k0 = p % C", "    k1 = k0 + 1 if k0 + 1 < C else 0"]
    lines += [f"    w0_{i} = CT(w[k0 * 9 + {i}])" for i in range(9)]
    lines += [f"    w1_{i} = CT(w[k1 * 9 + {i}])" for i in range(9)]
    lines += ["    b0 = CT(bias[k0]) if has_bias else ZERO",
              "    b1 = CT(bias[k1]) if has_bias else ZERO", "    nxt = False"]
    for j in range(V):
        lines += ["    rv0 = r >= 1", f"    rv2 = r < {H - 1}", "    cv0 = c >= 1",
                  f"    cv2 = c < {W - 1}", "    acc = b1 if nxt else b0"]
        for dr in (-1, 0, 1):
            for dc in (-1, 0, 1):
                idx = j + dr * W + dc - 4 * lo  # from the first element of group lo
                reg = f"a{idx // 4}_{idx % 4}"
                tap = (dr + 1) * 3 + dc + 1
                conds = [m for m in ({-1: "rv0", 1: "rv2"}.get(dr),
                                     {-1: "cv0", 1: "cv2"}.get(dc)) if m]
                v = reg if not conds else f"({reg} if {' and '.join(conds)} else ZERO)"
                lines.append(f"    acc += CT({v}) * (w1_{tap} if nxt else w0_{tap})")
        lines.append(f"    o{j} = acc")
        if j < V - 1:  # the next output: one column right, wrapping rows and planes
            lines += ["    c += 1", f"    if c == {W}:", "        c = 0", "        r += 1",
                      f"        if r == {H}:", "            r = 0", "            nxt = True"]
    lines += [f"    store4(y, b4 + {s}, (o{4 * s}, o{4 * s + 1}, o{4 * s + 2}, o{4 * s + 3}))"
              for s in range(V // 4)]
    return "\n".join(lines) + "\n"


@functools.lru_cache(maxsize=None)
def kernel(H, W, V=4, dtype="float32"):
    CT = getattr(np, dtype)
    ns = {"cuda": cuda, "load4": load4, "store4": store4, "CT": CT, "ZERO": CT(0)}
    exec(compile(source(H, W, V), f"<dw_flat {H}x{W}/{V}>", "exec"), ns)
    a = f"{dtype}[::1]"
    sig = f"void({a}, {a}, {a}, {a}, int64, int64, int64)"
    return Kernel(ns["dw_flat"], [sig]), sig


def dw_flat(x, w, y, bias=None, V=4):
    """y = depthwise 3x3/1 pad-1 conv of x (N, C, H, W), w (C, 1, 3, 3); V outputs a
    thread."""
    N, C, H, W = (int(s) for s in x.shape)
    assert N * C * H * W % V == 0 and H * W >= V, "V outputs a thread, two planes at most"
    n4 = N * C * H * W // 4
    k, sig = kernel(H, W, V, str(x.dtype).replace("torch.", ""))
    threads = n4 // (V // 4)
    k.launch(sig, -(-threads // BLOCK), BLOCK, 0, x, w, y, bias if bias is not None else w,
             n4, C, int(bias is not None))
    return y


def check(shapes):
    """Against the CPU reference (float64), with and without a bias."""
    from nbdnn.cuda.runtime.arrays import to_device
    rng = np.random.default_rng(0)
    for N, C, H in shapes:
        x = rng.standard_normal((N, C, H, H)).astype(np.float32)
        w = rng.standard_normal((C, 1, 3, 3)).astype(np.float32)
        b = rng.standard_normal(C).astype(np.float32)
        for bias, V in ((None, 4), (b, 4), (b, 8)):
            if N * C * H * H % V or H * H < V:
                continue
            want = nbdnn.conv2d(x.astype(np.float64), w.astype(np.float64),
                                None if bias is None else bias.astype(np.float64), padding=1,
                                groups=C)
            yd = to_device(np.zeros_like(x))
            dw_flat(to_device(x), to_device(w), yd, None if bias is None else to_device(bias), V)
            got = yd.copy_to_host()
            err = np.abs(got - want).max()
            assert err < 1e-5, (N, C, H, bias is not None, V, err)
        print(f"check {N}x{C}x{H}x{H}: ok", flush=True)


def ab(layers):
    import torch
    import torch.nn.functional as F
    from nbdnn.bench import time_gpu, time_graph
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    for C, H in layers:
        x = torch.randn(32, C, H, H, device="cuda")
        w = torch.randn(C, 1, 3, 3, device="cuda")
        ref = F.conv2d(x, w, padding=1, groups=C)
        y = torch.empty_like(ref)
        t_ref = time_gpu(lambda: F.conv2d(x, w, padding=1, groups=C))
        t_rows = time_graph(lambda: nbdnn.conv2d(x, w, padding=1, groups=C, out=y), min_time=0.1)
        line = f"{C}@{H}: cuDNN {t_ref * 1e6:.1f} us | rows {t_rows * 1e6:.1f} us " \
            f"({t_ref / t_rows:.0%})"
        for V in (4, 8):
            y.zero_()
            dw_flat(x, w, y, None, V)
            err = float((y - ref).abs().max() / ref.abs().max())
            t_flat = time_graph(lambda: dw_flat(x, w, y, None, V), min_time=0.1)
            k, sig = kernel(H, H, V)
            r = k.resources(sig)
            line += f" | flat{V} {t_flat * 1e6:.1f} us ({t_ref / t_flat:.0%}, err {err:.0e}, " \
                f"{r['regs']} regs, {r['local_bytes']} B local)"
        print(line, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check-only", action="store_true")
    args = ap.parse_args()
    check([(1, 4, 7), (2, 2, 5), (1, 2, 14)] if SIMULATOR else [(4, 64, 7), (8, 32, 14)])
    if not args.check_only:
        ab([(1024, 7), (512, 14), (256, 28)])


if __name__ == "__main__":
    main()

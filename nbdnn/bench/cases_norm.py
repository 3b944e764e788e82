"""Benchmark cases of the memory-bound norm families (run by bench.run_suite): pooling
on ResNet shapes, batch norm, layer norm and RMS norm, against PyTorch's ops on the same
shapes. Bytes are what a kernel must move (each input read once, each output written
once); the %copy column reads against that. A case that does not fit the suite's
element budget n is left out (the simulator's budget is tiny)."""
import numpy as np

import nbdnn
from .case import BenchCase
from .cases_compute import torch_fp32


def pool_cases(n):
    """ResNet's stem max pool (3x3/2, padding 1, 112x112), the same window averaged, and
    a 2x2/2 max pool on stage-2 maps; batch 32, NCHW; bytes = x read once + y written."""
    cases = []
    for label, (C, H, k, s, p, mode) in (("max_3x3s2", (64, 112, 3, 2, 1, "max")),
                                         ("avg_3x3s2", (64, 112, 3, 2, 1, "avg")),
                                         ("max_2x2s2", (256, 56, 2, 2, 0, "max"))):
        B, P = 32, (H + 2 * p - k) // s + 1
        if B * C * H * H > n:
            continue

        def make(d, h, C=C, H=H, k=k, s=s, p=p, mode=mode, P=P, B=B):
            torch = torch_fp32()
            x, y = d["x"][:B * C * H * H].reshape(B, C, H, H), d["y"][:B * C * P * P]
            y = y.reshape(B, C, P, P)
            hx = h["x"][:B * C * H * H].reshape(B, C, H, H)
            kw = dict(stride=s, padding=p, mode=mode)
            F = torch.nn.functional if torch else None
            tf = F and ((lambda: F.max_pool2d(x, k, s, p)) if mode == "max" else
                        (lambda: F.avg_pool2d(x, k, s, p)))
            return {"gpu": lambda: nbdnn.pool2d(x, k, out=y, **kw),
                    "cpu": lambda: nbdnn.pool2d(hx, k, **kw), "torch": tf}
        cases.append(BenchCase(f"pool2d/{label}", "pool2d", (B, C, H, H),
                               4 * (B * C * H * H + B * C * P * P), make))
    return cases


def _device(torch, host):
    """A device copy of a host array, a torch tensor when PyTorch is there."""
    if torch is not None and host.dtype.name != "bfloat16":  # (to_device: bf16 -> torch)
        return torch.from_numpy(host).cuda()
    from ..cuda.runtime.memory.arrays import to_device
    return to_device(host)


def bn_cases(n):
    """Batch norm, 64x256x64x64 NCHW (256 MiB): inference (x, y), training forward
    (x, y; the kernel reads x twice) and backward (dy, x, dx; it reads dy and x twice)."""
    B, C, H = 64, 256, 64
    size = B * C * H * H
    if size > n:
        return []
    cases = []
    for label, passes in (("infer", 2), ("train", 2), ("backward", 3)):
        def make(d, h, label=label):
            torch = torch_fp32()
            shape = (B, C, H, H)
            x, y, dy = (d[k][:size].reshape(shape) for k in ("x", "y", "dy"))
            hx, hdy = h["x"][:size].reshape(shape), h["dy"][:size].reshape(shape)
            hw, hb = np.ones(C, hx.dtype), np.zeros(C, hx.dtype)  # (scale, bias: x's dtype;
            hm, hv = np.zeros(C, np.float32), np.ones(C, np.float32)  # statistics float32)
            w, b, mean, var = (_device(torch, a.copy()) for a in (hw, hb, hm, hv))
            F = torch.nn.functional if torch else None
            if label == "infer":
                return {"gpu": lambda: nbdnn.batch_norm_infer(x, w, b, mean, var, out=y),
                        "cpu": lambda: nbdnn.batch_norm_infer(hx, hw, hb, hm, hv),
                        "torch": F and (lambda: F.batch_norm(x, mean, var, w, b))}
            if label == "train":
                return {"gpu": lambda: nbdnn.batch_norm_train(x, w, b, mean, var, out=y),
                        "cpu": lambda: nbdnn.batch_norm_train(hx, hw, hb),
                        "torch": F and (lambda: F.batch_norm(x, mean, var, w, b, True))}
            _, m, inv = nbdnn.batch_norm_train(x, w, b)
            stats = []

            def cpu():
                if not stats:
                    stats.extend(nbdnn.batch_norm_train(hx, hw, hb)[1:])
                return nbdnn.batch_norm_backward(hdy, hx, hw, *stats)
            return {"gpu": lambda: nbdnn.batch_norm_backward(dy, x, w, m, inv), "cpu": cpu,
                    "torch": None}
        cases.append(BenchCase(f"batch_norm/{label}", f"batch_norm_{label}", (B, C, H, H),
                               4 * passes * size, make))
    return cases


def row_norm_cases(n):
    """layer_norm over rows of 1k, 4k and 16k floats and rms_norm over 4k, 256 MiB."""
    cases = []
    for op, L in (("layer_norm", 1024), ("layer_norm", 4096), ("layer_norm", 16384),
                  ("rms_norm", 4096)):
        rows = (1 << 26) // L
        if rows * L > n:
            continue

        def make(d, h, op=op, L=L, rows=rows):
            torch = torch_fp32()
            x, y = d["x"][:rows * L].reshape(rows, L), d["y"][:rows * L].reshape(rows, L)
            w, b = d["dy"][:L], d["dy"][L:2 * L]
            hx = h["x"][:rows * L].reshape(rows, L)
            F = torch.nn.functional if torch else None
            fn = getattr(nbdnn, op)
            tf = F and ((lambda: F.layer_norm(x, (L,), w, b)) if op == "layer_norm" else
                        (lambda: F.rms_norm(x, (L,), w)))
            return {"gpu": (lambda: fn(x, w, b, out=y)) if op == "layer_norm" else
                    (lambda: fn(x, w, out=y)),
                    "cpu": lambda: fn(hx), "torch": tf}
        cases.append(BenchCase(f"{op}/{L}", op, (rows, L), 8 * rows * L, make))
    cases += _row_norm_backward_cases(n)
    return cases


def _row_norm_backward_cases(n):
    """layer_norm and rms_norm backward over rows of 4096, 256 MiB: read dy and x, write
    dx (12 B an element; dscale and dbias are one row). PyTorch's fused layer-norm
    backward is the peer; rms_norm has none timed."""
    L = 4096
    rows = (1 << 26) // L
    if rows * L > n:
        return []

    def make(d, h, op):
        torch = torch_fp32()
        x, dy = d["x"][:rows * L].reshape(rows, L), d["dy"][:rows * L].reshape(rows, L)
        w = d["y"][:L]
        hx, hdy = h["x"][:rows * L].reshape(rows, L), h["dy"][:rows * L].reshape(rows, L)
        fwd, bwd = getattr(nbdnn, op), getattr(nbdnn, op + "_backward")
        saved = fwd(x, w)[1:]
        stats = []

        def cpu():
            if not stats:
                stats.extend(fwd(hx, hdy[0])[1:])
            return bwd(hdy, hx, *stats, hdy[0])
        tb = None
        if torch is not None and op == "layer_norm":
            m, r = (s.reshape(rows, 1) for s in saved)
            tb = lambda: torch.ops.aten.native_layer_norm_backward(  # noqa: E731
                dy, x, (L,), m, r, w, None, (True, True, False))
        return {"gpu": lambda: bwd(dy, x, *saved, w), "cpu": cpu, "torch": tb}
    return [BenchCase(f"{op}_backward/{L}", f"{op}_backward", (rows, L), 12 * rows * L,
                      lambda d, h, op=op: make(d, h, op)) for op in ("layer_norm", "rms_norm")]


def other_norm_cases(n, shape=(64, 256, 64, 64)):
    """group_norm (32 groups) and instance_norm forward and backward, LRN (cuDNN's
    defaults) forward and backward, dropout (p = 0.5) forward and backward; NCHW, 256
    MiB. Bytes: forward x in, y out (8 B an element); backward dy and x in, dx out
    (12 B); dropout writes a 1-byte mask (9 B) and its backward reads it (9 B)."""
    B, C, H, W = shape
    size = B * C * H * W
    if size > n:
        return []

    def make(d, h, label):
        torch = torch_fp32()
        F = torch.nn.functional if torch else None
        x, y, dy = (d[k][:size].reshape(shape) for k in ("x", "y", "dy"))
        hx = h["x"][:size].reshape(shape)
        w = _device(torch, np.ones(C, hx.dtype))
        groups = 32 if label.startswith("group") else None
        if label in ("group_norm", "instance_norm"):
            fn = (lambda a, **kw: nbdnn.group_norm(a, groups, **kw))
            return {"gpu": lambda: fn(x, scale=w, out=y), "cpu": lambda: fn(hx),
                    "torch": F and ((lambda: F.group_norm(x, 32, w)) if groups else
                                    (lambda: F.instance_norm(x, weight=w)))}
        if label.endswith("norm_backward"):
            _, mean, inv = nbdnn.group_norm(x, groups, w)
            stats = nbdnn.group_norm(hx, groups)[1:]
            hdy = h["dy"][:size].reshape(shape)
            return {"gpu": lambda: nbdnn.group_norm_backward(dy, x, mean, inv, w, groups=groups),
                    "cpu": lambda: nbdnn.group_norm_backward(hdy, hx, *stats, groups=groups),
                    "torch": None}
        if label == "lrn":
            return {"gpu": lambda: nbdnn.lrn(x, out=y), "cpu": lambda: nbdnn.lrn(hx),
                    "torch": F and (lambda: F.local_response_norm(x, 5, 1e-4, 0.75, 2.0))}
        if label == "lrn_backward":
            hdy = h["dy"][:size].reshape(shape)
            return {"gpu": lambda: nbdnn.lrn_backward(dy, x), "cpu":
                    lambda: nbdnn.lrn_backward(hdy, hx), "torch": None}
        _, mask = nbdnn.dropout(x, 0.5, seed=1)
        if label == "dropout":
            return {"gpu": lambda: nbdnn.dropout(x, 0.5, seed=1, out=y),
                    "cpu": lambda: nbdnn.dropout(hx, 0.5, seed=1),
                    "torch": F and (lambda: F.dropout(x, 0.5))}
        hmask = nbdnn.dropout(hx, 0.5, seed=1)[1]
        return {"gpu": lambda: nbdnn.dropout_backward(dy, mask, 0.5, out=y),
                "cpu": lambda: nbdnn.dropout_backward(hx, hmask, 0.5), "torch": None}
    rows = (("group_norm", 8), ("group_norm_backward", 12), ("instance_norm", 8),
            ("instance_norm_backward", 12), ("lrn", 8), ("lrn_backward", 12), ("dropout", 9),
            ("dropout_backward", 9))
    return [BenchCase(f"{label.replace('_backward', '')}/"
                      f"{'backward' if 'backward' in label else 'forward'}", label, shape,
                      per * size, lambda d, h, label=label: make(d, h, label))
            for label, per in rows]

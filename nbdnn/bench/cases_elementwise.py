"""Benchmark cases of the tensor and softmax families (run by bench.run_suite).

Reductions move n * 4 bytes (a read of x; the output is tiny). Softmax reads and
writes each element once: 8 bytes per float32 element forward; backward reads dy and
y and writes dx: 12 bytes."""

import nbdnn
from .case import BenchCase
from .timing import torch_or_none


def reduce_cases(n):
    cases = []
    rows = 8192 if n >= 2 * 8192 else max(1, n // 16)  # small budgets: the simulator
    cols = n // rows
    for op, tfn in (("add", "sum"), ("max", "amax"), ("norm2", "norm")):
        for axes, label in ((None, "all"), ((1,), "last")):
            def make(d, h, op=op, tfn=tfn, axes=axes):
                torch = torch_or_none()
                m = rows * cols
                x2, hx = d["x"][:m].reshape(rows, cols), h["x"][:m].reshape(rows, cols)
                if torch is None:
                    tf = None
                elif tfn == "norm":
                    tf = (lambda: torch.linalg.vector_norm(x2)) if axes is None else \
                        (lambda: torch.linalg.vector_norm(x2, dim=1))
                else:
                    f = getattr(torch, tfn)
                    tf = (lambda: f(x2)) if axes is None else (lambda: f(x2, dim=1))
                return {"gpu": lambda: nbdnn.reduce_tensor(x2, op, axes),
                        "cpu": lambda: nbdnn.reduce_tensor(hx, op, axes), "torch": tf}
            cases.append(BenchCase(f"reduce_tensor/{op}/{label}", "reduce_tensor",
                                   (rows, cols), 4 * rows * cols, make))
    return cases


def softmax_cases(n):
    cases = []
    for cols in (1024, 2048, 4096, 8192, 16384, 32768, 65536):
        rows = 8192

        def make(d, h, cols=cols, rows=rows):
            torch = torch_or_none()
            m = rows * cols
            x, y = d["x"][:m].reshape(rows, cols), d["y"][:m].reshape(rows, cols)
            hx = h["x"][:m].reshape(rows, cols)
            return {"gpu": lambda: nbdnn.softmax(x, axis=-1, out=y),
                    "cpu": lambda: nbdnn.softmax(hx, axis=-1),
                    "torch": torch and (lambda: torch.softmax(x, dim=-1))}

        def make_bwd(d, h, cols=cols, rows=rows):
            torch = torch_or_none()
            m = rows * cols
            dy, y = d["dy"][:m].reshape(rows, cols), d["x"][:m].reshape(rows, cols)
            dx = d["y"][:m].reshape(rows, cols)
            hdy, hy = h["dy"][:m].reshape(rows, cols), h["x"][:m].reshape(rows, cols)
            return {"gpu": lambda: nbdnn.softmax_backward(dy, y, axis=-1, out=dx),
                    "cpu": lambda: nbdnn.softmax_backward(hdy, hy, axis=-1),
                    "torch": torch and (lambda: torch.ops.aten._softmax_backward_data(
                        dy, y, 1, y.dtype))}
        if rows * cols <= n:
            cases.append(BenchCase(f"softmax/accurate/{cols}", "softmax", (rows, cols),
                                   8 * rows * cols, make))
            cases.append(BenchCase(f"softmax_backward/accurate/{cols}", "softmax_backward",
                                   (rows, cols), 12 * rows * cols, make_bwd))
    return cases

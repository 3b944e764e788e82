"""Host cost of one eager call on a tiny tensor (ReLU of 1k floats): nbdnn with numba
device arrays and with torch tensors (with and without out=), numba's own dispatcher
launching the same kernel, and PyTorch's eager relu; a 1x1024 softmax against
torch.softmax (both replay eager call plans). Median of 2000 calls. Then the
cost a kernel of replaying a captured nbdnn.cuda.Graph of 1000 such calls, and the
host cost of a small conv2d (1x128x8x8, 128 3x3 filters, torch tensors, out=) for each
forward algorithm against torch's conv2d: several launches, workspaces and the GEMM's
planning behind one call; and the other calls of a small CNN (batch norm, max pool,
matmul, add) against PyTorch's. nbdnn's layer and conv rows come twice: as called
(eager call plans, nbdnn/ops/_plan.py) and with `op.unplanned` (the full front end).

    PYTHONPATH=. python perf/suites/launch_overhead.py [--json F]
"""
import argparse
import json

import numpy as np

import nbdnn
from nbdnn.bench import host_cost, _torch
from numba import cuda
from nbdnn.cuda import activation as cuda_act


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    args = p.parse_args()
    x = cuda.to_device(np.random.randn(1024).astype(np.float32))
    y = cuda.device_array_like(x)
    rows = {}
    rows["nbdnn relu, numba arrays, out="] = host_cost(lambda: nbdnn.activation(x, "relu", out=y))
    rows["nbdnn relu, numba arrays, new output"] = host_cost(lambda: nbdnn.activation(x, "relu"))
    # what a new output costs by kind: numba's allocator against torch's caching one
    rows["numba cuda.device_array(1024)"] = host_cost(
        lambda: cuda.device_array(1024, np.float32), calls=1000)
    kern, sig = cuda_act._FORWARD["relu", np.dtype("float32")]
    disp = kern.dispatcher
    rows["numba dispatcher kernel[grid, block](...)"] = host_cost(
        lambda: disp[1, 256](x, y, 1024, 1.0, 0.0, 0.0, 1))
    rows["Kernel.launch (fast path only)"] = host_cost(
        lambda: kern.launch(sig, 1, 256, 0, x, y, 1024, 1.0, 0.0, 0.0, 1))
    torch = _torch()
    if torch is not None:
        tx = torch.randn(1024, device="cuda")
        ty = torch.empty_like(tx)
        rows["nbdnn relu, torch tensors, out="] = host_cost(lambda: nbdnn.activation(tx, "relu", out=ty))
        rows["nbdnn relu, torch tensors, new output"] = host_cost(lambda: nbdnn.activation(tx, "relu"))
        rows["torch.relu(x)"] = host_cost(lambda: torch.relu(tx))
        rows["torch.empty(1024, device='cuda')"] = host_cost(
            lambda: torch.empty(1024, device="cuda"))
        rows["torch.relu(x, out=)"] = host_cost(lambda: torch.nn.functional.relu(tx, inplace=False))
        sx = tx.reshape(1, 1024)
        sy = torch.empty_like(sx)
        rows["nbdnn softmax 1x1024, torch tensors, out="] = host_cost(
            lambda: nbdnn.softmax(sx, -1, out=sy))
        rows["torch.softmax 1x1024"] = host_cost(lambda: torch.softmax(sx, -1))
    if torch is not None:
        rows.update(_interleaved({"nbdnn relu, torch tensors, out=": lambda: nbdnn.activation(
            tx, "relu", out=ty), "torch.relu(x)": lambda: torch.relu(tx)}))
    rows.update(_launch_paths(kern, sig, x, y))
    rows.update(_graph_replay(x, y))
    if torch is not None:
        rows.update(_front_end_pieces(tx, ty))
        rows.update(_conv_rows(torch))
        rows.update(_layer_rows(torch))
    w = max(map(len, rows))
    for k, v in rows.items():
        print(f"{k:<{w}}  {v * 1e6:7.2f} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({k: v * 1e6 for k, v in rows.items()}, f, indent=1)


def _planned_rows(name, op, args, kw, theirs, calls=1000):
    """nbdnn's call (its 4th and later calls replay a plan), the same without plans
    (op.unplanned: the whole front end every call), and PyTorch's."""
    rows = {f"nbdnn {name}": host_cost(lambda: op(*args, **kw), calls=calls)}
    if hasattr(op, "unplanned"):
        rows[f"nbdnn {name}, no plan"] = host_cost(lambda: op.unplanned(*args, **kw),
                                                   calls=calls)
    rows[f"torch {name}"] = host_cost(theirs, calls=calls)
    # the host's speed drifts within seconds (relu's median 12.7 us, 8.6 taking
    # turns with torch): the pair again, taking turns
    rows.update(_interleaved({f"nbdnn {name}": lambda: op(*args, **kw),
                              f"torch {name}": theirs}, rounds=10, calls=300))
    return rows


def _conv_rows(torch):
    x = torch.randn(1, 128, 8, 8, device="cuda")
    w = torch.randn(128, 128, 3, 3, device="cuda")
    y = torch.empty_like(x)
    rows = {}
    for algo in ("direct", "implicit_gemm", "winograd", "winograd4"):
        rows.update(_planned_rows(f"conv2d 1x128x8x8 {algo}, out=", nbdnn.conv2d, (x, w),
                                  dict(padding=1, algo=algo, out=y),
                                  lambda: torch.nn.functional.conv2d(x, w, padding=1), 500))
    return rows


def _layer_rows(torch):
    """The other calls of a small CNN's eager forward (digits CNN sizes, batch 1, torch
    tensors), each beside PyTorch's functional call; with out= and, as nbdnn.nn's
    layers call them, without."""
    F = torch.nn.functional
    x = torch.randn(1, 16, 8, 8, device="cuda")
    y = torch.empty_like(x)
    s, b, m, v = (torch.rand(16, device="cuda") + 0.5 for _ in range(4))
    p = torch.empty(1, 16, 4, 4, device="cuda")
    a, w = torch.randn(1, 128, device="cuda"), torch.randn(128, 10, device="cuda")
    c = torch.empty(1, 10, device="cuda")
    rows = {}
    for name, op, args, kw, theirs in (
            ("batch_norm_infer 1x16x8x8, out=", nbdnn.batch_norm_infer, (x, s, b, m, v),
             dict(out=y), lambda: F.batch_norm(x, m, v, s, b, training=False)),
            ("max pool 2x2 1x16x8x8, out=", nbdnn.pool2d, (x, 2), dict(out=p),
             lambda: F.max_pool2d(x, 2)),
            ("max pool 2x2 1x16x8x8", nbdnn.pool2d, (x, 2), {}, lambda: F.max_pool2d(x, 2)),
            ("matmul 1x128 @ 128x10, out=", nbdnn.matmul, (a, w), dict(out=c),
             lambda: torch.matmul(a, w)),
            ("add_tensor 1x16x8x8, out=", nbdnn.add_tensor, (x, y), dict(out=y),
             lambda: torch.add(x, y, out=y)),
            ("relu 1x16x8x8 (new output)", nbdnn.activation, (x, "relu"), {},
             lambda: torch.relu(x))):
        rows.update(_planned_rows(name, op, args, kw, theirs))
    return rows


def _graph_replay(x, y, n=1000, reps=50):
    """A graph of n captured relu calls: the host time of g.replay() and the wall
    time of replay + synchronize, both per captured kernel (the GPU runs each tiny
    kernel in about a microsecond, so the second is the replay's throughput)."""
    import statistics
    import time
    from nbdnn.cuda import Graph
    g = Graph()
    with g.capture():
        for _ in range(n):
            nbdnn.activation(x, "relu", out=y)
    assert len(g) == n
    host, wall = [], []
    for _ in range(reps):
        cuda.synchronize()
        t = time.perf_counter()
        g.replay()
        t1 = time.perf_counter()
        cuda.synchronize()
        host.append(t1 - t)
        wall.append(time.perf_counter() - t)
    return {f"graph of {n} relu calls: host time of replay(), a kernel":
            statistics.median(host) / n,
            f"graph of {n} relu calls: replay + synchronize, a kernel":
            statistics.median(wall) / n}


def _launch_paths(kern, sig, x, y):
    """cuLaunchKernel of the same packed parameters four ways: cuda.bindings, ctypes,
    an @njit function given the values, and nbdnn's: an @njit function reading the
    launch record (one array argument)."""
    import ctypes
    from numba import njit
    from nbdnn.cuda.runtime.launch import kernel as _launch
    kern.launch(sig, 1, 256, 0, x, y, 1024, 1.0, 0.0, 0.0, 1)
    lau = kern._launchers[sig]
    f, pa = int(lau.handle), lau.params_address
    drv = _launch.cuLaunchKernel
    rows = {"cuda.bindings cuLaunchKernel (pre-packed)": host_cost(
        lambda: drv(lau.function, 1, 1, 1, 256, 1, 1, 0, 0, pa, 0))}
    c = ctypes.CDLL("libcuda.so.1").cuLaunchKernel
    u, p = ctypes.c_uint, ctypes.c_size_t
    c.argtypes = [p, u, u, u, u, u, u, u, p, p, p]
    c.restype = ctypes.c_int
    rows["ctypes cuLaunchKernel (pre-packed)"] = host_cost(
        lambda: c(f, 1, 1, 1, 256, 1, 1, 0, 0, pa, 0))

    @njit(cache=False)
    def nj(f, gx, bx, shmem, stream, params):
        return c(f, gx, 1, 1, bx, 1, 1, shmem, stream, params, 0)
    assert nj(f, 1, 256, 0, 0, pa) == 0
    rows["@njit -> cuLaunchKernel (pre-packed)"] = host_cost(lambda: nj(f, 1, 256, 0, 0, pa))
    rows["@njit reading the launch record (nbdnn's path)"] = host_cost(
        lambda: _launch._launch_record(lau.record))
    rows["struct.pack_into of relu's parameters"] = host_cost(
        lambda: lau.pack(1, 1, 1, 256, 1, 1, 0, 0, x, y, 1024, 1.0, 0.0, 0.0, 1))
    return rows


def loop_cost(fn, n=20000):
    """Mean host seconds of fn() over n back-to-back calls (one timer around 100 calls,
    synchronising between batches): finer than timing each call."""
    import time
    for _ in range(200):
        fn()
    cuda.synchronize()
    total = 0.0
    for _ in range(n // 100):
        t = time.perf_counter()
        for _ in range(100):
            fn()
        total += time.perf_counter() - t
        cuda.synchronize()
    return total / (n // 100 * 100)


def _interleaved(fns, rounds=40, calls=500):
    """Median over rounds of each function's mean host cost, the functions taking turns
    round by round: the device host's speed drifts by up to 40% within seconds,
    so only costs measured side by side compare."""
    import statistics
    costs = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            costs[k].append(loop_cost(f, calls))
    return {f"interleaved: {k}": statistics.median(v) for k, v in costs.items()}


def _front_end_pieces(tx, ty):
    from nbdnn import arrays, backend
    from nbdnn.cuda import activation as ca
    from nbdnn.cuda.runtime.memory import arrays as _arrays
    kern, sig = ca._FORWARD["relu", np.dtype("float32")]
    lau = kern._launchers[sig]
    px, py = _arrays.ptr_size(tx), _arrays.ptr_size(ty)
    from nbdnn.cuda.runtime.launch.kernel import cuLaunchKernel as drv, _launch_record
    dt = np.dtype("float32")
    pieces = {
        "piece: ptr_size(torch)": lambda: _arrays.ptr_size(tx),
        "piece: facts(torch)": lambda: _arrays.facts(tx),
        "piece: dtype_of(torch)": lambda: _arrays.dtype_of(tx),
        "piece: kernel table lookup": lambda: ca._FORWARD["relu", dt],
        "piece: pack (pointer tuples)": lambda: lau.pack(1, 1, 1, 128, 1, 1, 0, 0, px, py,
                                                         1024, 1.0, 0.0, 0.0, 1),
        "piece: cuLaunchKernel (bindings)": lambda: drv(lau.function, 1, 1, 1, 128, 1, 1, 0, 0,
                                                      lau.params_address, 0),
        "piece: launch record (@njit)": lambda: _launch_record(lau.record),
        "piece: Kernel.launch": lambda: kern.launch(sig, 1, 128, 0, px, py, 1024, 1.0, 0.0, 0.0, 1),
        "piece: cuda.activation": lambda: ca.activation(tx, "relu", 0.0, alpha=1.0, beta=0.0,
                                                        out=ty, stream=0),
        "piece: nbdnn.activation": lambda: nbdnn.activation(tx, "relu", out=ty),
        "piece: torch.relu": lambda: __import__("torch").relu(tx),
    }
    from nbdnn.ops import _common, activation as oa
    from cuda.bindings import driver
    cs = driver.CUstream(0)
    pieces.update({
        "piece: cuLaunchKernel, CUstream object": lambda: drv(
            lau.function, 1, 1, 1, 128, 1, 1, 0, cs, lau.params_address, 0),
        "piece: Call()": lambda: _common.Call("activation", "activation", None, None,
                                              x=tx, out=ty),
        "piece: Call + array(x)": lambda: _common.Call("activation", "activation", None,
                                                       None, x=tx, out=ty).array("x", tx),
        "piece: _coef + blend_params": lambda: (oa._coef("activation", "relu", None),
                                                _common.blend_params("activation", 1.0, 0.0, ty)),
        "piece: stream_handle(None)": lambda: _arrays.stream_handle(None),
        # a plan's new output: torch.empty as _arrays.empty calls it, or new_empty
        "piece: torch.empty((4, 256), dtype=, device=x.device)": lambda: __import__(
            "torch").empty((4, 256), dtype=tx.dtype, device=tx.device),
        "piece: x.new_empty((4, 256))": lambda: tx.new_empty((4, 256)),
    })
    pieces.update(_plan_pieces(tx, ty))
    rows = {k: loop_cost(f) for k, f in pieces.items()}
    rows.update({
        "front end: backend.choose": host_cost(
            lambda: backend.choose("activation", {"x": tx, "out": ty})),
        "front end: arrays.describe (torch)": host_cost(
            lambda: arrays.describe("activation", "x", tx)),
        "cuda.activation (no front end), torch": host_cost(
            lambda: ca.activation(tx, "relu", 0.0, alpha=1.0, beta=0.0, out=ty, stream=0)),
    })
    return rows


def _plan_pieces(tx, ty):
    """An eager call plan's two steps for relu with out= (nbdnn/ops/_plan.py): the
    call's signature (two tensors, a mode) and the replay (one LaunchTable call)."""
    from nbdnn.ops import _plan
    fn = nbdnn.activation.unplanned
    key, arrays = _plan._signature(fn, (tx, "relu"), {"out": ty})
    plan = _plan.plans_of_this_thread().get(key)
    if type(plan) is not _plan.Plan:
        return {}
    return {"piece: plan signature (relu, out=)": lambda: _plan._signature(
                fn, (tx, "relu"), {"out": ty}),
            "piece: plan replay (relu, out=)": lambda: plan.run(arrays)}


if __name__ == "__main__":
    main()

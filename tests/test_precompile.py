"""Kernels compiled ahead of a workload (nbdnn/cuda/runtime/launch/precompile.py,
nbdnn.torch.precompile): a dry run notes what a workload launches and computes nothing;
forked workers compile it into the kernel cache; the real run then compiles nothing
and answers as without precompile (on a GPU, in a fresh process and cache folder)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import nbdnn
from nbdnn.cuda import SIMULATOR, precompile
from nbdnn.cuda.runtime.launch.kernel import dry_run, launched
from nbdnn.cuda.runtime.memory.arrays import to_device, to_host
from test_kernel_cache import COUNTING


def test_a_dry_run_notes_launches_and_runs_none():
    """Inside: each launch noted (Kernel, signature), nothing launched (an output passed
    in keeps its values), no eager call plan recorded or replayed (calls enough to
    plan inside, then the same calls outside answer right); a nested run's notes reach
    the outer list."""
    x = to_device(np.linspace(-2, 2, 64, dtype=np.float32))
    y = to_device(np.full(64, 7.0, np.float32))
    with dry_run() as noted:
        for _ in range(6):
            nbdnn.activation(x, "relu", out=y)
        with dry_run() as inner:
            nbdnn.softmax(x, axis=0, out=y)
    assert inner and set(inner) <= set(noted)
    assert len(noted) >= 7 and all(isinstance(sig, str) for _, sig in noted)
    assert {k.name for k, _ in noted} >= {k.name for k, _ in inner}
    np.testing.assert_array_equal(to_host(y), 7.0)
    with launched() as names:
        for _ in range(6):
            nbdnn.activation(x, "relu", out=y)
    assert names  # (ran: not replayed from a plan recorded in the dry run)
    np.testing.assert_array_equal(to_host(y), np.maximum(to_host(x), 0))


def test_a_dry_run_notes_every_threads_launches():
    """PyTorch runs a CUDA backward on its autograd engine's thread: a dry run notes the
    launches of any thread while it is open, and launches none of them."""
    import threading
    x = to_device(np.linspace(-2, 2, 64, dtype=np.float32))
    y = to_device(np.full(64, 7.0, np.float32))
    with dry_run() as noted:
        t = threading.Thread(target=lambda: nbdnn.activation(x, "relu", out=y))
        t.start()
        t.join()
    assert [k.name for k, _ in noted] == ["activation_forward"], noted
    np.testing.assert_array_equal(to_host(y), 7.0)


def test_precompile_of_a_workload_summarises_it():
    """nbdnn.cuda.precompile runs the function dry and counts the distinct signatures
    (under the simulator nothing compiles: all are left as they are)."""
    x = to_device(np.ones(32, np.float32))
    s = precompile(lambda: [nbdnn.activation(x, "gelu") for _ in range(3)])
    assert s.noted == 1 and not s.failures, s
    assert s.loaded + s.cached + s.compiled + s.left == 1, s
    assert "1 kernel signatures" in str(s)


def test_a_dry_run_that_stops_early_still_compiles_what_it_noted():
    """Garbage that meets a check ends the dry run: the error is the Summary's
    `stopped`, not raised, and the launches before it are counted."""
    x = to_device(np.ones(32, np.float32))

    def workload():
        nbdnn.activation(x, "tanh")
        raise ValueError("a check of the garbage")  # (as a model's check of a value)
    s = precompile(workload)
    assert s.noted == 1 and s.stopped == "ValueError: a check of the garbage", s
    assert "stopped early" in str(s)


def test_torch_precompile_keeps_the_models_state():
    """nbdnn.torch.precompile runs forward and backward once and puts back what the run
    would change: buffers (a native batch norm's running statistics), the random
    generator's state; the parameters' .grad stay None (CPU tensors: the reference
    runs, so the run is real)."""
    torch = pytest.importorskip("torch")
    import nbdnn.torch as nt
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6),
                              torch.nn.Dropout(0.5), torch.nn.Linear(6, 2))
    model, _ = nt.convert(net, exclude=["1"])  # (the batch norm stays native)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(5, 4)
    rng = torch.get_rng_state()
    s = nt.precompile(model.train(), x)
    assert s.noted == 0  # (CPU tensors launch nothing)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None for p in model.parameters())


CHILD = COUNTING + r"""
import json, sys
import torch
import nbdnn.torch as nt
torch.manual_seed(0)
net = torch.nn.Sequential(
    torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
    torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(16 * 4 * 4, 10),
    torch.nn.LayerNorm(10)).cuda().to(memory_format=torch.channels_last)
model, _ = nt.convert(net)
x = torch.randn(4, 8, 8, 8, device="cuda").contiguous(memory_format=torch.channels_last)
def step():
    with torch.autocast("cuda", torch.bfloat16):
        out = model(x)
    out.float().square().sum().backward()
    return out
s = None
if sys.argv[1] == "precompile":
    with torch.autocast("cuda", torch.bfloat16):
        s = nt.precompile(model.train(), x)
compiles_before = count[0]
out = step()
torch.cuda.synchronize()
print(json.dumps({"summary": None if s is None else vars(s), "compiles_before": compiles_before,
                  "compiles_in_step": count[0] - compiles_before,
                  "out": out.float().cpu().tolist(),
                  "grad": model[0].weight.grad.float().sum().item()}))
"""


@pytest.mark.skipif(SIMULATOR, reason="compiles cubins: a GPU")
def test_precompile_leaves_the_first_step_nothing_to_compile(tmp_path):
    """A converted conv/batch-norm/pool/linear/layer-norm model in bf16 autocast: in a
    fresh process and cache folder, precompile compiles its step's kernels in workers
    (none failed, none left) and the first step compiles nothing; its output and
    gradient equal those of a process without precompile (its own fresh folder)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    runs = {}
    for how in ("precompile", "plain"):
        env = dict(os.environ, NBDNN_KERNEL_CACHE=str(tmp_path / how),
                   PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
        r = subprocess.run([sys.executable, "-c", CHILD, how], env=env, capture_output=True,
                           text=True, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
        runs[how] = json.loads(r.stdout.strip().splitlines()[-1])
    pre, plain = runs["precompile"], runs["plain"]
    s = pre["summary"]
    assert s["compiled"] > 0 and not s["failures"] and s["left"] == 0, s
    assert pre["compiles_before"] == 0 and pre["compiles_in_step"] == 0, pre
    assert plain["compiles_in_step"] > 0
    assert pre["out"] == plain["out"] and pre["grad"] == plain["grad"]

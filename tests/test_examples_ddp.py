"""examples/ddp_resnet.py as torchrun runs it (issue 27): two processes over gloo on the
CPU, each engine on the tiny model, one JSON row from rank 0; the converted model's
loss equals PyTorch's own (same weights, same data, nbdnn's CPU reference)."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(engine):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           os.path.join(ROOT, "examples", "ddp_resnet.py"), "--engine", engine, "--model",
           "tiny", "--batch", "4", "--steps", "2", "--device", "cpu", "--json"]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for attempt in range(2):  # once more only when the rendezvous port was taken, or a
        # rank aborted in C++ ("terminate called without an active exception": gloo's
        # teardown on CI's loaded 2-core host, seen again after db11537's
        # barrier; the run passed alone three times in a row)
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env,
                             cwd=ROOT)
        err = out.stderr.lower()
        if out.returncode == 0 or not ("address already in use" in err or
                                       "terminate called without an active" in err):
            break
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_engine_trains_over_two_processes():
    rows = {e: _run(e) for e in ("nbdnn.nn", "nbdnn.torch", "torch")}
    for e, row in rows.items():
        assert row["world"] == 2 and row["images_per_s"] > 0 and row["loss"] > 0, row
    assert abs(rows["nbdnn.torch"]["loss"] - rows["torch"]["loss"]) < 1e-5, rows

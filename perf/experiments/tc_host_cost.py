"""Host cost of a tensor-core matmul call (issue 23: "within 2 us of a planned
matmul"), and whether blocks that make their own tensor maps (wgmma_gemm.OWN_MAPS)
are right and let the call plan.

Rows, bf16 256 x 256 x 256 torch tensors (the GPU time is a few us; the host's is what
is measured, `nbdnn.bench.host_cost`, median of 2000 calls): the same inputs each call
and new inputs each call (an activation of a training step is a new tensor: host-
encoded maps re-encode and upload two maps then), OWN_MAPS off and on; beside them
the planned float32 SIMT matmul of the same shape and torch.matmul. Then OWN_MAPS on:
the result of five calls on new tensors against torch, and whether a plan formed.

    PYTHONPATH=. python3 perf/experiments/tc_host_cost.py
"""
import numpy as np
import torch

import nbdnn
from nbdnn.bench import host_cost
from nbdnn.cuda.matmul import wgmma_gemm as W
from nbdnn.ops import _plan


def _pairs(n, dtype):
    g = torch.Generator().manual_seed(n)
    return [(torch.rand(256, 256, generator=g).to(dtype).cuda(),
             torch.rand(256, 256, generator=g).to(dtype).cuda()) for _ in range(n)]


def main():
    rows, default = {}, W.OWN_MAPS
    for own in (False, True):
        W.OWN_MAPS = own
        _plan.clear()  # (the key does not hold OWN_MAPS: a state learned with it off stays)
        same = _pairs(1, torch.bfloat16)[0]
        fresh = _pairs(64, torch.bfloat16)
        it = iter(range(10 ** 9))
        rows[f"bf16 same inputs, OWN_MAPS {own}"] = host_cost(lambda: nbdnn.matmul(*same))
        rows[f"bf16 new inputs, OWN_MAPS {own}"] = host_cost(
            lambda: nbdnn.matmul(*fresh[next(it) % 64]))
        states = [type(p).__name__ if type(p) is _plan.Plan else repr(p)
                  for p in _plan.plans_of_this_thread().values()]
        print(f"OWN_MAPS {own}: plan states {states}")
    W.OWN_MAPS = default
    f32 = _pairs(1, torch.float32)[0]
    rows["float32 ieee (SIMT), same inputs"] = host_cost(lambda: nbdnn.matmul(*f32))
    rows["torch.matmul bf16"] = host_cost(lambda: torch.matmul(*same))
    for k, v in rows.items():
        print(f"{k:45} {v * 1e6:8.2f} us")
    W.OWN_MAPS = True
    worst = 0.0
    for a, b in _pairs(5, torch.bfloat16):
        c = nbdnn.matmul(a, b)
        want = torch.matmul(a.double(), b.double())
        worst = max(worst, float(((c.double() - want).abs().max() / want.abs().max())))
    print(f"OWN_MAPS on, five calls on new tensors: max rel err {worst:.2e} "
          f"({'ok' if worst < 1e-2 else 'BAD'})")
    W.OWN_MAPS = default


if __name__ == "__main__":
    main()

"""One case of the tensor-core attention backward (flash_bwd.py) against the
float64 reference, in its own process (a kernel fault ends the CUDA context: run the
cases side by side in separate processes to tell which one faults), or the SASS of one
of its kernels around an offset a sanitizer named.

    PYTHONPATH=. python perf/experiments/flash_bwd_cases.py DTYPE D CAUSAL B HQ HK SQ SK LAYOUT
    PYTHONPATH=. python perf/experiments/flash_bwd_cases.py --sass dkv float16 64 0x9880
    (offset 0: just the counts of HGMMA and of local-memory loads and stores)

Prints one line: the case, then each gradient's largest error over its largest value, or
the exception's first line.
"""
import re
import sys

import numpy as np

import nbdnn
from nbdnn.cuda.attention import flash_bwd


def case(dtype, D, causal, B, Hq, Hk, Sq, Sk, layout):
    import ml_dtypes
    dt = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}[dtype]
    rng = np.random.default_rng(Sq * Sk)
    shape = (lambda H, S: (B, H, S, D)) if layout == "BHSD" else (lambda H, S: (B, S, H, D))
    q, do = (rng.normal(0, 1, shape(Hq, Sq)).astype(dt) for _ in range(2))
    k, v = (rng.normal(0, 1, shape(Hk, Sk)).astype(dt) for _ in range(2))
    kw = dict(is_causal=causal, enable_gqa=Hq != Hk, layout=layout)
    out = []
    for backend, args in (("cuda", (q, k, v, do)),
                          ("cpu", tuple(np.asarray(a, np.float64) for a in (q, k, v, do)))):
        o, lse = nbdnn.scaled_dot_product_attention(*args[:3], backend=backend, **kw)
        out.append([np.asarray(g, np.float64) for g in nbdnn.scaled_dot_product_attention_backward(
            args[3], *args[:3], o, lse, backend=backend, **kw)])
    return " ".join(f"{n} {np.abs(g - w).max() / max(np.abs(w).max(), 1e-6):.1e}"
                    for n, g, w in zip(("dq", "dk", "dv"), *out))


def sass(which, dtype, D, offset):
    kern = flash_bwd.kernel(which, dtype, D)
    text = kern.dispatcher.compile(kern.sigs[0]).inspect_sass()
    lines = text.splitlines()
    at = [i for i, s in enumerate(lines) if re.search(rf"/\*{offset:04x}\*/", s)]
    for i in at[:1]:
        print("\n".join(lines[max(0, i - 40):i + 8]))
    ops = re.findall(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\d+\s+)?([A-Z0-9_.]+)", text, re.M)
    counts = " ".join(f"{op} {sum(o.startswith(op) for o in ops)}" for op in ("HGMMA", "LDL", "STL"))
    print(f"({which} {dtype} D {D}: {len(lines)} lines, {counts}; offset {offset:#x} at line {at[:1]})")


if __name__ == "__main__":
    if sys.argv[1] == "--sass":
        sass(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5], 0))
        sys.exit()
    dtype, D, causal, B, Hq, Hk, Sq, Sk, layout = sys.argv[1:10]
    spec = (dtype, int(D), causal == "1", int(B), int(Hq), int(Hk), int(Sq), int(Sk), layout)
    try:
        print(*spec, ":", case(*spec), flush=True)
    except Exception as e:  # (a fault: its first line)
        print(*spec, ": failed:", str(e).splitlines()[0][:160], flush=True)

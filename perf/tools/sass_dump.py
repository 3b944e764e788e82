"""SASS of one registered kernel (needs nvdisasm: the GPU machine), with counts of the
local-memory (spill) instructions and of the FFMAs.

    PYTHONPATH=. python perf/tools/sass_dump.py nbdnn.cuda.conv conv_igemm_chunked_128x128x8_8x8 float32
    (the name may be a pattern, re.fullmatch: the first kernel it matches)
"""
import importlib
import re
import sys

import nbdnn.cuda  # noqa: F401  (numpy shim before numba.cuda)
from nbdnn.cuda.runtime.launch.kernel import REGISTRY

mod, name, dtype = sys.argv[1:4]
m = importlib.import_module(mod)
if hasattr(m, "ptx_examples"):  # kernels built on demand register when built
    m.ptx_examples()
for k in REGISTRY:
    sigs = [s for s in k.sigs if s.split("(", 1)[1].startswith(dtype)]
    if re.fullmatch(name, k.name) and sigs:  # (a name, or a pattern: its first kernel)
        sass = k.dispatcher.compile(sigs[0]).inspect_sass()
        print(sass)
        ops = re.findall(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\d+\s+)?([A-Z0-9_.]+)", sass, re.M)
        for op in ("LDL", "STL", "FFMA", "HGMMA", "HMMA", "UTMALDG", "UTMASTG", "LDG", "LDS", "STS",
                   "STG", "BAR", "IMAD"):
            print(op, sum(1 for o in ops if o.startswith(op)), file=sys.stderr)
        break

# quick GPU crosscheck of all registered specs with big shapes (probe)
import sys, time, numpy as np
import nbdnn.testing as T
from nbdnn.cuda import SIMULATOR
print("simulator:", SIMULATOR)
rng = np.random.default_rng(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
draw = lambda lo, hi: int(rng.integers(lo, hi + 1))
bad = 0
for s in T.SPECS:
    for dt in s.dtypes:
        for rep in range(3):
            c = s.make(draw, dt, True)
            strided = {0} if rep == 1 else set()
            blend = [None, (0.5, 0.75, 1), (1.0, 0.0, 2)][rep] if s.blend else None
            try:
                r = T.crosscheck(s, c, dt, strided=strided, blend=blend)
            except Exception as e:
                r = {"ok": False, "msg": repr(e)[:300], "max_abs": -1}
            if not r["ok"]:
                bad += 1; print("FAIL", s.name, dt, rep, r["msg"])
print("crosscheck failures:", bad)

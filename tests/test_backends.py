"""The op registry holds every public op, both backends' dispatch tables hold every
family (nbdnn/cpu/families.py, nbdnn/cuda/families.py), and every backend function an
op dispatches to exists in both backends under the same name: adding an op means
writing it in nbdnn/ops, nbdnn/cpu and nbdnn/cuda (and a spec row,
tests/test_crosscheck.py)."""
import numpy as np
import pytest

import nbdnn
from nbdnn import backend as _backend
from nbdnn.cuda import SIMULATOR, cuda
from nbdnn.ops.registry import OPS
from nbdnn.testing import SPECS


@pytest.mark.parametrize("backend", _backend.BACKENDS)
def test_the_dispatch_tables_hold_every_family_under_its_name(backend):
    table = _backend.families(backend)
    assert set(table) == {rec.family for rec in OPS.values()}
    for family, mod in table.items():
        assert mod.__name__ == f"nbdnn.{backend}.{family}"


@pytest.mark.parametrize("name", sorted(OPS))
def test_backends_have_every_dispatched_function(name):
    rec = OPS[name]
    for backend in _backend.BACKENDS:
        mod = _backend.families(backend)[rec.family]
        missing = sorted(n for n in rec.dispatches if not callable(getattr(mod, n, None)))
        assert not missing, f"{name}: nbdnn.{backend}.{rec.family} lacks {missing}"


SETTINGS = {"get_math", "math_mode", "set_math"}  # process settings, not ops


def test_the_exports_are_the_registry():
    public = {n for n in dir(nbdnn) if callable(getattr(nbdnn, n)) and not n.startswith("_")
              and not isinstance(getattr(nbdnn, n), type)}
    assert public == set(OPS) | SETTINGS
    assert set(nbdnn.__all__) >= set(OPS)
    for n, rec in OPS.items():
        fn = getattr(nbdnn, n)
        assert (getattr(fn, "unplanned", fn) is rec.fn) and (hasattr(fn, "unplanned") ==
                                                              (rec.planned and fn is not rec.fn))


def test_every_backward_is_an_op_and_every_op_has_a_row():
    for rec in OPS.values():
        assert all(b in OPS for b in rec.backward), rec
    checked = {n for s in SPECS for n in s.ops}
    assert checked <= set(OPS), checked - set(OPS)
    no_row = [n for n, rec in OPS.items() if rec.dispatches and n not in checked]
    assert not no_row, f"ops without a cross-check row: {no_row}"


def _run(code):
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)


def test_the_simulator_does_not_depend_on_import_order():
    """nbdnn imported before numba.cuda chooses the simulator where there is no GPU;
    imported after, a CUDA call says how to get it (a DeviceError, not numba's
    CudaSupportError from inside a launch)."""
    from nbdnn._gpu_check import driver_status
    if driver_status()[0]:
        pytest.skip("a GPU is here: both orders run on it")
    call = "nbdnn.softmax(np.ones((2, 3), np.float32), backend='cuda')"
    r = _run(f"import numpy as np, nbdnn\nfrom numba import cuda\n{call}\n"
             "from nbdnn.cuda import SIMULATOR; assert SIMULATOR")
    assert r.returncode == 0, r.stderr[-2000:]
    r = _run(f"from numba import cuda\nimport numpy as np, nbdnn\ntry:\n    {call}\n"
             "except nbdnn.DeviceError as e:\n    print('DeviceError', e)")
    assert r.returncode == 0 and "DeviceError" in r.stdout and "NUMBA_ENABLE_CUDASIM" in \
        r.stdout, (r.stdout, r.stderr[-2000:])


def test_the_simulators_thread_poll_yields_the_gil():
    """Under the simulator nbdnn makes the launching thread's poll of each block thread
    yield the GIL first (nbdnn/cuda/runtime/simulator.py: without it a barrier-heavy
    kernel waited for 5 ms forced switches, 5-600 s by chance); a kernel with barriers
    still runs right with it."""
    if not SIMULATOR:
        pytest.skip("numba's simulator is not active")
    from numba.cuda.simulator import kernel
    assert "is_alive" in vars(kernel.BlockThread), "the simulator's poll is not patched"

    @cuda.jit
    def reverse(x):
        s = cuda.shared.array(32, np.float32)
        i = cuda.threadIdx.x
        s[i] = x[i]
        cuda.syncthreads()
        x[i] = s[31 - i]
        cuda.syncthreads()

    x = np.arange(32, dtype=np.float32)
    d = cuda.to_device(x)
    reverse[1, 32](d)
    np.testing.assert_array_equal(d.copy_to_host(), x[::-1])

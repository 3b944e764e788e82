"""Which softmax kernel runs for which shape (nbdnn.cuda.softmax._path), and the
paths that random shapes reach rarely under the simulator: 16-vector register rows
(forward rows past ROWS_V16_MIN) checked on short rows by lowering the threshold."""
import numpy as np
import pytest

import nbdnn
from nbdnn.cuda import softmax as S


def test_path_choice_by_shape():
    rows = S._target()  # enough rows to fill the GPU
    assert S._path(rows, 1000, 1, False, None) == ("rows", (8, 32))
    assert S._path(rows, 4096, 1, False, None) == ("rows", (8, 128))
    assert S._path(rows, 16384, 1, False, None) == ("rows", (16, 256))
    assert S._path(rows, 32768, 1, False, None) == ("rows", (16, 512))
    assert S._path(rows, 16384, 1, True, None) == ("rows", (8, 512))
    assert S._path(rows, 32768, 1, True, None) == ("fused", None)
    assert S._path(rows, 65536, 1, False, None) == ("fused", None)
    assert S._path(rows, 65537, 1, False, None) == ("long", None)
    assert S._path(1, 40000, 1, False, None) == ("long", None)  # one row: split it
    assert S._path(rows, 100, 3, False, None) == ("strided", None)
    assert S._path(rows, 100, 1, False, "fused") == ("fused", None)
    # float64: two registers a value, so shorter register rows (no spills)
    assert S._path(rows, 1024, 1, False, None, True) == ("rows", (2, 128))
    assert S._path(rows, 8192, 1, False, None, True) == ("rows", (2, 1024))
    assert S._path(rows, 8192, 1, True, None, True) == ("rows", (4, 512))
    assert S._path(rows, 8200, 1, False, None, True) == ("fused", None)
    assert S._path(rows, 256, 1, False, None, True) == ("rows", (2, 32))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the simulator's NumPy scalars
@pytest.mark.parametrize("L", [2052, 2101])             # vector and scalar paths
@pytest.mark.parametrize("algo", ["fast", "accurate", "log"])
def test_sixteen_vector_rows_match_the_reference(monkeypatch, L, algo):
    monkeypatch.setattr(S, "ROWS_V16_MIN", 0)
    monkeypatch.setattr(S, "_CHOICES", {})  # choices made under the real threshold: not here
    assert S.rows_config(L, False, True) == (16, 64)
    rng = np.random.default_rng(L)
    x = rng.standard_normal((2, L)).astype(np.float32) * 4
    out = rng.standard_normal((2, L)).astype(np.float32)
    ref = 0.5 * nbdnn.softmax(x, -1, algo=algo) + 0.25 * out
    with S.forced("rows_block"):
        got = nbdnn.softmax(x, -1, algo=algo, alpha=0.5, beta=0.25, out=out.copy(),
                            backend="cuda")
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-6)


def test_forced_runs_the_named_path_and_keeps_plans_out():
    """forced(name) puts this thread's calls on that path (the names of the kernels
    launched), with the reference's answer; outside, the choice is the shape's again,
    and calls inside neither record nor replay eager call plans (ops/_plan.py)."""
    from nbdnn.cuda.runtime.memory.arrays import to_device
    from nbdnn.cuda.runtime.launch.kernel import launched
    from nbdnn.ops import _plan
    h = np.random.default_rng(0).standard_normal((2, 65)).astype(np.float32)
    want, x = nbdnn.softmax(h, -1), to_device(h)
    kernels = {"fused": ["softmax_fused"], "long": ["softmax_long_stats", "softmax_long_apply"],
               "strided": ["softmax_strided"]}
    for path, names in kernels.items():
        _plan.clear()
        with S.forced(path):
            for _ in range(5):  # past the 4th call: a plan would replay here
                with launched() as got:
                    y = nbdnn.softmax(x, -1)
                assert got == names, (path, got)
                np.testing.assert_allclose(y.copy_to_host(), want, rtol=1e-5, atol=1e-6)
            assert not _plan.plans_of_this_thread(), path
    with launched() as got:
        nbdnn.softmax(x, -1)
    assert got == ["softmax_rows_fwd_v1"]
    with pytest.raises(ValueError, match="rows_block"):
        with S.forced("tiled"):
            pass

"""The stencil kernels' source helpers (nbdnn/cuda/runtime/device_code/stencil.py), on the host."""
import numpy as np

from nbdnn.cuda.runtime.device_code.stencil import magic, rows_per_thread


def test_magic_division_is_exact_below_2_31():
    """n // d == (n * m) >> s for every divisor tried and numerators at the edges."""
    rng = np.random.default_rng(0)
    divisors = list(range(1, 1500)) + [2 ** k + e for k in range(11, 32) for e in (-1, 0, 1)]
    for d in divisors:
        m, s = magic(d)
        assert 0 < m < 2 ** 32, d
        top = 2 ** 31 - 1
        edges = [0, 1, d - 1, d, d + 1, top, top // d * d, top // d * d - 1]
        for n in [int(v) for v in rng.integers(0, 2 ** 31, 64)] + [e for e in edges if e >= 0]:
            assert (n * m) >> s == n // d, (n, d)


def test_rows_per_thread_balances_groups_and_caps_loads():
    assert rows_per_thread(3, 3, 1, 1, 14, 8, 64) == 7       # 7 + 7, not 8 + 6
    assert rows_per_thread(3, 3, 1, 1, 7, 4, 64) == 4        # 4 + 3
    assert rows_per_thread(3, 3, 1, 1, 3, 8, 64) == 3        # the map's rows
    assert rows_per_thread(5, 5, 1, 1, 56, 8, 40) == 4       # 8 rows of 5 taps

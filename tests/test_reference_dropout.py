"""Dropout's generator against Random123's known answers, its mask against a
binomial test, p = 0 and p = 1 exactly, and the CPU and CUDA masks bit for bit."""
import math

import numpy as np
import pytest

import nbdnn
from nbdnn._philox import philox4x32_10

# Random123 tests/kat_vectors, "philox4x32 10": counter[4] key[2] -> result[4]
KAT = [((0, 0, 0, 0), (0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
       ((0xffffffff,) * 4, (0xffffffff,) * 2, (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
       ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
        (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1))]


@pytest.mark.parametrize("ctr, key, expect", KAT)
def test_philox_known_answers(ctr, key, expect):
    assert tuple(int(w) for w in philox4x32_10(*ctr, *key)) == expect


@pytest.mark.parametrize("ctr, key, expect", KAT)
def test_device_philox_in_32_bit_words_gives_the_known_answers(ctr, key, expect):
    """nbdnn.cuda.dropout.philox4x32_10_u32 (the flash attention kernels' generator)."""
    from nbdnn.cuda import cuda
    from nbdnn.cuda.dropout import philox4x32_10_u32
    from numba import types

    @cuda.jit
    def draw(args, out):
        u = types.uint32
        w = philox4x32_10_u32(u(args[0]), u(args[1]), u(args[2]), u(args[3]), u(args[4]),
                              u(args[5]))
        for i in range(4):
            out[i] = w[i]
    out = cuda.to_device(np.zeros(4, np.uint32))
    draw[1, 1](cuda.to_device(np.array(ctr + key, np.uint32)), out)
    assert tuple(int(w) for w in out.copy_to_host()) == expect


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_rate_is_binomial(p):
    n = 1 << 18
    _, m = nbdnn.dropout(np.ones(n, np.float32), p, seed=123, offset=7)
    kept = int(m.sum())
    sd = math.sqrt(n * p * (1 - p))
    assert abs(kept - n * (1 - p)) < 5 * sd  # a 5-sigma two-sided test
    # neighbouring elements (one Philox call) are not correlated
    assert abs(np.corrcoef(m[0::2].astype(float), m[1::2].astype(float))[0, 1]) < 0.02


def test_p_zero_and_one_are_exact():
    x = np.random.default_rng(0).standard_normal(1001).astype(np.float32)
    y, m = nbdnn.dropout(x, 0.0, seed=1)
    assert m.all() and np.array_equal(y, x)
    y, m = nbdnn.dropout(x, 1.0, seed=1)
    assert not m.any() and not y.any()


def test_forward_scales_and_backward_matches():
    x = np.random.default_rng(1).standard_normal((4, 50))
    y, m = nbdnn.dropout(x, 0.25, seed=9, offset=3)
    np.testing.assert_allclose(y, x * m / 0.75, rtol=1e-15)
    dy = np.random.default_rng(2).standard_normal((4, 50))
    np.testing.assert_allclose(nbdnn.dropout_backward(dy, m, 0.25), dy * m / 0.75, rtol=1e-15)


def test_offsets_and_seeds_give_fresh_masks():
    x = np.ones(4096, np.float32)
    masks = [nbdnn.dropout(x, 0.5, seed=s, offset=o)[1] for s, o in ((1, 0), (1, 4096), (2, 0))]
    for a in range(3):
        for b in range(a + 1, 3):
            assert 0.4 < np.mean(masks[a] == masks[b]) < 0.6


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the simulator's NumPy scalars
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("p, seed, offset", [(0.3, 0, 0), (0.7, 2 ** 64 - 1, 2 ** 40 + 3),
                                             (0.0, 5, 1), (1.0, 5, 1)])
def test_cuda_mask_is_the_cpu_mask_bit_for_bit(dtype, p, seed, offset):
    x = np.random.default_rng(3).standard_normal((3, 41)).astype(dtype)
    y, m = nbdnn.dropout(x, p, seed=seed, offset=offset)
    yg, mg = nbdnn.dropout(x, p, seed=seed, offset=offset, backend="cuda")
    assert mg.dtype == np.uint8 and np.array_equal(mg, m)
    np.testing.assert_array_equal(yg, y)
    np.testing.assert_array_equal(nbdnn.dropout_backward(x, m, p, backend="cuda"),
                                  nbdnn.dropout_backward(x, m, p))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the simulator's NumPy scalars
@pytest.mark.parametrize("n, offset", [(2048, 0), (1015, 0), (1015, 1)])
def test_cuda_vector_and_scalar_paths_match_cpu(n, offset):
    """16-byte vectors with 4-byte mask words (aligned, whole vectors), the scalar tail
    (n not a multiple of the vectors a block covers) and misaligned views."""
    from nbdnn.cuda.runtime.memory.arrays import to_device, to_host
    x = np.random.default_rng(n).standard_normal(n + 1).astype(np.float32)
    xd = to_device(x)[offset:offset + n]
    y, m = nbdnn.dropout(x[offset:offset + n], 0.4, seed=9, offset=7)
    yg, mg = nbdnn.dropout(xd, 0.4, seed=9, offset=7)
    np.testing.assert_array_equal(to_host(mg), m)
    np.testing.assert_array_equal(to_host(yg), y)
    dx = nbdnn.dropout_backward(xd, mg, 0.4)
    np.testing.assert_array_equal(to_host(dx), nbdnn.dropout_backward(x[offset:offset + n],
                                                                      m, 0.4))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the simulator's NumPy scalars
@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_counter_offset_draws_the_int_offsets_masks_and_advances(backend):
    """A uint64 counter gives the masks of offsets start, start + n, ... and ends at
    start + 3n (wrapping at 2**64); on CUDA the counter lives and advances on the GPU."""
    x = np.random.default_rng(4).standard_normal((5, 7)).astype(np.float32)
    start = 2 ** 64 - 40
    counter = np.array([start], np.uint64)
    if backend == "cuda":
        from numba import cuda
        xs, counter = cuda.to_device(x), cuda.to_device(counter)
    else:
        xs = x
    for k in range(3):
        y, m = nbdnn.dropout(xs, 0.4, seed=11, offset=counter)
        ye, me = nbdnn.dropout(x, 0.4, seed=11, offset=(start + k * x.size) % 2 ** 64)
        host = (lambda a: a) if backend == "cpu" else (lambda a: a.copy_to_host())
        assert np.array_equal(host(m), me) and np.array_equal(host(y), ye)
    end = counter if backend == "cpu" else counter.copy_to_host()
    assert int(end[0]) == (start + 3 * x.size) % 2 ** 64


def test_counter_offset_forced_onto_cuda_is_copied_back():
    x = np.ones((2, 8), np.float32)
    counter = np.zeros(1, np.uint64)
    _, m = nbdnn.dropout(x, 0.5, seed=1, offset=counter, backend="cuda")
    assert int(counter[0]) == 16
    assert np.array_equal(m, nbdnn.dropout(x, 0.5, seed=1, offset=0)[1])

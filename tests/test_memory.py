"""Device-memory helpers (nbdnn/cuda/runtime/memory): padded_rows, which gives the
tensor-core GEMM rows a TMA map can stride over, in the simulator and on a GPU."""
import numpy as np
import pytest

from nbdnn.cuda.runtime.memory.arrays import to_device, to_host
from nbdnn.cuda.runtime.memory.strided import padded_rows


# (shape, width): a row widened by one element, rows already whole (a plain copy), a
# batch of matrices, one row, no rows
@pytest.mark.parametrize("shape,width", [((3, 5), 8), ((4, 8), 8), ((2, 3, 13), 16),
                                         ((1, 7), 8), ((0, 5), 8)])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_padded_rows_copies_each_row_then_zeros(shape, width, dtype):
    x = np.arange(1, np.prod(shape) + 1).reshape(shape).astype(dtype)
    got = to_host(padded_rows(to_device(x), width))
    want = np.zeros(shape[:-1] + (width,), dtype)
    want[..., :shape[-1]] = x
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_padded_rows_of_torch_bfloat16_stay_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch CUDA tensors")
    x = torch.randn(6, 50, dtype=torch.bfloat16, device="cuda")
    got = padded_rows(x, 56)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16
    assert torch.equal(got[:, :50], x) and not got[:, 50:].any()

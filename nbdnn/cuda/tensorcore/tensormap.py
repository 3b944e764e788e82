"""TMA tensor maps, built on the host through cuda-bindings and kept on the device.

A tensor map (CUtensorMap, 128 bytes) describes a tensor in global memory (base
address, sizes, byte strides, element type) and the box one TMA copy moves (its size
in elements, the shared-memory swizzle). numba cannot pass it as a __grid_constant__
kernel parameter, so it is copied into a device array and the kernel takes its
address (tma.fence_proxy_tensormap_acquire before first use). Encoding costs a few
microseconds of host time: maps are cached per (address, shape, strides, dtype, box,
swizzle), so a plan or a graph replay reuses them.
"""
import functools

import numpy as np

DTYPES = {"float16": "FLOAT16", "bfloat16": "BFLOAT16", "float32": "FLOAT32",
          "tfloat32": "TFLOAT32", "uint16": "UINT16", "uint32": "UINT32"}
SWIZZLES = {"none": "NONE", "32B": "32B", "64B": "64B", "128B": "128B"}


def tensor_map(address, shape, dtype, box, swizzle="none"):
    """Device address (int) of the tensor map for a row-major tensor at `address` of
    `shape` (outermost first) and `dtype` name, moved in boxes of `box` elements
    (outermost first); swizzle: "none", "32B", "64B" or "128B" (the box's inner extent
    in bytes must not exceed it). Cached; the device copy lives as long as the cache."""
    return encoded(address, shape, dtype, box, swizzle)[0]


def encoded(address, shape, dtype, box, swizzle="none"):
    """(device address, device array) of the tensor map tensor_map describes: a kernel
    launch recorded into a graph keeps the array alive (launch's `owners`)."""
    return _encoded(int(address), tuple(int(s) for s in shape), str(dtype),
                    tuple(int(b) for b in box), swizzle)


@functools.lru_cache(maxsize=1024)
def _encoded(address, shape, dtype, box, swizzle):
    from cuda.bindings import driver as drv
    from numba import cuda
    if dtype not in DTYPES or swizzle not in SWIZZLES or len(box) != len(shape):
        raise ValueError(f"tensor_map: dtype {dtype!r}, swizzle {swizzle!r}, box {box} "
                         f"for shape {shape}")
    item = np.dtype(np.uint16 if dtype in ("bfloat16", "float16", "uint16") else
                    np.uint32).itemsize
    rank = len(shape)
    dims = [drv.cuuint64_t(s) for s in reversed(shape)]           # innermost first
    strides = [drv.cuuint64_t(item * int(np.prod(shape[i + 1:]))) for i in
               reversed(range(rank - 1))]                          # (dims 1.. in bytes)
    err, tm = drv.cuTensorMapEncodeTiled(
        getattr(drv.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{DTYPES[dtype]}"), rank,
        address, dims, strides, [drv.cuuint32_t(b) for b in reversed(box)],
        [drv.cuuint32_t(1)] * rank, drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        getattr(drv.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{SWIZZLES[swizzle]}"),
        drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if err != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuTensorMapEncodeTiled: {err} (shape {shape}, box {box}, "
                           f"{dtype}, swizzle {swizzle})")
    dev = cuda.to_device(np.array([int(v) for v in tm.opaque], dtype=np.uint64))
    return dev.__cuda_array_interface__["data"][0], dev  # (allocations: 256-B aligned)

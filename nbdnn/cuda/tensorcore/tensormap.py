"""TMA tensor maps, built on the host through cuda-bindings and kept on the device.

A tensor map (CUtensorMap, 128 bytes) describes a tensor in global memory (base
address, sizes, byte strides, element type) and the box one TMA copy moves (its size
in elements, the shared-memory swizzle). numba cannot pass it as a __grid_constant__
kernel parameter, so it is copied into a device array and the kernel takes its
address (tma.fence_proxy_tensormap_acquire before first use). Encoding costs a few
microseconds of host time: the 128 bytes are cached per (address, shape, strides,
dtype, box, swizzle), their device copies per content, so a plan or a graph replay
reuses them.

Inside a CUDA stream capture (torch.cuda.graph) an upload is forbidden: cuMemAlloc
and a synchronous copy break the capture, and PyTorch's graph pool hands out addresses
the warm-up never saw (H200: a captured bf16 ResNet-50 step failed here). So a
map for a capturing stream that is not on the device yet is written by a one-thread
kernel (`_write_words`, its 16 words as kernel parameters, which the graph keeps) into
16 words from the caller's allocator (PyTorch's graph pool: the graph owns them), and
every replay writes it again before the kernel that reads it. A map already on the
device that a capture uses is kept for good (the graph holds its address; the cache
would free it on eviction).

Eager call plans: a map's device address is a plain integer kernel argument, so the
encoders tell a recording call how it was made (`_noted`), and a plan's replay makes
the map for its own tensors (`map_address`). Eager uploads wait until the copy
lands: a kernel on a non-blocking stream could otherwise read the map before it does
(an H200 probe: an illegal instruction).
"""
import collections
import functools

import numpy as np
from numba import cuda

from ..runtime.memory.arrays import capture_state, empty, landed_copy, ptr, stream_handle
from ..runtime.capture.graph import capturing
from ..runtime.launch.kernel import Kernel

DTYPES = {"float16": "FLOAT16", "bfloat16": "BFLOAT16", "float32": "FLOAT32",
          "tfloat32": "TFLOAT32", "uint16": "UINT16", "uint32": "UINT32"}
SWIZZLES = {"none": "NONE", "32B": "32B", "64B": "64B", "128B": "128B"}


def tensor_map(address, shape, dtype, box, swizzle="none"):
    """Device address (int) of the tensor map for a row-major tensor at `address` of
    `shape` (outermost first) and `dtype` name, moved in boxes of `box` elements
    (outermost first); swizzle: "none", "32B", "64B" or "128B" (the box's inner extent
    in bytes must not exceed it). Cached; the device copy lives as long as the cache.
    Rank 2 or more (the H200's driver refused a rank-1 map through cuda-bindings); a
    box's first byte must be 16-byte aligned in global memory (else the load is
    an illegal instruction: H200)."""
    return encoded(address, shape, dtype, box, swizzle)[0]


def encoded(address, shape, dtype, box, swizzle="none", stream=0, like=None):
    """(device address, device array) of the tensor map tensor_map describes: a kernel
    launch recorded into a graph keeps the array alive (launch's `owners`). stream: the
    launch's (a capturing one gets the map written on it, module docstring); like: an
    array of the caller's kind, whose allocator then holds the map."""
    static = (tuple(int(s) for s in shape), str(dtype), tuple(int(b) for b in box), swizzle)
    return _noted(_placed(_encoded(int(address), *static), stream, like), address,
                  ("tiled",) + static)


def encoded_im2col(address, shape, dtype, pixels, channels, lower, upper, strides,
                   swizzle="128B", stream=0, like=None):
    """(device address, device array) of an im2col tensor map (TMA's im2col mode, for
    convolution) of the channels-last tensor at `address` of `shape` (N, [H,] W, C),
    outermost first: a load moves `pixels` pixels (rows of shared memory) of `channels`
    channels each (one 128-byte row for 16-bit data and 64 channels). lower, upper:
    the bounding box of the window corners per spatial axis (outermost first), lower
    corner relative to 0, upper to the axis' last element (-padding and
    (out - 1) * stride - size + 1 - padding for a convolution); strides: the step
    between consecutive pixels per spatial axis (the convolution's stride); stream,
    like: as `encoded`'s."""
    static = (tuple(int(s) for s in shape), str(dtype), int(pixels), int(channels),
              tuple(int(v) for v in lower), tuple(int(v) for v in upper),
              tuple(int(v) for v in strides), swizzle)
    return _noted(_placed(_encoded_im2col(int(address), *static), stream, like), address,
                  ("im2col",) + static)


def map_address(address, kind, *static):
    """The device address of the map of `kind` ("tiled", "im2col") at `address` with
    the rest of its encoding (an eager call plan's replay: plan_record.py)."""
    return _placed(_ENCODERS[kind](address, *static), 0, None)[0]


def _noted(placed, address, spec):
    """placed, its address told to an eager call being recorded for its plan (a replay
    makes the map for its own tensors' addresses: map_address)."""
    rec = capture_state.__dict__.get("plan")
    if rec is not None:
        rec.derive(placed[0], int(address), (map_address,) + spec)
    return placed


@functools.lru_cache(maxsize=1024)
def _encoded_im2col(address, shape, dtype, pixels, channels, lower, upper, strides, swizzle):
    from cuda.bindings import driver as drv
    drv_args = _layout(drv, shape, dtype)
    err, tm = drv.cuTensorMapEncodeIm2col(
        *drv_args[:2], address, *drv_args[2:], list(reversed(lower)), list(reversed(upper)),
        channels, pixels, [drv.cuuint32_t(v) for v in (1,) + tuple(reversed(strides)) + (1,)],
        *_modes(drv, swizzle))
    return _words(drv, err, tm, f"cuTensorMapEncodeIm2col (shape {shape}, {pixels} "
                      f"pixels x {channels} channels, box {lower}..{upper}, strides {strides})")


def _layout(drv, shape, dtype):
    """(data type, rank, dims, byte strides) of a row-major tensor, innermost first."""
    if dtype not in DTYPES:
        raise ValueError(f"tensor_map: dtype {dtype!r}")
    item = 2 if dtype in ("bfloat16", "float16", "uint16") else 4
    rank = len(shape)
    dims = [drv.cuuint64_t(s) for s in reversed(shape)]           # innermost first
    strides = [drv.cuuint64_t(item * int(np.prod(shape[i + 1:]))) for i in
               reversed(range(rank - 1))]                          # (dims 1.. in bytes)
    return (getattr(drv.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{DTYPES[dtype]}"),
            rank, dims, strides)


def _modes(drv, swizzle):
    """The encoders' last four arguments: no interleave, the swizzle, 256-byte L2
    promotion, out-of-bounds elements as zeros."""
    return (drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            getattr(drv.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{SWIZZLES[swizzle]}"),
            drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)


def _words(drv, err, tm, what):
    """The 16 words of an encoded map; RuntimeError naming `what` when the encoder
    failed."""
    if err != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what}: {err}")
    return tuple(int(v) for v in tm.opaque)


UPLOADS = 1024  # device copies cached (128 B each), least recently used dropped
_uploads = collections.OrderedDict()  # words -> (address, device array)
_kept = {}  # words -> (address, device array): used by a capture, never dropped


def _placed(words, stream, like):
    """(device address, device array) holding `words` for a launch on `stream`."""
    hit = _kept.get(words)
    if hit is not None:
        return hit
    hit = _uploads.get(words)
    if stream and capturing(stream_handle(stream)):
        if hit is None:
            return _written(words, stream, like)
        _kept[words] = _uploads.pop(words)
    elif hit is None:
        dev = landed_copy(np.array(words, dtype=np.uint64))  # (a recorded call stays
        # plannable: its replay makes the map itself, map_address)
        hit = _uploads[words] = ptr(dev), dev  # (allocations: 256-byte aligned)
        if len(_uploads) > UPLOADS:
            _uploads.popitem(last=False)
    else:
        _uploads.move_to_end(words)
    return hit


def _write_words(dst, w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14,
                 w15):
    """dst[:16] = the words (one thread: 128 bytes, once a replay)."""
    if cuda.threadIdx.x == 0:
        dst[0], dst[1], dst[2], dst[3], dst[4], dst[5], dst[6], dst[7] = \
            w0, w1, w2, w3, w4, w5, w6, w7
        dst[8], dst[9], dst[10], dst[11], dst[12], dst[13], dst[14], dst[15] = \
            w8, w9, w10, w11, w12, w13, w14, w15


WRITE_SIG = "void(uint64[::1], " + ", ".join(["uint64"] * 16) + ")"
WRITER = Kernel(_write_words, [WRITE_SIG])


def _written(words, stream, like):
    """A map written on a capturing stream into 16 words of like's allocator."""
    if like is None or not (type(like).__module__ or "").startswith(("torch", "cupy")):
        from ...errors import NotSupportedError
        raise NotSupportedError(
            "nbdnn: a TMA tensor map for a new address during a CUDA stream capture needs "
            "PyTorch or CuPy arrays (their allocators work inside a capture); warm up with "
            "the same buffers first, or use nbdnn.cuda.Graph")
    dst = empty(like, (16,), "uint64")
    WRITER.launch(WRITE_SIG, 1, 32, stream_handle(stream), dst, *words, owners=(dst,))
    return ptr(dst), dst


@functools.lru_cache(maxsize=1024)
def _encoded(address, shape, dtype, box, swizzle):
    from cuda.bindings import driver as drv
    if swizzle not in SWIZZLES or len(box) != len(shape) or len(shape) < 2:
        raise ValueError(f"tensor_map: dtype {dtype!r}, swizzle {swizzle!r}, box {box} "
                         f"for shape {shape}")
    kind, rank, dims, strides = _layout(drv, shape, dtype)
    err, tm = drv.cuTensorMapEncodeTiled(
        kind, rank, address, dims, strides, [drv.cuuint32_t(b) for b in reversed(box)],
        [drv.cuuint32_t(1)] * rank, *_modes(drv, swizzle))
    return _words(drv, err, tm, f"cuTensorMapEncodeTiled (shape {shape}, box {box}, "
                      f"{dtype}, swizzle {swizzle})")


_ENCODERS = {"tiled": _encoded, "im2col": _encoded_im2col}

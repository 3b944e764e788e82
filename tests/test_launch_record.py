"""The fast launch path's parameter layout, checked without a GPU (the simulator never
takes this path): _Launcher's one buffer holds the launch record that
`_launch_record` reads (slot 0 function, 1 parameter array, 2-4 grid, 5-7 block, 8
shared bytes, 9 stream) followed by one 8-byte slot a kernel parameter, laid out as
numba passes arguments (an array: meminfo, parent, nitems, itemsize, data, shape,
stride)."""
import ctypes
import struct
import types

import numpy as np
from numba.core import sigutils

from nbdnn.cuda.runtime.launch import kernel as _launch


def _launcher(monkeypatch, sig):
    monkeypatch.setattr(_launch, "driver", types.SimpleNamespace(CUfunction=lambda h: h))
    argtypes, _ = sigutils.normalize_signature(sig)
    return _launch._Launcher(0xABC0, argtypes, "k")


def test_record_and_parameter_slots(monkeypatch):
    la = _launcher(monkeypatch, "void(float32[::1], int64, float64, float32, int32)")
    base = ctypes.addressof(la.buf)
    nslots = 7 + 4
    assert len(la.buf.raw) == 80 + 8 * nslots
    assert list(la.params) == [base + 80 + 8 * i for i in range(nslots)]
    la.pack(3, 2, 1, 128, 1, 1, 512, 2 ** 63 + 5, (0xD000, 1000), 7, 2.5, 1.5, -3)
    rec = la.record
    assert rec.dtype == np.int64 and rec.ctypes.data == base
    assert rec[0] == 0xABC0 and rec[1] == la.params_address == ctypes.addressof(la.params)
    assert list(rec[2:9]) == [3, 2, 1, 128, 1, 1, 512]
    assert rec[9] == np.int64(5 - 2 ** 63)  # the stream's 64 bits, as the driver reads them
    params = la.buf.raw[80:]
    assert struct.unpack_from("<qqqqQqq", params, 0) == (0, 0, 1000, 4, 0xD000, 1000, 4)
    assert struct.unpack_from("<qd", params, 56) == (7, 2.5)
    assert struct.unpack_from("<f", params, 72)[0] == 1.5
    assert struct.unpack_from("<i", params, 80)[0] == -3


def test_pack_takes_device_arrays_through_ptr_size(monkeypatch):
    la = _launcher(monkeypatch, "void(float64[::1], float64[::1])")
    calls = []
    monkeypatch.setitem(la.pack.__globals__, "ptr_size",
                        lambda a: calls.append(a) or (0x1000 * len(calls), 9))
    la.pack(1, 1, 1, 32, 1, 1, 0, 0, "x", (0x5000, 4))
    assert calls == ["x"]  # a (pointer, count) tuple is taken as it is
    p = la.buf.raw[80:]
    assert struct.unpack_from("<qqqqQqq", p, 0) == (0, 0, 9, 8, 0x1000, 9, 8)
    assert struct.unpack_from("<qqqqQqq", p, 56) == (0, 0, 4, 8, 0x5000, 4, 8)


def test_launched_blocks_nest():
    """launched(): an enclosing block's list also gets the names launched inside an
    inner block (a test that wraps a helper which watches launches itself)."""
    import nbdnn
    x = np.linspace(-1, 1, 64).astype(np.float32)
    with _launch.launched() as outer:
        nbdnn.activation(x, "relu", backend="cuda")
        with _launch.launched() as inner:
            nbdnn.activation(x, "relu", backend="cuda")
        assert inner and outer == 2 * inner

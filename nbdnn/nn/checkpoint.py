"""A model's checkpoint file: NumPy's .npz (a zip of .npy arrays, no pickles), one member
a parameter or buffer, named as Sequential.state() names them.

Writing is atomic (nbdnn/_files.py): a Ctrl-C or a full disk part-way leaves the previous
checkpoint whole. bfloat16 has no NumPy type of its own in a .npy header (ml_dtypes'
arrays would be stored as raw 2-byte voids, `|V2`), so bfloat16 arrays are stored as
their uint16 bits and listed in the member BF16_LIST; a `|V2` member written by an
older nbdnn is read as bfloat16 where the model holds bfloat16.

Reading trusts nothing in the file: a path that is not a regular file (a FIFO, a
device) is refused without opening it; a .npy file, a file that is no zip, a member
that is not an .npy array, a missing or extra key are named errors; each member's
shape and dtype are read from its .npy header and checked against the model, and its
size from the zip's directory, before its data is read, so a small file cannot make
load allocate more than the model's own arrays."""
import os
import stat
import zipfile

import ml_dtypes
import numpy as np

from .._files import atomic_write
from ..errors import BadParamError, DtypeError, NbdnnError, ShapeError

BF16_LIST = "nbdnn.bfloat16"  # member: the names of the members holding bfloat16 bits
_BF16 = np.dtype(ml_dtypes.bfloat16)
_HEADER_ROOM = 1 << 16  # bytes an .npy header may take beyond its data


def write(path, state):
    """state (name -> host array) to path (".npz" added when missing), atomically."""
    p = os.fspath(path)
    if not p.endswith(".npz"):
        p += ".npz"
    arrays, bf16 = {}, []
    for k, a in state.items():
        if a.dtype == _BF16:
            arrays[k] = a.view(np.uint16)
            bf16.append(k)
        else:
            arrays[k] = a
    if bf16:
        arrays[BF16_LIST] = np.array(bf16)
    with atomic_write(p) as f:
        np.savez(f, **arrays)
    return p


def resolve(path):
    """The file save() wrote for `path` (with or without ".npz")."""
    p = os.fspath(path)
    if not os.path.exists(p) and os.path.exists(p + ".npz"):
        p += ".npz"
    return p


def read(p, want):
    """{name: host array in the model's dtype} for every name in want (name -> the
    model's array); an NbdnnError naming the file (and the member) for anything else."""
    try:
        st = os.stat(p)
    except OSError as e:
        raise BadParamError(f"load: cannot read {p}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise BadParamError(f"load: {p} is not a regular file (a folder, a FIFO or a device)")
    with open(p, "rb") as f:
        magic = f.read(6)
    if magic == b"\x93NUMPY":
        raise BadParamError(f"load: {p} is an .npy file (one array), not a saved model (.npz)")
    try:
        with zipfile.ZipFile(p) as z:
            return _members(p, z, want)
    except NbdnnError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError,
            NotImplementedError) as e:
        raise BadParamError(f"load: cannot read {p} as a saved model (.npz): "
                            f"{type(e).__name__}: {e}") from None


def _members(p, z, want):
    infos = {}
    for info in z.infolist():
        if not info.filename.endswith(".npy"):
            raise BadParamError(f"load: {p} member {info.filename!r} is not an .npy array: "
                                "not a saved model")
        infos[info.filename[:-4]] = info
    bf16 = set()
    if BF16_LIST in infos:
        names = _array(p, z, infos.pop(BF16_LIST), None, None)
        if names.dtype.kind != "U" or names.ndim != 1:
            raise BadParamError(f"load: {p} member {BF16_LIST!r} is not a list of names")
        bf16 = set(names.tolist())
    out = {}
    for key, v in want.items():
        if key not in infos:
            raise BadParamError(f"load: {p} lacks key {key!r}")
        vt = np.dtype(str(v.dtype).rpartition(".")[2])
        out[key] = _array(p, z, infos[key], tuple(v.shape), vt, key in bf16)
    extra = sorted(set(infos) - set(want))
    if extra:
        raise BadParamError(f"load: {p} holds keys the model lacks: {extra}")
    return out


def _array(p, z, info, shape, vt, bf16=False):
    """The member's array, its header checked first: shape (None: any, for the list of
    names, which must be small) and a dtype that converts to vt."""
    key = info.filename[:-4]
    with z.open(info) as f:
        version = np.lib.format.read_magic(f)
        if version not in ((1, 0), (2, 0), (3, 0)):
            raise BadParamError(f"load: {p} member {key!r}: unknown .npy version {version}")
        header = (np.lib.format.read_array_header_1_0 if version == (1, 0) else
                  np.lib.format.read_array_header_2_0)(f, max_header_size=_HEADER_ROOM)
        got_shape, fortran, dt = header
        if dt.hasobject:
            raise BadParamError(f"load: {p} member {key!r} holds Python objects: refused")
        nbytes = int(np.prod(got_shape, dtype=np.int64)) * dt.itemsize
        if shape is None:
            if nbytes > _HEADER_ROOM:
                raise BadParamError(f"load: {p} member {key!r} is {nbytes} bytes: too large")
        else:
            if bf16 and dt == np.dtype(np.uint16) or (dt.kind == "V" and dt.itemsize == 2
                                                        and vt == _BF16):
                dt = _BF16  # (bfloat16's bits; |V2: an older nbdnn's bfloat16)
            if dt.kind not in "fiu" and dt != _BF16 or not (
                    dt == vt or np.can_cast(dt, vt, "same_kind")):
                raise DtypeError(f"load: {p} key {key!r} has dtype {dt}, not one that "
                                 f"converts to the model's {vt}")
            if tuple(got_shape) != shape:
                raise ShapeError(f"load: {p} key {key!r} has shape {tuple(got_shape)}, the "
                                 f"model's {shape}")
        if info.file_size > nbytes + _HEADER_ROOM or info.file_size < nbytes:
            raise BadParamError(f"load: {p} member {key!r}: {info.file_size} bytes in the "
                                f"zip for {nbytes} bytes of data: damaged")
        data = f.read(nbytes)
        if len(data) != nbytes:
            raise BadParamError(f"load: {p} member {key!r} is truncated ({len(data)} of "
                                f"{nbytes} bytes)")
    a = np.frombuffer(data, dtype=dt if dt != _BF16 else np.uint16)
    if dt == _BF16:
        a = a.view(_BF16)
    a = a.reshape(got_shape, order="F" if fortran else "C")
    return a if shape is None else np.ascontiguousarray(a.astype(vt))

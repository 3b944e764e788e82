"""Files nbdnn writes lose nothing and files it reads cannot hurt it: atomic writes
(nbdnn/_files.py) for checkpoints and `nbdnn bench --json/--plot`; a checkpoint in every
precision round-trips; load refuses a .npy, a non-zip, a non-.npy member, a huge
header and a FIFO by name, before it reads (or allocates for) any data
(nbdnn/nn/checkpoint.py)."""
import io
import json
import os
import threading
import zipfile

import numpy as np
import pytest

import nbdnn
from nbdnn import nn
from nbdnn._files import atomic_write
from nbdnn.nn import checkpoint


def model(seed=0):
    return nn.Sequential([nn.Linear(4, 3, seed=seed), nn.ReLU(), nn.Linear(3, 2, seed=seed + 1)])


def same_params(a, b):
    for (m1, k1), (m2, k2) in zip(a.parameters(), b.parameters()):
        x, y = m1.params[k1], m2.params[k2]
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x, np.float64), np.asarray(y, np.float64))


def test_atomic_write_keeps_the_old_file_when_the_writer_fails(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"old")
    os.chmod(path, 0o640)
    with pytest.raises(KeyboardInterrupt):
        with atomic_write(path) as f:
            f.write(b"new, half")
            raise KeyboardInterrupt
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["f.bin"]
    with atomic_write(path) as f:
        f.write(b"new")
    assert path.read_bytes() == b"new" and os.listdir(tmp_path) == ["f.bin"]
    assert os.stat(path).st_mode & 0o777 == 0o640  # (the old file's permissions)


def test_atomic_write_replaces_a_symlink_not_its_target(tmp_path):
    target, link = tmp_path / "target", tmp_path / "link"
    target.write_bytes(b"keep me")
    os.symlink(target, link)
    with atomic_write(link) as f:
        f.write(b"mine")
    assert target.read_bytes() == b"keep me" and not os.path.islink(link)
    assert link.read_bytes() == b"mine"


def test_an_interrupted_save_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    """A Ctrl-C while the 3rd array is written: the last checkpoint still loads."""
    m = model()
    path = m.save(tmp_path / "ckpt")
    assert path.endswith("ckpt.npz")
    real, calls = np.lib.format.write_array, [0]

    def interrupted(*args, **kw):
        calls[0] += 1
        if calls[0] == 3:
            raise KeyboardInterrupt
        return real(*args, **kw)
    monkeypatch.setattr(np.lib.format, "write_array", interrupted)
    with pytest.raises(KeyboardInterrupt):
        model(seed=7).save(tmp_path / "ckpt")
    monkeypatch.undo()
    assert calls[0] == 3
    fresh = model(seed=9)
    fresh.load(tmp_path / "ckpt")
    same_params(fresh, m)
    assert os.listdir(tmp_path) == ["ckpt.npz"]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_every_precision_round_trips(tmp_path, precision):
    m = model().to_precision(precision)
    m.save(tmp_path / "p")
    other = model(seed=4).to_precision(precision)
    other.load(tmp_path / "p")
    same_params(other, m)
    if precision == "bf16":  # (the bits stored as uint16 and named as bfloat16)
        with np.load(tmp_path / "p.npz") as f:
            assert str(checkpoint.BF16_LIST) in f.files


def test_an_older_bfloat16_checkpoint_of_raw_voids_loads(tmp_path):
    """np.savez of ml_dtypes' bfloat16 writes |V2 members (what save did before)."""
    m = model().to_precision("bf16")
    np.savez(tmp_path / "old.npz", **m.state())
    with np.load(tmp_path / "old.npz") as f:
        assert f[f.files[0]].dtype.kind == "V"
    other = model(seed=3).to_precision("bf16")
    other.load(tmp_path / "old.npz")
    same_params(other, m)


def checkpoint_with(tmp_path, name, members):
    """A zip of raw members (name -> bytes)."""
    path = tmp_path / f"{name}.npz"
    with zipfile.ZipFile(path, "w") as z:
        for k, data in members.items():
            z.writestr(k, data)
    return path


def npy(array):
    b = io.BytesIO()
    np.save(b, array)
    return b.getvalue()


def test_load_refuses_foreign_files_by_name(tmp_path):
    m = model()
    good = m.state()
    np.save(tmp_path / "one.npy", np.zeros(3))
    cases = {
        tmp_path / "one.npy": "an .npy file",
        checkpoint_with(tmp_path, "text", {"0.p.w.txt": b"hello"}): "not an .npy array",
        checkpoint_with(tmp_path, "objects", {
            k + ".npy": npy(v) for k, v in good.items()} | {
            "x.npy": npy(np.array([None, 1], dtype=object))}): "objects|lacks",
        tmp_path / "folder": "not a regular file",
    }
    os.mkdir(tmp_path / "folder")
    before = {k: v.copy() for k, v in m.state().items()}
    for path, what in cases.items():
        with pytest.raises(nbdnn.NbdnnError, match=what):
            m.load(path)
    for k, v in m.state().items():
        np.testing.assert_array_equal(v, before[k])


def test_load_checks_shapes_from_the_headers_before_allocating(tmp_path, monkeypatch):
    """A member whose .npy header claims shape (2**40,) (a few hundred bytes on disk) is
    a ShapeError, not a MemoryError, and no array of its size is ever made; a member
    whose zip size is too small for its header is damaged."""
    m = model()
    members = {k + ".npy": npy(v) for k, v in m.state().items()}
    key = sorted(members)[0]
    big = np.lib.format.header_data_from_array_1_0(np.zeros(1, np.float32))
    big["shape"] = (2 ** 40,)
    b = io.BytesIO()
    np.lib.format.write_array_header_1_0(b, big)
    huge = checkpoint_with(tmp_path, "huge", dict(members, **{key: b.getvalue() + b"\0" * 64}))
    allocated = []
    real = np.frombuffer
    monkeypatch.setattr(np, "frombuffer",
                        lambda data, *a, **k: allocated.append(len(data)) or real(data, *a, **k))
    with pytest.raises(nbdnn.ShapeError, match="huge.npz"):
        m.load(huge)
    assert all(n < 1 << 20 for n in allocated)
    shape = m.state()[key[:-4]].shape
    hdr = np.lib.format.header_data_from_array_1_0(np.zeros(shape, np.float32))
    b = io.BytesIO()
    np.lib.format.write_array_header_1_0(b, hdr)
    short = checkpoint_with(tmp_path, "short", dict(members, **{key: b.getvalue() + b"\0" * 3}))
    with pytest.raises(nbdnn.NbdnnError, match="damaged|truncated"):
        m.load(short)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_load_refuses_a_fifo_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.npz"
    os.mkfifo(fifo)
    result = []
    t = threading.Thread(target=lambda: result.append(_load_error(fifo)), daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "load blocked on a FIFO"
    assert "not a regular file" in result[0]


def _load_error(path):
    try:
        model().load(path)
    except nbdnn.NbdnnError as e:
        return str(e)
    return "loaded"


def test_bench_json_is_atomic_and_takes_numpy_numbers(tmp_path):
    from nbdnn import bench
    row = bench.Row(op="relu", shape="4", dtype="float32", bytes=np.int64(32),
                    gpu_s=np.float32(1e-6), copy_bw=np.float64(1e12))
    path = tmp_path / "rows.json"
    path.write_text("previous")
    bench.save_json([row], path, {"seed": np.int64(3)})
    data = json.loads(path.read_text())
    assert data["meta"]["seed"] == 3 and data["rows"][0]["op"] == "relu"

    class Unwritable:
        pass
    with pytest.raises(TypeError):
        bench.save_json([row], path, {"bad": Unwritable()})
    assert json.loads(path.read_text()) == data  # (the old file, whole)
    assert os.listdir(tmp_path) == ["rows.json"]

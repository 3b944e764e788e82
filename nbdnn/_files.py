"""Writing a file so that nothing is lost: the new bytes go to a private temporary file
in the same folder, are flushed to the disk (fsync), and then replace the old file in
one rename (os.replace). A Ctrl-C, a full disk or an exception part-way leaves the
previous file whole and no temporary file behind; a reader never sees half a file.
(A symlink at the path is replaced, not written through.)"""
import contextlib
import os
import tempfile


@contextlib.contextmanager
def atomic_write(path, mode="wb"):
    """`with atomic_write(path) as f: f.write(...)`: path holds the new content once the
    block ends without an exception, the old content otherwise. mode: "wb" or "w"."""
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_write: mode must be 'wb' or 'w', got {mode!r}")
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                               dir=folder)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if os.path.exists(path):  # (mkstemp's 0600: keep the old file's permissions)
            os.chmod(tmp, os.stat(path).st_mode & 0o7777)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise

"""The cache folder and its entries: where it is, whether it may be trusted, reading and
writing an entry (data only: a header and a cubin), the size cap and clearing (the
rules are in the package's docstring)."""
import hashlib
import json
import os
import stat
import tempfile
import time
import warnings
import zlib


class KernelCacheWarning(UserWarning):
    """A cache folder or entry not used (unsafe, damaged, unwritable): the kernel
    compiles as usual."""


def directory():
    """The cache's folder (read on each compile), or None when NBDNN_KERNEL_CACHE=0."""
    where = os.environ.get("NBDNN_KERNEL_CACHE")
    if where == "0":
        return None
    if where:
        return os.path.abspath(os.path.expanduser(where))
    base = os.environ.get("XDG_CACHE_HOME")
    if not base or not os.path.isabs(base):  # (the XDG spec: a relative one is ignored)
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "nbdnn", "kernels")


FORMAT = b"nbdnn kernel cache entry 1\n"
MAX_ENTRY = 64 << 20  # bytes of a stored or decompressed cubin (ours: up to ~1 MB)
MAX_HEADER = 4096
DEFAULT_MAX_MB = 1024
_folders = {}  # folder -> why it is not used ("" when it is), checked once a process


def warn(text):
    warnings.warn(f"nbdnn: {text}", KernelCacheWarning, stacklevel=3)


def usable(folder):
    """folder (made, 0700, when missing) if only this user can write it; else None,
    with one warning a process."""
    why = _folders.get(folder)
    if why is None:
        why = _folders[folder] = _refusal(folder)
        if why:
            warn(f"kernel cache folder {folder} not used ({why}); kernels compile as usual")
    return None if why else folder


def _refusal(folder):
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        st = os.stat(folder)
    except OSError as e:
        return f"cannot make it: {e.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return "not a folder"
    return _unsafe(st, "folder")


def _unsafe(st, what):
    """Why a file or folder with stat st must not be trusted, or "" ."""
    if st.st_uid != os.geteuid():
        return f"the {what} belongs to user {st.st_uid}, not to this user ({os.geteuid()})"
    if st.st_mode & 0o022:
        return f"the {what} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return ""


def read(path, expected):
    """(entry symbol, cubin bytes) stored at path when the entry is sound and its header
    holds `expected` (key, kernel, sig, cc); None otherwise: silently when there is no
    entry, with a warning when there is a bad one (it is compiled over)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as e:  # (ELOOP: a symlink)
        return _bad(path, f"cannot be opened safely: {e.strerror}")
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        why = "not a regular file" if not stat.S_ISREG(st.st_mode) else _unsafe(st, "file")
        if why:
            return _bad(path, why)
        data = f.read(MAX_ENTRY + MAX_HEADER)
        try:
            found = _parse(data, expected)
        except (ValueError, zlib.error) as e:  # (json's errors are ValueErrors)
            return _bad(path, str(e))
        try:
            os.utime(fd)  # (its last use, for the size cap's eviction)
        except OSError:
            pass
    return found


def _bad(path, why):
    warn(f"kernel cache entry {path} ignored ({why}); compiling over it")
    return None


def _parse(data, expected):
    if not data.startswith(FORMAT):
        raise ValueError("not an nbdnn kernel cache entry")
    end = data.find(b"\n", len(FORMAT), len(FORMAT) + MAX_HEADER)
    if end < 0:
        raise ValueError("no header line")
    header = json.loads(data[len(FORMAT):end].decode("utf-8", "replace"))
    if not isinstance(header, dict):
        raise ValueError("a header that is not an object")
    for k, v in expected.items():
        if header.get(k) != v:
            raise ValueError(f"its {k} is {header.get(k)!r}, not {v!r}")
    n, digest, entry = header.get("bytes"), header.get("sha256"), header.get("entry")
    if type(n) is not int or not 0 < n <= MAX_ENTRY or type(digest) is not str or \
            type(entry) is not str:
        raise ValueError("a header without a sound size, digest and entry symbol")
    unzip = zlib.decompressobj()
    cubin = unzip.decompress(data[end + 1:], n + 1)
    if len(cubin) != n or not unzip.eof or hashlib.sha256(cubin).hexdigest() != digest:
        raise ValueError(f"truncated or damaged: {len(cubin)} of {n} bytes, or another digest")
    return entry, cubin


def write(folder, path, header, cubin):
    """Store cubin under header at path: a fresh private temporary file in the folder,
    then an atomic rename over path; then keep the folder under its size cap."""
    header = dict(header, bytes=len(cubin), sha256=hashlib.sha256(cubin).hexdigest())
    blob = FORMAT + json.dumps(header, sort_keys=True).encode() + b"\n" + \
        zlib.compress(cubin, 6)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".nbk", dir=folder)  # (O_EXCL, 0600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise
    evict(folder)


def _remove(path):
    try:
        os.unlink(path)
        return True
    except OSError:
        return False


def max_bytes():
    """The size cap (NBDNN_KERNEL_CACHE_MAX_MB, default 1024 MB)."""
    text = os.environ.get("NBDNN_KERNEL_CACHE_MAX_MB")
    try:
        mb = float(text) if text else DEFAULT_MAX_MB
    except ValueError:
        mb = -1.0
    if not mb > 0:
        warn(f"NBDNN_KERNEL_CACHE_MAX_MB={text!r} is not a positive number; "
              f"using {DEFAULT_MAX_MB}")
        mb = DEFAULT_MAX_MB
    return int(mb * (1 << 20))


def entries(folder):
    """[(path, bytes, last use)] of the folder's entries, and its stale temporary files
    (a writer that died: older than an hour) as entries last used at time 0."""
    found, now = [], time.time()
    try:
        with os.scandir(folder) as it:
            for e in it:
                if not e.name.endswith(".nbk") or not e.is_file(follow_symlinks=False):
                    continue
                st = e.stat(follow_symlinks=False)
                if not e.name.startswith(".tmp-"):
                    found.append((e.path, st.st_size, st.st_mtime))
                elif now - st.st_mtime > 3600:
                    found.append((e.path, st.st_size, 0.0))
    except OSError:
        pass
    return found


def evict(folder, limit=None):
    """Remove the least recently used entries until the folder holds at most 90% of
    `limit` bytes (the cap), when it holds more; returns how many went."""
    limit = max_bytes() if limit is None else limit
    es = entries(folder)
    total = sum(n for _, n, _ in es)
    removed = 0
    if total > limit:
        for path, n, _ in sorted(es, key=lambda e: e[2]):
            if total <= 0.9 * limit:
                break
            if _remove(path):
                total, removed = total - n, removed + 1
    return removed


def clear(folder):
    """Remove every entry (and temporary file) of the folder; returns how many."""
    return sum(_remove(path) for path, _, _ in entries(folder) + [
        (os.path.join(folder, n), 0, 0) for n in _names(folder) if n.startswith(".tmp-")])


def _names(folder):
    try:
        return os.listdir(folder)
    except OSError:
        return []

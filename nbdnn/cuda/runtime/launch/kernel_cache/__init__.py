"""Compiled kernels kept on disk between processes: on by default, per user.

numba compiles each kernel signature when it is first launched: typing, lowering,
NVVM, then the driver's PTX assembler. A bf16 ResNet-50 step meets a few hundred such
signatures and spends over 300 s compiling them on an H100's host before its first
step; every new process paid it again. `Kernel.compile` looks in the cache folder
first and stores what it compiled there.

The folder: `NBDNN_KERNEL_CACHE=DIR` if set (`NBDNN_KERNEL_CACHE=0`: off), else
`$XDG_CACHE_HOME/nbdnn/kernels`, else `~/.cache/nbdnn/kernels` (as Triton keeps
~/.triton/cache). `nbdnn cache info` and `nbdnn cache clear` show and empty it.

What is stored is data, never code to run: an entry is a format line, a one-line JSON
header (the full key, the kernel's name, signature, compute capability and entry
symbol, the cubin's size and SHA-256) and the zlib-compressed cubin, which the driver
loads as numba does its own. Nothing is unpickled. Safe in a shared or hostile place:
- a folder or an entry not owned by this user, or writable by group or others, is not
  used (a warning; kernels compile as usual); the folder is made 0700;
- entries are opened without following symlinks (and without blocking on a FIFO),
  must be regular files, and are written to a fresh mkstemp name (O_EXCL, 0600) then
  renamed over the entry (os.replace replaces a planted symlink, never its target);
- an entry whose header does not match what is asked, or whose bytes are truncated,
  damaged or of another size than the header says, is compiled over (a warning);
- the folder is kept under NBDNN_KERNEL_CACHE_MAX_MB (default 1024): after a store,
  the least recently used entries go (a load marks its entry used).

An entry is named by a hash of everything the compiled code can depend on (key()):
- the versions of numba, numba-cuda;
- the kernel's code: its bytecode, and a generated kernel's text
  (cuda/runtime/launch/codegen.py) or its file's bytes; the same for every function, device
  function and generated helper it refers to by a global name or a closure cell,
  recursively (one factory's lambdas differ only in their bytecode);
- every nbdnn source file those functions' modules (and the nbdnn modules the code
  reads attributes of) import, transitively: whatever the code can reach is in one of
  them. An edit to another family's kernels, to an op's checks in nbdnn/ops or to
  nbdnn.torch keeps a kernel's name; one to a file it can reach gives a new name;
- the values it reads as globals, closure cells or default arguments at compile time
  (numba freezes them into the code): numbers, strings, tuples, NumPy arrays, and the
  numbers and strings of an nbdnn module it reads attributes from (a switch flipped at
  run time changes the name);
- the signature, the Kernel's architecture and jit options, the GPU's compute
  capability.
A value it cannot describe stably (an object printed with its address, a device
array) makes the kernel uncachable: it compiles as usual.
"""
import os
import re

from .store import (KernelCacheWarning, clear, directory, entries, evict, max_bytes, read, usable,
    warn, write)
from .key import Uncachable, key

__all__ = ["KernelCacheWarning", "Uncachable", "argument_types", "clear",
           "compiled", "directory", "entries", "entry", "evict", "file_name", "header", "key",
           "max_bytes", "storable",
           "path_for", "read", "usable", "write"]


def compiled(kernel, sig):
    """(function handle, argument types) of Kernel kernel's signature sig: loaded from
    the cache folder when it holds a sound entry, else compiled (and stored there)."""
    folder = directory()
    folder = folder and usable(folder)
    path = expected = None
    if folder:
        cc = _cc()
        path, full = entry(folder, kernel, sig, cc)
        if full:
            expected = header(kernel, sig, cc, full)
            found = read(path, expected)
            if found is not None:
                return _load(*found), argument_types(sig)
    kern = kernel.dispatcher.compile(sig)
    lib = kern._codelibrary
    handle = int(lib.get_cufunc().handle)
    if path and storable(lib):
        try:
            write(folder, path, dict(expected, entry=lib._entry_name), _cubin_bytes(lib))
        except OSError as e:  # (a full disk or a read-only folder: run uncached)
            warn(f"kernel cache entry {path} not written ({e})")
    return handle, kern.argument_types


def header(kernel, sig, cc, full_key):
    """What an entry's header must say of kernel's signature sig (its entry name beside
    it when written)."""
    return {"key": full_key, "kernel": kernel.name, "sig": sig, "cc": list(cc)}


def storable(lib):
    """A cubin that loads alone: no module set-up (NRT), no files to link at load, no
    device array's address baked in."""
    return not (lib._setup_functions or lib._teardown_functions or lib._linking_files or
                any(hasattr(o, "__cuda_array_interface__")
                    for o in (getattr(lib, "referenced_objects", None) or {}).values()))


def _cubin_bytes(lib):
    obj = lib.get_cubin()
    return bytes(getattr(obj, "code", obj))


def _load(entry, cubin):
    """The stored cubin loaded into the current context as numba loads its own (the
    context keeps the module); the entry's handle."""
    from cuda.core import ObjectCode
    from numba import cuda
    module = cuda.current_context().create_module_image(ObjectCode.from_cubin(cubin))
    return int(module.get_function(entry).handle)


def argument_types(sig):
    """numba's types of a signature's parameters (what the compiled kernel reports)."""
    from numba.core import sigutils
    return tuple(sigutils.normalize_signature(sig)[0])


def _cc():
    from numba import cuda
    return cuda.get_current_device().compute_capability


def file_name(name, full_key):
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    return f"{stem}-{full_key[:32]}.nbk"


def path_for(kernel, sig, cc):
    """Where kernel's signature sig lives in the cache folder, or None (cache off, or
    uncachable)."""
    where = directory()
    return None if where is None else entry(where, kernel, sig, cc)[0]


def entry(folder, kernel, sig, cc):
    """(path, full key) of kernel's signature sig in folder; (None, None) when the
    kernel is uncachable."""
    try:
        full = key(kernel.pyfunc, sig, kernel.arch, kernel.jit_options, cc)
    except Uncachable:
        return None, None
    return os.path.join(folder, file_name(kernel.name, full)), full

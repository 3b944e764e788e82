"""What every op's front end does: pick the backend, validate, move NumPy inputs to the
GPU when `backend="cuda"` is forced (and the results back), make CUDA inputs
contiguous, hand validated arguments to the backend function of the same name."""
import math
import numbers

import ml_dtypes  # noqa: F401  (registers the dtype name "bfloat16" with NumPy)
import numpy as np

from .. import arrays as _arrays, backend as _backend
from .._vocab import BF16_DTYPES, FLOAT_DTYPES
from ..errors import BadParamError, DeviceError, DtypeError, ShapeError, fail
from .registry import OPS

_allowed_sets = {}  # dtype-name tuple -> frozenset of np.dtype (dtype.name is slow)
_modules = {}


def backend_module(name, family, op=None):
    m = _modules.get((name, family))
    if m is None:
        m = _modules[name, family] = _backend.module(name, family, op)
    return m


_FLOATS = frozenset(np.dtype(d) for d in FLOAT_DTYPES)
_COMPUTE = {np.dtype(d): np.dtype("float64" if d == "float64" else "float32")
            for d in BF16_DTYPES}


def compute_dtype(dtype):
    """float32 for float16/bfloat16/float32 storage, float64 for float64 (a dict
    lookup: a NumPy dtype's .name costs ~1 us, and every statistics-checking call asked
    twice)."""
    return _COMPUTE.get(dtype) or _COMPUTE[np.dtype(dtype)]


_describers = _arrays.describers  # type -> describe function, filled by describe()
_kinds = _arrays.array_kinds  # type -> 'cpu' | 'cuda', filled by kind()


def _wrong_dtype(op, name, dtypes, dtype):
    """DtypeError for an array of a dtype the op does not take; a float of the other
    byte order (big-endian '>f4' prints as float32 too) is said so."""
    if dtype.byteorder not in "=|" and dtype.newbyteorder("=") in _allowed(dtypes):
        fail(DtypeError, op, name, f"one of {', '.join(dtypes)} in the machine's byte order "
             f"(pass x.astype(x.dtype.newbyteorder('=')))",
             f"{dtype.name} of the other byte order ({dtype.str})")
    fail(DtypeError, op, name, f"one of {', '.join(dtypes)}", dtype.name)


def _allowed(dtypes):
    s = _allowed_sets.get(dtypes)
    if s is None:
        s = _allowed_sets[dtypes] = frozenset(np.dtype(d) for d in dtypes)
    return s


class Call:
    """One op call: the chosen backend and the arrays going to it.

    Typical use in an op:  c = Call(op, backend, stream, x=x, out=out) (the family is
    the op's record's);
    shape, dtype = c.array("x", x); ...checks...; return c.run(fname, x, ..., out=out)

    This sits on every eager call's path, so it does the least work it can: one
    describe per array (cached per array type), dtype checks against frozensets."""

    __slots__ = ("op", "family", "backend", "copy", "strided", "stream", "arrays", "outs",
                 "device")

    def __init__(self, op, backend, stream=None, **arrays):
        self.op, self.family = op, OPS[op].family
        self.arrays, self.outs = arrays, None
        self.backend, self.copy = _backend.choose(op, arrays, backend)
        if stream is not None:
            _backend.check_stream(op, stream)
        if self.copy:  # remember which NumPy input goes over, for capture's error
            self.copy = next((n for n, a in arrays.items() if a is not None), "an input")
        self.strided = None  # ids of CUDA inputs that are strided views
        self.stream = stream
        self.device = None  # several GPUs: the one holding the arrays (run() goes there)
        if self.backend == "cuda" and not self.copy and _backend.several_devices():
            self.device = _device_of(op, arrays)

    def array(self, name, x, dtypes=FLOAT_DTYPES):
        """(shape, dtype) of argument `name`, checked against the allowed dtypes."""
        f = _describers.get(type(x))
        try:
            shape, dtype, contig = f(x) if f is not None else \
                _arrays.describe(self.op, name, x)
        except _arrays.Refused as r:
            fail(r.cls, self.op, name, r.expected, r.given)
        if dtypes is not None and dtype not in (_FLOATS if dtypes is FLOAT_DTYPES
                                                else _allowed(dtypes)):
            _wrong_dtype(self.op, name, dtypes, dtype)
        if not contig:
            if self.strided is None:
                self.strided = set()
            self.strided.add(id(x))
        return shape, dtype

    def out(self, out, shape, dtype, name="out"):
        """Check out= against the result's shape and dtype; out must be C-contiguous."""
        if out is None:
            return None
        f = _describers.get(type(out))
        try:
            oshape, odtype, contig = f(out) if f is not None else \
                _arrays.describe(self.op, name, out)
        except _arrays.Refused as r:
            fail(r.cls, self.op, name, r.expected, r.given)
        if oshape != shape and tuple(oshape) != tuple(shape):
            fail(ShapeError, self.op, f"{name}.shape", tuple(shape), tuple(oshape))
        if odtype is not dtype and odtype != dtype:
            fail(DtypeError, self.op, f"{name}.dtype", np.dtype(dtype).name, odtype.name)
        if not contig:
            fail(BadParamError, self.op, name, "C-contiguous", "a strided view")
        if (self.copy or self.backend == "cpu") and not out.flags.writeable:
            fail(BadParamError, self.op, name, "writeable", "a read-only array")
        if len(self.arrays) > 1 or self.outs:
            self._apart(name, out)
        return out

    def _apart(self, name, out):
        """BadParamError when `out` shares memory with an input or an earlier output,
        unless it is exactly an input the op may overwrite (its record's in_place:
        elementwise and row-wise ops read each element before they write it; every other
        kernel would read what it already wrote). Memory is compared as byte ranges, on the GPU as
        on the CPU (numpy.may_share_memory), so the rule is the same on both backends.
        (On every unplanned call's path: a contiguous CUDA array's range is its
        address and size, ~1 us.)"""
        rec = OPS.get(self.op)
        same_ok = rec.in_place if rec is not None else ()
        span = None
        # the inputs, and the outputs checked so far (out= arrays of later results, also
        # among self.arrays, are checked against this one when their turn comes)
        others = [(n, a) for n, a in self.arrays.items() if not n.startswith("out")]
        for n, a in others + (self.outs or []):
            if a is None or n == name or a is out and n in same_ok:
                continue
            if span is None:
                span = self._span(out)
            sa = self._span(a)
            if n in same_ok and sa == span and tuple(a.shape) == tuple(out.shape):
                continue
            if span[0] < sa[1] and sa[0] < span[1] and span[0] < span[1] and sa[0] < sa[1]:
                allowed = f" or exactly one of {', '.join(same_ok)}" if same_ok else ""
                fail(BadParamError, self.op, name,
                     f"memory apart from the inputs and other outputs{allowed}",
                     f"an array that overlaps {n}")
        if self.outs is None:
            self.outs = []
        self.outs.append((name, out))

    def _span(self, a):
        """(first, one past last) byte of array a, NumPy or CUDA."""
        if isinstance(a, np.ndarray):
            return _byte_bounds(a)
        arrays = _cuda_arrays()
        if self.strided is None or id(a) not in self.strided:  # C-contiguous
            p, n = arrays.ptr_size(a)
            return p, p + n * arrays.dtype_of(a).itemsize
        return arrays.span(a)

    def run(self, fname, *args, out=None, inplace=(), **kw):
        """Call the backend's `fname`; CUDA inputs that are strided views are made
        contiguous first; NumPy inputs forced onto "cuda" are copied to the GPU and the
        results back (into `out` when given), and so are the arguments at positions
        `inplace` (updated in place by the op)."""
        if self.device is not None:  # (several GPUs: on the arrays' device, then back)
            device, self.device = self.device, None
            with _backend.cuda_runtime("device").on(device):
                return self.run(fname, *args, out=out, inplace=inplace, **kw)
        fn = _functions.get((self.backend, self.family, fname)) or \
            _function(self.backend, self.family, fname, self.op)
        if self.backend == "cpu":
            return fn(*args, out=out, **kw)
        if self.stream is None and not self.copy and self.strided is None:  # the common case
            return fn(*args, out=out, stream=0, **kw)
        arrays = _cuda_arrays()
        stream = arrays.stream_handle(self.stream)
        if self.copy:
            if _backend.cuda_runtime("launch").recording() is not None:
                fail_capture(self.op, self.copy)
            dev = [arrays.to_device(a) if isinstance(a, np.ndarray) else a for a in args]
            dout = (None if out is None else tuple(map(arrays.to_device, out))
                    if isinstance(out, tuple) else arrays.to_device(out))
            res = _back_to_host(fn(*dev, out=dout, stream=stream, **kw), out)
            for i in inplace:
                if isinstance(args[i], np.ndarray):
                    args[i][...] = arrays.to_host(dev[i])
            return res
        if self.strided:
            args = [impl_contiguous(a, stream) if id(a) in self.strided else a for a in args]
        return fn(*args, out=out, stream=stream, **kw)


_arrays_mod = None
_functions = {}
def _device_of(op, arrays):
    """The ordinal of the device holding every CUDA array among arrays (name -> array);
    a DeviceError naming two that live on different devices."""
    of = _backend.cuda_runtime("device").of
    first = None
    for name, a in arrays.items():
        if a is None:
            continue
        d = of(a)
        if first is None:
            first = name, d
        elif d != first[1]:
            raise DeviceError(
                f"{op}: {first[0]} is on cuda:{first[1]} but {name} is on cuda:{d}; pass "
                f"every array on one device (copy with .to('cuda:{first[1]}') or "
                "cupy.asarray under that device)")
    return None if first is None else first[1]


def _function(backend, family, fname, op=None):
    f = _functions.get((backend, family, fname))
    if f is None:
        f = _functions[backend, family, fname] = getattr(backend_module(backend, family, op),
                                                         fname)
    return f


def _cuda_arrays():
    global _arrays_mod
    if _arrays_mod is None:
        _arrays_mod = _backend.cuda_runtime("arrays")
    return _arrays_mod


def fail_capture(op, name):
    from ..errors import NotSupportedError
    raise NotSupportedError(
        f"{op}: {name} is a NumPy array, copied to the GPU once per call; inside "
        f"Graph.capture that copy would be baked in and replays would not see new host "
        f"data. Copy it to a device array before capturing and write new data into it")


def impl_contiguous(x, stream):
    return _backend.cuda_runtime("strided").contiguous(x, stream)


def _back_to_host(res, out):
    _arrays = _cuda_arrays()
    if isinstance(out, tuple):  # one out= array per result
        return tuple(_back_to_host(r, o) for r, o in zip(res, out))
    if isinstance(res, tuple):
        return tuple(_back_to_host(r, None) for r in res) if out is None else \
            (_back_to_host(res[0], out),) + tuple(_back_to_host(r, None) for r in res[1:])
    if res is None or isinstance(res, (numbers.Number, np.generic)):
        return res
    host = _arrays.to_host(res)
    if out is not None:
        out[...] = host
        return out
    return host


# op -> inputs that out= may be exactly (the same array): the kernels read each element
# of these before writing the element of out at the same place. Any other overlap of
# out with an input or another output is an error (Call._apart).


try:
    from numpy.lib.array_utils import byte_bounds as _byte_bounds
except ImportError:  # numpy < 2
    _byte_bounds = np.byte_bounds


def is_int(v):
    """A Python or NumPy integer, not a bool (a float 2.0 is not an int: it would be
    truncated silently)."""
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


def int_tuple(op, name, v, what):
    """v as a tuple of ints; BadParamError (what: the expectation) for anything else,
    floats and strings included."""
    try:
        items = tuple(v) if not isinstance(v, (str, bytes)) else None
    except TypeError:
        items = None
    if items is None or not all(is_int(i) for i in items):
        fail(BadParamError, op, name, what, repr(v))
    return tuple(int(i) for i in items)


def required(op, **arrays):
    """BadParamError for an array argument given as None that the op cannot do without
    (a statistic the backward needs, the gradient itself)."""
    for name, a in arrays.items():
        if a is None:
            fail(BadParamError, op, name, "an array", "None")


def out_tuple(op, out, names):
    """out= of an op with several results: None, or a tuple/list of one array per
    result (names: what they are, for the message)."""
    if out is None:
        return ()
    if not isinstance(out, (tuple, list)) or len(out) != len(names):
        got = f"{len(out)} arrays" if isinstance(out, (tuple, list)) else type(out).__name__
        fail(BadParamError, op, "out", f"None or a tuple of {len(names)} arrays "
             f"({', '.join(names)})", got)
    return tuple(out)


MAX_ELEMENTS = 2 ** 40  # no machine holds a tensor this large (4 TiB of float32)


def check_size(op, name, shape):
    """NotSupportedError, up front, for a result or workspace that no memory could hold
    (a geometry like padding=10**9 asks for one)."""
    n = math.prod(shape)
    if n > MAX_ELEMENTS:
        from ..errors import NotSupportedError
        raise NotSupportedError(f"{op}: {name} would hold {n:.3g} elements (shape {tuple(shape)}),"
                                f" more than any memory holds (nbdnn's limit {MAX_ELEMENTS:.3g})")


def flag(op, name, v):
    """A bool parameter (Python or NumPy)."""
    if not isinstance(v, (bool, np.bool_)):
        fail(BadParamError, op, name, "True or False", repr(v))
    return bool(v)


def choice(op, name, value, choices):
    if value not in choices:
        fail(BadParamError, op, name, f"one of {', '.join(map(repr, choices))}", repr(value))
    return value


def scalar(op, name, value, *, finite=True, low=None, high=None, low_open=False):
    """A real Python/NumPy number, optionally finite and in [low, high] (or (low, ...))."""
    t = type(value)
    if (t is float or t is int) and low is None and high is None:  # the common case, fast
        v = float(value)
        if not finite or -math.inf < v < math.inf:
            return v
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, np.generic)):
        fail(BadParamError, op, name, "a real number", repr(value))
    v = float(value)
    if finite and not math.isfinite(v):
        fail(BadParamError, op, name, "finite", v)
    if low is not None and (v < low or (low_open and v == low)):
        fail(BadParamError, op, name, f"{'>' if low_open else '>='} {low}", v)
    if high is not None and v > high:
        fail(BadParamError, op, name, f"<= {high}", v)
    return v


def blend_params(op, alpha, beta, out):
    """alpha and beta as floats; beta != 0 reads `out` (what it blends into), so it
    needs one."""
    if type(alpha) is float and type(beta) is float and \
            -math.inf < alpha < math.inf and -math.inf < beta < math.inf:
        pass  # the common case, without two calls
    else:
        alpha, beta = scalar(op, "alpha", alpha), scalar(op, "beta", beta)
    if beta != 0 and out is None:
        need_out(op, beta, out)
    return alpha, beta


def need_out(op, beta, out, what="beta"):
    if beta != 0 and out is None:
        fail(BadParamError, op, what, "0 when out= is not given (beta != 0 reads out)", beta)


def same_shape(op, names, shapes):
    first = shapes[0]
    for n, s in zip(names[1:], shapes[1:]):
        if tuple(s) != tuple(first):
            fail(ShapeError, op, f"{n}.shape", f"equal to {names[0]}.shape {tuple(first)}",
                 tuple(s))


def same_dtype(op, names, dtypes):
    for n, d in zip(names[1:], dtypes[1:]):
        if d != dtypes[0]:
            fail(DtypeError, op, f"{n}.dtype", f"{dtypes[0].name} like {names[0]}", d.name)


def normalize_axis(op, name, axis, ndim):
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        fail(BadParamError, op, name, "an int", repr(axis))
    if not -ndim <= axis < ndim:
        fail(BadParamError, op, name, f"in [{-ndim}, {ndim})", axis)
    return int(axis) % ndim

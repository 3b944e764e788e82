"""nbdnn's errors. Every bad input raises a subclass of NbdnnError whose message names
the op, the parameter, what was expected and what was given."""


class NbdnnError(Exception):
    """Base class of every error nbdnn raises on purpose."""


class ShapeError(NbdnnError, ValueError):
    """Shapes that do not fit together: mismatched operands, bad axes, wrong out shape."""


class DtypeError(NbdnnError, TypeError):
    """A dtype the op does not take, or operands whose dtypes disagree."""


class BadParamError(NbdnnError, ValueError):
    """A parameter outside its domain: unknown mode, negative coef, bad layout name."""


class NotSupportedError(NbdnnError, NotImplementedError):
    """A valid request this version cannot serve (e.g. > 2**31 elements on one axis)."""


class DeviceError(NbdnnError, RuntimeError):
    """Host and device arrays mixed, no CUDA device, a failed launch."""


def fail(cls, op, param, expected, given):
    """Raise `cls` with the standard message: op, parameter, expected, given."""
    raise cls(f"{op}: {param} must be {expected}; got {given}")

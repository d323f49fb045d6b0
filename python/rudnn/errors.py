"""Exceptions raised by rudnn. Each is also the matching builtin exception."""


class Error(Exception):
    """Base class of every error rudnn raises on purpose."""


class ShapeError(Error, ValueError):
    """An array has the wrong rank or sizes."""


class DTypeError(Error, TypeError):
    """An array has the wrong element type."""


class DeviceError(Error, ValueError):
    """Arrays are on the wrong or on different devices."""


class ArgumentError(Error, ValueError):
    """A non-array argument is out of range (eps <= 0, a bad option, ...)."""


class FrameworkError(Error, TypeError):
    """An argument is not an array rudnn understands, or arrays mix frameworks."""


class UnsupportedError(Error, NotImplementedError):
    """A valid request this build or device cannot serve."""


class CudaError(Error, RuntimeError):
    """The CUDA runtime reported a failure."""

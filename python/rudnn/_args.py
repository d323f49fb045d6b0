"""The one rule for non-array arguments, shared by every family (issue 27, items 6, 9, 10).

Flags are True or False, never a truthy string or number; integers are integers (Python's,
NumPy's, anything with __index__), never bools, floats or strings; numbers are real scalars,
never strings or bools, and a number the kernels take as float32 must survive the conversion
(1e300 would become inf, 1e-300 zero). Each failure is an ArgumentError naming the op and the
argument, raised before anything is allocated.
"""

from __future__ import annotations

import math
import operator

import numpy as np

from .errors import ArgumentError

_FLOAT32_MAX = float(np.finfo(np.float32).max)
_FLOAT32_TINY = float(np.finfo(np.float32).smallest_subnormal)
INT32_MAX = 2**31 - 1


def flag(op, name, value):
    """bool(value) of True or False (NumPy's too)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ArgumentError(f"{op}: {name}: expected True or False, got {value!r}")


def integer(op, name, value, *, low=None, high=INT32_MAX, expected=None):
    """int(value) of an integer in [low, high] (high defaults to the int32 range the bindings take)."""
    what = expected or _range_words(low, high)
    if isinstance(value, (bool, np.bool_)):
        raise ArgumentError(f"{op}: {name}: expected {what}, got {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise ArgumentError(f"{op}: {name}: expected {what}, got {value!r}") from None
    if (low is not None and v < low) or (high is not None and v > high):
        raise ArgumentError(f"{op}: {name}: expected {what}, got {v}")
    return v


def int64(op, name, value, expected):
    """int(value) of an integer that libruDNN takes as int64 (sizes, strides, paddings), with its
    own message past that range."""
    v = integer(op, name, value, low=None, high=None, expected=expected)
    if not -(2**63) <= v <= 2**63 - 1:
        raise ArgumentError(f"{op}: {name}: {v} is out of the int64 range")
    return v


def number(op, name, value, expected):
    """float(value) of a real number (a Python or NumPy scalar, a 0-d array)."""
    if not isinstance(value, (str, bytes, bool, np.bool_)) and value is not None:
        try:
            return float(value)
        except (TypeError, ValueError):
            pass
    raise ArgumentError(f"{op}: {name}: expected {expected}, got {value!r}")


def float32_number(op, name, value, expected, *, positive=False):
    """number(...) that the kernels read as float32: finite after the conversion, and not
    flushed to zero (so 1e-300 is not silently 0, which may mean "off"); positive=True also
    refuses values <= 0 and NaN."""
    v = number(op, name, value, expected)
    if (positive and not v > 0) or not math.isfinite(v):
        raise ArgumentError(f"{op}: {name}: expected {expected}, got {value!r}")
    if abs(v) > _FLOAT32_MAX:
        raise ArgumentError(f"{op}: {name}: expected {expected} that float32 can hold "
                            f"(|value| <= {_FLOAT32_MAX:.7g}), got {value!r}")
    if v != 0 and abs(v) < _FLOAT32_TINY:
        raise ArgumentError(f"{op}: {name}: expected {expected} that float32 can hold "
                            f"(|value| >= {_FLOAT32_TINY:.3g}; smaller becomes 0), got {value!r}")
    return v


def _range_words(low, high):
    top = "2^31 - 1" if high == INT32_MAX else high
    if low is not None and high is not None:
        return f"an integer in [{low}, {top}]"
    if low is not None:
        return f"an integer >= {low}"
    return f"an integer <= {top}" if high is not None else "an integer"

"""What every rudnn.jax family shares: registering the XLA FFI targets once, turning
arguments into JAX arrays and (shape, dtype) specs for the C++ validation, and the vmap
rule for row-wise custom calls."""

from __future__ import annotations

import functools
import re
import threading

import jax
import jax.numpy as jnp
import numpy as np

from .. import _C
from .. import errors
from ..errors import ArgumentError, FrameworkError, UnsupportedError

# ---------------------------------------------------------------------------
# FFI target registration (once, on first use)
# ---------------------------------------------------------------------------

_registered = False
_register_lock = threading.Lock()


def ensure_ready(op: str) -> None:
    """Registers the FFI targets with XLA on first use; raises if this build has none."""
    global _registered
    if _registered:
        return
    if not getattr(_C, "has_jax_ffi", False):
        raise UnsupportedError(
            f"rudnn.jax.{op}: this build of rudnn has no JAX support (jaxlib's XLA FFI headers were not found "
            "when it was compiled). Reinstall it in an environment with jax installed, without build isolation: "
            "pip install --no-build-isolation <path to rudnn>")
    with _register_lock:
        if not _registered:
            for platform, targets in _C.jax_ffi_targets().items():
                for name, capsule in targets.items():
                    jax.ffi.register_ffi_target(name, capsule, platform=platform)
            _registered = True


# ---------------------------------------------------------------------------
# Errors a handler reports while XLA runs the call
# ---------------------------------------------------------------------------

_HANDLER_ERROR = re.compile(r"rudnn\.(\w+Error): (.*)", re.S)


def raises_rudnn_errors(op_function):
    """Decorates a public rudnn.jax function: when an eager call's handler fails as XLA runs it
    (checks of array values, such as the CPU's cu_seqlens checks), the rudnn error it reported
    (jax_ffi_common.hpp: "rudnn.<Kind>Error: <message>") is raised as that rudnn.Error subclass.
    Under jit the failure happens when the compiled function runs, outside this call: there it
    stays XLA's runtime error, with the same message."""
    @functools.wraps(op_function)
    def call(*args, **kwargs):
        try:
            return op_function(*args, **kwargs)
        except jax.errors.JaxRuntimeError as e:
            found = _HANDLER_ERROR.search(str(e))
            kind = getattr(errors, found.group(1), None) if found else None
            if not (isinstance(kind, type) and issubclass(kind, errors.Error)):
                raise
            raise kind(found.group(2)) from e
    return call


# ---------------------------------------------------------------------------
# Argument handling
# ---------------------------------------------------------------------------


def array(a, op: str, name: str, *, required: bool = False):
    """A JAX array (NumPy arrays are converted); None stays None unless required."""
    if a is None:
        if required:
            raise ArgumentError(f"{op}: {name} is required, got None")
        return None
    if isinstance(a, jax.Array):  # includes tracers under jit/grad/vmap
        return a
    if isinstance(a, (np.ndarray, np.generic)):
        return jnp.asarray(a)
    raise FrameworkError(f"{op}: {name}: expected a jax.Array, got {type(a).__module__}.{type(a).__qualname__} "
                         "(rudnn.jax takes JAX or NumPy arrays; use rudnn.<op> for other frameworks)")


def spec(a):
    """(shape, dtype name): what the C++ validation needs to know about an abstract array."""
    return None if a is None else (tuple(int(d) for d in a.shape), jnp.dtype(a.dtype).name)


def static_float(v, op: str, name: str) -> float:
    """float(v) of a static real number; strings and bools are refused like traced arrays."""
    if not isinstance(v, (str, bytes, bool)):
        try:
            return float(v)
        except (TypeError, ValueError):  # includes jax's ConcretizationTypeError for traced values
            pass
    raise ArgumentError(f"{op}: {name}: expected a Python float (a static value, not a traced array), "
                        f"got {type(v).__name__}")


def no_out(op: str, out) -> None:
    if out is not None:
        raise UnsupportedError(f"rudnn.jax.{op}: out= is not supported for JAX arrays (they are immutable); "
                               "use the returned array")


def present(*arrays):
    return tuple(a for a in arrays if a is not None)


def sds(shape, dtype):
    return jax.ShapeDtypeStruct(tuple(shape), dtype)


def row_batching_rule(f, row_args, row_only_outputs):
    """vmap rule for a custom call that works on rows of its row arguments.

    When only row arguments (x, residual, dy, statistics) are batched and every output is
    row-wise, the batch axis becomes one more leading axis of the rows and the op runs
    once on the bigger problem. Otherwise (a batched weight/bias, or outputs reduced over
    rows such as dweight) it runs once per batch element (lax.map).
    """

    def rule(axis_size, in_batched, *args):
        batched_params = any(b for b, is_row in zip(in_batched, row_args) if not is_row)
        if row_only_outputs and not batched_params:
            args = [a if b else jnp.broadcast_to(a, (axis_size,) + a.shape) if is_row else a
                    for a, b, is_row in zip(args, in_batched, row_args)]
            out = f(*args)
        else:
            def one(batched):
                it = iter(batched)
                return f(*[next(it) if b else a for a, b in zip(args, in_batched)])

            out = jax.lax.map(one, tuple(a for a, b in zip(args, in_batched) if b))
        return out, tuple(True for _ in out)

    return rule


def unpack(outs):
    return outs[0] if len(outs) == 1 else tuple(outs)

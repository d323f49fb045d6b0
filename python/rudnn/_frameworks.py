"""The only module that knows torch, CuPy, JAX and NumPy.

It tells which framework and device a call's arrays belong to, allocates outputs
and workspaces with that framework on that device, finds the framework's current
CUDA stream, and exports arrays as DLPack capsules for that stream.
"""

from __future__ import annotations

import sys
import warnings

from .errors import ArgumentError, DeviceError, DTypeError, FrameworkError, UnsupportedError

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
# Every dtype libruDNN's arrays can have (cpp/bindings/tensor_convert.hpp).
DTYPES = FLOAT_DTYPES + ("int32", "int64", "uint32", "uint8", "bool")


_FRAMEWORK_OF_TYPE: dict = {}  # type -> framework name: the test below runs once per array type


def _module_of(a) -> str | None:
    """The framework of array `a` without importing any framework."""
    t = type(a)
    try:
        return _FRAMEWORK_OF_TYPE[t]
    except KeyError:
        name = _FRAMEWORK_OF_TYPE[t] = _classify(a)
        return name
    except TypeError:  # an unhashable type
        return _classify(a)


def _classify(a) -> str | None:
    mod = type(a).__module__.split(".")[0]
    if mod == "torch" and "torch" in sys.modules and isinstance(a, sys.modules["torch"].Tensor):
        return "torch"
    if mod in ("jax", "jaxlib"):
        return "jax"
    if mod == "cupy":
        return "cupy"
    if mod == "numpy" and type(a).__name__ == "ndarray":
        return "numpy"
    return None


def is_jax(a) -> bool:
    return a is not None and _module_of(a) == "jax"


def _stream_handle(op, stream) -> int:
    """An explicit stream= argument as an integer cudaStream_t (checked on the CPU too, where it
    is not used, so that a call does not pass on one machine and fail on another)."""
    for attr in ("cuda_stream", "ptr"):  # torch.cuda.Stream, cupy Stream
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    if isinstance(stream, int) and not isinstance(stream, bool) and stream >= 0:
        return stream
    raise ArgumentError(f"{op}: stream: expected None, a torch.cuda.Stream, a cupy Stream or a cudaStream_t "
                        f"handle (an int >= 0), got {stream!r}")


class _Torch:
    name = "torch"

    def __init__(self):
        import torch

        self.torch = torch
        self.dtypes = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                       "uint8": torch.uint8, "int32": torch.int32, "int64": torch.int64,
                       "uint32": torch.uint32, "bool": torch.bool}
        self.names = {v: k for k, v in self.dtypes.items()}
        self.devices = {}
        # torch.Tensor.__dlpack__ is a Python method that repeats checks done here (grad, neg and
        # conj bits) and costs ~2 µs a call; the exporter it wraps does the same export without
        # stream handling, which is all the CPU and a same-stream export need.
        self.to_dlpack = torch._C._to_dlpack

    def device(self, a):
        d = a.device
        return (d.type, d.index if d.index is not None else 0)

    def dtype_name(self, a):
        name = self.names.get(a.dtype)
        return name if name is not None else str(a.dtype).replace("torch.", "")

    def empty(self, shape, dtype, device):
        return self.torch.empty(tuple(shape), dtype=self.dtypes[dtype], device=self._device(device))

    def zeros(self, shape, dtype, device):
        return self.torch.zeros(tuple(shape), dtype=self.dtypes[dtype], device=self._device(device))

    def _device(self, device):
        d = self.devices.get(device)  # a torch.device is cheaper to pass than a string to parse
        if d is None:
            d = self.devices[device] = self.torch.device("cpu" if device[0] == "cpu" else f"cuda:{device[1]}")
        return d

    def current_stream(self, device):
        return self.torch.cuda.current_stream(device[1]).cuda_stream

    def copy_from_host(self, dst, host, stream, current):
        """Copies the NumPy array `host` into the device tensor `dst`, ordered on `stream`
        (queued there; the pageable source is consumed before this returns)."""
        src = self.torch.from_numpy(host)
        if stream == current:
            dst.copy_(src, non_blocking=True)
            return
        with self.torch.cuda.stream(self.torch.cuda.ExternalStream(stream, device=dst.device)):
            dst.copy_(src, non_blocking=True)

    def check_exportable(self, op, name, a, writes):
        # DLPack carries no negative or conjugate bit: the data would be read without its sign.
        if a.is_neg() or a.is_conj():
            raise FrameworkError(f"{op}: {name}: a torch view with the {'negative' if a.is_neg() else 'conjugate'} "
                                 f"bit set (as .conj().imag gives) cannot be passed through DLPack; call "
                                 f".resolve_neg() / .resolve_conj() first")

    def check_autograd(self, op, present, outputs):
        """rudnn's eager ops record no autograd: say so where torch would have recorded it. With
        out= this is an error, as torch refuses out= arguments that need gradients."""
        if not self.torch.is_grad_enabled():  # torch.no_grad(), or inside a rudnn.torch custom op
            return
        needing = [name for name, a in present if a.requires_grad and name not in outputs]
        if not needing:
            return
        if any(name in outputs for name, _ in present):
            raise ArgumentError(f"{op}: out: an out= array records no gradient, and {needing[0]} requires grad; "
                                f"drop out= or run under torch.no_grad()")
        warnings.warn(f"{op}: {needing[0]} requires grad, but rudnn's eager ops record no autograd graph: use the "
                      f"rudnn.torch op of the same name for gradients, or run under torch.no_grad()",
                      stacklevel=4)

    def capsule(self, a, stream, current):
        # On the CPU, or on the producer's stream, there is nothing to order: export directly
        # (check_exportable has refused neg/conj views). Otherwise torch makes `stream` wait.
        if stream == current:
            return self.to_dlpack(a)
        return a.detach().__dlpack__(stream=stream if stream != 0 else 1)


class _CuPy:
    name = "cupy"

    def __init__(self):
        import cupy

        self.cupy = cupy

    def device(self, a):
        return ("cuda", a.device.id)

    def dtype_name(self, a):
        return str(a.dtype)

    def empty(self, shape, dtype, device):
        with self.cupy.cuda.Device(device[1]):
            return self.cupy.empty(tuple(shape), dtype=self._dtype(dtype))

    def zeros(self, shape, dtype, device):
        with self.cupy.cuda.Device(device[1]):
            return self.cupy.zeros(tuple(shape), dtype=self._dtype(dtype))

    def _dtype(self, dtype):
        if dtype == "bfloat16":
            raise UnsupportedError("cupy has no bfloat16 arrays; use torch or jax for bfloat16")
        return dtype

    def current_stream(self, device):
        with self.cupy.cuda.Device(device[1]):
            return self.cupy.cuda.get_current_stream().ptr

    def copy_from_host(self, dst, host, stream, current):
        """Copies the NumPy array `host` into the device array `dst`, ordered on `stream`."""
        with self.cupy.cuda.Device(dst.device.id):
            dst.set(host, stream=None if stream == current else self.cupy.cuda.ExternalStream(stream))

    def check_exportable(self, op, name, a, writes):
        pass

    def capsule(self, a, stream, current):
        if stream == current:
            return a.__dlpack__(stream=-1)
        return a.__dlpack__(stream=stream if stream != 0 else 1)


class _NumPy:
    name = "numpy"

    def __init__(self):
        import numpy

        self.np = numpy

    def device(self, a):
        return ("cpu", 0)

    def dtype_name(self, a):
        return str(a.dtype)

    def empty(self, shape, dtype, device):
        return self.np.empty(tuple(shape), dtype=self._dtype(dtype))

    def zeros(self, shape, dtype, device):
        return self.np.zeros(tuple(shape), dtype=self._dtype(dtype))

    def _dtype(self, dtype):
        if dtype == "bfloat16":
            raise UnsupportedError("NumPy arrays cannot carry bfloat16 through DLPack; use torch or jax for bfloat16")
        return dtype

    def current_stream(self, device):
        return 0

    def check_exportable(self, op, name, a, writes):
        if writes and not a.flags.writeable:
            raise ArgumentError(f"{op}: {name}: expected a writable array, got a read-only numpy.ndarray "
                                f"(np.broadcast_to and friends return read-only views)")

    def capsule(self, a, stream, current):
        # nanobind reads NumPy arrays directly (buffer protocol), read-only ones included.
        if str(a.dtype) == "bfloat16":
            raise UnsupportedError("NumPy arrays cannot carry bfloat16 through DLPack; use torch or jax for bfloat16")
        return a


_adapters: dict = {}


def _adapter(name):
    if name not in _adapters:
        _adapters[name] = {"torch": _Torch, "cupy": _CuPy, "numpy": _NumPy}[name]()
    return _adapters[name]


def _describe(a) -> str:
    return f"{type(a).__module__}.{type(a).__name__}"


class Call:
    """The arrays of one op call: one framework, one device, one stream.

    `arrays` maps argument names to arrays (None for absent optional ones); the
    first non-None entry decides the framework and the device. `required` names the arrays
    that may not be None (default: the first); `outputs` those the op writes (caller-given
    out= arrays), which must be writable.
    """

    def __init__(self, op: str, arrays: dict, stream=None, required=None, outputs=("out",)):
        self.op = op
        for name in required or list(arrays)[:1]:  # by default the first array is required
            if arrays[name] is None:
                raise FrameworkError(f"{op}: {name}: expected a torch.Tensor, cupy.ndarray, numpy.ndarray or "
                                     f"jax.Array, got None")
        present = [(k, v) for k, v in arrays.items() if v is not None]
        first_name, first = present[0]
        fw = _module_of(first)
        if fw is None or fw == "jax":
            raise FrameworkError(
                f"{op}: {first_name}: expected a torch.Tensor, cupy.ndarray, numpy.ndarray or jax.Array, "
                f"got {_describe(first)}")
        self.fw = _adapter(fw)
        self.device = self.fw.device(first)
        for name, a in present[1:]:
            other = _module_of(a)
            if other != fw:
                raise FrameworkError(
                    f"{op}: {name}: expected a {_describe(first)} like {first_name} (one framework per call), "
                    f"got {_describe(a)}")
            dev = self.fw.device(a)
            if dev != self.device:
                raise DeviceError(f"{op}: {name}: expected device {_fmt(self.device)} like {first_name}, "
                                  f"got {_fmt(dev)}")
        for name, a in present:  # each op's own checks then say which of these it takes
            dtype = self.fw.dtype_name(a)
            if dtype not in DTYPES:
                raise DTypeError(f"{op}: {name}: {dtype} arrays are not taken by rudnn (its data arrays are "
                                 f"{', '.join(FLOAT_DTYPES)}; its index arrays int32, int64, uint32, uint8 or bool), "
                                 f"got {dtype}")
            self.fw.check_exportable(op, name, a, writes=name in outputs)
        if fw == "torch":
            self.fw.check_autograd(op, present, outputs)
        handle = None if stream is None else _stream_handle(op, stream)
        if self.device[0] == "cuda":
            self.current = self.fw.current_stream(self.device)
            self.stream = handle if handle is not None else self.current
        elif self.device[0] == "cpu":
            self.current = self.stream = 0
        else:
            raise DeviceError(f"{op}: {first_name}: unsupported device {_fmt(self.device)} (expected cpu or cuda)")

    def arg(self, a):
        """The DLPack capsule (or array) to hand to rudnn._C for array `a`."""
        if a is None:
            return None
        return self.fw.capsule(a, self.stream, self.current)

    def empty(self, shape, dtype):
        return self.fw.empty(shape, dtype, self.device)

    def zeros(self, shape, dtype):
        return self.fw.zeros(shape, dtype, self.device)

    def copy_from_host(self, dst, host):
        """Host NumPy data into the device array dst of this call, on its stream."""
        self.fw.copy_from_host(dst, host, self.stream, self.current)

    def workspace_alloc(self, nbytes):
        """A uint8 workspace of nbytes, as the capsule rudnn._C takes (the bindings call this
        with the size they computed, so that no array is exported twice)."""
        return self.arg(self.empty((nbytes,), "uint8"))

    def dtype_name(self, a):
        return self.fw.dtype_name(a)


def _fmt(device) -> str:
    return "cpu" if device[0] == "cpu" else f"{device[0]}:{device[1]}"

"""rudnn.torch's eager fast path (python/rudnn/torch/_op.py): a call that needs nothing of the
custom-op machinery runs the op's function directly; every call that does (autograd, tracing,
fake tensors, dispatch modes, functorch, mutation) still goes through the registered op."""

import importlib
import pathlib

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode

import rudnn.torch as rt
from rudnn.torch import _op
from util import rand

# The modules (rudnn.torch.attention etc. are also the names of functions in rudnn.torch).
MODULES = [importlib.import_module(f"rudnn.torch.{m}") for m in
           ("attention", "conv", "ctc", "gated_delta", "grid_sample", "interpolate", "moe", "norm", "paged", "pooling")]
rt_norm, rt_paged = importlib.import_module("rudnn.torch.norm"), importlib.import_module("rudnn.torch.paged")


class _OpEntered(Exception):
    pass


def _forbid(*args, **kwargs):
    raise _OpEntered


@pytest.fixture
def op_forbidden(monkeypatch):
    """Entering the registered norm forward op raises, so a call that returns took the direct path."""
    monkeypatch.setattr(rt_norm._norm_forward, "op", _forbid)


def _inputs():
    return rand((6, 64), torch.float32, "cpu"), rand((64,), torch.float32, "cpu", seed=1, offset=1.0)


def test_plain_eager_call_skips_the_op_and_matches_it(monkeypatch):
    x, w = _inputs()
    through_op = rt_norm._norm_forward.op(x, w, None, None, 1e-6, 1)
    monkeypatch.setattr(rt_norm._norm_forward, "op", _forbid)
    direct = rt_norm._norm_forward(x, w, None, None, 1e-6, 1)
    assert len(direct) == len(through_op)
    for a, b in zip(direct, through_op):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    y = rt.rms_norm(x, w)  # the public wrapper too
    assert torch.equal(y, through_op[0])


def test_parameters_without_grad_mode_take_the_direct_path(op_forbidden):
    x, w = _inputs()
    p = torch.nn.Parameter(w)
    with torch.no_grad():
        rt.rms_norm(x, p)
    with torch.inference_mode():
        rt.rms_norm(x, w)


def test_inputs_autograd_tracks_go_through_the_op(op_forbidden):
    x, w = _inputs()
    with pytest.raises(_OpEntered):
        rt.rms_norm(x.requires_grad_(), w)
    with pytest.raises(_OpEntered):
        rt.rms_norm(x.detach(), torch.nn.Parameter(w))


def test_autograd_still_works_through_the_op():
    x, w = _inputs()
    xs = x.clone().requires_grad_()
    rt.rms_norm(xs, w).sum().backward()
    xo = x.clone().double().requires_grad_()
    torch.nn.functional.rms_norm(xo, (64,), w.double(), 1e-6).sum().backward()
    torch.testing.assert_close(xs.grad.double(), xo.grad, rtol=1e-5, atol=1e-6)


def test_make_fx_records_the_op():
    x, w = _inputs()
    graph = make_fx(lambda a, b: rt.rms_norm(a, b))(x, w)
    assert "rudnn.norm_forward" in str(graph.graph)


def test_fake_tensors_go_through_the_fake_implementation():
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    with FakeTensorMode():
        x = torch.empty(6, 64)
        w = torch.empty(64)
        y = rt.rms_norm(x, w)
    assert isinstance(y, FakeTensor) and y.shape == (6, 64)


def test_a_dispatch_mode_sees_the_op():
    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    x, w = _inputs()
    with Record():
        y = rt.rms_norm(x, w)
    assert "rudnn.norm_forward.default" in seen
    assert torch.equal(y, rt.rms_norm(x, w))


def test_a_function_mode_keeps_the_op(op_forbidden):
    x, w = _inputs()
    with torch.device("cpu"), pytest.raises(_OpEntered):
        rt.rms_norm(x, w)


def test_vmap_never_hands_batched_tensors_to_rudnn():
    x, w = _inputs()
    xb = x.reshape(2, 3, 64)
    try:
        got = torch.vmap(lambda a: rt.rms_norm(a, w))(xb)
    except RuntimeError as e:  # the op has no batching rule: torch says so
        assert "rudnn" in str(e) or "vmap" in str(e).lower() or "batch" in str(e).lower()
    else:
        assert torch.equal(got, torch.stack([rt.rms_norm(xi, w) for xi in xb]))


def test_mutating_ops_always_take_the_op():
    ops = [v for m in MODULES for v in vars(m).values() if isinstance(v, _op.Op)]
    assert len(ops) == 41, len(ops)  # every custom op of rudnn.torch
    assert rt_paged._append_op.direct is False
    assert all(op.direct for op in ops if op is not rt_paged._append_op)


def test_every_custom_op_is_defined_through_the_one_rule():
    root = pathlib.Path(rt.__file__).parent
    for path in root.glob("*.py"):
        if path.name != "_op.py":
            assert "torch.library.custom_op(" not in path.read_text(), f"{path.name} bypasses rudnn.torch._op"

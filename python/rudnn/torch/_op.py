"""How rudnn.torch defines and calls its custom ops.

A torch.library custom op costs about 70 us of host time per eager call on top of the rudnn call
it wraps (measured on the CPU, torch 2.13: the dispatcher, the autograd wrapper and dynamo's
disable guard), which is several times a decode-sized kernel. So a call that needs none of what
the op machinery adds goes straight to the function the op wraps: plain eager mode, no input
that autograd must track, no tracer, no tensor subclass, no dispatch or function mode. Every other
call (autograd, torch.compile, make_fx/export, FakeTensor, functorch transforms, jit tracing)
goes through the registered op exactly as before. Ops that mutate an argument always take the
registered op, which bumps the mutated tensors' version counters for autograd's checks.
"""

from __future__ import annotations

import torch

_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)
_wrapped = torch._C._functorch.is_functorch_wrapped_tensor


def _plain_eager(args, kwargs) -> bool:
    """True when calling the op's function directly is indistinguishable from calling the op.
    (Dynamo, which traces this code, only sees the first test: is_compiling is True for it.)"""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return False
    if torch._C._len_torch_dispatch_stack() or torch._C._len_torch_function_stack():
        return False
    grad = torch.is_grad_enabled()
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            if type(a) not in _PLAIN_TYPES or (grad and a.requires_grad) or _wrapped(a):
                return False
    return True


class Op:
    """A registered custom op (`op`, what torch.ops.rudnn.<name> runs) and the function it
    wraps (`fn`); calling it picks one as the module docstring says."""

    __slots__ = ("op", "fn", "direct")

    def __init__(self, op, fn, direct: bool):
        self.op, self.fn, self.direct = op, fn, direct

    def register_fake(self, fake):
        return self.op.register_fake(fake)

    def __call__(self, *args, **kwargs):
        if self.direct and _plain_eager(args, kwargs):
            return self.fn(*args, **kwargs)
        return self.op(*args, **kwargs)


def custom_op(name: str, *, mutates_args=()):
    """torch.library.custom_op with rudnn's eager fast path (see the module docstring)."""
    def wrap(fn):
        op = torch.library.custom_op(name, mutates_args=mutates_args)(fn)
        return Op(op, fn, direct=not mutates_args)
    return wrap

"""rudnn.jax.ctc_loss (XLA FFI on the cpu and CUDA platforms): the loss and jax.grad against
torch's float64 ctc_loss and autograd, under jit; rudnn.ctc_loss with JAX arrays; errors."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

jax = pytest.importorskip("jax")
jnp = jax.numpy

import rudnn  # noqa: E402
import rudnn.jax as rj  # noqa: E402
from util import jax_gpu  # noqa: E402

if not rudnn._C.has_jax_ffi:
    pytest.skip("this build has no XLA FFI handlers", allow_module_level=True)

# JAX's default device on the CPU: the cpu handlers. The CUDA tests put their arrays on the GPU.
pytestmark = pytest.mark.usefixtures("jax_on_cpu")


GPU = jax_gpu()
needs_jax_gpu = pytest.mark.skipif(GPU is None, reason="needs a JAX CUDA device and a CUDA build of rudnn")

TOL = 2e-5
TARGETS = np.array([[1, 2, 2, 3], [4, 1, 1, 0], [3, 3, 3, 3]], np.int32)
IL, TL = np.array([14, 11, 6], np.int32), np.array([4, 3, 4], np.int32)  # the last is impossible


def _log_probs(T=14, N=3, C=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(T, N, C, generator=g, dtype=torch.float64) * 2).log_softmax(-1).float()


def _oracle(lp, reduction, zero_infinity, dloss):
    x = lp.double().requires_grad_()
    loss = F.ctc_loss(x, torch.from_numpy(TARGETS).long(), torch.from_numpy(IL).long(), torch.from_numpy(TL).long(),
                      reduction=reduction, zero_infinity=zero_infinity)
    loss.backward(torch.as_tensor(np.asarray(dloss), dtype=torch.float64))
    return loss.detach().numpy(), x.grad.numpy()


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("zero_infinity", [False, True])
def test_jit_and_grad_match_torch(reduction, zero_infinity):
    lp = _log_probs()
    kw = dict(reduction=reduction, zero_infinity=zero_infinity)
    loss = jax.jit(lambda x: rj.ctc_loss(x, TARGETS, IL, TL, **kw))(jnp.asarray(lp.numpy()))
    dloss = np.linspace(0.5, 1.5, loss.size, dtype=np.float32).reshape(loss.shape)
    ref_loss, ref_grad = _oracle(lp, reduction, zero_infinity, dloss)
    np.testing.assert_allclose(np.asarray(loss), ref_loss, rtol=TOL, atol=TOL)

    def weighted(x):
        return jnp.sum(rj.ctc_loss(x, jnp.asarray(TARGETS), jnp.asarray(IL), jnp.asarray(TL), **kw) * dloss)

    grad = jax.jit(jax.grad(weighted))(jnp.asarray(lp.numpy()))
    np.testing.assert_allclose(np.asarray(grad), ref_grad, rtol=TOL, atol=TOL)
    explicit = rj.ctc_loss_backward(jnp.asarray(dloss), jnp.asarray(lp.numpy()), TARGETS, IL, TL, **kw)
    np.testing.assert_allclose(np.asarray(explicit), ref_grad, rtol=TOL, atol=TOL)


def test_top_level_and_batch_less():
    lp = _log_probs(N=1)
    loss = rudnn.ctc_loss(jnp.asarray(lp[:, 0].numpy()), TARGETS[0], 14, 4, reduction="none")
    ref = F.ctc_loss(lp[:, 0].double(), torch.from_numpy(TARGETS[0]).long(), torch.tensor(14), torch.tensor(4),
                     reduction="none")
    assert loss.shape == ()
    np.testing.assert_allclose(np.asarray(loss), ref.numpy(), rtol=TOL)


def test_value_errors_are_rudnn_errors():
    with pytest.raises(rudnn.ArgumentError, match=r"ctc_loss: input_lengths: expected values in \[0, 14\]"):
        rj.ctc_loss(jnp.asarray(_log_probs().numpy()), TARGETS, np.array([15, 1, 1], np.int32), TL)
    with pytest.raises(rudnn.ArgumentError, match="ctc_loss: reduction: expected 'none', 'mean' or 'sum'"):
        rj.ctc_loss(jnp.asarray(_log_probs().numpy()), TARGETS, IL, TL, reduction="max")


def gpu(a):
    return jax.device_put(jnp.asarray(a), GPU)


@pytest.mark.cuda
@needs_jax_gpu
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("zero_infinity", [False, True])
def test_cuda_jit_and_grad_match_torch(reduction, zero_infinity):
    """The CUDA handlers (targets and lengths copied to the host on XLA's stream, the workspace
    from XLA's scratch memory): log_probs on the GPU, the integer operands as NumPy arrays (put on
    the GPU by XLA) and as GPU arrays, eager and jitted, the loss and jax.grad against torch."""
    lp = _log_probs()
    kw = dict(reduction=reduction, zero_infinity=zero_infinity)
    x = gpu(lp.numpy())
    ints = [gpu(a) for a in (TARGETS, IL, TL)]
    loss = jax.jit(lambda x: rj.ctc_loss(x, TARGETS, IL, TL, **kw))(x)
    assert loss.devices() == {GPU}
    dloss = np.linspace(0.5, 1.5, loss.size, dtype=np.float32).reshape(loss.shape)
    ref_loss, ref_grad = _oracle(lp, reduction, zero_infinity, dloss)
    np.testing.assert_allclose(np.asarray(loss), ref_loss, rtol=TOL, atol=TOL)
    np.testing.assert_allclose(np.asarray(rj.ctc_loss(x, *ints, **kw)), ref_loss, rtol=TOL, atol=TOL)

    def weighted(x):
        return jnp.sum(rj.ctc_loss(x, *ints, **kw) * dloss)

    grad = jax.jit(jax.grad(weighted))(x)
    assert grad.devices() == {GPU}
    np.testing.assert_allclose(np.asarray(grad), ref_grad, rtol=TOL, atol=TOL)
    explicit = rj.ctc_loss_backward(gpu(dloss), x, *ints, **kw)
    assert explicit.devices() == {GPU}
    np.testing.assert_allclose(np.asarray(explicit), ref_grad, rtol=TOL, atol=TOL)


@pytest.mark.cuda
@needs_jax_gpu
def test_cuda_concatenated_float16_matches_the_cpu_handler():
    """Concatenated GPU targets and float16 log_probs: the CUDA handler against the cpu handler on
    the same values (both compute in float32; the results may differ by one float16 rounding)."""
    lp = _log_probs(seed=3).half().numpy()
    concat = np.concatenate([TARGETS[n, :TL[n]] for n in range(3)]).astype(np.int32)
    kw = dict(reduction="none", zero_infinity=True)
    on_gpu = rj.ctc_loss(gpu(lp), gpu(concat), gpu(IL), gpu(TL), **kw)
    on_cpu = rj.ctc_loss(jnp.asarray(lp), concat, IL, TL, **kw)
    assert on_gpu.dtype == jnp.float16 and on_gpu.devices() == {GPU}
    np.testing.assert_allclose(np.asarray(on_gpu, np.float32), np.asarray(on_cpu, np.float32), rtol=2e-3, atol=2e-3)
    dloss = np.array([1.0, -0.5, 2.0], np.float16)
    grad_gpu = rj.ctc_loss_backward(gpu(dloss), gpu(lp), gpu(concat), gpu(IL), gpu(TL), **kw)
    grad_cpu = rj.ctc_loss_backward(jnp.asarray(dloss), jnp.asarray(lp), concat, IL, TL, **kw)
    np.testing.assert_allclose(np.asarray(grad_gpu, np.float32), np.asarray(grad_cpu, np.float32), rtol=2e-3,
                               atol=2e-3)


@pytest.mark.cuda
@needs_jax_gpu
def test_cuda_value_errors_are_rudnn_errors():
    """The checks of the values read from the GPU: the same messages as on the cpu platform, as a
    rudnn error where the handler fails inside the eager call, or as XLA's runtime error naming it
    where the GPU client reports the failure when the result is waited for."""
    x = gpu(_log_probs().numpy())
    errors = (rudnn.ArgumentError, jax.errors.JaxRuntimeError)
    with pytest.raises(errors, match=r"ctc_loss: input_lengths: expected values in \[0, 14\]"):
        jax.block_until_ready(rj.ctc_loss(x, gpu(TARGETS), gpu(np.array([15, 1, 1], np.int32)), gpu(TL)))
    blank_inside = TARGETS.copy()
    blank_inside[1, 2] = 0
    with pytest.raises(errors, match=r"ctc_loss_backward: targets: expected labels in \[0, 5\) other "
                                     r"than blank \(0\), got 0 at position 2 of sequence 1"):
        jax.block_until_ready(rj.ctc_loss_backward(gpu(np.float32(1)), x, gpu(blank_inside), gpu(IL), gpu(TL)))

"""rudnn.jax.ctc_loss (XLA FFI on the cpu platform): the loss and jax.grad against torch's
float64 ctc_loss and autograd, under jit; rudnn.ctc_loss with JAX arrays; errors."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

jax = pytest.importorskip("jax")
jnp = jax.numpy

import rudnn  # noqa: E402
import rudnn.jax as rj  # noqa: E402

if not rudnn._C.has_jax_ffi:
    pytest.skip("this build has no XLA FFI handlers", allow_module_level=True)

pytestmark = pytest.mark.usefixtures("jax_on_cpu")  # the CTC handlers are registered for the cpu platform

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

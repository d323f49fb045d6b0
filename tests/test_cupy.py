"""CuPy arrays through the rudnn entry points (CUDA only: CuPy has no CPU arrays). Each result
must be a cupy.ndarray on the input's device, equal to what the same call gives for torch
tensors holding the same data (the same kernels run), and ordered on CuPy's current stream.
Named *_cuda so that `pytest -k cuda` (the GPU check) selects them; skipped without CuPy or a GPU."""

import numpy as np
import pytest
import torch

import rudnn

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.cuda


def _both(shape, dtype=np.float32, seed=0):
    """The same random data as a cupy array and a torch CUDA tensor."""
    host = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    return cp.asarray(host), torch.from_numpy(host).cuda()


def _same(ours, theirs):
    assert isinstance(ours, cp.ndarray), type(ours)
    np.testing.assert_array_equal(cp.asnumpy(ours), theirs.cpu().numpy())


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_norms_cuda(dtype):
    x_cp, x_t = _both((33, 200), dtype)
    w_cp, w_t = _both((200,), np.float32, seed=1)
    b_cp, b_t = _both((200,), np.float32, seed=2)
    _same(rudnn.layer_norm(x_cp, w_cp, b_cp), rudnn.layer_norm(x_t, w_t, b_t))
    _same(rudnn.rms_norm(x_cp, w_cp), rudnn.rms_norm(x_t, w_t))
    _same(rudnn.softmax(x_cp), rudnn.softmax(x_t))


def test_norm_backward_cuda():
    x_cp, x_t = _both((16, 96))
    dy_cp, dy_t = _both((16, 96), seed=3)
    w_cp, w_t = _both((96,), seed=4)
    _, mean_cp, rstd_cp = rudnn.layer_norm(x_cp, w_cp, return_stats=True)
    _, mean_t, rstd_t = rudnn.layer_norm(x_t, w_t, return_stats=True)
    for ours, theirs in zip(rudnn.layer_norm_backward(dy_cp, x_cp, w_cp, mean_cp, rstd_cp),
                            rudnn.layer_norm_backward(dy_t, x_t, w_t, mean_t, rstd_t)):
        if theirs is not None:
            _same(ours, theirs)


def test_attention_cuda():
    (q_cp, q_t), (k_cp, k_t), (v_cp, v_t) = (_both((2, 4, 70, 64), np.float16, seed=s) for s in (5, 6, 7))
    out_cp, lse_cp = rudnn.attention(q_cp, k_cp, v_cp, causal=True, return_lse=True)
    out_t, lse_t = rudnn.attention(q_t, k_t, v_t, causal=True, return_lse=True)
    _same(out_cp, out_t)
    _same(lse_cp, lse_t)


def test_current_stream_cuda():
    """A call made under a non-default CuPy stream runs on it: the result is complete once that
    stream is synchronized, with no device-wide synchronization."""
    x_cp, x_t = _both((4096, 512), seed=8)
    w_cp, w_t = _both((512,), seed=9)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        y = rudnn.rms_norm(x_cp, w_cp)
        stream.synchronize()
    _same(y, rudnn.rms_norm(x_t, w_t))


def test_mixed_frameworks_cuda():
    x_cp, _ = _both((4, 8))
    _, w_t = _both((8,), seed=1)
    with pytest.raises(rudnn.FrameworkError):
        rudnn.rms_norm(x_cp, w_t)

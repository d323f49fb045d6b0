"""layer_norm / rms_norm / softmax and their backward functions against torch.nn.functional
(float64 oracle on the CPU; error budget: twice that of the same-dtype torch computation)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import rudnn
from reference import norm as ref
from util import DEVICES, DTYPES, assert_close_to_oracle, rand

SHAPES = [(1, 1), (3, 1), (5, 7), (4, 65), (2, 3, 96), (3, 1000), (2, 4097), (2, 65536)]
EMPTY = [(0, 16), (2, 0, 8)]


def _params(H, dtype, param_dtype, device, bias=True, seed=1):
    pdt = dtype if param_dtype == "x" else torch.float32
    w = rand((H,), pdt, device, seed=seed, scale=0.5, offset=1.0)
    b = rand((H,), pdt, device, seed=seed + 1) if bias else None
    return w, b


def _oracle_layer_norm(h, w, b, eps):
    H = h.shape[-1]
    return F.layer_norm(h.cpu().double(), (H,), None if w is None else w.cpu().double(),
                        None if b is None else b.cpu().double(), eps)


def _torch_layer_norm(h, w, b, eps):
    """The same computation by torch in h's dtype (its error sets our budget)."""
    H = h.shape[-1]
    cast = lambda t: None if t is None else t.cpu().to(h.dtype)
    return F.layer_norm(h.cpu(), (H,), cast(w), cast(b), eps)


def _oracle_rms_norm(h, w, eps):
    return F.rms_norm(h.cpu().double(), (h.shape[-1],), None if w is None else w.cpu().double(), eps)


def _torch_rms_norm(h, w, eps):
    return F.rms_norm(h.cpu(), (h.shape[-1],), None if w is None else w.cpu().to(h.dtype), eps)


# ---- forward ---------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("param_dtype", ["f32", "x"])
def test_layer_norm_forward(device, dtype, shape, param_dtype):
    x = rand(shape, dtype, device, scale=2.0, offset=0.5)
    w, b = _params(shape[-1], dtype, param_dtype, device)
    y, mean, rstd = rudnn.layer_norm(x, w, b, eps=1e-5, return_stats=True)
    assert y.dtype == dtype and y.device == x.device and mean.dtype == rstd.dtype == torch.float32
    assert_close_to_oracle(y, _torch_layer_norm(x, w, b, 1e-5), _oracle_layer_norm(x, w, b, 1e-5), "y")
    m64, r64 = ref.layer_norm_stats(x.cpu(), 1e-5)
    torch.testing.assert_close(mean.cpu().double(), m64, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rstd.cpu().double(), r64, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("param_dtype", ["f32", "x"])
def test_rms_norm_forward(device, dtype, shape, param_dtype):
    x = rand(shape, dtype, device, scale=2.0, offset=0.5)
    w, _ = _params(shape[-1], dtype, param_dtype, device, bias=False)
    y, rstd = rudnn.rms_norm(x, w, eps=1e-6, return_stats=True)
    assert y.dtype == dtype and rstd.shape == shape[:-1]
    assert_close_to_oracle(y, _torch_rms_norm(x, w, 1e-6), _oracle_rms_norm(x, w, 1e-6), "y")
    torch.testing.assert_close(rstd.cpu().double(), ref.rms_norm_rstd(x.cpu(), 1e-6), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_softmax_forward(device, dtype, shape):
    x = rand(shape, dtype, device, scale=3.0)
    y = rudnn.softmax(x)
    assert y.dtype == dtype
    assert_close_to_oracle(y, torch.softmax(x.cpu(), -1), ref.softmax(x.cpu()), "y")


@pytest.mark.parametrize("device", DEVICES)
def test_no_weight_no_bias(device):
    x = rand((6, 33), torch.float32, device)
    assert_close_to_oracle(rudnn.layer_norm(x), _torch_layer_norm(x, None, None, 1e-5),
                           _oracle_layer_norm(x, None, None, 1e-5))
    assert_close_to_oracle(rudnn.rms_norm(x), _torch_rms_norm(x, None, 1e-6), _oracle_rms_norm(x, None, 1e-6))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", EMPTY)
def test_empty_batches(device, shape):
    x = rand(shape, torch.float16, device)
    w = torch.ones(shape[-1], device=device)
    y, mean, rstd = rudnn.layer_norm(x, w, return_stats=True)
    assert y.shape == shape and mean.shape == shape[:-1] and rstd.shape == shape[:-1]
    assert rudnn.rms_norm(x, w).shape == shape and rudnn.softmax(x).shape == shape
    dx, dw, db = rudnn.layer_norm_backward(x, x, w, mean, rstd)
    assert dx.shape == shape and torch.equal(dw.cpu(), torch.zeros(shape[-1])) and torch.equal(db.cpu(), dw.cpu())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_rows_and_out(device, dtype):
    """Rows with gaps (a [B, S, H] slice of a bigger buffer) in and out: no copies needed."""
    big = rand((4, 9, 80), dtype, device, scale=2.0)
    x = big[:, 1:8:2, :70]  # leading strides 720 and 160; last axis dense
    out_buf = torch.full((4, 5, 72), 7.0, dtype=dtype, device=device)
    out = out_buf[:, :4, 1:71]
    w, b = _params(70, dtype, "f32", device)
    y = rudnn.layer_norm(x, w, b, out=out)
    assert y is out
    assert_close_to_oracle(out, _torch_layer_norm(x, w, b, 1e-5), _oracle_layer_norm(x, w, b, 1e-5), "out")
    untouched = out_buf.clone()
    untouched[:, :4, 1:71] = 7.0
    assert torch.all(untouched == 7.0), "layer_norm wrote outside out="
    y2 = rudnn.softmax(x.transpose(0, 1))  # a permuted view
    assert_close_to_oracle(y2, torch.softmax(x.transpose(0, 1).cpu(), -1), ref.softmax(x.transpose(0, 1).cpu()))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_residual_fusion(device, dtype, kind):
    x = rand((7, 130), dtype, device, seed=3)
    r = rand((7, 130), dtype, device, seed=4)
    w, b = _params(130, dtype, "f32", device, bias=kind == "layer")
    h_expected = (x.cpu() + r.cpu())  # torch adds in x's dtype, as rudnn does
    if kind == "layer":
        y, h = rudnn.layer_norm(x, w, b, residual=r)
        oracle, same = _oracle_layer_norm(h_expected, w, b, 1e-5), _torch_layer_norm(h_expected, w, b, 1e-5)
    else:
        y, h = rudnn.rms_norm(x, w, residual=r)
        oracle, same = _oracle_rms_norm(h_expected, w, 1e-6), _torch_rms_norm(h_expected, w, 1e-6)
    assert torch.equal(h.cpu(), h_expected), "residual output must be x + residual rounded to x's dtype"
    assert_close_to_oracle(y, same, oracle, "y")


@pytest.mark.parametrize("device", DEVICES)
def test_residual_with_stats_order(device):
    x, r = rand((3, 8), torch.float32, device), rand((3, 8), torch.float32, device, seed=9)
    outs = rudnn.layer_norm(x, residual=r, return_stats=True)
    assert len(outs) == 4 and outs[2].shape == (3,) and outs[3].shape == (3,)
    outs = rudnn.rms_norm(x, residual=r, return_stats=True)
    assert len(outs) == 3 and outs[1].shape == (3, 8) and outs[2].dtype == torch.float32


@pytest.mark.parametrize("device", DEVICES)
def test_softmax_special_rows(device):
    x = torch.tensor([[0.0, float("-inf"), 1.0], [float("-inf")] * 3, [1e4, -1e4, 1e4]], device=device)
    y = rudnn.softmax(x).cpu()
    torch.testing.assert_close(y[0], torch.softmax(x[0].cpu(), -1))
    assert torch.isnan(y[1]).all(), "a row of only -inf gives NaN, like torch"
    torch.testing.assert_close(y[2], torch.tensor([0.5, 0.0, 0.5]))


@pytest.mark.parametrize("device", DEVICES)
def test_in_place(device):
    x = rand((5, 300), torch.float32, device, scale=2.0)
    expected = _oracle_layer_norm(x, None, None, 1e-5)
    same = _torch_layer_norm(x, None, None, 1e-5)
    rudnn.layer_norm(x, out=x)
    assert_close_to_oracle(x, same, expected, "in-place")



@pytest.mark.cuda
@pytest.mark.parametrize("kind, dtype, param_dtype, shape, residual", [
    ("layer", torch.bfloat16, "x", (37, 2048), True),   # teams of 64, several rows each
    ("rms", torch.float16, "f32", (100, 512), True),    # float32 weights of 16-bit rows: not cached
    ("layer", torch.float32, "f32", (23, 1000), False),  # a partial last slot
    ("rms", torch.bfloat16, "x", (1000, 64), False),    # teams of 2
    ("layer", torch.float16, "x", (3, 4, 8192), True),  # teams of 256, two leading axes collapsed to one
])
def test_pipelined_forward_is_bitwise_the_1024_thread_kernel(monkeypatch, kind, dtype, param_dtype, shape, residual):
    """Rows of 16-byte chunks whose teams fit 256 threads run norm_forward_regs_pipelined (weights in
    registers, the next row's loads in flight); RUDNN_NORM_PIPELINED=0 runs norm_forward_regs on the
    same call. Same reduction order and arithmetic: every output has the same bits."""
    x, r = rand(shape, dtype, "cuda", seed=5, scale=3.0), rand(shape, dtype, "cuda", seed=6)
    w, b = _params(shape[-1], dtype, param_dtype, "cuda", bias=kind == "layer")
    fn = (lambda: rudnn.layer_norm(x, w, b, residual=r if residual else None, return_stats=True)) \
        if kind == "layer" else (lambda: rudnn.rms_norm(x, w, residual=r if residual else None, return_stats=True))
    pipelined = fn()
    monkeypatch.setenv("RUDNN_NORM_PIPELINED", "0")
    plain = fn()
    assert len(pipelined) == len(plain) >= 2
    for a, e in zip(pipelined, plain):
        assert torch.equal(a, e), (kind, dtype, shape)


def _cuda_kernels_of(fn):
    """fn()'s result and the names of the CUDA kernels it launched (torch's profiler)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out = fn()
        torch.cuda.synchronize()
    return out, {event.name for event in prof.events()}


@pytest.mark.cuda
@pytest.mark.parametrize("kind, dtype, param_dtype, shape, residual", [
    ("layer", torch.bfloat16, "x", (8, 65536), True),     # clusters of 8 blocks (on 132 SMs)
    ("rms", torch.float16, "f32", (64, 32768), False),    # 2 blocks a row, float32 weight
    ("layer", torch.float32, "f32", (100, 20480), True),  # rows of the two-read kernel: 3 blocks a row
    ("layer", torch.bfloat16, "x", (3, 5, 24584), False),  # rows not collapsible, a partial last slot
    ("rms", torch.bfloat16, "x", (300, 8192), True),      # 300 rows one block would hold each: clusters of 2
])
def test_cluster_forward_few_long_rows(monkeypatch, kind, dtype, param_dtype, shape, residual):
    """norm_forward_cluster (a row shared by a cluster of blocks, partial sums through distributed
    shared memory), taken with RUDNN_NORM_CLUSTER=1 (the profiler must show it; whether the planner
    takes it by default depends on the SM count, which the emulator's plan table checks): y within
    the oracle's budget, the statistics as the float64 ones, residual_out bitwise x + residual; with
    RUDNN_NORM_CLUSTER=0 the former kernels run the same call and agree to the same budget (not
    bitwise: the cluster sums in another order)."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the cluster kernels run on Hopper (sm_90a code)")
    H = shape[-1]
    if len(shape) == 3:  # every other row of a taller tensor: two row strides that do not collapse
        x = rand((shape[0], 2 * shape[1], H), dtype, "cuda", seed=5, scale=3.0)[:, ::2]
    else:
        x = rand(shape, dtype, "cuda", seed=5, scale=3.0)
    r = rand(x.shape, dtype, "cuda", seed=6) if residual else None
    w, b = _params(H, dtype, param_dtype, "cuda", bias=kind == "layer")
    eps = 1e-5
    fn = (lambda: rudnn.layer_norm(x, w, b, eps=eps, residual=r, return_stats=True)) if kind == "layer" \
        else (lambda: rudnn.rms_norm(x, w, eps=eps, residual=r, return_stats=True))
    monkeypatch.setenv("RUDNN_NORM_CLUSTER", "1")
    clustered, kernels = _cuda_kernels_of(fn)
    assert any("norm_forward_cluster" in name for name in kernels), kernels
    h = x.cpu() + r.cpu() if residual else x.cpu()
    if kind == "layer":
        oracle, same = _oracle_layer_norm(h, w, b, eps), _torch_layer_norm(h, w, b, eps)
        m64, r64 = ref.layer_norm_stats(h, eps)
        torch.testing.assert_close(clustered[-2].cpu().double(), m64, rtol=1e-5, atol=1e-6)
    else:
        oracle, same = _oracle_rms_norm(h, w, eps), _torch_rms_norm(h, w, eps)
        r64 = ref.rms_norm_rstd(h, eps)
    torch.testing.assert_close(clustered[-1].cpu().double(), r64, rtol=1e-5, atol=1e-6)
    assert_close_to_oracle(clustered[0], same, oracle, "y")
    if residual:
        assert torch.equal(clustered[1].cpu(), h)
    monkeypatch.setenv("RUDNN_NORM_CLUSTER", "0")
    plain, kernels = _cuda_kernels_of(fn)
    assert not any("norm_forward_cluster" in name for name in kernels), kernels
    assert_close_to_oracle(plain[0], same, oracle, "y without clusters")
    if residual:
        assert torch.equal(plain[1], clustered[1])


@pytest.mark.cuda
@pytest.mark.parametrize("kind, dtype, param_dtype, shape, wgrad", [
    # fused weight gradients, one split per block (<= 2 per SM): several rows per team only where the
    # rows exceed the splits' teams (132-SM H100/H200: 264 splits)
    ("layer", torch.bfloat16, "x", (8192, 1024), True),   # teams of 64, 4 a block: ~8 rows per team
    ("rms", torch.float16, "f32", (4096, 512), True),     # float32 weights of 16-bit rows (not cached); 2 a team
    ("layer", torch.float32, "f32", (23, 1000), True),    # a partial last slot, one row per team
    ("rms", torch.bfloat16, "x", (1000, 64), True),       # teams of 4
    ("layer", torch.float16, "x", (3, 4, 4096), True),    # teams of 256, two leading axes collapsed to one
    # dx only: rows spread over the resident blocks (two 256-thread blocks per SM), ~10 rows per team
    ("rms", torch.float16, "x", (40000, 256), False),
])
def test_pipelined_backward_dx_is_bitwise_the_1024_thread_kernel(monkeypatch, kind, dtype, param_dtype, shape, wgrad):
    """Rows of 16-byte chunks whose teams fit 256 threads run norm_backward_regs_pipelined (the
    weight in registers, the next row's loads in flight); RUDNN_NORM_PIPELINED=0 runs
    norm_backward_regs on the same call. Same per-row arithmetic and order: dx has the same bits.
    The weight gradients are summed over fewer teams per block (256-thread blocks instead of up to
    512), so only their rounding may differ: to 1e-5 of the sum of the terms' magnitudes."""
    x, dy = rand(shape, dtype, "cuda", seed=5, scale=3.0), rand(shape, dtype, "cuda", seed=6)
    w, b = _params(shape[-1], dtype, param_dtype, "cuda", bias=kind == "layer")
    if kind == "layer":
        _, mean, rstd = rudnn.layer_norm(x, w, b, return_stats=True)
        fn = lambda: rudnn.layer_norm_backward(dy, x, w if wgrad else None, mean, rstd)
        xhat = (x.double() - mean.double().unsqueeze(-1)) * rstd.double().unsqueeze(-1)
    else:
        _, rstd = rudnn.rms_norm(x, w, return_stats=True)
        fn = lambda: rudnn.rms_norm_backward(dy, x, w if wgrad else None, rstd)
        xhat = x.double() * rstd.double().unsqueeze(-1)
    pipelined = fn()
    monkeypatch.setenv("RUDNN_NORM_PIPELINED", "0")
    plain = fn()
    assert torch.equal(pipelined[0], plain[0]), (kind, dtype, shape)
    if not wgrad:
        return
    H = shape[-1]
    magnitudes = [(dy.double() * xhat).abs().reshape(-1, H).sum(0), dy.double().abs().reshape(-1, H).sum(0)]
    for a, e, m in zip(pipelined[1:], plain[1:], magnitudes):
        assert ((a.double() - e.double()).abs() <= 1e-5 * m).all(), (kind, dtype, shape)

# ---- backward --------------------------------------------------------------------------------

def _autograd(fn, dtype, dy, *inputs):
    """torch autograd of fn on copies of `inputs` in dtype (None entries pass through)."""
    leaves = [None if t is None else t.detach().cpu().to(dtype).requires_grad_() for t in inputs]
    out = fn(*leaves)
    out.backward(dy.cpu().to(dtype))
    return [None if t is None else t.grad for t in leaves]


def _term_scale(dy, w, rstd):
    """Size of the terms of dx = rstd * (g - ...), g = dy * w, that cancel for tiny H."""
    return (dy.cpu().double() * w.cpu().double() * rstd.cpu().double().unsqueeze(-1)).abs().max().item()


BACKWARD_SHAPES = [(1, 1), (5, 7), (3, 65), (2, 3, 96), (33, 1000), (2, 4097), (3, 65536)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", BACKWARD_SHAPES)
def test_layer_norm_backward(device, dtype, shape):
    H = shape[-1]
    x = rand(shape, dtype, device, scale=2.0, offset=0.3)
    dy = rand(shape, dtype, device, seed=5)
    w, b = _params(H, dtype, "f32", device)
    _, mean, rstd = rudnn.layer_norm(x, w, b, return_stats=True)
    dx, dw, db = rudnn.layer_norm_backward(dy, x, w, mean, rstd)
    assert dx.dtype == dtype and dw.dtype == db.dtype == torch.float32 and dw.shape == (H,)
    fn = lambda x_, w_, b_: F.layer_norm(x_, (H,), w_, b_, 1e-5)
    g64 = _autograd(fn, torch.float64, dy, x, w, b)
    gsame = _autograd(fn, dtype, dy, x, w, b)
    assert_close_to_oracle(dx, gsame[0], g64[0], "dx", scale=_term_scale(dy, w, rstd))
    assert_close_to_oracle(dw, gsame[1], g64[1], "dweight", dtype=dtype)
    assert_close_to_oracle(db, gsame[2], g64[2], "dbias", dtype=dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", BACKWARD_SHAPES)
def test_rms_norm_backward(device, dtype, shape):
    H = shape[-1]
    x = rand(shape, dtype, device, scale=2.0, offset=0.3)
    dy = rand(shape, dtype, device, seed=5)
    w, _ = _params(H, dtype, "x", device, bias=False)
    _, rstd = rudnn.rms_norm(x, w, return_stats=True)
    dx, dw = rudnn.rms_norm_backward(dy, x, w, rstd)
    assert dx.dtype == dtype and dw.dtype == torch.float32
    fn = lambda x_, w_: F.rms_norm(x_, (H,), w_, 1e-6)
    g64 = _autograd(fn, torch.float64, dy, x, w)
    gsame = _autograd(fn, dtype, dy, x, w)
    assert_close_to_oracle(dx, gsame[0], g64[0], "dx", scale=_term_scale(dy, w, rstd))
    assert_close_to_oracle(dw, gsame[1], g64[1], "dweight", dtype=dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", BACKWARD_SHAPES)
def test_softmax_backward(device, dtype, shape):
    x = rand(shape, dtype, device, scale=2.0)
    dy = rand(shape, dtype, device, seed=6)
    y = rudnn.softmax(x)
    dx = rudnn.softmax_backward(dy, y)
    assert dx.dtype == dtype
    fn = lambda x_: torch.softmax(x_, -1)
    assert_close_to_oracle(dx, _autograd(fn, dtype, dy, x)[0], _autograd(fn, torch.float64, dy, x)[0], "dx")


@pytest.mark.parametrize("device", DEVICES)
def test_backward_without_weight(device):
    x, dy = rand((4, 50), torch.float32, device), rand((4, 50), torch.float32, device, seed=2)
    _, mean, rstd = rudnn.layer_norm(x, return_stats=True)
    dx, dw, db = rudnn.layer_norm_backward(dy, x, None, mean, rstd)
    assert dw is None and db.shape == (50,)
    g64 = _autograd(lambda x_: F.layer_norm(x_, (50,)), torch.float64, dy, x)
    gsame = _autograd(lambda x_: F.layer_norm(x_, (50,)), torch.float32, dy, x)
    assert_close_to_oracle(dx, gsame[0], g64[0], "dx")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_weight_gradients_are_deterministic(device, kind):
    x, dy = rand((3000, 515), torch.bfloat16, device), rand((3000, 515), torch.bfloat16, device, seed=8)
    w = torch.ones(515, device=device)
    if kind == "layer":
        _, mean, rstd = rudnn.layer_norm(x, w, return_stats=True)
        runs = [rudnn.layer_norm_backward(dy, x, w, mean, rstd) for _ in range(3)]
    else:
        _, rstd = rudnn.rms_norm(x, w, return_stats=True)
        runs = [rudnn.rms_norm_backward(dy, x, w, rstd) for _ in range(3)]
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b), "backward must be bitwise run-to-run deterministic"


# ---- numpy -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_numpy_arrays(dtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 40)).astype(dtype)
    w = rng.standard_normal(40).astype(np.float32)
    y, mean, rstd = rudnn.layer_norm(x, w, return_stats=True)
    assert isinstance(y, np.ndarray) and y.dtype == dtype and mean.dtype == np.float32
    xt, wt = torch.from_numpy(x), torch.from_numpy(w)
    assert_close_to_oracle(torch.from_numpy(y), _torch_layer_norm(xt, wt, None, 1e-5),
                           _oracle_layer_norm(xt, wt, None, 1e-5))
    dx, dw, db = rudnn.layer_norm_backward(x, x, w, mean, rstd)
    assert isinstance(dx, np.ndarray) and dw.dtype == np.float32
    s = rudnn.softmax(x)
    assert isinstance(s, np.ndarray)
    assert_close_to_oracle(torch.from_numpy(s), torch.softmax(xt, -1), ref.softmax(xt))


def test_numpy_read_only_and_strided():
    x = np.arange(60, dtype=np.float32).reshape(6, 10)[::2]
    x.flags.writeable = False
    y = rudnn.rms_norm(x)
    xt = torch.from_numpy(x.copy())
    assert_close_to_oracle(torch.from_numpy(y), _torch_rms_norm(xt, None, 1e-6), _oracle_rms_norm(xt, None, 1e-6))
    out = np.zeros((3, 10), np.float32)
    assert rudnn.softmax(x, out=out) is out
    assert_close_to_oracle(torch.from_numpy(out), torch.softmax(xt, -1), ref.softmax(xt))


@pytest.mark.cuda
@pytest.mark.parametrize("kind, dtype, param_dtype, shape, weighted", [
    ("layer", torch.bfloat16, "x", (8, 65536), True),     # clusters of 8, weight gradients by the column kernel
    ("rms", torch.float16, "f32", (64, 32768), True),     # clusters of 4, float32 weight
    ("rms", torch.float32, "f32", (100, 12288), False),   # rows of the two-read kernel, no weight (dx only): clusters of 3
])
def test_cluster_backward_few_long_rows(monkeypatch, kind, dtype, param_dtype, shape, weighted):
    """Few long rows whose weight gradients are not fused (rows too long for the fused shared-memory
    accumulators, or no weight) run norm_backward_cluster for dx with RUDNN_NORM_CLUSTER=1 (the
    profiler must show it): dx within the oracle's budget; with RUDNN_NORM_CLUSTER=0 the former
    kernels give dx to the same budget and the same weight-gradient bits (the column kernel
    computes them either way)."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the cluster kernels run on Hopper (sm_90a code)")
    H = shape[-1]
    x, dy = rand(shape, dtype, "cuda", seed=5, scale=2.0, offset=0.3), rand(shape, dtype, "cuda", seed=6)
    w, b = _params(H, dtype, param_dtype, "cuda", bias=kind == "layer")
    w = w if weighted else None
    if kind == "layer":
        _, mean, rstd = rudnn.layer_norm(x, w, b, return_stats=True)
        fn = lambda: rudnn.layer_norm_backward(dy, x, w, mean, rstd)
        oracle_fn = lambda x_, w_: F.layer_norm(x_, (H,), w_, None, 1e-5)
    else:
        _, rstd = rudnn.rms_norm(x, w, eps=1e-5, return_stats=True)
        fn = lambda: rudnn.rms_norm_backward(dy, x, w, rstd)
        oracle_fn = lambda x_, w_: F.rms_norm(x_, (H,), w_, 1e-5)
    monkeypatch.setenv("RUDNN_NORM_CLUSTER", "1")
    clustered, kernels = _cuda_kernels_of(fn)
    assert any("norm_backward_cluster" in name for name in kernels), kernels
    g64, gsame = _autograd(oracle_fn, torch.float64, dy, x, w), _autograd(oracle_fn, dtype, dy, x, w)
    scale = _term_scale(dy, w if weighted else torch.ones(H), rstd)
    assert_close_to_oracle(clustered[0], gsame[0], g64[0], "dx", scale=scale)
    monkeypatch.setenv("RUDNN_NORM_CLUSTER", "0")
    plain, kernels = _cuda_kernels_of(fn)
    assert not any("norm_backward_cluster" in name for name in kernels), kernels
    assert_close_to_oracle(plain[0], gsame[0], g64[0], "dx without clusters", scale=scale)
    for a, e in zip(clustered[1:], plain[1:]):
        assert (a is None and e is None) or torch.equal(a, e)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype, shape", [
    (torch.bfloat16, (8, 65536)),   # clusters of 8 both ways
    (torch.float16, (64, 32768)),   # 2 blocks a row forward, 4 backward
    (torch.float32, (100, 20480)),  # rows of the two-read kernels: 3 blocks a row forward, 5 backward
])
def test_cluster_softmax_few_long_rows(monkeypatch, dtype, shape):
    """softmax_forward_cluster and softmax_backward_cluster, taken with RUDNN_NORM_CLUSTER=1 (the
    profiler must show them): y and dx within the oracle's budget; with RUDNN_NORM_CLUSTER=0 the
    former kernels give both to the same budget."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the cluster kernels run on Hopper (sm_90a code)")
    x, dy = rand(shape, dtype, "cuda", scale=2.0), rand(shape, dtype, "cuda", seed=6)
    fn = lambda x_: torch.softmax(x_, -1)
    y_same, y64 = fn(x.cpu()), ref.softmax(x.cpu())
    dx_same, dx64 = _autograd(fn, dtype, dy, x)[0], _autograd(fn, torch.float64, dy, x)[0]
    for variant, wanted in (("1", True), ("0", False)):
        monkeypatch.setenv("RUDNN_NORM_CLUSTER", variant)
        y, kernels = _cuda_kernels_of(lambda: rudnn.softmax(x))
        assert any("softmax_forward_cluster" in name for name in kernels) == wanted, kernels
        assert_close_to_oracle(y, y_same, y64, "y")
        dx, kernels = _cuda_kernels_of(lambda: rudnn.softmax_backward(dy, y))
        assert any("softmax_backward_cluster" in name for name in kernels) == wanted, kernels
        assert_close_to_oracle(dx, dx_same, dx64, "dx")

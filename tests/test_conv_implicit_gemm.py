"""strategy="implicit_gemm" of rudnn.conv (CUTLASS implicit-GEMM convolutions).

CPU part: the dispatch decision, a pure function of the validated call, the dtype, the device's
compute capability and the tensors' addresses (rudnn._C._conv_plan runs it for a chosen compute
capability): which kernel family takes a case, why one cannot, which tensors are copied through
the workspace and how many bytes that takes. CUDA part (skipped without a GPU): implicit_gemm
against the CPU reference (torch.nn.functional in float64) for ResNet-50-like and 3-D VAE-like
shapes, every layout, bias, dgrad and wgrad, and what conv_last_algorithm() reports.
"""

import pytest
import torch
import torch.nn.functional as F

import rudnn
from rudnn import _C
from util import run_with_autotune_cache

BF16 = torch.bfloat16
FWD, DGRAD, WGRAD = 0, 1, 2
H100, A100, L40, T4 = (9, 0), (8, 0), (8, 9), (7, 5)


def _nhwc(n, c, *spatial, dtype=BF16):
    return torch.zeros((n, *spatial, c), dtype=dtype)


def _out(i, k, s, p, d=1):
    return (i + 2 * p - d * (k - 1) - 1) // s + 1


def plan(op, a, b, out, bias=None, stride=1, pad=0, dil=1, groups=1, layout=1, cc=H100, pad_after=None):
    dims = a.dim() - 2
    after = pad if pad_after is None else pad_after
    name, why, nbytes, copies = _C._conv_plan(op, a, b, out, bias, [stride] * dims, [pad] * dims, [after] * dims,
                                              [dil] * dims, groups, layout, cc[0], cc[1])
    return name, why, nbytes, copies


def fprop_case(n=2, c=64, k=64, size=14, r=3, s=1, p=0, dims=2, dtype=BF16, d=1):
    o = _out(size, r, s, p, d)
    x = _nhwc(n, c, *([size] * dims), dtype=dtype)
    w = torch.zeros((k, *([r] * dims), c), dtype=dtype)
    y = _nhwc(n, k, *([o] * dims), dtype=dtype)
    return x, w, y


# ---- which kernel family takes a case ------------------------------------------------------------

@pytest.mark.parametrize("c,k,r,s,p", [(64, 256, 1, 1, 0), (64, 64, 3, 1, 1), (128, 128, 3, 2, 1), (8, 64, 7, 2, 3),
                                       (256, 512, 1, 2, 0)])
def test_resnet50_nhwc_forward_takes_sm90_without_copies(c, k, r, s, p):
    x, w, y = fprop_case(c=c, k=k, size=28, r=r, s=s, p=p)
    b = torch.zeros(k, dtype=BF16)
    assert plan(FWD, x, w, y, b, stride=s, pad=p) == ("implicit_gemm_sm90", "", 0, (False, False, False, False))
    assert plan(FWD, x, w, y, b, stride=s, pad=p, cc=A100) == ("implicit_gemm_sm80", "", 0,
                                                               (False, False, False, False))
    assert plan(FWD, x, w, y, b, stride=s, pad=p, cc=L40)[0] == "implicit_gemm_sm80"


def test_every_rank_and_op_on_both_generations():
    for dims in (1, 2, 3):
        x, w, y = fprop_case(c=32, k=16, size=9, dims=dims, p=1)
        for cc, name in ((H100, "implicit_gemm_sm90"), (A100, "implicit_gemm_sm80")):
            assert plan(FWD, x, w, y, pad=1, cc=cc)[0] == name, (dims, cc)
            assert plan(DGRAD, y, w, x, pad=1, cc=cc)[0] == name, (dims, cc)
            assert plan(WGRAD, y, x, w, pad=1, cc=cc)[0] == name, (dims, cc)


def test_f16_is_taken():
    x, w, y = fprop_case(dtype=torch.float16)
    assert plan(FWD, x, w, y)[0] == "implicit_gemm_sm90"


def test_the_stem_with_three_input_channels_runs_direct():
    x, w, y = fprop_case(c=3, k=64, size=32, r=7, s=2, p=3)
    name, why, nbytes, _ = plan(FWD, x, w, y, stride=2, pad=3)
    assert (name, nbytes) == ("direct", 0)
    assert why == ("CUTLASS implicit GEMM needs input and output channels that are multiples of 8 (16-byte accesses), "
                   "got Cin = 3, Cout = 64")


@pytest.mark.parametrize("c,k", [(12, 64), (64, 20)])
def test_channels_not_multiple_of_8(c, k):
    x, w, y = fprop_case(c=c, k=k)
    name, why, _, _ = plan(FWD, x, w, y)
    assert name == "direct" and f"Cin = {c}, Cout = {k}" in why


def test_float32_takes_the_tf32_sm80_kernels_on_every_gpu():
    # TF32 is built for the CUTLASS 2.x kernels only: Hopper runs them too (from their PTX).
    x, w, y = fprop_case(dtype=torch.float32)
    for cc in (H100, A100, L40):
        assert plan(FWD, x, w, y, cc=cc)[:2] == ("implicit_gemm_sm80", ""), cc
        assert plan(DGRAD, y, w, x, cc=cc)[0] == "implicit_gemm_sm80", cc
        assert plan(WGRAD, y, x, w, cc=cc)[0] == "implicit_gemm_sm80", cc
    # 16-byte accesses are 4 float32 elements: 4 channels suffice, 6 do not
    x, w, y = fprop_case(c=4, k=12, dtype=torch.float32)
    assert plan(FWD, x, w, y)[0] == "implicit_gemm_sm80"
    x, w, y = fprop_case(c=6, k=12, dtype=torch.float32)
    assert plan(FWD, x, w, y)[1] == ("CUTLASS implicit GEMM needs input and output channels that are multiples of 4 "
                                     "(16-byte accesses), got Cin = 6, Cout = 12")


def test_groups_run_direct():
    x = _nhwc(2, 64, 8, 8)
    w = torch.zeros((64, 3, 3, 32), dtype=BF16)
    y = _nhwc(2, 64, 8, 8)
    name, why, _, _ = plan(FWD, x, w, y, pad=1, groups=2)
    assert name == "direct"
    assert why.startswith("CUTLASS implicit GEMM takes groups == 1, got 2")


def test_device_generations():
    x, w, y = fprop_case()
    assert plan(FWD, x, w, y, cc=(0, 0))[:2] == (
        "direct", "CUTLASS implicit GEMM runs on CUDA devices only (the tensors are on the CPU)")
    assert plan(FWD, x, w, y, cc=T4)[:2] == (
        "direct", "CUTLASS implicit GEMM needs a GPU of compute capability 8.0 or newer, this one is 7.5")
    # sm_90a SASS runs on 9.0 only; other GPUs from 8.0 up run the sm80 kernels.
    assert plan(FWD, x, w, y, cc=(10, 0))[0] == "implicit_gemm_sm80"
    assert plan(FWD, x, w, y, cc=(8, 6))[0] == "implicit_gemm_sm80"


def test_empty_batch_runs_direct():
    x, w, y = fprop_case(n=0)
    assert plan(FWD, x, w, y)[0] == "direct"


# ---- kernel limits ------------------------------------------------------------------------------------

def test_strided_dgrad_on_hopper_takes_the_sm80_kernel():
    x, w, y = fprop_case(c=64, k=128, size=56, r=3, s=2, p=1)
    assert plan(DGRAD, y, w, x, stride=2, pad=1)[:2] == ("implicit_gemm_sm80", "")
    assert plan(DGRAD, y, w, x, stride=2, pad=1, cc=A100)[0] == "implicit_gemm_sm80"
    # Stride-1 dgrad and strided fprop / wgrad stay on sm90.
    assert plan(FWD, x, w, y, stride=2, pad=1)[0] == "implicit_gemm_sm90"
    assert plan(WGRAD, y, x, w, stride=2, pad=1)[0] == "implicit_gemm_sm90"


def test_strided_3d_dgrad_runs_direct():
    x, w, y = fprop_case(c=16, k=16, size=9, r=3, s=2, p=1, dims=3)
    name, why, _, _ = plan(DGRAD, y, w, x, stride=2, pad=1)
    assert name == "direct"
    assert why == ("the sm90 data-gradient kernel is used with stride 1 only, got [2, 2, 2]; the sm80 3-D "
                   "data-gradient kernel takes stride 1, got [2, 2, 2]")
    assert plan(DGRAD, y, w, x, stride=2, pad=1, cc=A100)[1] == "the sm80 3-D data-gradient kernel takes stride 1, " \
                                                                "got [2, 2, 2]"
    # The forward and the weight gradient of the same layer are taken.
    assert plan(FWD, x, w, y, stride=2, pad=1)[0] == "implicit_gemm_sm90"
    assert plan(WGRAD, y, x, w, stride=2, pad=1, cc=A100)[0] == "implicit_gemm_sm80"


def test_dilation():
    x, w, y = fprop_case(size=16, r=3, p=2, d=2)
    assert plan(FWD, x, w, y, pad=2, dil=2, cc=A100)[0] == "implicit_gemm_sm80"
    assert plan(FWD, x, w, y, pad=2, dil=2)[0] == "implicit_gemm_sm90"
    assert plan(DGRAD, y, w, x, pad=2, dil=2)[0] == "implicit_gemm_sm90"
    assert plan(DGRAD, y, w, x, pad=2, dil=2, cc=A100)[:2] == (
        "direct", "the sm80 data-gradient kernels take dilation 1, got [1, 2, 2]")


def test_large_padding_leaves_tma_for_the_sm80_kernels():
    x, w, y = fprop_case(size=8, r=3, p=20)
    name, why, _, _ = plan(FWD, x, w, y, pad=20)
    assert (name, why) == ("implicit_gemm_sm80", "")
    x, w, y = fprop_case(size=40, r=33, p=0)
    name, why, _, _ = plan(FWD, x, w, y)
    assert name == "direct"
    assert why == ("the sm90 kernels' TMA im2col loads take (kernel - 1) * dilation < 31, got kernel [1, 33, 33], "
                   "dilation [1, 1, 1]; the sm80 kernels take kernel extents <= 32 per axis, got [1, 33, 33]")


def test_strides_over_8_leave_tma_for_the_sm80_kernels():
    # A ViT patch embedding (kernel 16, stride 16): the stride is TMA im2col's traversal stride,
    # which a tensor map encodes up to 8 only; the sm80 kernels take any stride.
    x, w, y = fprop_case(c=64, k=128, size=64, r=16, s=16)
    assert plan(FWD, x, w, y, stride=16) == ("implicit_gemm_sm80", "", 0, (False, False, False, False))
    assert plan(WGRAD, y, x, w, stride=16)[:2] == ("implicit_gemm_sm80", "")
    x, w, y = fprop_case(c=64, k=128, size=64, r=8, s=8)
    assert plan(FWD, x, w, y, stride=8)[0] == "implicit_gemm_sm90"
    x, w, y = fprop_case(c=64, k=128, size=80, r=33, s=9)
    assert plan(FWD, x, w, y, stride=9)[:2] == (
        "direct", "the sm90 kernels' TMA im2col loads take stride <= 8, got [1, 9, 9]; "
                  "the sm80 kernels take kernel extents <= 32 per axis, got [1, 33, 33]")


def test_floor_dropped_padding_is_not_negative_upper_padding():
    # in 8, kernel 3, stride 2, no padding: out 3 and the last input row is never read.
    x, w, y = fprop_case(size=8, r=3, s=2, p=0)
    assert plan(FWD, x, w, y, stride=2)[0] == "implicit_gemm_sm90"


def test_asymmetric_same_padding():
    # padding="same" with an even kernel: one more after than before.
    x = _nhwc(1, 16, 10, 10)
    w = torch.zeros((16, 4, 4, 16), dtype=BF16)
    y = _nhwc(1, 16, 10, 10)
    assert plan(FWD, x, w, y, pad=1, pad_after=2)[0] == "implicit_gemm_sm90"


# ---- layouts and the workspace --------------------------------------------------------------------

def test_nchw_is_copied_once_each_way():
    x = torch.zeros((2, 16, 8, 8), dtype=BF16)
    w = torch.zeros((16, 16, 3, 3), dtype=BF16)
    y = torch.zeros((2, 16, 8, 8), dtype=BF16)
    b = torch.zeros(16, dtype=BF16)
    name, why, nbytes, copies = plan(FWD, x, w, y, b, pad=1, layout=0)
    assert (name, copies) == ("implicit_gemm_sm90", (True, True, True, False))
    # 256-byte aligned packs of 2 * 16 * 64, 16 * 16 * 9 and 2 * 16 * 64 bf16 elements (4096, 4608, 4096 bytes).
    assert nbytes == 4096 + 4608 + 4096
    # dgrad: dy in, dx out; wgrad: dy and x in, dw out.
    assert plan(DGRAD, y, w, x, pad=1, layout=0)[2:] == (4096 + 4608 + 4096, (True, True, True, False))
    assert plan(WGRAD, y, x, w, pad=1, layout=0)[2:] == (4096 + 4608 + 4096, (True, True, True, False))


def test_nchw_float32_copies_four_byte_elements():
    x, w, y = (torch.zeros(shape, dtype=torch.float32) for shape in ((2, 16, 8, 8), (16, 16, 3, 3), (2, 16, 8, 8)))
    name, _, nbytes, copies = plan(FWD, x, w, y, pad=1, layout=0)
    assert (name, copies) == ("implicit_gemm_sm80", (True, True, True, False))
    assert nbytes == 8192 + 9216 + 8192  # 2048, 2304 and 2048 float32 elements, 256-byte aligned


def test_torch_channels_last_runs_in_place():
    cl = torch.channels_last
    x = torch.zeros((2, 16, 8, 8), dtype=BF16).to(memory_format=cl)
    w = torch.zeros((16, 16, 3, 3), dtype=BF16).to(memory_format=cl)
    y = torch.zeros((2, 16, 8, 8), dtype=BF16).to(memory_format=cl)
    assert plan(FWD, x, w, y, pad=1, layout=0) == ("implicit_gemm_sm90", "", 0, (False, False, False, False))
    cl3 = torch.channels_last_3d
    x = torch.zeros((1, 16, 4, 8, 8), dtype=BF16).to(memory_format=cl3)
    w = torch.zeros((32, 16, 3, 3, 3), dtype=BF16).to(memory_format=cl3)
    y = torch.zeros((1, 32, 4, 8, 8), dtype=BF16).to(memory_format=cl3)
    assert plan(FWD, x, w, y, pad=1, layout=0)[2:] == (0, (False, False, False, False))
    # Only the NCHW weight of a mixed call is copied.
    w = torch.zeros((32, 16, 3, 3, 3), dtype=BF16)
    assert plan(FWD, x, w, y, pad=1, layout=0)[2:] == (32 * 16 * 27 * 2, (False, True, False, False))


def test_strided_or_misaligned_tensors_are_copied():
    x, w, y = fprop_case(c=16, k=16, size=8, p=1)
    # Every other batch element: not packed.
    big = _nhwc(4, 16, 8, 8)
    assert plan(FWD, big[::2], w, y, pad=1)[3] == (True, False, False, False)
    # A base 2 bytes past a 16-byte boundary.
    flat = torch.zeros(x.numel() + 1, dtype=BF16)
    shifted = flat[1:].view(x.shape)
    assert plan(FWD, shifted, w, y, pad=1)[3] == (True, False, False, False)
    # A bias with stride 2 (or misaligned) is copied; a contiguous one is read in place.
    b2 = torch.zeros(32, dtype=BF16)[::2]
    name, _, nbytes, copies = plan(FWD, x, w, y, b2, pad=1)
    assert (name, nbytes, copies) == ("implicit_gemm_sm90", 256, (False, False, False, True))
    assert plan(FWD, x, w, y, torch.zeros(16, dtype=BF16), pad=1)[3] == (False, False, False, False)


def test_size_one_axes_ignore_their_strides():
    # A 1-D NWC problem: its leading axes are size 1 whatever their strides.
    x = torch.zeros((2, 9, 16), dtype=BF16)
    w = torch.zeros((8, 3, 16), dtype=BF16)
    y = torch.zeros((2, 7, 8), dtype=BF16)
    assert plan(FWD, x, w, y) == ("implicit_gemm_sm90", "", 0, (False, False, False, False))
    # Batch 1 with an odd batch stride.
    x1 = torch.zeros((3, 9, 16), dtype=BF16)[1:2]
    assert plan(FWD, x1, w, y[:1])[3] == (False, False, False, False)


# ---- the strategies on the CPU ------------------------------------------------------------------------

def test_auto_on_the_cpu_runs_the_reference():
    x = torch.randn(1, 8, 6, 6).to(BF16)
    w = torch.randn(8, 8, 3, 3).to(BF16)
    y = rudnn.conv(x, w, padding=1)
    assert rudnn.conv_last_algorithm() == "cpu"
    ref = F.conv2d(x.double(), w.double(), padding=1)
    torch.testing.assert_close(y.double(), ref, rtol=1e-2, atol=1e-2)


# ---- CUDA (skipped without a GPU) ------------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _tol(dtype):  # TF32 (float32 on these kernels) keeps 11 significant bits, as float16 does
    return dict(rtol=2e-2, atol=2e-2) if dtype == BF16 else dict(rtol=5e-3, atol=5e-3)


def _cases():
    # (N, C, spatial, Cout, kernel, stride, padding): ResNet-50-like 1x1, 3x3 s1 / s2, 7x7 s2 and 3-D VAE-like.
    return [(4, 64, (14, 14), 256, 1, 1, 0), (4, 64, (14, 14), 64, 3, 1, 1), (4, 128, (15, 15), 128, 3, 2, 1),
            (2, 16, (32, 32), 64, 7, 2, 3), (1, 32, (6, 12, 12), 32, 3, 1, 1), (2, 32, (17,), 16, 5, 1, 2)]


def _tensors(case, dtype, layout):
    n, c, spatial, k, r, s, p = case
    dims = len(spatial)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, c, *spatial, generator=gen).to(dtype)
    w = (torch.randn(k, c, *([r] * dims), generator=gen) / (c * r ** dims) ** 0.5).to(dtype)
    b = torch.randn(k, generator=gen).to(dtype)
    return x, w, b, dims


def _put(t, layout, dims):
    t = t.cuda()
    if layout == "channels_last" and dims in (2, 3):
        return t.to(memory_format=torch.channels_last if dims == 2 else torch.channels_last_3d)
    if layout == "NHWC":
        return t.movedim(1, -1).contiguous()
    return t


def _get(t, layout):
    return (t.movedim(-1, 1) if layout == "NHWC" else t).cpu().double()


def _rudnn_layout(layout):
    return "NHWC" if layout == "NHWC" else "NCHW"


@cuda
@pytest.mark.parametrize("dtype", [BF16, torch.float16, torch.float32])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC", "channels_last"])
@pytest.mark.parametrize("case", _cases())
def test_cuda_forward_with_bias(case, layout, dtype):
    x, w, b, dims = _tensors(case, dtype, layout)
    _, _, _, _, _, s, p = case
    conv_nd = getattr(F, f"conv{dims}d")
    ref = conv_nd(x.double(), w.double(), b.double(), stride=s, padding=p)
    y = rudnn.conv(_put(x, layout, dims), _put(w, layout, dims), b.cuda(), stride=s, padding=p,
                   layout=_rudnn_layout(layout), strategy="implicit_gemm")
    torch.cuda.synchronize()
    assert rudnn.conv_last_algorithm().startswith("implicit_gemm_sm")
    torch.testing.assert_close(_get(y, layout), ref, **_tol(dtype))


@cuda
@pytest.mark.parametrize("dtype", [BF16, torch.float16, torch.float32])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC", "channels_last"])
@pytest.mark.parametrize("case", _cases())
def test_cuda_backward(case, layout, dtype):
    x, w, _, dims = _tensors(case, dtype, layout)
    _, _, _, _, _, s, p = case
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    yd = getattr(F, f"conv{dims}d")(xd, wd, stride=s, padding=p)
    dy = torch.randn(yd.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    dx_ref, dw_ref = torch.autograd.grad(yd, (xd, wd), dy.double())
    lay = _rudnn_layout(layout)
    x_shape = tuple(_put(x, layout, dims).shape)
    w_shape = tuple(_put(w, layout, dims).shape)
    strategy = "implicit_gemm"
    if dims == 3 and s != 1:
        strategy = "auto"
    dx = rudnn.conv_data_backward(_put(dy, layout, dims), _put(w, layout, dims), x_shape, stride=s, padding=p,
                                  layout=lay, strategy=strategy)
    torch.cuda.synchronize()
    torch.testing.assert_close(_get(dx, layout), dx_ref, **_tol(dtype))
    dw = rudnn.conv_weight_backward(_put(dy, layout, dims), _put(x, layout, dims), w_shape, stride=s, padding=p,
                                    layout=lay, strategy="implicit_gemm")
    torch.cuda.synchronize()
    assert rudnn.conv_last_algorithm().startswith("implicit_gemm_sm")
    # dw sums over N * spatial products: scale the tolerance with the reduction's magnitude.
    scale = dw_ref.abs().max().item() + 1.0
    torch.testing.assert_close(_get(dw, layout) / scale, dw_ref / scale, **_tol(dtype))
    # Deterministic: the same bits twice.
    dw2 = rudnn.conv_weight_backward(_put(dy, layout, dims), _put(x, layout, dims), w_shape, stride=s, padding=p,
                                     layout=lay, strategy="implicit_gemm")
    assert torch.equal(dw.cpu(), dw2.cpu())


@cuda
def test_cuda_auto_takes_implicit_gemm_and_falls_back():
    x = torch.randn(2, 64, 14, 14, device="cuda").to(BF16).to(memory_format=torch.channels_last)
    w = torch.randn(64, 64, 3, 3, device="cuda").to(BF16).to(memory_format=torch.channels_last)
    rudnn.conv(x, w, padding=1)
    major, _ = torch.cuda.get_device_capability()
    if major >= 8:
        assert rudnn.conv_last_algorithm().startswith("implicit_gemm_sm")
    # float32: exact (direct) unless implicit_gemm is asked for, which runs the TF32 sm80 kernels
    y = rudnn.conv(x.float(), w.float(), padding=1)
    assert rudnn.conv_last_algorithm() in ("direct", "direct_packed")
    t = rudnn.conv(x.float(), w.float(), padding=1, strategy="implicit_gemm")
    assert rudnn.conv_last_algorithm() == "implicit_gemm_sm80"
    ref = F.conv2d(x.double(), w.double(), padding=1)
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-4)
    scale = ref.abs().max().item()
    torch.testing.assert_close(t.double() / scale, ref / scale, rtol=5e-3, atol=5e-3)
    assert not torch.equal(t, y)  # TF32 rounding shows
    with pytest.raises(rudnn.UnsupportedError, match="conv: strategy 'implicit_gemm': CUTLASS implicit GEMM needs "
                                                     "input and output channels that are multiples of 4"):
        rudnn.conv(x.float()[:, :6], w.float()[:, :6], padding=1, strategy="implicit_gemm")
    with pytest.raises(rudnn.UnsupportedError, match="groups == 1, got 2"):
        rudnn.conv(x, w[:, :32].contiguous(), padding=1, groups=2, strategy="implicit_gemm")


_CONV_AUTOTUNE_ONE_CALL = """
import torch, torch.nn.functional as F, rudnn
x = torch.randn(2, 64, 14, 14, device="cuda").to(torch.bfloat16).to(memory_format=torch.channels_last)
w = (torch.randn(64, 64, 3, 3, device="cuda") / 24).to(torch.bfloat16).to(memory_format=torch.channels_last)
y = rudnn.conv(x, w, padding=1, strategy="autotune")
ref = F.conv2d(x.double(), w.double(), padding=1)
assert torch.allclose(y.double(), ref, rtol=2e-2, atol=2e-2)
print(rudnn.conv_last_algorithm())
"""


@cuda
def test_cuda_autotune_times_once_and_the_recorded_choice_persists(tmp_path):
    """"autotune" times the plan's kernel against direct once per shape; with RUDNN_AUTOTUNE_CACHE
    the winner lands in the file under a key naming the build, the device and the shape, and a
    later process runs what the file says (a line edited to 'direct') without adding a line."""
    path = tmp_path / "autotune.tsv"

    def run():
        return run_with_autotune_cache(_CONV_AUTOTUNE_ONE_CALL, path)

    first = run()
    assert first.startswith("implicit_gemm_sm") or first in ("direct", "direct_packed")
    lines = path.read_text().splitlines()
    assert len(lines) == 1, lines
    key, choice = lines[0].split("\t")
    assert key.startswith(_C.build_id() + " | conv forward | ") and torch.cuda.get_device_name() in key
    assert choice == ("implicit_gemm" if first.startswith("implicit_gemm") else "direct")
    path.write_text(f"{key}\tdirect\n")
    assert run() in ("direct", "direct_packed")
    path.write_text(f"{key}\timplicit_gemm\n")
    assert run().startswith("implicit_gemm_sm")
    assert path.read_text() == f"{key}\timplicit_gemm\n"

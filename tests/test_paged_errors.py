"""Every documented error of rudnn.paged: the exception type and a message naming the argument
(and the row) at fault. Nothing the caller passed in is modified by a failed call."""

import re

import numpy as np
import pytest
import torch

import rudnn
from rudnn.paged import DevicePlan, HostPlan, SplitWorkspace


def raises(kind, text):
    return pytest.raises(kind, match=re.escape(text))


def good(**kw):
    args = dict(page_size=4, pages=6, tables=[[0, 1], [2]], lengths=[7, 3], sequence_ids=[0, 1, 0],
                positions=[6, 2, 5])
    args.update(kw)
    return args


def host(**kw):
    return HostPlan(**good(**kw))


# ---- HostPlan ------------------------------------------------------------------------------

@pytest.mark.parametrize("kw,kind,text", [
    (dict(page_size=0), rudnn.ArgumentError, "HostPlan: page_size: expected an integer >= 1, got 0"),
    (dict(page_size=4.0), rudnn.ArgumentError, "HostPlan: page_size: expected an integer >= 1, got 4.0"),
    (dict(page_size=True), rudnn.ArgumentError, "HostPlan: page_size: expected an integer >= 1, got True"),
    (dict(pages=-1), rudnn.ArgumentError, "HostPlan: pages: expected an integer >= 0, got -1"),
    (dict(page_size=2**31), rudnn.ArgumentError, "HostPlan: page_size: expected an integer in [1, 2^31 - 1], got "
                                                 "2147483648"),
    (dict(pages=2**31), rudnn.ArgumentError, "HostPlan: pages: expected an integer in [0, 2^31 - 1], got 2147483648"),
    (dict(lengths=[2**31, 3]), rudnn.ArgumentError, "HostPlan: lengths[0] = 2147483648: expected a length in "
                                                    "[0, 2^31 - 1]"),
    (dict(tables=[[0, 1], [[2]]]), rudnn.ShapeError, "HostPlan: tables[1]: expected a 1-D list of page ids"),
    (dict(tables=np.array([0, 1])), rudnn.ShapeError,
     "HostPlan: tables: expected a list of per-sequence page lists or a 2-D array [num_seqs, max_pages]"),
    (dict(tables=np.array([[0, 1], [2, 0]], dtype=np.float32)), rudnn.DTypeError,
     "HostPlan: tables: expected an integer dtype (int32, int64, uint32 or uint8), got float32"),
    (dict(tables=[[0.0, 1.0], [2.0]]), rudnn.DTypeError,
     "HostPlan: tables[0]: expected an integer dtype (int32, int64, uint32 or uint8), got float64"),
    (dict(lengths=[True, False]), rudnn.DTypeError,
     "HostPlan: lengths: expected an integer dtype (int32, int64, uint32 or uint8), got bool"),
    (dict(positions=torch.tensor([6.0, 2.0, 5.0])), rudnn.DTypeError,
     "HostPlan: positions: expected an integer dtype (int32, int64, uint32 or uint8), got float32"),
    (dict(lengths="7,3"), rudnn.ArgumentError, "HostPlan: lengths: expected a list of integers or a host integer array"),
    (dict(lengths=[[7, 3]]), rudnn.ShapeError, "HostPlan: lengths: expected rank 1 [num_seqs], got shape [1, 2]"),
    (dict(lengths=[7, 3, 1]), rudnn.ShapeError,
     "HostPlan: lengths: expected one length per sequence of tables ([2]), got shape [3]"),
    (dict(positions=[6, 2]), rudnn.ShapeError,
     "HostPlan: positions: expected one position per query row of sequence_ids ([3]), got shape [2]"),
    (dict(lengths=[7, -3]), rudnn.ArgumentError, "HostPlan: lengths[1] = -3: expected a length in [0, 2^31 - 1]"),
    (dict(lengths=[7, 5]), rudnn.ShapeError,
     "HostPlan: lengths[1] = 5 needs 2 pages of page_size 4, but tables[1] holds 1 (capacity 4)"),
    (dict(tables=np.array([[0, 1], [2, 3]]), lengths=[9, 3], positions=[6, 2, 8]), rudnn.ShapeError,
     "HostPlan: lengths[0] = 9 needs 3 pages of page_size 4, but tables[0] holds 2 (capacity 8)"),
    (dict(tables=[[0, 6], [2]]), rudnn.ArgumentError, "HostPlan: tables[0][1] = 6 >= pages = 6"),
    (dict(tables=[[0, 1], [-2]]), rudnn.ArgumentError, "HostPlan: tables[1][0] = -2 < 0"),
    (dict(sequence_ids=[0, 2, 0]), rudnn.ArgumentError, "HostPlan: sequence_ids[1] = 2 >= num_seqs = 2"),
    (dict(sequence_ids=[0, 1, -1]), rudnn.ArgumentError, "HostPlan: sequence_ids[2] = -1 < 0"),
    (dict(positions=[6, 3, 5]), rudnn.ArgumentError,
     "HostPlan: positions[1] = 3 >= lengths[1] = 3 (the length of sequence sequence_ids[1] = 1)"),
    (dict(positions=[6, 2, -1]), rudnn.ArgumentError, "HostPlan: positions[2] = -1 < 0"),
])
def test_host_plan_errors(kw, kind, text):
    with raises(kind, text):
        host(**kw)


def test_host_plan_accepts_padding_and_shared_pages():
    # entries past a sequence's pages are ignored, whatever they hold; a page in several tables is fine
    HostPlan(4, 6, np.array([[0, 1, 99], [0, -5, 7]]), [7, 3], [0, 1], [6, 2])


def test_host_plan_device_array():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    with raises(rudnn.DeviceError, "HostPlan: lengths: expected a host (CPU) array or a list"):
        host(lengths=torch.tensor([7, 3], device="cuda"))


# ---- DevicePlan ----------------------------------------------------------------------------

def test_upload_errors():
    q = torch.zeros(3, 2, 4)
    with raises(rudnn.ArgumentError, "DevicePlan.upload: host: expected a rudnn.paged.HostPlan, got dict"):
        DevicePlan.upload(good(), q)
    with raises(rudnn.ArgumentError, "DevicePlan.upload: into: expected a rudnn.paged.DevicePlan, got str"):
        DevicePlan.upload(host(), q, into="plan")
    small = DevicePlan.reserve(q, 2, 4, 4)
    with raises(rudnn.ShapeError, "DevicePlan.upload: into: the schedule needs 3 query rows (max_queries), the plan "
                                  "holds 2 (make it with DevicePlan.reserve of a larger capacity)"):
        DevicePlan.upload(host(), q, into=small)
    narrow = DevicePlan.reserve(q, 4, 4, 1)
    with raises(rudnn.ShapeError, "the schedule needs 2 pages per sequence (max_pages), the plan holds 1"):
        DevicePlan.upload(host(), q, into=narrow)
    other = DevicePlan.reserve(q.numpy(), 4, 4, 4)
    with raises(rudnn.DeviceError, "DevicePlan.upload: into: expected a plan of q's framework and device (torch cpu), "
                                   "got numpy cpu"):
        DevicePlan.upload(host(), q, into=other)
    with raises(rudnn.ArgumentError, "DevicePlan.reserve: max_seqs: expected an integer >= 0, got -1"):
        DevicePlan.reserve(q, 4, -1, 4)
    with raises(rudnn.FrameworkError, "DevicePlan.upload: q: expected a torch.Tensor, cupy.ndarray, numpy.ndarray"):
        DevicePlan.upload(host(), [1.0])


def test_reserved_plan_without_schedule():
    q = torch.zeros(0, 2, 4)
    plan = DevicePlan.reserve(q, 4, 4, 4)
    with raises(rudnn.ArgumentError, "paged_attention: plan: this plan was reserved but holds no schedule yet"):
        plan.attention(q, torch.zeros(6, 4, 1, 4), torch.zeros(6, 4, 1, 4))


# ---- attention -----------------------------------------------------------------------------

def operands(Hq=4, Hkv=2, D=8, Dv=8, dtype=torch.float32, pages=6, page_size=4):
    q = torch.randn(3, Hq, D).to(dtype)
    k = torch.randn(pages, page_size, Hkv, D).to(dtype)
    v = torch.randn(pages, page_size, Hkv, Dv).to(dtype)
    return DevicePlan.upload(host(), q), q, k, v


@pytest.mark.parametrize("change,kind,text", [
    (lambda q, k, v: (q.int(), k, v), rudnn.DTypeError, "paged_attention: q: expected float32, float16 or bfloat16, "
                                                        "got int32"),
    (lambda q, k, v: (q[0], k, v), rudnn.ShapeError, "paged_attention: q: expected rank 3 [queries, Hq, D], got shape "
                                                     "[4, 8]"),
    (lambda q, k, v: (q[:2], k, v), rudnn.ShapeError, "paged_attention: q: expected 3 query rows (the plan's queries) "
                                                      "on axis 0, got shape [2, 4, 8]"),
    (lambda q, k, v: (q, k.half(), v), rudnn.DTypeError, "paged_attention: k_cache: expected the dtype of q (float32), "
                                                         "got float16"),
    (lambda q, k, v: (q, k[:, :2], v), rudnn.ShapeError, "paged_attention: k_cache: expected page_size = 4 slots per "
                                                         "page (axis 1, the plan's page_size), got shape [6, 2, 2, 8]"),
    (lambda q, k, v: (q, k[0], v), rudnn.ShapeError, "paged_attention: k_cache: expected rank 4 [pages, page_size, "
                                                     "Hkv, D], got shape [4, 2, 8]"),
    (lambda q, k, v: (q, k[..., :4], v), rudnn.ShapeError, "paged_attention: k_cache: expected head dim D = 8 (the "
                                                           "last axis of q), got shape [6, 4, 2, 4]"),
    (lambda q, k, v: (q, k, v[:5]), rudnn.ShapeError, "paged_attention: v_cache: expected 6 pages and Hkv = 2 heads "
                                                      "(like k_cache [6, 4, 2, 8]), got shape [5, 4, 2, 8]"),
    (lambda q, k, v: (q[:, :3], k, v), rudnn.ShapeError, "paged_attention: the number of query heads Hq = 3 must be a "
                                                         "multiple of the number of key/value heads Hkv = 2"),
    (lambda q, k, v: (torch.randn(3, 4, 16)[..., ::2], k, v), rudnn.ShapeError,
     "paged_attention: q: the last axis must be contiguous (stride 1), got stride 2"),
    (lambda q, k, v: (q, torch.randn(6, 4, 2, 16)[..., ::2], v), rudnn.ShapeError,
     "paged_attention: k_cache: the last axis must be contiguous (stride 1), got stride 2"),
    (lambda q, k, v: (torch.zeros(3, 4, 1025), torch.zeros(6, 4, 2, 1025), v), rudnn.ShapeError,
     "paged_attention: q: the head dim D (last axis) must be in 1..1024, got shape [3, 4, 1025]"),
    (lambda q, k, v: (q, k, torch.zeros(6, 4, 2, 1025)), rudnn.ShapeError,
     "paged_attention: v_cache: the head dim Dv (last axis) must be in 1..1024, got shape [6, 4, 2, 1025]"),
])
def test_attention_operand_errors(change, kind, text):
    plan, q, k, v = operands()
    q, k, v = change(q, k, v)
    with raises(kind, text):
        plan.attention(q, k, v)


def test_cache_with_fewer_pages_than_the_plan():
    plan, q, k, v = operands()
    with raises(rudnn.ArgumentError, "paged_attention: plan.tables[0][1] = 1 >= pages = 1"):
        plan.attention(q, k[:1], v[:1])


@pytest.mark.parametrize("scale,text", [
    (0.0, "paged_attention: scale: expected a finite value > 0, got 0.000000"),
    (-1.0, "paged_attention: scale: expected a finite value > 0, got -1.000000"),
    (float("nan"), "paged_attention: scale: expected a finite value > 0, got nan"),
    (float("inf"), "paged_attention: scale: expected a finite value > 0, got inf"),
    (1e300, "paged_attention: scale: expected a value > 0 that float32 represents"),
    ("0.5", "paged_attention: scale: expected a finite value > 0, got '0.5'"),
])
def test_attention_scale_errors(scale, text):
    plan, q, k, v = operands()
    with raises(rudnn.ArgumentError, text):
        plan.attention(q, k, v, scale)


def test_attention_flag_and_output_errors():
    plan, q, k, v = operands()
    with raises(rudnn.ArgumentError, "paged_attention: causal: expected True or False, got 1"):
        plan.attention(q, k, v, None, 1)
    with raises(rudnn.ArgumentError, "paged_attention: return_lse: expected True or False, got 'yes'"):
        plan.attention(q, k, v, return_lse="yes")
    with raises(rudnn.ShapeError, "paged_attention: out: expected shape [3, 4, 8] [queries, Hq, Dv] (q's dtype), got "
                                  "[3, 4, 4]"):
        plan.attention(q, k, v, out=torch.zeros(3, 4, 4))
    with raises(rudnn.DTypeError, "paged_attention: out: expected the dtype of q (float32), got float16"):
        plan.attention(q, k, v, out=torch.zeros(3, 4, 8, dtype=torch.float16))
    with raises(rudnn.ShapeError, "paged_attention: out: expected an output whose elements do not share memory"):
        plan.attention(q, k, v, out=torch.zeros(1, 4, 8).expand(3, 4, 8))
    with raises(rudnn.DeviceError, "paged_attention: plan: expected the framework and device of the plan (torch cpu), "
                                   "got numpy cpu"):
        plan.attention(q.numpy(), k.numpy(), v.numpy())
    with raises(rudnn.FrameworkError, "paged_attention: k_cache: expected a torch.Tensor"):
        plan.attention(q, k.numpy(), v)


def test_corrupted_metadata_never_reads_outside_the_caches():
    """A plan whose arrays were overwritten after upload: the CPU backend checks them again."""
    plan, q, k, v = operands()
    before = q.clone()
    plan.tables[0, 1] = 1000
    with raises(rudnn.ArgumentError, "paged_attention: plan.tables[0][1] = 1000 >= pages = 6"):
        plan.attention(q, k, v)
    plan.tables[0, 1] = 1
    plan.positions[2] = 7
    with raises(rudnn.ArgumentError, "paged_attention: plan.positions[2] = 7 >= plan.lengths[0] = 7"):
        plan.attention(q, k, v)
    plan.positions[2] = 5
    plan.sequence_ids[0] = 9
    with raises(rudnn.ArgumentError, "paged_attention: plan.sequence_ids[0] = 9 >= num_seqs = 2"):
        plan.attention(q, k, v)
    plan.sequence_ids[0] = 0
    plan.lengths[1] = 50
    with raises(rudnn.ShapeError, "paged_attention: plan.lengths[1] = 50 needs 13 pages of page_size 4, but "
                                  "plan.tables[1] holds 2"):
        plan.attention(q, k, v)
    plan.lengths[1] = 3
    plan.attention(q, k, v)  # repaired
    assert torch.equal(q, before)


def test_metadata_dtype_error():
    plan, q, k, v = operands()
    plan.tables = plan.tables.long()
    with raises(rudnn.DTypeError, "paged_attention: plan.tables: expected int32, got int64"):
        plan.attention(q, k, v)


# ---- split-KV ------------------------------------------------------------------------------

def test_split_workspace_errors():
    q = torch.zeros(1)
    for splits in (0, 1, 33):
        with raises(rudnn.ArgumentError, f"SplitWorkspace: splits: expected an integer in 2..32, got {splits}"):
            SplitWorkspace(q, 4, 4, 4, splits)
    with raises(rudnn.ArgumentError, "SplitWorkspace: 32 splits of 4096 queries x 32 heads x 128 values need "
                                     "2164260864 bytes, above the 64 MiB cap of a split workspace (use fewer splits)"):
        SplitWorkspace(q, 4096, 32, 128, 32)
    with raises(rudnn.ArgumentError, "SplitWorkspace: heads: expected an integer >= 1, got 0"):
        SplitWorkspace(q, 4, 0, 4, 2)
    plan, q, k, v = operands()
    with raises(rudnn.ShapeError, "paged_attention: workspace: made for [queries, heads, value_dim] = [3, 4, 4], the "
                                  "output is [3, 4, 8] (a workspace serves one shape)"):
        plan.attention(q, k, v, workspace=SplitWorkspace(q, 3, 4, 4, 2))
    with raises(rudnn.ArgumentError, "paged_attention: workspace: expected a rudnn.paged.SplitWorkspace or None, got "
                                     "Tensor"):
        plan.attention(q, k, v, workspace=torch.zeros(100, dtype=torch.uint8))
    with raises(rudnn.DeviceError, "paged_attention: workspace: expected a workspace of q's framework and device "
                                   "(torch cpu), got numpy cpu"):
        plan.attention(q, k, v, workspace=SplitWorkspace(q.numpy(), 3, 4, 8, 2))


# ---- MLA -----------------------------------------------------------------------------------

def mla_operands(H=4, R=16, P=8):
    q = torch.randn(3, H, R)
    qp = torch.randn(3, H, P)
    latent = torch.randn(6, 4, 1, R)
    kp = torch.randn(6, 4, 1, P)
    return DevicePlan.upload(host(), q), q, qp, latent, kp


@pytest.mark.parametrize("change,kind,text", [
    (lambda q, qp, l, kp: (q, qp, l.expand(6, 4, 2, 16), kp), rudnn.ShapeError,
     "paged_mla: latent: expected one shared head on axis 2 [pages, page_size, 1, R], got shape [6, 4, 2, 16]"),
    (lambda q, qp, l, kp: (q, qp, l, kp[:5]), rudnn.ShapeError,
     "paged_mla: kp: expected shape [6, 4, 1, P] (the pages of latent, one head), got [5, 4, 1, 8]"),
    (lambda q, qp, l, kp: (q, qp, l[..., :8], kp), rudnn.ShapeError,
     "paged_mla: latent: expected latent dim R = 16 (the last axis of q), got shape [6, 4, 1, 8]"),
    (lambda q, qp, l, kp: (q, qp[..., :4], l, kp), rudnn.ShapeError,
     "paged_mla: qp: expected shape [3, 4, 8] [queries, H, P], got [3, 4, 4]"),
    (lambda q, qp, l, kp: (q, qp, l, torch.zeros(6, 4, 1, 257)), rudnn.ShapeError,
     "paged_mla: kp: the rotary dim P (last axis) must be in 1..256, got shape [6, 4, 1, 257]"),
    (lambda q, qp, l, kp: (torch.zeros(3, 4, 1025), qp, torch.zeros(6, 4, 1, 1025), kp), rudnn.ShapeError,
     "paged_mla: q: the latent dim R (last axis) must be in 1..1024, got shape [3, 4, 1025]"),
    (lambda q, qp, l, kp: (q, qp.half(), l, kp), rudnn.DTypeError,
     "paged_mla: qp: expected the dtype of q (float32), got float16"),
    (lambda q, qp, l, kp: (q, qp, l, kp[:, :2]), rudnn.ShapeError,
     "paged_mla: kp: expected page_size = 4 slots per page"),
])
def test_mla_errors(change, kind, text):
    plan, q, qp, latent, kp = mla_operands()
    q, qp, latent, kp = change(q, qp, latent, kp)
    with raises(kind, text):
        plan.mla(q, qp, latent, kp, 0.1)


def test_mla_scale_is_required():
    plan, q, qp, latent, kp = mla_operands()
    with pytest.raises(TypeError):
        plan.mla(q, qp, latent, kp)
    with raises(rudnn.ArgumentError, "paged_mla: scale: expected a finite value > 0, got None"):
        plan.mla(q, qp, latent, kp, None)


# ---- append --------------------------------------------------------------------------------

def test_append_duplicate_slot_writes_nothing():
    # rows 0 and 2 both write position 5 of sequence 0
    plan = DevicePlan.upload(host(positions=[5, 2, 5]), torch.zeros(1))
    k = torch.randn(3, 2, 8)
    v = torch.randn(3, 2, 4)
    kc, vc = torch.zeros(6, 4, 2, 8), torch.zeros(6, 4, 2, 4)
    with raises(rudnn.ArgumentError, "paged_append: rows 0 and 2 both write page 1 slot 1 (sequence 0 position 5 and "
                                     "sequence 0 position 5); nothing was written"):
        plan.append(k, v, kc, vc)
    assert not kc.any() and not vc.any()


def test_append_duplicate_through_a_shared_page():
    # sequences 0 and 1 share page 0; rows at position 1 of each name the same slot
    plan = DevicePlan.upload(HostPlan(4, 3, [[0, 1], [0]], [6, 4], [0, 1], [1, 1]), torch.zeros(1))
    kc, vc = torch.zeros(3, 4, 1, 2), torch.zeros(3, 4, 1, 2)
    with raises(rudnn.ArgumentError, "paged_append: rows 0 and 1 both write page 0 slot 1"):
        plan.append(torch.ones(2, 1, 2), torch.ones(2, 1, 2), kc, vc)
    assert not kc.any() and not vc.any()


@pytest.mark.parametrize("change,kind,text", [
    (lambda k, v, kc, vc: (k[:2], v, kc, vc), rudnn.ShapeError,
     "paged_append: k: expected 3 query rows (the plan's queries) on axis 0, got shape [2, 2, 8]"),
    (lambda k, v, kc, vc: (k[:, :1], v, kc, vc), rudnn.ShapeError,
     "paged_append: k: expected shape [3, 2, 8] [queries, Hkv, D] (like k_cache), got [3, 1, 8]"),
    (lambda k, v, kc, vc: (k, v[..., :2], kc, vc), rudnn.ShapeError,
     "paged_append: v: expected shape [3, 2, 4] [queries, Hkv, Dv] (like v_cache), got [3, 2, 2]"),
    (lambda k, v, kc, vc: (k, v, kc.half(), vc), rudnn.DTypeError,
     "paged_append: k_cache: expected the dtype of k (float32), got float16"),
    (lambda k, v, kc, vc: (k.int(), v, kc, vc), rudnn.DTypeError,
     "paged_append: k: expected float32, float16 or bfloat16, got int32"),
    (lambda k, v, kc, vc: (k, v, kc[:, :2], vc), rudnn.ShapeError,
     "paged_append: k_cache: expected page_size = 4 slots per page"),
    (lambda k, v, kc, vc: (k, v, kc, vc[:2]), rudnn.ShapeError,
     "paged_append: v_cache: expected 6 pages and Hkv = 2 heads (like k_cache [6, 4, 2, 8]), got shape [2, 4, 2, 4]"),
    (lambda k, v, kc, vc: (k, k, kc, kc), rudnn.ArgumentError,
     "paged_append: v_cache: expected a cache apart from k_cache (the same memory was given twice)"),
    (lambda k, v, kc, vc: (k, v, kc[:1], vc[:1]), rudnn.ArgumentError,
     "paged_append: plan.tables[0][1] = 1 >= pages = 1"),
])
def test_append_errors(change, kind, text):
    plan = DevicePlan.upload(host(), torch.zeros(1))
    k, v = torch.randn(3, 2, 8), torch.randn(3, 2, 4)
    kc, vc = torch.zeros(6, 4, 2, 8), torch.zeros(6, 4, 2, 4)
    k, v, kc, vc = change(k, v, kc, vc)
    snapshot = (kc.clone(), vc.clone())
    with raises(kind, text):
        plan.append(k, v, kc, vc)
    assert torch.equal(kc, snapshot[0]) and torch.equal(vc, snapshot[1])


@pytest.mark.cuda
def test_cuda_backward_is_not_built_yet():
    q = torch.zeros(3, 4, 8, device="cuda")
    plan = DevicePlan.upload(host(), q)
    kc, vc = torch.zeros(6, 4, 2, 8, device="cuda"), torch.zeros(6, 4, 2, 4, device="cuda")
    with raises(rudnn.UnsupportedError, "paged_attention_backward: the CUDA backward of the paged family is not "
                                        "built yet"):
        plan.attention_backward(q, kc, vc, torch.zeros(3, 4, 4, device="cuda"))


@pytest.mark.cuda
def test_cuda_append_refuses_duplicate_slots_before_writing():
    plan = DevicePlan.upload(host(positions=[5, 2, 5]), torch.zeros(1, device="cuda"))
    k, v = torch.randn(3, 2, 8, device="cuda"), torch.randn(3, 2, 4, device="cuda")
    kc, vc = torch.zeros(6, 4, 2, 8, device="cuda"), torch.zeros(6, 4, 2, 4, device="cuda")
    with raises(rudnn.ArgumentError, "paged_append: rows 0 and 2 both write page 1 slot 1 (sequence 0 position 5 and "
                                     "sequence 0 position 5); nothing was written"):
        plan.append(k, v, kc, vc)
    assert not kc.any() and not vc.any()


def test_append_into_a_read_only_numpy_cache():
    plan = DevicePlan.upload(host(), np.zeros(1, np.float32))
    kc = np.broadcast_to(np.zeros((1, 4, 2, 8), np.float32), (6, 4, 2, 8))
    with raises(rudnn.ArgumentError, "paged_append: k_cache: expected a writable array, got a read-only numpy.ndarray"):
        plan.append(np.ones((3, 2, 8), np.float32), np.ones((3, 2, 4), np.float32), kc, np.zeros((6, 4, 2, 4),
                                                                                               np.float32))


def test_plans_of_a_q_that_requires_grad_do_not_warn():
    import warnings

    q = torch.zeros(3, 4, 8, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DevicePlan.upload(host(), q)
        DevicePlan.reserve(q, 4, 4, 4)
        SplitWorkspace(q, 3, 4, 8, 2)

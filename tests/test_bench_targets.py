"""The benchmark harness's own logic (python -m rudnn.bench), on the CPU: the SPEC section 8
target lines of memory- and compute-bound families, and the MoE family's correctness check on a
smaller layer of the same model than the one it times."""

import os

import pytest
import torch

from rudnn import bench
from rudnn.bench import moe as bmoe

ENV = {"device": "cuda", "matmul_tflops": 800.0, "copy_gbs": 4000.0}


def _row(op, ms, peer_ms, flops=0, nbytes=0, status="ok", dtype="bfloat16"):
    return {"op": op, "ms": ms, "peer_ms": peer_ms, "flops": flops, "bytes": nbytes, "status": status, "dtype": dtype}


def test_moe_target_line_per_op():
    rows = [_row("moe_grouped_gemm", 1.0, 2.0, flops=int(0.7 * 800e9)),   # 560 TFLOP/s: 70% of matmul
            _row("moe_grouped_gemm", 1.0, 2.0, flops=int(0.5 * 800e9)),   # 50%: misses
            _row("moe_forward", 1.0, 1.5), _row("moe_forward", 1.0, 1.1),  # 1.5x meets 1.3x, 1.1x misses
            _row("moe_forward", 1.0, 9.0, status="FAIL"),                  # a failed row never counts
            _row("moe_forward", 1.0, 9.0, dtype="float32")]                # nor does another dtype
    line = bench.target_line("moe", rows, ENV)
    assert line.startswith("moe: SPEC §8 ")
    assert "moe_grouped_gemm: target (≥60% of the bf16 matmul rate) met by 1 of 2 bf16 rows" in line
    assert "moe_forward: target (≥1.3× the peer) met by 1 of 3 bf16 rows" in line


def test_memory_family_target_line():
    rows = [_row("rms_norm", 1.0, 2.0, nbytes=int(3.8e9)), _row("rms_norm", 1.0, 2.0, nbytes=int(3.0e9)),
            _row("rms_norm", 1.0, 1.2, nbytes=int(3.9e9))]
    line = bench.target_line("norm", rows, ENV)
    assert "target (≥90% of copy bandwidth and ≥1.5× the peer) met by 1 of 3 bf16 rows" in line


def test_no_target_line_on_the_cpu_or_without_a_target():
    rows = [_row("moe_forward", 1.0, 2.0)]
    assert bench.target_line("moe", rows, {"device": "cpu"}) is None
    assert bench.target_line("attention", [_row("attention", 1.0, 2.0, flops=1)], ENV) is None


def test_moe_checks_a_smaller_layer_than_it_times(monkeypatch):
    monkeypatch.setattr(bmoe, "_CHECK_TOKENS", 5)
    made = []
    original = bmoe._Layer.__init__

    def init(self, spec, device, fused=False, tokens=None):
        original(self, spec, device, fused, tokens)
        made.append(self.T)

    monkeypatch.setattr(bmoe._Layer, "__init__", init)
    for op in bmoe.OPS:
        made.clear()
        spec = bench.CaseSpec("moe", op, (16, 32, 16, 4, 2), "float32")
        torch.manual_seed(0)
        p = bmoe.prepare(spec, "cpu")
        checks = p.check()
        assert made == [16, 5], (op, made)  # timed at 16 tokens, checked at 5
        assert checks and all(c.ok for c in checks), (op, checks)
        assert p.timing == "host" and p.algorithm() == "cpu; peer: per-expert loop"


def test_moe_unfused_rows_price_the_fused_gate_up(monkeypatch):
    """GPU rows build the experts with fused_gate_up, their "[unfused]" twins without it (same op,
    same shape); the CPU rows never fuse."""
    seen = []
    for name in ("_forward", "_grouped_gemm", "_forward_backward"):
        monkeypatch.setattr(bmoe, name, lambda spec, device, fused, name=name: seen.append((name, fused)))
    gpu = bmoe.cases("cuda", quick=True)
    unfused = [c for c in gpu if c.op.endswith("[unfused]")]
    assert {c.op for c in unfused} == {"moe_forward[unfused]", "moe_grouped_gemm[unfused]"}
    for c in unfused:  # each beside a fused row of the same shape
        assert any(d.op == c.op[:-len("[unfused]")] and d.shape == c.shape for d in gpu), c
    for spec, device in [(unfused[0], "cuda"), (gpu[0], "cuda"), (gpu[0], "cpu")]:
        bmoe.prepare(spec, device)
    assert seen == [("_forward", False), ("_forward", True), ("_forward", False)], seen
    assert not any(c.op.endswith("[unfused]") for c in bmoe.cases("cpu", quick=False))


def test_moe_cooperative_rows_price_the_pingpong_tiles(monkeypatch):
    """"[cooperative]" twins exist only for cases whose default takes the ping-pong tiles (at most 64
    rows per expert on average), beside the default row of the same shape, and their run and check
    see RUDNN_MOE_GEMM_SCHEDULE=cooperative (restored after); the default rows see no override."""
    monkeypatch.delenv("RUDNN_MOE_GEMM_SCHEDULE", raising=False)
    env = lambda: os.environ.get("RUDNN_MOE_GEMM_SCHEDULE")
    for name in ("_forward", "_grouped_gemm", "_forward_backward"):
        monkeypatch.setattr(bmoe, name, lambda spec, device, fused: bench.Prepared(
            run=lambda: (env(), fused), peer=lambda: None, check=lambda: (env(), fused)))
    gpu = bmoe.cases("cuda", quick=True)
    twins = [c for c in gpu if c.op.endswith("[cooperative]")]
    assert {c.op for c in twins} == {"moe_forward[cooperative]", "moe_grouped_gemm[cooperative]"}
    for c in twins:
        T, H, I, E, k = c.shape
        assert T * k <= 64 * E, c  # the default takes the ping-pong tiles here
        assert any(d.op == c.op[:-len("[cooperative]")] and d.shape == c.shape for d in gpu), c
        p = bmoe.prepare(c, "cuda")
        assert p.run() == p.check() == ("cooperative", True), c  # fused, as the default row
        assert env() is None
    default = bmoe.prepare(next(c for c in gpu if c.op == "moe_forward"), "cuda")
    assert default.run() == (None, True)
    assert not any(c.op.endswith("[cooperative]") for c in bmoe.cases("cpu", quick=False))


@pytest.mark.parametrize("variant", ["multicast", "pingpong_wide"])
def test_moe_variant_rows_only_where_built(monkeypatch, variant):
    """"[multicast]" and "[pingpong_wide]" twins exist only where libruDNN has the GEMM variants
    (rudnn._C.has_moe_gemm_variants, -DRUDNN_WITH_MOE_GEMM_VARIANTS=ON), for cases whose default takes
    the cooperative tiles (more than 64 rows per expert on average), beside the default row of the
    same shape; their run and check see RUDNN_MOE_GEMM_SCHEDULE=<variant> (restored after)."""
    from rudnn import _C

    monkeypatch.delenv("RUDNN_MOE_GEMM_SCHEDULE", raising=False)
    env = lambda: os.environ.get("RUDNN_MOE_GEMM_SCHEDULE")
    for name in ("_forward", "_grouped_gemm", "_forward_backward"):
        monkeypatch.setattr(bmoe, name, lambda spec, device, fused: bench.Prepared(
            run=lambda: (env(), fused), peer=lambda: None, check=lambda: (env(), fused)))
    monkeypatch.setattr(_C, "has_moe_gemm_variants", False, raising=False)
    suffix = f"[{variant}]"
    assert not any(c.op.endswith(suffix) for c in bmoe.cases("cuda", quick=True))
    monkeypatch.setattr(_C, "has_moe_gemm_variants", True, raising=False)
    gpu = bmoe.cases("cuda", quick=True)
    twins = [c for c in gpu if c.op.endswith(suffix)]
    assert {c.op for c in twins} == {"moe_forward" + suffix, "moe_grouped_gemm" + suffix}
    for c in twins:
        T, H, I, E, k = c.shape
        assert T * k > 64 * E, c  # the default takes the cooperative tiles here
        assert any(d.op == c.op[:-len(suffix)] and d.shape == c.shape for d in gpu), c
        p = bmoe.prepare(c, "cuda")
        assert p.run() == p.check() == (variant, True), c
        assert env() is None
    assert gpu.index(twins[0]) > max(i for i, c in enumerate(gpu) if "[" not in c.op)  # after the default rows
    assert not any(c.op.endswith(suffix) for c in bmoe.cases("cpu", quick=False))


def test_paged_mixed_cases_check_on_the_cpu():
    from rudnn.bench import paged_mixed

    for spec in paged_mixed.cases("cpu", quick=False):
        p = paged_mixed.prepare(spec, "cpu")
        checks = p.check()
        assert checks and all(c.ok for c in checks), (spec, checks)
        assert p.flops > 0 and p.algorithm() == "cpu"


def test_norm_fused_and_decode_rows():
    from rudnn.bench import norm

    specs = [s for s in norm.cases("cpu", quick=True) if s.op in ("add_rms_norm", "add_layer_norm")]
    assert {s.op for s in specs} == {"add_rms_norm", "add_layer_norm"}
    for spec in specs:
        p = norm.prepare(spec, "cpu")
        assert all(c.ok for c in p.check()), spec
        assert p.timing == ("host" if spec.shape[0] <= 64 else "device")


def test_gated_delta_chunk_flops_and_l2_flush():
    from rudnn.bench import gated_delta as gd

    # one chunk of 64 tokens, K = V = 128, one head: 5 C x C products, 3 state products, the inverse
    assert gd.chunk_flops(1, 64, 1, 128, 128) == 2 * 64 * 64 * 640 + 6 * 64 * 128 * 128 + 2 * 64 ** 3 // 3
    assert gd.chunk_flops(2, 65, 3, 128, 128) == 2 * 3 * 2 * gd.chunk_flops(1, 64, 1, 128, 128)  # ceil(65/64) = 2
    ratio = gd.chunk_flops(1, 8192, 1, 128, 128) / (6 * 8192 * 128 * 128)
    assert 1.8 < ratio < 2.0
    small = [s for s in gd.cases("cpu", quick=True) if s.op != "gated_delta_rule"]
    for spec in small:
        p = gd.prepare(spec, "cpu")
        assert p.flush_l2  # CPU-sized inputs fit any L2: the flag is set, the CPU timer ignores it
        assert all(c.ok for c in p.check())


def _env_seen_by(monkeypatch, op, name):
    """The value of environment variable `name` at each call of rudnn.<op> from now on (the variable
    unset first): how a bench row's library knob is checked to be set while rudnn runs."""
    import rudnn

    monkeypatch.delenv(name, raising=False)
    seen = []
    real = getattr(rudnn, op)

    def spy(*args, **kwargs):
        seen.append(os.environ.get(name))
        return real(*args, **kwargs)

    monkeypatch.setattr(rudnn, op, spy)
    return seen


@pytest.mark.parametrize("row, op, variable, shape", [
    ("chunk_gated_delta_rule_fwd_bwd[1stage]", "chunk_gated_delta_rule_backward", "RUDNN_GATED_DELTA_BWD_STAGES",
     (1, 32, 2, 4, 32, 32)),
    ("chunk_gated_delta_rule[wgmma]", "chunk_gated_delta_rule", "RUDNN_GATED_DELTA_WGMMA", (1, 64, 2, 4, 32, 32))])
def test_gated_delta_variant_rows_set_their_knob(monkeypatch, row, op, variable, shape):
    """On a GPU the gated delta family times forward + backward also with
    RUDNN_GATED_DELTA_BWD_STAGES=1 (the chunked backward's state passes on one stage), and the
    chunked forward also with RUDNN_GATED_DELTA_WGMMA=1 (the state kernel on wgmma, opt-in until
    measured), beside the default rows of the same shapes, each knob set only while rudnn runs and
    checks."""
    from rudnn.bench import gated_delta as bgd

    base, suffix = row[:row.index("[")], row[row.index("["):]
    for quick in (True, False):
        cases = bgd.cases("cuda", quick=quick)
        variant = {c.shape for c in cases if c.op == row}
        assert variant and variant <= {c.shape for c in cases if c.op == base}
    assert not [c for c in bgd.cases("cpu", quick=True) if c.op.endswith(suffix)]
    seen = _env_seen_by(monkeypatch, op, variable)
    p = bgd.prepare(bench.CaseSpec("gated_delta", row, shape, "bfloat16"), "cpu")
    assert all(c.ok for c in p.check())
    p.run()
    assert seen and set(seen) == {"1"}
    assert variable not in os.environ


def test_norm_regs_rows_run_the_previous_kernel(monkeypatch):
    """On a GPU the norm family times rms_norm, add_rms_norm and layer_norm_backward also with
    RUDNN_NORM_PIPELINED=0 (the kernels before the pipelined ones), set only while rudnn runs and
    checks."""
    from rudnn.bench import norm as bnorm

    regs = [c for c in bnorm.cases("cuda", quick=True) if c.op.endswith("[regs]")]
    assert {c.op for c in regs} == {"rms_norm[regs]", "add_rms_norm[regs]", "layer_norm_backward[regs]"}
    assert not [c for c in bnorm.cases("cpu", quick=True) if c.op.endswith("[regs]")]
    _assert_norm_row_sets(monkeypatch, "add_rms_norm[regs]", "rms_norm", "RUDNN_NORM_PIPELINED")


def _assert_norm_row_sets(monkeypatch, row, op, variable):
    """The norm bench row `row` runs and checks rudnn.<op> with `variable` = 0, which is unset again
    outside rudnn's calls (the peer's included)."""
    from rudnn.bench import norm as bnorm

    seen = _env_seen_by(monkeypatch, op, variable)
    p = bnorm.prepare(bench.CaseSpec("norm", row, (64, 256), "bfloat16"), "cpu")
    assert all(c.ok for c in p.check())
    p.run()
    p.peer()
    assert seen and set(seen) == {"0"}
    assert variable not in os.environ


def test_norm_no_cluster_rows_run_the_one_block_per_row_kernels(monkeypatch):
    """On a GPU the norm family times layer_norm, rms_norm, softmax and their backward on its
    few-long-row shapes also with RUDNN_NORM_CLUSTER=0 (the kernels the cluster kernels replace
    there), set only while rudnn runs and checks."""
    from rudnn.bench import norm as bnorm

    rows = [c for c in bnorm.cases("cuda", quick=True) if c.op.endswith("[no_cluster]")]
    ops = ("layer_norm", "rms_norm", "layer_norm_backward", "rms_norm_backward", "softmax", "softmax_backward")
    assert {(c.op, c.shape) for c in rows} == {(op + "[no_cluster]", shape) for op in ops
                                               for shape in ((8, 65536), (64, 32768))}
    # the same shapes run the default kernels in the same run (the cluster kernel on Hopper)
    plain = {(c.op, c.shape) for c in bnorm.cases("cuda", quick=True)}
    assert all((c.op[:-len("[no_cluster]")], c.shape) in plain for c in rows)
    assert not [c for c in bnorm.cases("cpu", quick=True) if c.op.endswith("[no_cluster]")]
    _assert_norm_row_sets(monkeypatch, "layer_norm[no_cluster]", "layer_norm", "RUDNN_NORM_CLUSTER")

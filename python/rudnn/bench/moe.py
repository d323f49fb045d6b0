"""Benchmark family `moe`: a whole MoE layer (softmax top-k routing, dispatch, SwiGLU experts,
weighted combine), forward and forward+backward, and the SwiGLU grouped GEMMs alone, against a
torch pipeline.

Peer: the same layer written with torch ops on torch._grouped_mm (where this torch and GPU
have it): softmax/top-k routing, a stable argsort dispatch, expert counts by scatter_add (no
host synchronization: bincount would sync twice), gate and up as ONE grouped GEMM over weights
concatenated once when the case is made ([E, 2I, H], as a tuned model keeps them), the down
grouped GEMM, an index_add_ combine. Where _grouped_mm is missing or refuses the case the peer
falls back to a per-expert loop of matmuls, which reads the offsets on the host; the check
column then says "peer: per-expert loop", never silently. The forward+backward peer is torch
autograd through that pipeline (forward and backward timed together, as rudnn's training chain);
`moe_grouped_gemm` times SwiGluExperts.forward_dispatched alone against the peer's three grouped
GEMMs and SwiGLU (its "% matmul" column is the SPEC target: ≥ 60% of the bf16 matmul rate).

Correctness is checked on a layer of the same model dimensions with at most 256 tokens (the
float64 reference of the large cases would eat the run's budget: Mixtral at T = 16384 is ~11.5
TFLOP in float64); timing runs at the full size. Decode sizes (T ≤ 64) are timed host-inclusive
(back-to-back calls, one synchronization: a decode step is bound by launches and host work).
The check column names the experts strategy that served the row (rudnn.moe.last_algorithm()).
On the GPU the experts are built with fused_gate_up (gate and up interleaved once, SwiGLU in the
gate/up GEMM's epilogue on Hopper: "tensor_core_fused" in the check column), as the peer keeps its
gate+up weights concatenated; rows "<op>[unfused]" time the same case on gate and up as given
(two GEMM operand sets and a SwiGLU kernel), so one run prices the fusion. On Hopper the forward's
GEMMs take 64-row ping-pong tiles when experts hold <= 64 rows on average (decode and small
batches), 128x128 cooperative tiles otherwise; rows "<op>[cooperative]" force the latter on such
cases (RUDNN_MOE_GEMM_SCHEDULE, set and restored around each call: a few microseconds of Python in
their host-timed rows), so one run prices the choice; where libruDNN has the GEMM variants
(-DRUDNN_WITH_MOE_GEMM_VARIANTS=ON, as bench/gpu_check.sh builds it), rows "<op>[multicast]" time the
large cases on the cooperative tiles in 1x2 clusters sharing A, and "<op>[pingpong_wide]" with the
nt GEMMs (the down projection) on 128x128 ping-pong tiles (RUDNN_MOE_GEMM_SCHEDULE).
Shapes: Qwen3-30B-A3B (H=2048, I=768, E=128, k=8; SPEC shape T = 8192) and Mixtral 8x7B
(H=4096, I=14336, E=8, k=2).
"""

from __future__ import annotations

from . import CaseSpec, Prepared, compare, torch_dtype, with_env

FAMILY = "moe"
PEER = "torch pipeline (_grouped_mm, else per-expert loop)"
BOUND = "compute"
TARGET = (0.60, 1.3)  # SPEC section 8: grouped GEMM >= 60% of the bf16 matmul rate, >= 1.3x the peer
TARGETS = {"moe_grouped_gemm": (0.60, 0.0), "moe_forward": (0.0, 1.3)}  # the two halves of TARGET, per op

OPS = ("moe_forward", "moe_grouped_gemm", "moe_forward_backward")
_UNFUSED = "[unfused]"  # "<op>[unfused]": the experts without fused_gate_up (GPU rows only)
_COOPERATIVE = "[cooperative]"  # "<op>[cooperative]": the forward GEMMs' 128-row tiles forced (GPU rows only)
_MULTICAST = "[multicast]"  # "<op>[multicast]": those tiles in 1x2 clusters sharing A (GPU rows, where built)
_PINGPONG_WIDE = "[pingpong_wide]"  # "<op>[pingpong_wide]": the nt GEMMs on 128x128 ping-pong tiles (the same)
_CHECK_TOKENS = 256  # correctness on at most this many tokens of the same model
_DECODE_TOKENS = 64  # up to here rows are timed host-inclusive

MODELS = {"qwen3": (2048, 768, 128, 8), "mixtral": (4096, 14336, 8, 2)}  # H, I, E, k

# (T, model); shape label T×H×I×E×k. The backward runs the scalar kernels (no tensor-core
# backward yet), so the quick list keeps its largest cases out.
_GPU_FWD = [(8192, "qwen3"), (1, "qwen3"), (16, "qwen3"), (64, "qwen3"), (2048, "qwen3"), (16384, "qwen3"),
            (128, "mixtral"), (2048, "mixtral"), (16384, "mixtral")]
_GPU_GEMM = [(8192, "qwen3"), (2048, "qwen3"), (512, "qwen3"), (16384, "mixtral")]
_GPU_BWD_QUICK = [(128, "qwen3"), (2048, "qwen3"), (128, "mixtral")]
_GPU_UNFUSED = {"moe_forward": [(8192, "qwen3"), (64, "qwen3")],
                "moe_grouped_gemm": [(8192, "qwen3"), (16384, "mixtral")]}
# cases where the default picks the ping-pong tiles (T * k / E <= 64), timed again on cooperative ones
_GPU_COOPERATIVE = {"moe_forward": [(16, "qwen3"), (64, "qwen3"), (128, "mixtral")],
                    "moe_grouped_gemm": [(512, "qwen3")]}
# cases where the default takes the cooperative tiles (T * k / E > 64), timed again on each variant
_GPU_VARIANTS = {"moe_forward": [(8192, "qwen3"), (2048, "mixtral")],
                 "moe_grouped_gemm": [(8192, "qwen3"), (16384, "mixtral")]}


def _has_variants() -> bool:
    from .. import _C

    return bool(getattr(_C, "has_moe_gemm_variants", False))
_CPU = [(16, (64, 32, 8, 2)), (8, (32, 16, 16, 4))]


def _shape(T, model):
    H, I, E, k = MODELS[model] if isinstance(model, str) else model
    return (T, H, I, E, k)


def cases(device: str, quick: bool) -> list:
    if device != "cuda":
        return [CaseSpec(FAMILY, op, _shape(T, m), "float32") for op in OPS for T, m in _CPU]
    fwd = [CaseSpec(FAMILY, "moe_forward", _shape(T, m), "bfloat16") for T, m in _GPU_FWD]
    gemm = [CaseSpec(FAMILY, "moe_grouped_gemm", _shape(T, m), "bfloat16") for T, m in _GPU_GEMM]
    bwd_sizes = _GPU_BWD_QUICK if quick else _GPU_FWD
    bwd = [CaseSpec(FAMILY, "moe_forward_backward", _shape(T, m), "bfloat16") for T, m in bwd_sizes]
    tables = [(_UNFUSED, _GPU_UNFUSED), (_COOPERATIVE, _GPU_COOPERATIVE)]
    if _has_variants():
        tables += [(_MULTICAST, _GPU_VARIANTS), (_PINGPONG_WIDE, _GPU_VARIANTS)]
    variants = [CaseSpec(FAMILY, op + suffix, _shape(T, m), "bfloat16")
                for suffix, table in tables for op, sizes in table.items() for T, m in sizes]
    return fwd + gemm + bwd + variants  # the variants last: a bench cut short by its time limit keeps the rest


def prepare(spec: CaseSpec, device: str) -> Prepared:
    op, variant = spec.op, ""
    for suffix in (_UNFUSED, _COOPERATIVE, _MULTICAST, _PINGPONG_WIDE):
        if op.endswith(suffix):
            op, variant = op[:-len(suffix)], suffix
    fused = device == "cuda" and variant != _UNFUSED
    prepared = {"moe_forward": _forward, "moe_grouped_gemm": _grouped_gemm,
                "moe_forward_backward": _forward_backward}[op](spec, device, fused)
    if variant in (_COOPERATIVE, _MULTICAST, _PINGPONG_WIDE):
        schedule = variant[1:-1]
        prepared.run = with_env(prepared.run, "RUDNN_MOE_GEMM_SCHEDULE", schedule)
        prepared.check = with_env(prepared.check, "RUDNN_MOE_GEMM_SCHEDULE", schedule)
    return prepared


# ---------------------------------------------------------------------------------------------


class _Layer:
    def __init__(self, spec, device, fused=False, tokens=None):
        import torch

        import rudnn

        self.torch, self.rudnn = torch, rudnn
        self.T, self.H, self.I, self.E, self.k = spec.shape
        if tokens is not None:
            self.T = min(self.T, tokens)
        self.dt = torch_dtype(spec.dtype)
        self.device = device
        r = lambda *s, scale=1.0: (torch.randn(*s, device=device) * scale).to(self.dt)
        self.x = r(self.T, self.H)
        self.logits = r(self.T, self.E)
        self.gate = r(self.E, self.I, self.H, scale=self.H ** -0.5)
        self.up = r(self.E, self.I, self.H, scale=self.H ** -0.5)
        self.down = r(self.E, self.H, self.I, scale=self.I ** -0.5)
        self.fused = fused and self.I % 64 == 0  # fused_gate_up needs I in 64-row blocks
        self.experts = rudnn.moe.SwiGluExperts(self.gate, self.up, self.down, fused_gate_up=self.fused)
        self.gate_up = torch.cat([self.gate, self.up], 1)  # [E, 2I, H]: the peer's one gate+up GEMM
        self.grouped_mm = getattr(torch, "_grouped_mm", None) if device == "cuda" else None
        self.flops_fwd = 2 * self.T * self.k * 3 * self.H * self.I

    def peer_kind(self):
        return "peer: _grouped_mm" if self.grouped_mm is not None else "peer: per-expert loop"

    def algorithm(self):
        return f"{self.rudnn.moe.last_algorithm()}; {self.peer_kind()}"

    def small(self, spec):
        """A layer of the same model with at most _CHECK_TOKENS tokens (for the correctness check)."""
        return self if self.T <= _CHECK_TOKENS else _Layer(spec, self.device, self.fused, _CHECK_TOKENS)

    # -- torch pipeline ------------------------------------------------------------------------
    def _expert_mm(self, xs, w, offs):
        """xs [N, K] grouped by expert (segment ends `offs`), w [E, N_out, K] -> [N, N_out]."""
        torch = self.torch
        if self.grouped_mm is not None:
            try:
                return self.grouped_mm(xs, w.transpose(1, 2), offs=offs)
            except (RuntimeError, TypeError):
                self.grouped_mm = None  # this torch/GPU has no grouped GEMM for the case: loop
        out = xs.new_empty((xs.shape[0], w.shape[1]))
        ends = offs.tolist()
        start = 0
        for e, end in enumerate(ends):
            out[start:end] = xs[start:end] @ w[e].T
            start = end
        return out

    def torch_route(self, logits):
        """(weights [T, k] float32, tokens of the dispatched rows, sorting order, offsets int32 [E])."""
        torch = self.torch
        probs = torch.softmax(logits.float(), -1)
        idx = torch.topk(probs.detach(), self.k, -1).indices
        w = probs.gather(1, idx)
        w = w / w.sum(-1, keepdim=True)
        flat = idx.flatten()
        order = torch.argsort(flat, stable=True)
        counts = torch.zeros(self.E, dtype=torch.int32, device=flat.device)
        counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))  # no host sync
        return w, order // self.k, order, torch.cumsum(counts, 0, dtype=torch.int32)

    def torch_experts(self, xs, gate_up, down, offs):
        """SwiGLU experts on rows grouped by expert: one gate+up grouped GEMM, then down."""
        a, b = self._expert_mm(xs, gate_up, offs).split(self.I, -1)
        return self._expert_mm(self.torch.nn.functional.silu(a) * b, down, offs)

    def torch_layer(self, x, logits, gate_up, down):
        torch = self.torch
        w, tokens, order, offs = self.torch_route(logits)
        y = self.torch_experts(x[tokens], gate_up, down, offs)
        out = torch.zeros(self.T, self.H, dtype=torch.float32, device=x.device)
        out.index_add_(0, tokens, y.float() * w.flatten()[order, None])
        return out.to(x.dtype)

    # -- rudnn ---------------------------------------------------------------------------------
    def rudnn_forward(self):
        return self.experts(self.x, self.logits, top_k=self.k)

    def rudnn_training(self, dout):
        moe = self.rudnn.moe
        plan = moe.route(self.logits, self.k).into_training(self.logits)
        d = plan.dispatch(self.x)
        y, cache = self.experts.forward_dispatched_training(d)
        out = d.combine(y)
        dy, dweights = d.combine_backward(y, dout)
        dx_d, dgate, dup, ddown = cache.backward(dy)
        return out, d.dispatch_backward(dx_d), plan.router_backward(dweights), dgate, dup, ddown

    # -- float64 reference of the same selection -----------------------------------------------
    def reference(self, with_grads=False, dout=None):
        torch = self.torch
        leaves = [t.double().requires_grad_(with_grads) for t in (self.x, self.logits, self.gate, self.up, self.down)]
        x, logits, gate, up, down = leaves
        idx, _ = self.rudnn.moe.route(self.logits, self.k).expert_indices.long(), None
        with torch.enable_grad():
            p = torch.softmax(logits, -1).gather(1, idx)
            w = p / p.sum(-1, keepdim=True)
            out = torch.zeros(self.T, self.H, dtype=torch.float64, device=self.device)
            for e in range(self.E):
                t, j = (idx == e).nonzero(as_tuple=True)
                if t.numel() == 0:
                    continue
                xs = x[t]
                h = torch.nn.functional.silu(xs @ gate[e].T) * (xs @ up[e].T)
                out = out.index_add(0, t, (h @ down[e].T) * w[t, j, None])
            if not with_grads:
                return out.detach()
            grads = torch.autograd.grad(out, leaves, dout.double())
        return out.detach(), grads


def _timing(L):
    return "host" if L.T <= _DECODE_TOKENS else "device"


def _prepared(L, peer, **kw):
    """The case, after one peer call (so that the check column's "peer: ..." says whether the
    grouped GEMM or the per-expert loop is what gets timed)."""
    peer()
    return Prepared(peer=peer, algorithm=L.algorithm, timing=_timing(L), **kw)


def _forward(spec, device, fused):
    L = _Layer(spec, device, fused)

    def check():
        S = L.small(spec)
        peer = S.torch_layer(S.x, S.logits, S.gate_up, S.down)
        return [compare("out", S.rudnn_forward(), S.reference(), peer, expect_dtype=S.dt)]

    return _prepared(L, lambda: L.torch_layer(L.x, L.logits, L.gate_up, L.down), run=L.rudnn_forward,
                     check=check, flops=L.flops_fwd, bytes=(L.x.numel() * 2 + 3 * L.gate.numel()) * L.x.element_size())


def _grouped_gemm(spec, device, fused):
    """SwiGluExperts.forward_dispatched alone on a dispatched batch, against the peer's gate+up and
    down grouped GEMMs with SwiGLU between them on the same grouped rows."""
    L = _Layer(spec, device, fused)
    d = L.rudnn.moe.route(L.logits, L.k).dispatch(L.x)
    offs = d.offsets[1:].contiguous()  # the peer's segment ends
    xs = d.x

    def check():
        S = L.small(spec)
        sd = S.rudnn.moe.route(S.logits, S.k).dispatch(S.x)
        ends = sd.offsets.tolist()
        ref = S.torch.zeros(sd.x.shape, dtype=S.torch.float64, device=device)
        x64 = sd.x.double()
        for e in range(S.E):
            rows = slice(ends[e], ends[e + 1])
            h = S.torch.nn.functional.silu(x64[rows] @ S.gate[e].double().T) * (x64[rows] @ S.up[e].double().T)
            ref[rows] = h @ S.down[e].double().T
        peer = S.torch_experts(sd.x, S.gate_up, S.down, sd.offsets[1:].contiguous())
        return [compare("y", S.experts.forward_dispatched(sd), ref, peer, expect_dtype=S.dt)]

    return _prepared(L, lambda: L.torch_experts(xs, L.gate_up, L.down, offs),
                     run=lambda: L.experts.forward_dispatched(d), check=check, flops=L.flops_fwd,
                     bytes=(2 * xs.numel() + 3 * L.gate.numel()) * L.x.element_size())


def _forward_backward(spec, device, fused):
    L = _Layer(spec, device, fused)
    torch = L.torch

    def peer_of(layer, dout):
        """torch autograd through the pipeline; gradients (out, dx, dlogits, dgate, dup, ddown)."""
        leaves = [t.detach().clone().requires_grad_() for t in (layer.x, layer.logits, layer.gate_up, layer.down)]

        def run():
            with torch.enable_grad():
                out = layer.torch_layer(*leaves)
                dx, dlogits, dgate_up, ddown = torch.autograd.grad(out, leaves, dout)
                dgate, dup = dgate_up.split(layer.I, 1)
                return out, dx, dlogits, dgate, dup, ddown

        return run

    dout = (torch.randn(L.T, L.H, device=device)).to(L.dt)

    def check():
        S = L.small(spec)
        sdout = dout[:S.T]
        ref_out, ref_grads = S.reference(True, sdout)
        out, dx, dlogits, dgate, dup, ddown = S.rudnn_training(sdout)
        p = peer_of(S, sdout)()
        f32 = torch.float32
        return [compare("out", out, ref_out, p[0], expect_dtype=S.dt),
                compare("dx", dx, ref_grads[0], p[1], expect_dtype=S.dt),
                compare("dlogits", dlogits, ref_grads[1], p[2], expect_dtype=S.dt),
                compare("dgate", dgate, ref_grads[2], p[3], expect_dtype=f32),
                compare("dup", dup, ref_grads[3], p[4], expect_dtype=f32),
                compare("ddown", ddown, ref_grads[4], p[5], expect_dtype=f32)]

    return _prepared(L, peer_of(L, dout), run=lambda: L.rudnn_training(dout), check=check, flops=3 * L.flops_fwd,
                     bytes=(2 * L.x.numel() * 2 + 3 * L.gate.numel()) * L.x.element_size() + 3 * L.gate.numel() * 4)

"""Benchmark family `moe`: a whole MoE layer (softmax top-k routing, dispatch, SwiGLU experts,
weighted combine), forward and forward+backward, against a torch pipeline.

Peer: the same layer written with torch ops on torch._grouped_mm (where this torch and GPU
have it, else a per-expert loop of matmuls): softmax/top-k routing, a stable argsort dispatch,
grouped GEMMs for gate, up and down, index_add_ combine. The forward+backward peer is torch
autograd through that pipeline (forward and backward timed together, as for rudnn's training
chain). The float64 reference is written here from the math (same selection, float64 matmuls).
Shapes: Qwen3-30B-A3B (H=2048, I=768, E=128, k=8) and Mixtral 8x7B (H=4096, I=14336, E=8, k=2).
"""

from __future__ import annotations

from . import CaseSpec, Prepared, compare, torch_dtype

FAMILY = "moe"
PEER = "torch pipeline (_grouped_mm, else per-expert loop)"
BOUND = "compute"
TARGET = (0.60, 1.3)  # SPEC section 8: grouped GEMM >= 60% of the bf16 matmul rate, >= 1.3x the peer

OPS = ("moe_forward", "moe_forward_backward")

MODELS = {"qwen3": (2048, 768, 128, 8), "mixtral": (4096, 14336, 8, 2)}  # H, I, E, k

# (T, model); shape label T×H×I×E×k. The backward runs the scalar kernels (no tensor-core
# backward yet), so the quick list keeps its largest cases out.
_GPU_FWD = [(128, "qwen3"), (2048, "qwen3"), (16384, "qwen3"), (128, "mixtral"), (2048, "mixtral"),
            (16384, "mixtral")]
_GPU_BWD_QUICK = [(128, "qwen3"), (2048, "qwen3"), (128, "mixtral")]
_CPU = [(16, (64, 32, 8, 2)), (8, (32, 16, 16, 4))]


def _shape(T, model):
    H, I, E, k = MODELS[model] if isinstance(model, str) else model
    return (T, H, I, E, k)


def cases(device: str, quick: bool) -> list:
    if device != "cuda":
        return [CaseSpec(FAMILY, op, _shape(T, m), "float32") for op in OPS for T, m in _CPU]
    fwd = [CaseSpec(FAMILY, "moe_forward", _shape(T, m), "bfloat16") for T, m in _GPU_FWD]
    bwd_sizes = _GPU_BWD_QUICK if quick else _GPU_FWD
    bwd = [CaseSpec(FAMILY, "moe_forward_backward", _shape(T, m), "bfloat16") for T, m in bwd_sizes]
    return fwd + bwd


def prepare(spec: CaseSpec, device: str) -> Prepared:
    return (_forward if spec.op == "moe_forward" else _forward_backward)(spec, device)


# ---------------------------------------------------------------------------------------------


class _Layer:
    def __init__(self, spec, device):
        import torch

        import rudnn

        self.torch, self.rudnn = torch, rudnn
        self.T, self.H, self.I, self.E, self.k = spec.shape
        self.dt = torch_dtype(spec.dtype)
        self.device = device
        r = lambda *s, scale=1.0: (torch.randn(*s, device=device) * scale).to(self.dt)
        self.x = r(self.T, self.H)
        self.logits = r(self.T, self.E)
        self.gate = r(self.E, self.I, self.H, scale=self.H ** -0.5)
        self.up = r(self.E, self.I, self.H, scale=self.H ** -0.5)
        self.down = r(self.E, self.H, self.I, scale=self.I ** -0.5)
        self.experts = rudnn.moe.SwiGluExperts(self.gate, self.up, self.down)
        self.grouped_mm = getattr(torch, "_grouped_mm", None) if device == "cuda" else None
        self.flops_fwd = 2 * self.T * self.k * 3 * self.H * self.I

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

    def torch_layer(self, x, logits, gate, up, down):
        torch = self.torch
        probs = torch.softmax(logits.float(), -1)
        idx = torch.topk(probs.detach(), self.k, -1).indices
        w = probs.gather(1, idx)
        w = w / w.sum(-1, keepdim=True)
        flat = idx.flatten()
        order = torch.argsort(flat, stable=True)
        tokens = order // self.k
        offs = torch.cumsum(torch.bincount(flat, minlength=self.E), 0).to(torch.int32)
        xs = x[tokens]
        h = torch.nn.functional.silu(self._expert_mm(xs, gate, offs)) * self._expert_mm(xs, up, offs)
        y = self._expert_mm(h, down, offs)
        out = torch.zeros(self.T, self.H, dtype=torch.float32, device=x.device)
        out.index_add_(0, tokens, y.float() * w.flatten()[order, None])
        return out.to(x.dtype)

    # -- rudnn ----------------------------------------------------------------------------------
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


def _forward(spec, device):
    L = _Layer(spec, device)

    def check():
        ref = L.reference()
        peer = L.torch_layer(L.x, L.logits, L.gate, L.up, L.down)
        return [compare("out", L.rudnn_forward(), ref, peer, expect_dtype=L.dt)]

    return Prepared(run=L.rudnn_forward, peer=lambda: L.torch_layer(L.x, L.logits, L.gate, L.up, L.down),
                    check=check, flops=L.flops_fwd,
                    bytes=(L.x.numel() * 2 + 3 * L.gate.numel()) * L.x.element_size())


def _forward_backward(spec, device):
    L = _Layer(spec, device)
    torch = L.torch
    dout = (torch.randn(L.T, L.H, device=device)).to(L.dt)
    leaves = [t.detach().clone().requires_grad_() for t in (L.x, L.logits, L.gate, L.up, L.down)]

    def peer():
        with torch.enable_grad():
            out = L.torch_layer(*leaves)
            return (out,) + torch.autograd.grad(out, leaves, dout)

    def check():
        ref_out, ref_grads = L.reference(True, dout)
        out, dx, dlogits, dgate, dup, ddown = L.rudnn_training(dout)
        p = peer()
        f32 = torch.float32
        return [compare("out", out, ref_out, p[0], expect_dtype=L.dt),
                compare("dx", dx, ref_grads[0], p[1], expect_dtype=L.dt),
                compare("dlogits", dlogits, ref_grads[1], p[2], expect_dtype=L.dt),
                compare("dgate", dgate, ref_grads[2], p[3], expect_dtype=f32),
                compare("dup", dup, ref_grads[3], p[4], expect_dtype=f32),
                compare("ddown", ddown, ref_grads[4], p[5], expect_dtype=f32)]

    return Prepared(run=lambda: L.rudnn_training(dout), peer=peer, check=check, flops=3 * L.flops_fwd,
                    bytes=(2 * L.x.numel() * 2 + 3 * L.gate.numel()) * L.x.element_size() + 3 * L.gate.numel() * 4)

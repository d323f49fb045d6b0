"""Benchmark family `norm`: LayerNorm, RMSNorm and softmax, forward and backward, and the fused
residual add + norm, against torch eager.

Forward peers are torch.nn.functional.layer_norm / rms_norm / torch.softmax; the fused
`add_rms_norm` / `add_layer_norm` rows (rudnn's `residual=`: h = x + residual, y = norm(h), both
returned) race torch's two kernels (the add, then the norm). Backward peers are
torch autograd of the same op: the forward runs once outside the timed region and only
torch.autograd.grad(..., retain_graph=True) is timed. Weights and biases take x's dtype (what
bf16 models hold), for rudnn and torch alike. The float64 references are written here from the
math, independently of both libraries.
"""

from __future__ import annotations

from . import STATS_FLOOR, CaseSpec, Prepared, compare, poison_allocator, torch_dtype, with_env

FAMILY = "norm"
PEER = "torch eager"
BOUND = "memory"
TARGET = (0.90, 1.5)  # SPEC section 8: >= 90% of copy bandwidth and >= 1.5x torch (bf16, large rows)

OPS = ("layer_norm", "layer_norm_backward", "rms_norm", "rms_norm_backward", "softmax", "softmax_backward",
       "add_rms_norm", "add_layer_norm")
_FUSED = ("add_rms_norm", "add_layer_norm")

# rows x H; bf16 from many short rows to few long ones, then f32/f16 at one size.
_GPU_QUICK = [((32768, 1024), "bfloat16"), ((16384, 4096), "bfloat16"), ((4096, 16384), "bfloat16"),
              ((1024, 65536), "bfloat16"), ((16384, 4096), "float32"), ((16384, 4096), "float16")]
_GPU_MORE = [((65536, 512), "bfloat16"), ((16384, 5120), "bfloat16"), ((8192, 7168), "bfloat16"),
             ((32768, 1024), "float32"), ((32768, 1024), "float16"), ((1024, 65536), "float32")]
# Few long rows (the chip underfilled by one block per row) and decode-size batches (<= 64 rows, timed
# host-inclusive: back-to-back calls with one synchronization, where launch and host cost are the floor).
_GPU_FEW_ROWS = [((8, 65536), "bfloat16"), ((64, 32768), "bfloat16"), ((1, 4096), "bfloat16"),
                 ((16, 4096), "bfloat16"), ((64, 8192), "bfloat16")]
_DECODE_ROWS = 64
_CPU = [((512, 1024), "bfloat16"), ((64, 8192), "bfloat16"), ((512, 1024), "float32"), ((512, 1024), "float16")]
_CPU_MORE = [((256, 1000), "float32")]  # a hidden size that is no multiple of a vector width

LN_EPS, RMS_EPS = 1e-5, 1e-6

# "<op>[regs]": the op with RUDNN_NORM_PIPELINED=0, i.e. norm_forward_regs / norm_backward_regs where
# the pipelined register kernel would run (issue 25; bench/NOTES.md "the pipelined register forward",
# "the pipelined register backward"): the two kernels side by side in one run decide which stays the
# default.
_REGS = "[regs]"
_REGS_SIZES = [((32768, 1024), "bfloat16"), ((16384, 4096), "bfloat16")]
# "<op>[no_cluster]": the op with RUDNN_NORM_CLUSTER=0, i.e. the one-block-per-row kernels where the
# cluster kernels (few long rows shared by a cluster of blocks, sm_90; bench/NOTES.md "a cluster of
# blocks per row") run by default: the few-long-row shapes, both kernels in one run.
_NO_CLUSTER = "[no_cluster]"
_NO_CLUSTER_SIZES = _GPU_FEW_ROWS[:2]
# suffix -> the environment variable and value its rows run under
_VARIANTS = {_REGS: ("RUDNN_NORM_PIPELINED", "0"), _NO_CLUSTER: ("RUDNN_NORM_CLUSTER", "0")}


def cases(device: str, quick: bool) -> list:
    if device == "cuda":
        sizes = _GPU_QUICK + _GPU_FEW_ROWS[:2] if quick else _GPU_QUICK + _GPU_MORE + _GPU_FEW_ROWS
        fused = [((16384, 4096), "bfloat16"), ((32768, 1024), "bfloat16"), ((16, 4096), "bfloat16")]
    else:
        sizes = _CPU if quick else _CPU + _CPU_MORE
        fused = [((512, 1024), "bfloat16"), ((16, 1024), "float32")]
    regs = [CaseSpec(FAMILY, op + _REGS, shape, dt) for op in ("rms_norm", "add_rms_norm", "layer_norm_backward")
            for shape, dt in _REGS_SIZES] if device == "cuda" else []
    if device == "cuda":
        regs += [CaseSpec(FAMILY, op + _NO_CLUSTER, shape, dt)
                 for op in ("layer_norm", "rms_norm", "layer_norm_backward", "rms_norm_backward", "softmax",
                            "softmax_backward")
                 for shape, dt in _NO_CLUSTER_SIZES]
    return [CaseSpec(FAMILY, op, shape, dt) for op in OPS if op not in _FUSED for shape, dt in sizes] + \
        [CaseSpec(FAMILY, op, shape, dt) for op in _FUSED for shape, dt in fused] + regs


def prepare(spec: CaseSpec, device: str) -> Prepared:
    for suffix, (variable, value) in _VARIANTS.items():
        if spec.op.endswith(suffix):
            import dataclasses

            prepared = prepare(dataclasses.replace(spec, op=spec.op[:-len(suffix)]), device)
            prepared.run = with_env(prepared.run, variable, value)
            prepared.check = with_env(prepared.check, variable, value)
            return prepared
    prepared = _PREPARE[spec.op](spec, device)
    if spec.shape[0] <= _DECODE_ROWS:
        prepared.timing = "host"
    return prepared


# ---------------------------------------------------------------------------------------------


class _Inputs:
    def __init__(self, spec, device):
        import torch
        import torch.nn.functional as F

        import rudnn

        self.torch, self.F, self.rudnn = torch, F, rudnn
        self.n, self.h = spec.shape
        self.dt = torch_dtype(spec.dtype)
        self.device = device
        # Drawn in float32 and rounded: the same values whatever the dtype's own generator does.
        self.x = self.randn(self.n, self.h)
        self.w = (1 + 0.1 * torch.randn(self.h, device=device)).to(self.dt)
        self.b = (0.1 * torch.randn(self.h, device=device)).to(self.dt)
        self.s = self.x.element_size()

    def randn(self, *shape):
        return self.torch.randn(*shape, device=self.device).to(self.dt)

    def poisoned_like_x(self):
        return self.torch.full_like(self.x, float("nan"))


def _ln_stats64(x, eps):
    xd = x.double()
    mean = xd.mean(-1)
    var = (xd - mean[:, None]).square().mean(-1)
    return mean, (var + eps).rsqrt()


def _rms_rstd64(x, eps):
    return (x.double().square().mean(-1) + eps).rsqrt()


def _out_used(y, out):
    from . import OutputCheck

    ok = y is not None and y.data_ptr() == out.data_ptr()
    return OutputCheck("out=", 0.0, None, 0.0, ok, "" if ok else "result is not the out= tensor")


def _layer_norm(spec, device):
    a = _Inputs(spec, device)
    torch, F, rudnn, x, w, b, h = a.torch, a.F, a.rudnn, a.x, a.w, a.b, a.h

    def check():
        mean_ref, rstd_ref = _ln_stats64(x, LN_EPS)
        y_ref = (x.double() - mean_ref[:, None]) * rstd_ref[:, None] * w.double() + b.double()
        out = a.poisoned_like_x()
        y, mean, rstd = rudnn.layer_norm(x, w, b, LN_EPS, return_stats=True, out=out)
        ty, tmean, trstd = torch.native_layer_norm(x, (h,), w, b, LN_EPS)
        return [compare("y", y, y_ref, ty, expect_dtype=a.dt), _out_used(y, out),
                compare("mean", mean, mean_ref, tmean, expect_dtype=torch.float32, floor=STATS_FLOOR),
                compare("rstd", rstd, rstd_ref, trstd, expect_dtype=torch.float32, floor=STATS_FLOOR)]

    return Prepared(run=lambda: rudnn.layer_norm(x, w, b, LN_EPS), peer=lambda: F.layer_norm(x, (h,), w, b, LN_EPS),
                    check=check, bytes=2 * x.numel() * a.s + 2 * h * w.element_size())


def _rms_norm(spec, device):
    a = _Inputs(spec, device)
    torch, F, rudnn, x, w, h = a.torch, a.F, a.rudnn, a.x, a.w, a.h

    def check():
        rstd_ref = _rms_rstd64(x, RMS_EPS)
        y_ref = x.double() * rstd_ref[:, None] * w.double()
        out = a.poisoned_like_x()
        y, rstd = rudnn.rms_norm(x, w, RMS_EPS, return_stats=True, out=out)
        ty = F.rms_norm(x, (h,), w, RMS_EPS)
        return [compare("y", y, y_ref, ty, expect_dtype=a.dt), _out_used(y, out),
                compare("rstd", rstd, rstd_ref, None, expect_dtype=torch.float32, floor=STATS_FLOOR)]

    return Prepared(run=lambda: rudnn.rms_norm(x, w, RMS_EPS), peer=lambda: F.rms_norm(x, (h,), w, RMS_EPS),
                    check=check, bytes=2 * x.numel() * a.s + h * w.element_size())


def _softmax(spec, device):
    a = _Inputs(spec, device)
    torch, rudnn, x = a.torch, a.rudnn, a.x

    def check():
        y_ref = torch.softmax(x.double(), -1)
        out = a.poisoned_like_x()
        y = rudnn.softmax(x, out=out)
        return [compare("y", y, y_ref, torch.softmax(x, -1), expect_dtype=a.dt), _out_used(y, out)]

    return Prepared(run=lambda: rudnn.softmax(x), peer=lambda: torch.softmax(x, -1), check=check,
                    bytes=2 * x.numel() * a.s)


def _layer_norm_backward(spec, device):
    a = _Inputs(spec, device)
    torch, F, rudnn, x, w, b, h = a.torch, a.F, a.rudnn, a.x, a.w, a.b, a.h
    dy = a.randn(a.n, h)
    mean64, rstd64 = _ln_stats64(x, LN_EPS)
    mean, rstd = mean64.float(), rstd64.float()
    del mean64, rstd64
    xg, wg, bg = (t.detach().clone().requires_grad_() for t in (x, w, b))
    with torch.enable_grad():
        yg = F.layer_norm(xg, (h,), wg, bg, LN_EPS)

    def peer():
        return torch.autograd.grad(yg, (xg, wg, bg), dy, retain_graph=True)

    def run():
        return rudnn.layer_norm_backward(dy, x, w, mean, rstd)

    def check():
        m, r = mean.double()[:, None], rstd.double()[:, None]
        xhat = (x.double() - m) * r
        dyd = dy.double()
        g = dyd * w.double()
        dx_ref = r * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
        dw_ref, db_ref = (dyd * xhat).sum(0), dyd.sum(0)
        del xhat, g
        poison_allocator(device, [(x.shape, a.dt), ((h,), torch.float32), ((h,), torch.float32)])
        dx, dw, db = run()
        tdx, tdw, tdb = peer()
        return [compare("dx", dx, dx_ref, tdx, expect_dtype=a.dt),
                compare("dweight", dw, dw_ref, tdw, expect_dtype=torch.float32),
                compare("dbias", db, db_ref, tdb, expect_dtype=torch.float32)]

    nbytes = 3 * x.numel() * a.s + 2 * a.n * 4 + h * w.element_size() + 2 * h * 4
    return Prepared(run=run, peer=peer, check=check, bytes=nbytes)


def _rms_norm_backward(spec, device):
    a = _Inputs(spec, device)
    torch, F, rudnn, x, w, h = a.torch, a.F, a.rudnn, a.x, a.w, a.h
    dy = a.randn(a.n, h)
    rstd = _rms_rstd64(x, RMS_EPS).float()
    xg, wg = (t.detach().clone().requires_grad_() for t in (x, w))
    with torch.enable_grad():
        yg = F.rms_norm(xg, (h,), wg, RMS_EPS)

    def peer():
        return torch.autograd.grad(yg, (xg, wg), dy, retain_graph=True)

    def run():
        return rudnn.rms_norm_backward(dy, x, w, rstd)

    def check():
        r = rstd.double()[:, None]
        xhat = x.double() * r
        dyd = dy.double()
        g = dyd * w.double()
        dx_ref = r * (g - xhat * (g * xhat).mean(-1, keepdim=True))
        dw_ref = (dyd * xhat).sum(0)
        del xhat, g
        poison_allocator(device, [(x.shape, a.dt), ((h,), torch.float32)])
        dx, dw = run()
        tdx, tdw = peer()
        return [compare("dx", dx, dx_ref, tdx, expect_dtype=a.dt),
                compare("dweight", dw, dw_ref, tdw, expect_dtype=torch.float32)]

    nbytes = 3 * x.numel() * a.s + a.n * 4 + h * w.element_size() + h * 4
    return Prepared(run=run, peer=peer, check=check, bytes=nbytes)


def _softmax_backward(spec, device):
    a = _Inputs(spec, device)
    torch, rudnn, x = a.torch, a.rudnn, a.x
    dy = a.randn(a.n, a.h)
    xg = x.detach().clone().requires_grad_()
    with torch.enable_grad():
        yg = torch.softmax(xg, -1)
    y = yg.detach()  # rudnn and torch differentiate through the same y

    def peer():
        return torch.autograd.grad(yg, (xg,), dy, retain_graph=True)[0]

    def run():
        return rudnn.softmax_backward(dy, y)

    def check():
        yd, dyd = y.double(), dy.double()
        dx_ref = yd * (dyd - (dyd * yd).sum(-1, keepdim=True))
        del yd, dyd
        poison_allocator(device, [(x.shape, a.dt)])
        dx = run()
        return [compare("dx", dx, dx_ref, peer(), expect_dtype=a.dt)]

    return Prepared(run=run, peer=peer, check=check, bytes=3 * x.numel() * a.s)


def _add_norm(spec, device):
    """h = x + residual (rounded to x's dtype), y = norm(h): rudnn's one fused kernel against
    torch's add and norm."""
    a = _Inputs(spec, device)
    torch, F, rudnn, x, w, b, h = a.torch, a.F, a.rudnn, a.x, a.w, a.b, a.h
    r = a.randn(a.n, h)
    layer = spec.op == "add_layer_norm"
    eps = LN_EPS if layer else RMS_EPS

    def run():
        if layer:
            return rudnn.layer_norm(x, w, b, eps, residual=r)
        return rudnn.rms_norm(x, w, eps, residual=r)

    def peer():
        hs = x + r
        return (F.layer_norm(hs, (h,), w, b, eps) if layer else F.rms_norm(hs, (h,), w, eps)), hs

    def check():
        hs = (x + r)  # h is defined in x's dtype (one rounding of the sum)
        hd = hs.double()
        if layer:
            mean, rstd = _ln_stats64(hs, eps)
            y_ref = (hd - mean[:, None]) * rstd[:, None] * w.double() + b.double()
        else:
            y_ref = hd * _rms_rstd64(hs, eps)[:, None] * w.double()
        poison_allocator(device, [(x.shape, a.dt), (x.shape, a.dt)])
        y, h_out = run()
        ty, th = peer()
        return [compare("y", y, y_ref, ty, expect_dtype=a.dt), compare("h", h_out, hd, th, expect_dtype=a.dt)]

    # x and residual read, y and h written, the parameters read once
    nbytes = 4 * x.numel() * a.s + (2 if layer else 1) * h * w.element_size()
    return Prepared(run=run, peer=peer, check=check, bytes=nbytes)


_PREPARE = {"add_rms_norm": _add_norm, "add_layer_norm": _add_norm, "layer_norm": _layer_norm, "rms_norm": _rms_norm, "softmax": _softmax,
            "layer_norm_backward": _layer_norm_backward, "rms_norm_backward": _rms_norm_backward,
            "softmax_backward": _softmax_backward}

"""Property-based fuzzing of rudnn's public functions (issue 27), run by tests/test_fuzz.py in a
subprocess so that a crash fails the test instead of killing pytest.

For every case, drawn by hypothesis (derandomized: the same cases on every run), the call must
either match an independent oracle (torch in float64 on the CPU) or raise a rudnn.Error whose
message starts with the op's name, and in both cases leave every input's storage byte for byte as
it was. Outputs given with out= are poisoned (NaN) first, and so is every array rudnn allocates for
a call (outputs, workspaces: NaN, or 0x5a bytes for integers), so memory nobody wrote shows. The cases
mix valid and invalid shapes, dtypes, layouts (transposed, sliced, expanded, overlapping), scalars
and out= arrays that alias inputs; metadata (MoE offsets and row_of_slot, paged schedules) valid or
broken in one place, where a break must be refused (must_refuse), and paged append's caches, which
a failed call must leave as they were.

    python tests/fuzz/driver.py [--examples N] [--family NAME ...]

prints one line per family (cases, results, error classes) and exits 1 if any property failed.
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import sys
import time
import traceback
import warnings

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rudnn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the references
from reference import gated_delta as ref_gated_delta  # noqa: E402
from reference import moe as ref_moe  # noqa: E402
from reference import paged as ref_paged  # noqa: E402

F = torch.nn.functional
FLOATS = [torch.float32, torch.float16, torch.bfloat16]
DTYPES = FLOATS + [torch.float64, torch.int32, torch.bool]
TOL = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 6e-2}
SCALARS = [1.0, 0.5, 1e-6, 0.0, -1.0, 1e300, 1e-300, float("nan"), float("inf"), "1", True, None, 2**40]

stats: dict = collections.defaultdict(collections.Counter)


# ---- drawing arrays ------------------------------------------------------------------------------

def _values(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(shape, generator=g, dtype=torch.float64) * 2
    if dtype == torch.bool:
        return base > 0
    if dtype == torch.int32:
        return base.round().to(torch.int32)
    return base.to(dtype)


def fuzz_cases(examples):
    """The hypothesis settings of every family: `examples` derandomized cases (the same on every
    run), no example database, no deadline, health checks off; the case draws from `st.data()`."""
    def wrap(case):
        return settings(max_examples=examples, derandomize=True, database=None, deadline=None,
                        suppress_health_check=list(HealthCheck))(given(st.data())(case))
    return wrap


@st.composite
def arrays(draw, shape, dtypes=DTYPES, float_bias=True):
    """An array of `shape` in a drawn dtype and memory layout (a view of a larger storage)."""
    dtype = draw(st.sampled_from(FLOATS if float_bias and draw(st.integers(0, 5)) else dtypes))
    seed = draw(st.integers(0, 2**16))
    layout = draw(st.sampled_from(["dense", "dense", "transposed", "sliced", "expanded", "overlapping"]))
    shape = tuple(shape)
    if layout == "transposed" and len(shape) >= 2:
        t = _values(shape[:-2] + (shape[-1], shape[-2]), dtype, seed)
        return t.transpose(-1, -2)
    if layout == "sliced" and len(shape) >= 1:
        t = _values(shape[:-1] + (2 * shape[-1] + 1,), dtype, seed)
        return t[..., 1::2] if draw(st.booleans()) else t[..., : shape[-1]]
    if layout == "expanded" and len(shape) >= 2 and shape[0] > 0:
        return _values((1,) + shape[1:], dtype, seed).expand(shape)
    if layout == "overlapping" and len(shape) >= 2 and all(shape):
        flat = _values((sum(shape) + 8,), dtype, seed)
        return flat.as_strided(shape, (1,) * len(shape))
    return _values(shape, dtype, seed)


def like(data, shape, ref):
    """An array of `shape`, mostly in `ref`'s dtype (so that most calls get past the dtype checks)."""
    return data.draw(arrays(shape, dtypes=[ref.dtype] * 40 + DTYPES, float_bias=False))


@st.composite
def shapes(draw, min_rank=1, max_rank=4, max_side=6):
    rank = draw(st.integers(min_rank, max_rank))
    return tuple(draw(st.integers(0 if draw(st.integers(0, 9)) == 0 else 1, max_side)) for _ in range(rank))


@st.composite
def out_for(draw, inputs, shape, dtype):
    """None, a fresh array, an input itself, a view overlapping an input, or an expanded array."""
    kind = draw(st.sampled_from(["none", "none", "fresh", "alias", "overlap", "expanded", "wrong"]))
    if kind == "fresh" or (kind in ("alias", "overlap") and not inputs):
        return torch.full(shape, float("nan")).to(dtype) if dtype.is_floating_point else torch.empty(shape, dtype=dtype)
    if kind == "alias":
        return draw(st.sampled_from(inputs))
    if kind == "overlap":
        t = draw(st.sampled_from(inputs))
        # the same view one element on, where the storage has room for it (else t itself)
        reach = t.storage_offset() + 1 + sum((n - 1) * abs(d) for n, d in zip(t.shape, t.stride())) + 1
        if t.numel() > 0 and reach * t.element_size() <= t.untyped_storage().nbytes():
            return t.as_strided(t.shape, t.stride(), t.storage_offset() + 1)
        return t
    if kind == "expanded" and len(shape) >= 2:
        return torch.full(shape[1:], float("nan")).to(dtype).expand(shape)
    if kind == "wrong":
        return torch.full(tuple(s + 1 for s in shape), float("nan")).to(dtype)
    return None


# ---- the properties ----------------------------------------------------------------------------------

def _poison_outputs():
    """Every array rudnn allocates for a call (outputs, workspaces) starts as NaN (float) or
    0x5a bytes (integer), so memory a call leaves unwritten shows in its results."""
    from rudnn import _frameworks

    plain = _frameworks.Call.empty

    def empty(self, shape, dtype):
        a = plain(self, shape, dtype)
        if isinstance(a, torch.Tensor) and a.numel():
            if a.dtype.is_floating_point:
                a.fill_(float("nan"))
            else:
                a.view(torch.uint8).fill_(0x5A) if a.dtype != torch.bool else a.fill_(True)
        return a

    _frameworks.Call.empty = empty


def _storage_bytes(t):
    s = t.untyped_storage()
    snap = torch.empty(s.nbytes(), dtype=torch.uint8)
    snap.untyped_storage().copy_(s)
    return snap


def check_call(family, op, call, oracle, inputs, out=None, written=(), must_refuse=None, tol_dtype=None,
               nan_exact=False):
    """Runs call(); checks the properties; records the outcome under `family`.

    written: arrays the op writes in place (paged append's caches): untouched when it fails.
    must_refuse: a reason the call has to raise a rudnn.Error (broken metadata), or None.
    tol_dtype: the dtype whose tolerance applies (default: each result's own; float32 weight
    gradients computed from float16 inputs and pre-activations take float16's).
    nan_exact: NaN exactly where the oracle is NaN (a documented NaN result), not only no NaN
    where the oracle is finite."""
    kept = [(t, _storage_bytes(t)) for t in inputs
            if isinstance(t, torch.Tensor) and (out is None or not _shares(t, out))
            and not any(_shares(t, w) for w in written)]
    kept_written = [(t, _storage_bytes(t)) for t in written]
    try:
        result = call()
    except rudnn.Error as e:
        stats[family][type(e).__name__] += 1
        assert str(e).startswith(op), f"{op}: error message does not start with the op's name: {e}"
        result = None
    except Exception as e:  # noqa: BLE001 (any other exception is a finding)
        raise AssertionError(f"{op}: raised {type(e).__name__}, not a rudnn.Error: {e}") from e
    for t, snap in kept:
        assert torch.equal(_storage_bytes(t), snap), f"{op}: an input's storage changed"
    if result is None:
        for t, snap in kept_written:
            assert torch.equal(_storage_bytes(t), snap), f"{op}: a failed call wrote into an array"
        return
    assert must_refuse is None, f"{op}: accepted {must_refuse}"
    stats[family]["ok"] += 1
    try:
        expected = oracle()
    except Exception:  # noqa: BLE001 (torch refuses what rudnn takes: no oracle for this case)
        stats[family]["no oracle"] += 1
        return
    results = result if isinstance(result, tuple) else (result,)
    expects = expected if isinstance(expected, tuple) else (expected,)
    assert len(results) == len(expects), f"{op}: {len(results)} results, the oracle has {len(expects)}"
    for got, want in zip(results, expects):
        if got is None or want is None:
            assert got is None and want is None, f"{op}: a result is None where the oracle has one (or back)"
            continue
        assert tuple(got.shape) == tuple(want.shape), f"{op}: shape {tuple(got.shape)} != {tuple(want.shape)}"
        if got.numel() == 0:
            continue
        # The oracle rounded to the result's dtype: a value past that dtype's range is inf there,
        # and the result must then be that same inf.
        g, w = got.double(), (want.to(got.dtype) if got.dtype.is_floating_point else want).double()
        overflow = torch.isinf(w) & torch.isfinite(want.double())
        assert torch.equal(g[overflow], w[overflow]), f"{op}: not the inf of a value past the dtype's range"
        bad_nan = torch.isnan(g) & ~torch.isnan(w)
        assert not bad_nan.any(), f"{op}: NaN where the oracle is finite (unwritten or wrong memory)"
        assert not (nan_exact and (torch.isnan(w) & ~torch.isnan(g)).any()), f"{op}: a number where NaN is documented"
        tol = TOL.get(tol_dtype or got.dtype, 1e-4)
        finite = torch.isfinite(w)
        err = (g[finite] - w[finite]).abs().max().item() if finite.any() else 0.0
        exact = want.double()  # the error scale is the oracle's own, overflowing values included
        scale = max(1.0, exact[torch.isfinite(exact)].abs().max().item() if torch.isfinite(exact).any() else 1.0)
        assert err <= tol * scale, f"{op}: max error {err:.3g} > {tol * scale:.3g}"


def _shares(a, b):
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


# ---- families ----------------------------------------------------------------------------------------

def fuzz_norm(examples):
    @fuzz_cases(examples)
    def case(data):
        shape = data.draw(shapes())
        x = data.draw(arrays(shape))
        op = data.draw(st.sampled_from(["softmax", "rms_norm", "layer_norm"]))
        H = shape[-1]
        w = data.draw(st.one_of(st.none(), arrays((H,), float_bias=True)))
        eps = data.draw(st.sampled_from([1e-5] * 4 + SCALARS))
        out = data.draw(out_for([x], shape, x.dtype if x.dtype.is_floating_point else torch.float32))
        x64 = x.double()
        if op == "softmax":
            call = lambda: rudnn.softmax(x, out=out)
            oracle = lambda: torch.softmax(x64, -1)
        elif op == "rms_norm":
            call = lambda: rudnn.rms_norm(x, w, eps, out=out)
            oracle = lambda: (x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
                              * (1 if w is None else w.double()))
        else:
            call = lambda: rudnn.layer_norm(x, w, None, eps, out=out)
            oracle = lambda: F.layer_norm(x64, (H,), None if w is None else w.double(), None, eps)
        check_call("norm", op, call, oracle, [x, w], out)

    case()


def fuzz_pooling(examples):
    @fuzz_cases(examples)
    def case(data):
        shape = data.draw(shapes(min_rank=3, max_rank=4, max_side=7))
        x = data.draw(arrays(shape))
        kind = data.draw(st.sampled_from(["max_pool", "avg_pool"]))
        kernel = data.draw(st.sampled_from([1, 2, 3, 2, 3, (2, 1), 2, 0, -1, 9, 2.5, "2"]))
        stride = data.draw(st.sampled_from([None, 1, 2, None, 1, 2, 0]))
        padding = data.draw(st.sampled_from([0, 1, 0, 1, -1, 2]))
        ceil_mode = data.draw(st.sampled_from([False, True, False, True, "no"]))
        x64 = x.double()
        dims = len(shape) - 2 if len(shape) == 4 else 1
        tf = {(1, "max_pool"): F.max_pool1d, (2, "max_pool"): F.max_pool2d, (1, "avg_pool"): F.avg_pool1d,
              (2, "avg_pool"): F.avg_pool2d}[(dims, kind)]
        fn = getattr(rudnn, kind)
        call = lambda: fn(x, kernel, stride, padding, ceil_mode=ceil_mode)
        oracle = lambda: tf(x64, kernel, stride, padding, ceil_mode=ceil_mode)
        check_call("pooling", kind, call, oracle, [x])

    case()


def fuzz_interpolate(examples):
    @fuzz_cases(examples)
    def case(data):
        shape = data.draw(shapes(min_rank=4, max_rank=4, max_side=6))
        x = data.draw(arrays(shape))
        mode = data.draw(st.sampled_from(["nearest", "bilinear", "bicubic", "area", "nearest-exact", "linear", "x"]))
        size = data.draw(st.sampled_from([None, 3, (2, 5), 0, -1]))
        scale = None if size is not None else data.draw(st.sampled_from([2, 0.5, 1.7, 0, -1.0, float("nan")]))
        align = data.draw(st.sampled_from([None, True, False])) if mode in ("bilinear", "bicubic") else None
        x64 = x.double()
        call = lambda: rudnn.interpolate(x, size, scale, mode, align)
        oracle = lambda: F.interpolate(x64, size, scale, mode, align)
        check_call("interpolate", "interpolate", call, oracle, [x])

    case()


def fuzz_attention(examples):
    @fuzz_cases(examples)
    def case(data):
        B, Hq, Sq, Sk, D = (data.draw(st.integers(1, 3)) for _ in range(5))
        Hk = data.draw(st.sampled_from([Hq, 1, Hq + 1]))
        q = data.draw(arrays((B, Hq, Sq, D)))
        k = data.draw(arrays((B, Hk, Sk, D)))
        v = data.draw(arrays((B, Hk, Sk, D)))
        scale = data.draw(st.sampled_from([None] * 6 + [0.5] * 4 + SCALARS))
        causal = data.draw(st.sampled_from([False, True] * 3 + [1]))
        out = data.draw(out_for([q, k, v], (B, Hq, Sq, D), q.dtype if q.dtype.is_floating_point else torch.float32))

        def oracle():
            rep = Hq // Hk
            if Hq % Hk:
                raise ValueError("no oracle")
            kk, vv = (t.double().repeat_interleave(rep, 1) for t in (k, v))
            return F.scaled_dot_product_attention(q.double(), kk, vv, is_causal=bool(causal) and Sq == Sk,
                                                  scale=scale) if not causal or Sq == Sk else _raise()

        call = lambda: rudnn.attention(q, k, v, scale=scale, causal=causal, out=out)
        check_call("attention", "attention", call, oracle, [q, k, v], out)

    case()


def _raise():
    raise ValueError("no oracle")


def fuzz_moe(examples):
    @fuzz_cases(examples)
    def case(data):
        T, E = data.draw(st.integers(0, 5)), data.draw(st.integers(1, 6))
        logits = data.draw(arrays((T, E)))
        top_k = data.draw(st.sampled_from([1, 2, E] * 3 + [E + 1, 0, -1, 2.7, "2", True, 2**40]))
        renorm = data.draw(st.sampled_from([True, False] * 3 + ["no", 1]))

        def call():
            plan = rudnn.moe.route(logits, top_k, renorm)
            return plan.weights

        def oracle():
            p = torch.softmax(logits.double(), -1)
            w = p.topk(top_k, -1).values
            return w / w.sum(-1, keepdim=True) if renorm else w

        check_call("moe", "moe.route", call, oracle, [logits])

    case()


def fuzz_conv(examples):
    warnings.filterwarnings("ignore", "Using padding='same'")  # torch's note on its own even kernels

    @fuzz_cases(examples)
    def case(data):
        shape = data.draw(shapes(min_rank=3, max_rank=4, max_side=6))
        x = data.draw(arrays(shape))
        dims = len(shape) - 2
        groups = data.draw(st.sampled_from([1] * 6 + [2, 2, 3, 0, -1, True, 2.0]))
        g = groups if type(groups) is int and groups > 0 else 1
        cin = shape[1]
        cin_g = data.draw(st.sampled_from([max(cin // g, 1)] * 4 + [cin + 1, 1]))
        cout = data.draw(st.sampled_from([1, 2, 4, 6, 3]))
        k = data.draw(st.sampled_from([1, 2, 3, 3, 5]))
        w = data.draw(arrays((cout, cin_g) + (k,) * dims))
        b = data.draw(st.one_of(st.none(), arrays((cout,))))
        stride = data.draw(st.sampled_from([1] * 4 + [2, 2, 0, (1, 2), "1"]))
        padding = data.draw(st.sampled_from([0, 1, 2, "same", "valid"] * 2 + [-1, "full", (1, 0)]))
        dilation = data.draw(st.sampled_from([1] * 4 + [2, 2, 0]))
        tf = F.conv1d if dims == 1 else F.conv2d
        x64, w64, b64 = x.double(), w.double(), None if b is None else b.double()
        try:
            y_shape = tf(x64, w64, b64, stride, padding, dilation, groups).shape
        except Exception:  # noqa: BLE001 (torch refuses it too: any out= shape will do)
            y_shape = shape
        op = data.draw(st.sampled_from(["conv"] * 3 + ["conv_data_backward", "conv_weight_backward",
                                                         "conv_bias_backward"]))
        opts = (stride, padding, dilation, groups)
        if op == "conv":
            out = None
            if data.draw(st.integers(0, 2)) == 0:  # out= in a third of the cases (else most calls are refused)
                out = data.draw(out_for([x, w], y_shape, x.dtype if x.dtype.is_floating_point else torch.float32))
            call = lambda: rudnn.conv(x, w, b, *opts, out=out)
            oracle = lambda: tf(x64, w64, b64, *opts)
            check_call("conv", op, call, oracle, [x, w, b], out)
            return
        dy = data.draw(arrays(y_shape if data.draw(st.integers(0, 5)) else shape))

        def grad(wrt):
            xs, ws = x64.clone().requires_grad_(wrt == "x"), w64.clone().requires_grad_(wrt == "w")
            y = tf(xs, ws, None, *opts)
            return torch.autograd.grad(y, xs if wrt == "x" else ws, dy.double())[0]

        if op == "conv_data_backward":
            call = lambda: rudnn.conv_data_backward(dy, w, x.shape, *opts)
            oracle = lambda: grad("x")
        elif op == "conv_weight_backward":
            call = lambda: rudnn.conv_weight_backward(dy, x, w.shape, *opts)
            oracle = lambda: grad("w")
        else:
            call = lambda: rudnn.conv_bias_backward(dy)
            oracle = lambda: dy.double().sum([0] + list(range(2, dy.dim())))
        check_call("conv", op, call, oracle, [x, w, dy])

    case()


def fuzz_grid_sample(examples):
    @fuzz_cases(examples)
    def case(data):
        rank = data.draw(st.sampled_from([4, 4, 5]))
        N, C = data.draw(st.integers(0, 2)), data.draw(st.integers(1, 3))
        spatial = tuple(data.draw(st.integers(1, 5)) for _ in range(rank - 2))
        x = data.draw(arrays((N, C) + spatial))
        out_sp = tuple(data.draw(st.integers(1, 4)) for _ in range(rank - 2))
        gshape = (N,) + out_sp + (data.draw(st.sampled_from([rank - 2] * 5 + [rank - 1])),)
        grid = data.draw(arrays(gshape, dtypes=[x.dtype] * 4 + DTYPES))
        mode = data.draw(st.sampled_from(["bilinear", "nearest", "bicubic"] * 2 + ["linear", 1]))
        padding_mode = data.draw(st.sampled_from(["zeros", "border", "reflection"] * 2 + ["wrap"]))
        align = data.draw(st.sampled_from([False, True] * 3 + ["no"]))
        call = lambda: rudnn.grid_sample(x, grid, mode, padding_mode, align)
        oracle = lambda: F.grid_sample(x.double(), grid.double(), mode, padding_mode, align)
        check_call("grid_sample", "grid_sample", call, oracle, [x, grid])

    case()


def fuzz_ctc(examples):
    @fuzz_cases(examples)
    def case(data):
        T, N, C = data.draw(st.integers(1, 8)), data.draw(st.integers(1, 3)), data.draw(st.integers(2, 5))
        log_probs = data.draw(arrays((T, N, C))).float().log_softmax(-1).to(
            data.draw(st.sampled_from(FLOATS * 2 + [torch.float64])))
        S = data.draw(st.integers(0, 4))
        blank = data.draw(st.sampled_from([0] * 4 + [C - 1, C, -1]))
        g = torch.Generator().manual_seed(data.draw(st.integers(0, 999)))
        labels = [c for c in range(C) if c != blank] or [0]
        targets = torch.tensor(labels)[torch.randint(len(labels), (N, S), generator=g)]
        if data.draw(st.integers(0, 9)) == 0:
            targets = targets.float()
        input_lengths = torch.randint(0, T + 1, (N,), generator=g)
        target_lengths = torch.randint(0, S + 1, (N,), generator=g)
        if data.draw(st.integers(0, 9)) == 0:
            target_lengths[0] = S + 1  # longer than the padded targets
        reduction = data.draw(st.sampled_from(["mean", "sum", "none"] * 2 + ["avg"]))
        zero_inf = data.draw(st.sampled_from([False, True] * 3 + [0]))
        call = lambda: rudnn.ctc_loss(log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_inf)
        oracle = lambda: F.ctc_loss(log_probs.double(), targets, input_lengths, target_lengths, blank, reduction,
                                    zero_inf)
        check_call("ctc", "ctc_loss", call, oracle, [log_probs, targets, input_lengths, target_lengths])

    case()


def _autograd(fn, wrt, dy):
    """d(sum(fn(*wrt) * dy)) / d wrt, in float64: the backward oracle."""
    xs = [t.double().detach().requires_grad_() for t in wrt]
    with torch.enable_grad():
        y = fn(*xs)
        return torch.autograd.grad(y, xs, dy.double())


def fuzz_backward(examples):
    """The backward functions of norm, softmax, attention, pooling and interpolate against torch
    autograd in float64 (the forward's saved tensors come from rudnn's own forward)."""
    @fuzz_cases(examples)
    def case(data):
        op = data.draw(st.sampled_from(["layer_norm_backward", "rms_norm_backward", "softmax_backward",
                                        "attention_backward", "max_pool_backward", "avg_pool_backward",
                                        "interpolate_backward"]))
        if op in ("layer_norm_backward", "rms_norm_backward", "softmax_backward"):
            shape = data.draw(shapes(min_rank=1, max_rank=3))
            x = data.draw(arrays(shape))
            dy = like(data, shape if data.draw(st.integers(0, 7)) else shape[:-1] + (shape[-1] + 1,), x)
            H = shape[-1]
            w = like(data, (H,), x) if data.draw(st.booleans()) else None
            if op == "softmax_backward":
                try:
                    y = rudnn.softmax(x)
                except rudnn.Error:
                    y = x
                call = lambda: rudnn.softmax_backward(dy, y)
                oracle = lambda: _autograd(lambda a: torch.softmax(a, -1), [x], dy)[0]
                check_call("backward", op, call, oracle, [dy, y])
                return
            try:
                if op == "layer_norm_backward":
                    _, mean, rstd = rudnn.layer_norm(x, w, None, 1e-5, return_stats=True)
                else:
                    (_, rstd), mean = rudnn.rms_norm(x, w, 1e-5, return_stats=True), None
            except rudnn.Error:
                mean = rstd = torch.zeros(shape[:-1])
            if op == "layer_norm_backward":
                call = lambda: rudnn.layer_norm_backward(dy, x, w, mean, rstd)[:1]
                oracle = lambda: _autograd(lambda a: F.layer_norm(a, (H,), None if w is None else w.double(), None,
                                                                  1e-5), [x], dy)
            else:
                call = lambda: rudnn.rms_norm_backward(dy, x, w, rstd)[:1]
                oracle = lambda: _autograd(lambda a: a / torch.sqrt(a.pow(2).mean(-1, keepdim=True) + 1e-5)
                                           * (1 if w is None else w.double()), [x], dy)
            check_call("backward", op, call, oracle, [dy, x, w, mean, rstd])
            return
        if op == "attention_backward":
            B, H, Sq, Sk, D = (data.draw(st.integers(1, 3)) for _ in range(5))
            q = data.draw(arrays((B, H, Sq, D)))
            k, v = like(data, (B, H, Sk, D), q), like(data, (B, H, Sk, D), q)
            causal = data.draw(st.sampled_from([False, True]))
            try:
                out, lse = rudnn.attention(q, k, v, causal=causal, return_lse=True)
            except rudnn.Error:
                out, lse = q, torch.zeros(B, H, Sq)
            dout = like(data, (B, H, Sq, D), q)
            sdpa = lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=causal)  # noqa: E731
            call = lambda: tuple(rudnn.attention_backward(dout, q, k, v, out, lse, causal=causal))
            oracle = lambda: _autograd(sdpa, [q, k, v], dout) if not causal or Sq == Sk else _raise()
            check_call("backward", op, call, oracle, [dout, q, k, v, out, lse])
            return
        shape = data.draw(shapes(min_rank=4, max_rank=4, max_side=6))
        x = data.draw(arrays(shape))
        if op == "interpolate_backward":
            size = data.draw(st.sampled_from([(3, 4), (7, 2), (1, 1)]))
            mode = data.draw(st.sampled_from(["nearest", "bilinear", "bicubic", "area"]))
            align = False if mode in ("bilinear", "bicubic") else None
            out_shape = shape[:2] + size
            dy = like(data, out_shape if data.draw(st.integers(0, 7)) else shape, x)
            call = lambda: rudnn.interpolate_backward(dy, x.shape, size=size, mode=mode, align_corners=align)
            oracle = lambda: _autograd(lambda a: F.interpolate(a, size, None, mode, align), [x], dy)[0]
            check_call("backward", op, call, oracle, [dy])
            return
        kernel, stride, padding = data.draw(st.sampled_from([(2, 2, 0), (3, 2, 1), (3, 1, 1), (1, 1, 0)]))
        tf = F.max_pool2d if op == "max_pool_backward" else F.avg_pool2d
        try:
            y_shape = tf(x.double(), kernel, stride, padding).shape
        except Exception:  # noqa: BLE001 (torch refuses it: any dy shape will do)
            y_shape = shape
        dy = like(data, y_shape if data.draw(st.integers(0, 7)) else shape, x)
        if op == "max_pool_backward":
            try:
                _, indices = rudnn.max_pool(x, kernel, stride, padding, return_indices=True)
            except rudnn.Error:
                indices = torch.zeros(y_shape, dtype=torch.int64)
            call = lambda: rudnn.max_pool_backward(dy, x, indices, kernel=kernel, stride=stride, padding=padding)
            inputs = [dy, x, indices]
        else:
            call = lambda: rudnn.avg_pool_backward(dy, x.shape, kernel=kernel, stride=stride, padding=padding)
            inputs = [dy]
        oracle = lambda: _autograd(lambda a: tf(a, kernel, stride, padding), [x], dy)[0]
        check_call("backward", op, call, oracle, inputs)

    case()


def gated_delta_inputs(data, max_t, max_dim, *, decay_heads_off=True):
    """The drawn arguments of a gated delta call, forward or backward: (q, k, v, beta, log_decay,
    state, scale, chunk). Hv is sometimes not a multiple of Hk and, with decay_heads_off, log_decay
    sometimes has one head too many; scale and chunk_size are sometimes invalid."""
    B, T = data.draw(st.integers(1, 2)), data.draw(st.integers(0, max_t))
    Hk, K, V = (data.draw(st.integers(1, 2)), data.draw(st.integers(1, max_dim)),
                data.draw(st.integers(1, max_dim)))
    Hv = Hk * data.draw(st.sampled_from([1, 1, 2])) + data.draw(st.sampled_from([0] * 8 + [1]))
    q = data.draw(arrays((B, Hk, T, K)))
    k = like(data, (B, Hk, T, K), q)
    v = like(data, (B, Hv, T, V), q)
    beta = like(data, (B, Hv, T), q)
    if beta.dtype.is_floating_point and often(data, 7):
        beta = beta.float().sigmoid().to(beta.dtype)
    extra_head = 1 if decay_heads_off and not often(data, 7) else 0
    log_decay = like(data, (B, Hv + extra_head, T), torch.zeros(0))  # float32
    if log_decay.dtype.is_floating_point:
        log_decay = -log_decay.abs()  # a decay in (0, 1]
    state = like(data, (B, Hv, K, V), torch.zeros(0)) if data.draw(st.booleans()) else None  # float32
    scale = data.draw(st.sampled_from([0.5] * 20 + SCALARS))
    chunk = data.draw(st.sampled_from([64] * 4 + [2, 3, 1] * 2 + [0, -1, 2**40, 4.0]))
    return q, k, v, beta, log_decay, state, scale, chunk


def fuzz_gated_delta(examples):
    @fuzz_cases(examples)
    def case(data):
        q, k, v, beta, log_decay, state, scale, chunk = gated_delta_inputs(data, 6, 4)
        op = data.draw(st.sampled_from(["chunk_gated_delta_rule", "gated_delta_rule"]))
        if op == "chunk_gated_delta_rule":
            call = lambda: rudnn.chunk_gated_delta_rule(q, k, v, beta, log_decay, state, scale=scale, chunk_size=chunk)
        else:
            call = lambda: rudnn.gated_delta_rule(q, k, v, beta, log_decay, state, scale=scale)
        oracle = lambda: ref_gated_delta.gated_delta_rule(q, k, v, beta, log_decay, scale, state)
        check_call("gated_delta", op, call, oracle, [q, k, v, beta, log_decay, state])

    case()


def fuzz_paged(examples):
    """HostPlan metadata (valid, and broken in one place: a page id out of range, a length past the
    table, a position past its length, a sequence id past the tables) and paged attention against
    the gather-then-softmax reference."""
    @fuzz_cases(examples)
    def case(data):
        page_size, pages = data.draw(st.sampled_from([1, 2, 4])), data.draw(st.integers(1, 6))
        S = data.draw(st.integers(1, 3))
        lengths = [data.draw(st.integers(0, 3 * page_size)) for _ in range(S)]
        width = max(1, max(-(-n // page_size) for n in lengths))
        tables = [[data.draw(st.integers(0, pages - 1)) for _ in range(width)] for _ in range(S)]
        seq_ids, positions = [], []
        for s in range(S):
            for _ in range(data.draw(st.integers(0, 2)) if lengths[s] else 0):
                seq_ids.append(s)
                positions.append(data.draw(st.integers(0, lengths[s] - 1)))
        if not seq_ids:
            return
        broken = data.draw(st.sampled_from([None] * 6 + ["page", "length", "position", "sequence", "negative"]))
        if broken == "page":
            tables[0][0] = pages
            lengths[0] = max(lengths[0], 1)
        elif broken == "length":
            lengths[-1] = width * page_size + 1
        elif broken == "position":
            positions[-1] = lengths[seq_ids[-1]]
        elif broken == "sequence":
            seq_ids[-1] = S
        elif broken == "negative":
            positions[0] = -1
        Hkv = data.draw(st.integers(1, 2))
        Hq = Hkv * data.draw(st.sampled_from([1, 2])) + data.draw(st.sampled_from([0] * 8 + [1]))
        D, Dv = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))
        q = data.draw(arrays((len(seq_ids), Hq, D)))
        k_cache = like(data, (pages, page_size, Hkv, D), q)
        v_cache = like(data, (pages, page_size, Hkv, Dv), q)
        causal = data.draw(st.sampled_from([False, True]))
        scale = data.draw(st.sampled_from([0.5] * 20 + SCALARS))

        def call():
            host = rudnn.paged.HostPlan(page_size, pages, tables, lengths, seq_ids, positions)
            return rudnn.paged.DevicePlan.upload(host, q).attention(q, k_cache, v_cache, scale, causal)

        def oracle():
            if Hq % Hkv:
                raise ValueError("no oracle")
            sched = (page_size, tables, lengths, seq_ids, positions)
            return ref_paged.attention(sched, q, k_cache, v_cache, scale=scale, causal=causal)[0]

        check_call("paged", ("HostPlan", "DevicePlan.upload", "paged_attention"), call, oracle, [q, k_cache, v_cache])

    case()


def fuzz_moe_dispatch(examples):
    """dispatch then combine of random (valid or out-of-range) expert indices: each token comes
    back as the weighted sum of its rows."""
    @fuzz_cases(examples)
    def case(data):
        T, E, H = data.draw(st.integers(0, 5)), data.draw(st.integers(1, 5)), data.draw(st.integers(1, 4))
        k = data.draw(st.integers(1, E))
        g = torch.Generator().manual_seed(data.draw(st.integers(0, 999)))
        indices = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]) if T else \
            torch.zeros(0, k, dtype=torch.int64)
        indices = indices.to(data.draw(st.sampled_from([torch.int32, torch.int64, torch.uint32])))
        bad = data.draw(st.sampled_from([None] * 6 + ["high", "negative"]))
        if bad and T:
            indices = indices.to(torch.int64)
            indices[0, 0] = E if bad == "high" else -1
        x = data.draw(arrays((T, H)))
        weights = like(data, (T, k), x)

        def call():
            plan = rudnn.moe.RoutingPlan(indices, weights, E, scoring="softmax", renormalize=True, scale=1.0)
            d = plan.dispatch(x)
            return d.combine(d.x)

        oracle = lambda: (weights.double().sum(-1, keepdim=True) * x.double())  # every row is a copy of its token
        check_call("moe_dispatch", "moe.", call, oracle, [indices, x, weights])  # moe.dispatch or moe.combine

    case()


# ---- MoE experts and the training chain ---------------------------------------------------------

def often(data, n):
    """True n times in n + 1 (hypothesis draws small integers more often than uniformly, so
    `integers(0, n)` is 0 far more often than 1 in n + 1)."""
    return data.draw(st.sampled_from([True] * n + [False]))


def mostly_dense(data, shape, ref):
    """Like `like`, but dense in ref's dtype three times in four (for arrays that must be dense,
    the MoE expert weights and the paged caches: else most cases stop at a layout check)."""
    if often(data, 3):
        return _values(shape, ref.dtype, data.draw(st.integers(0, 2**16)))
    return like(data, shape, ref)


def _partition(g, rows, E):
    """int32 offsets [E + 1] cutting `rows` into E segments (some empty)."""
    cuts = sorted(torch.randint(0, rows + 1, (E - 1,), generator=g).tolist()) if E > 1 else []
    return torch.tensor([0] + cuts + [rows], dtype=torch.int32)


def _break_offsets(kind, offsets, rows):
    """offsets broken in one way (each must be refused where the offsets are host arrays)."""
    o = offsets.clone()
    E = o.numel() - 1
    if kind == "start":
        o[0] = 1
    elif kind == "negative":
        o[0] = -1
    elif kind == "decreasing" and E >= 2:
        o[1] = o[2] + 1
    elif kind == "short":
        o[E] = rows - 1
    elif kind == "long":
        o[E] = rows + 1
    elif kind == "length":
        return o[:E]
    elif kind == "dtype":
        return o.long()
    else:
        return None  # this kind cannot break these offsets: no case
    return o


def _segment_expert_rows(x, offsets, gate, up, down):
    """The experts' outputs [N, H] row by row in float64 (tests/reference/moe.expert), with the
    expert of each row read from the offsets: differentiable in x and the weights."""
    o = [int(v) for v in offsets]
    rows = []
    for e in range(len(o) - 1):
        for r in range(o[e], o[e + 1]):
            rows.append(ref_moe.expert(x[r], gate[e], up[e], down[e]))
    return torch.stack(rows) if rows else torch.zeros(0, x.shape[1], dtype=torch.float64)


def _combine_ref(y, row_of_slot, weights, T):
    """out[t] = sum_j w[t, j] y[row_of_slot[t, j]] (weights None: 1), float64, differentiable."""
    outs = []
    for t in range(T):
        acc = torch.zeros(y.shape[1], dtype=torch.float64)
        for j in range(row_of_slot.shape[1]):
            w = 1.0 if weights is None else weights[t, j]
            acc = acc + w * y[int(row_of_slot[t, j])]
        outs.append(acc)
    return torch.stack(outs) if outs else torch.zeros(0, y.shape[1], dtype=torch.float64)


def _grads(fn, wrt, douts):
    """Gradients of sum_i <fn(*wrt)[i], douts[i]> with respect to wrt, in float64 (zeros for
    arrays the result does not depend on)."""
    xs = [t.double().detach().requires_grad_() for t in wrt]
    with torch.enable_grad():
        ys = fn(*xs)
        ys = ys if isinstance(ys, tuple) else (ys,)
        pairs = [(y, d.double()) for y, d in zip(ys, douts) if d is not None and y.requires_grad]
        if not pairs:
            return tuple(torch.zeros_like(x) for x in xs)
        gs = torch.autograd.grad([y for y, _ in pairs], xs, [d for _, d in pairs], allow_unused=True)
    return tuple(torch.zeros_like(x) if g is None else g for x, g in zip(xs, gs))


def _interleave_ref(gate, up):
    """gate_up from its definition: per expert, 64-row blocks of gate and of up alternate."""
    E, I, H = gate.shape
    blocks = (gate.reshape(E, I // 64, 64, H), up.reshape(E, I // 64, 64, H))
    return torch.stack(blocks, dim=2).reshape(E, 2 * I, H)


def fuzz_moe_experts(examples):
    """SwiGluExperts.forward_dispatched (with or without fused_gate_up), forward_dispatched_training
    + MoeTrainingCache.backward, DispatchedTokens.combine_backward and dispatch_backward, on
    dispatched rows from a real dispatch or drawn directly, with offsets and row_of_slot valid or
    broken in one way (every host-side break must be refused), against tests/reference/moe.py and
    torch autograd in float64; moe.interleave_gate_up against its layout."""
    @fuzz_cases(examples)
    def case(data):
        T, E = data.draw(st.integers(0, 4)), data.draw(st.integers(1, 3))
        H, I = data.draw(st.integers(1, 4)), data.draw(st.sampled_from([1, 2, 3, 4, 64]))
        k = data.draw(st.integers(1, E))
        g = torch.Generator().manual_seed(data.draw(st.integers(0, 9999)))
        N = T * k
        op = data.draw(st.sampled_from(["forward_dispatched", "forward_dispatched_training", "backward",
                                        "combine_backward", "dispatch_backward", "interleave_gate_up"]))
        if op == "interleave_gate_up":
            gate = mostly_dense(data, (E, I, H), torch.zeros(0, dtype=data.draw(st.sampled_from(FLOATS))))
            up = mostly_dense(data, (E, I + (not often(data, 7)), H), gate)
            check_call("moe_experts", "moe.interleave_gate_up", lambda: rudnn.moe.interleave_gate_up(gate, up),
                       lambda: _interleave_ref(gate.double(), up.double()), [gate, up])
            return
        indices = (torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]) if T
                   else torch.zeros(0, k, dtype=torch.int64)).to(torch.int32)
        weights = like(data, (T, k), torch.zeros(0))
        plan = rudnn.moe.RoutingPlan(indices, weights, E, scoring="softmax", renormalize=True, scale=1.0)
        if data.draw(st.booleans()):  # the metadata of a real dispatch
            d = plan.dispatch(torch.zeros(T, H))
            offsets, token_of_row, row_of_slot = d.offsets, d.token_of_row, d.row_of_slot
        else:  # drawn: any partition of the rows, any permutation of the slots
            offsets = _partition(g, N, E)
            row_of_slot = torch.randperm(N, generator=g).to(torch.int32).reshape(T, k)
            token_of_row = torch.full((N,), -1, dtype=torch.int32)
        broken = data.draw(st.sampled_from([None] * 8 + ["start", "negative", "decreasing", "short", "long",
                                                         "length", "dtype", "row high", "row negative",
                                                         "row duplicate", "few rows", "shape"]))
        must_refuse = None
        if broken in ("start", "negative", "decreasing", "short", "long", "length", "dtype"):
            if op not in ("forward_dispatched", "forward_dispatched_training", "backward"):
                return
            offsets = _break_offsets(broken, offsets, N)
            if offsets is None:
                return
            must_refuse = f"offsets broken ({broken}): {offsets.tolist()} for {N} rows"
        elif broken in ("row high", "row negative", "row duplicate"):
            if op not in ("combine_backward", "dispatch_backward") or N < 2:
                return
            row_of_slot = row_of_slot.clone()
            row_of_slot[0, 0] = N if broken == "row high" else -1 if broken == "row negative" else \
                int(row_of_slot.flatten()[-1])
            if broken != "row duplicate" or op == "combine_backward":  # dispatch_backward sums a repeated row
                must_refuse = f"row_of_slot {row_of_slot.tolist()} for {N} rows"
        rows_n = N - 1 if broken == "few rows" and N else N
        if rows_n < N and op in ("forward_dispatched", "forward_dispatched_training", "backward"):
            must_refuse = f"offsets {offsets.tolist()} ending past x's {rows_n} rows"
        d = rudnn.moe.DispatchedTokens(plan, None, offsets, token_of_row, row_of_slot)
        gate = mostly_dense(data, (E, I, H), torch.zeros(0, dtype=data.draw(st.sampled_from(FLOATS))))
        up, down = mostly_dense(data, (E, I, H), gate), mostly_dense(data, (E, H + (broken == "shape"), I), gate)
        x = mostly_dense(data, (rows_n, H), gate)
        d.x = x
        strategy = data.draw(st.sampled_from(["auto", "scalar", "auto", "scalar", "tensor_core", "fast"]))
        experts = None
        if op in ("forward_dispatched", "forward_dispatched_training", "backward"):
            try:  # fused_gate_up: refused at construction unless I is a multiple of 64
                experts = rudnn.moe.SwiGluExperts(gate, up, down, fused_gate_up=data.draw(st.booleans()))
            except rudnn.Error as e:
                stats["moe_experts"][type(e).__name__] += 1
                assert str(e).startswith("SwiGluExperts"), e
                return
        if op == "forward_dispatched":
            call = lambda: experts.forward_dispatched(d, strategy)
            oracle = lambda: _segment_expert_rows(x.double(), offsets, gate.double(), up.double(), down.double())
            check_call("moe_experts", "SwiGluExperts.forward_dispatched", call, oracle, [x, offsets, gate, up, down],
                       must_refuse=must_refuse)
        elif op == "forward_dispatched_training":
            def call():
                return experts.forward_dispatched_training(d, strategy)[0]

            oracle = lambda: _segment_expert_rows(x.double(), offsets, gate.double(), up.double(), down.double())
            check_call("moe_experts", "SwiGluExperts.forward_dispatched_training", call, oracle,
                       [x, offsets, gate, up, down], must_refuse=must_refuse)
        elif op == "backward":
            good = rudnn.moe.DispatchedTokens(plan, x, _partition(g, rows_n, E) if must_refuse else offsets,
                                              token_of_row, row_of_slot)
            try:  # the cache of a valid forward; the broken offsets (if any) are planted into it
                _, cache = experts.forward_dispatched_training(good, "scalar")
            except rudnn.Error as e:
                stats["moe_experts"][type(e).__name__] += 1
                return
            cache.dispatched = d
            dy_shape = (rows_n, H) if often(data, 7) else (rows_n, H + 1)
            dy = like(data, dy_shape, x)

            def call():
                return cache.backward(dy, strategy)

            oracle = lambda: _grads(lambda *a: _segment_expert_rows(*a[:1], offsets, *a[1:]), [x, gate, up, down],
                                    [dy])
            check_call("moe_experts", "MoeTrainingCache.backward", call, oracle,
                       [x, offsets, gate, up, down, dy, cache.gate_pre, cache.up_pre], must_refuse=must_refuse,
                       tol_dtype=x.dtype)
        elif op == "combine_backward":
            y = x
            dout = like(data, (T, H) if often(data, 7) else (T, H + 1), y)
            strat = data.draw(st.sampled_from(["plane", "serial", "plane", "serial", "fast"]))
            if broken == "few rows" and N:
                must_refuse = f"y with {rows_n} rows for row_of_slot {row_of_slot.tolist()}"

            def call():
                return d.combine_backward(y, dout, strat)

            oracle = lambda: _grads(lambda yy, ww: _combine_ref(yy, row_of_slot, ww, T), [y, weights], [dout])
            check_call("moe_experts", "moe.combine_backward", call, oracle, [y, dout, row_of_slot, weights],
                       must_refuse=must_refuse)
        else:
            if broken == "few rows" and N:
                must_refuse = f"dx_dispatched with {rows_n} rows for row_of_slot {row_of_slot.tolist()}"

            def call():
                return d.dispatch_backward(x)

            oracle = lambda: _combine_ref(x.double(), row_of_slot, None, T)
            check_call("moe_experts", "moe.dispatch_backward", call, oracle, [x, row_of_slot],
                       must_refuse=must_refuse)

    case()


def fuzz_moe_router(examples):
    """selected_router_weights and selected_router_backward (softmax or sigmoid scores, renormalized
    or not, scaled) against tests/reference/moe.selected_weights and its torch autograd in float64;
    an expert index outside [0, E) must make its row NaN (SPEC section 4), exactly that row."""
    @fuzz_cases(examples)
    def case(data):
        T, E = data.draw(st.integers(0, 4)), data.draw(st.integers(1, 5))
        k = data.draw(st.integers(1, E))
        logits = data.draw(arrays((T, E)))
        g = torch.Generator().manual_seed(data.draw(st.integers(0, 9999)))
        indices = torch.stack([torch.randint(0, E, (k,), generator=g) for _ in range(T)]) if T else \
            torch.zeros(0, k, dtype=torch.int64)  # repeated indices gather (allowed)
        if T and not often(data, 4):
            indices[-1, 0] = data.draw(st.sampled_from([E, -1, 2**31 + 5]))
        indices = indices.to(data.draw(st.sampled_from([torch.int32, torch.int64, torch.uint32, torch.float32])))
        scoring = data.draw(st.sampled_from(["softmax", "sigmoid"] * 3 + ["relu"]))
        renorm = data.draw(st.sampled_from([True, False] * 3 + ["yes"]))
        scale = data.draw(st.sampled_from([1.0, 2.5] * 5 + SCALARS))
        ids = indices.to(torch.int64).tolist() if indices.dtype != torch.float32 else []
        bad_rows = [t for t, row in enumerate(ids) if any(e < 0 or e >= E for e in row)]

        def weights(lg):
            rows = []
            for t in range(T):
                if t in bad_rows:
                    rows.append(torch.full((k,), float("nan"), dtype=torch.float64))
                else:
                    rows.append(ref_moe.selected_weights(lg[t], ids[t], scoring, renorm, scale))
            return torch.stack(rows) if rows else torch.zeros(0, k, dtype=torch.float64)

        if often(data, 1):
            op = "moe.selected_router_weights"
            call = lambda: rudnn.moe.selected_router_weights(logits, indices, scoring, renorm, scale)  # noqa: E731
            oracle = lambda: weights(logits.double())  # noqa: E731
            inputs = [logits, indices]
        else:
            op = "moe.selected_router_backward"
            grad = like(data, (T, k) if often(data, 7) else (T, k + 1), torch.zeros(0))

            def oracle():
                d = _grads(weights, [logits], [grad])[0]
                d[bad_rows] = float("nan")
                return d

            call = lambda: rudnn.moe.selected_router_backward(logits, indices, grad, scoring, renorm, scale)  # noqa
            inputs = [logits, indices, grad]
        check_call("moe_router", op, call, oracle, inputs, nan_exact=True,
                   must_refuse="float32 indices" if indices.dtype == torch.float32 else None)

    case()


# ---- gated delta backward ----------------------------------------------------------------------------

def fuzz_gated_delta_backward(examples):
    """chunk_gated_delta_rule_backward and gated_delta_rule_backward against torch autograd through
    the float64 recurrence of tests/reference/gated_delta.py."""
    @fuzz_cases(examples)
    def case(data):
        q, k, v, beta, log_decay, state, scale, chunk = gated_delta_inputs(data, 5, 3, decay_heads_off=False)
        B, Hv, T, V, K = v.shape[0], v.shape[1], v.shape[2], v.shape[3], q.shape[3]
        dout = like(data, (B, Hv, T, V) if often(data, 9) else (B, Hv, T + 1, V), q)
        dfinal = like(data, (B, Hv, K, V), torch.zeros(0)) if data.draw(st.booleans()) else None
        op = data.draw(st.sampled_from(["chunk_gated_delta_rule_backward", "gated_delta_rule_backward"]))
        if op == "chunk_gated_delta_rule_backward":
            call = lambda: rudnn.chunk_gated_delta_rule_backward(dout, q, k, v, beta, log_decay, state, dfinal,
                                                                 scale=scale, chunk_size=chunk)
        else:
            call = lambda: rudnn.gated_delta_rule_backward(dout, q, k, v, beta, log_decay, state, dfinal, scale=scale)

        def oracle():
            wrt = [q, k, v, beta, log_decay] + ([state] if state is not None else [])
            fn = lambda *a: ref_gated_delta.gated_delta_rule(*a[:5], scale, a[5] if len(a) > 5 else None)  # noqa: E731
            grads = _grads(fn, wrt, [dout, dfinal])
            return tuple(grads) + ((None,) if state is None else ())

        def run():
            return call()

        check_call("gated_delta_backward", op, run, oracle, [dout, q, k, v, beta, log_decay, state, dfinal])

    case()


# ---- paged: MLA, the backward functions, append ----------------------------------------------------

@st.composite
def paged_schedules(draw, broken_rate=10):
    """((page_size, pages, tables, lengths, sequence_ids, positions), broken): mostly valid; one
    in `broken_rate` broken in one place (named by `broken`: HostPlan must refuse it)."""
    page_size, pages = draw(st.sampled_from([1, 2, 4])), draw(st.integers(1, 5))
    S = draw(st.integers(1, 3))
    lengths = [draw(st.integers(0, 3 * page_size)) for _ in range(S)]
    width = max(1, max(-(-n // page_size) for n in lengths))
    tables = [[draw(st.integers(0, pages - 1)) for _ in range(width)] for _ in range(S)]
    seq_ids, positions = [], []
    for s in range(S):
        for _ in range(draw(st.integers(0, 2)) if lengths[s] else 0):
            seq_ids.append(s)
            positions.append(draw(st.integers(0, lengths[s] - 1)))
    broken = None
    if seq_ids and draw(st.integers(0, broken_rate - 1)) == 0:
        broken = draw(st.sampled_from(["page", "position", "sequence"]))
        if broken == "page":
            tables[seq_ids[0]][0] = pages
        elif broken == "position":
            positions[-1] = lengths[seq_ids[-1]]
        else:
            seq_ids[-1] = S
    return (page_size, pages, tables, lengths, seq_ids, positions), broken


def _upload(sched, q):
    page_size, pages, tables, lengths, seq_ids, positions = sched
    host = rudnn.paged.HostPlan(page_size, pages, tables, lengths, seq_ids, positions)
    return rudnn.paged.DevicePlan.upload(host, q)


_PAGED_OPS = ("HostPlan", "DevicePlan.upload")


def fuzz_paged_more(examples):
    """plan.mla, plan.attention_backward and plan.mla_backward against torch autograd through
    tests/reference/paged.py in float64 (need= subsets included), on valid and broken schedules."""
    @fuzz_cases(examples)
    def case(data):
        sched, broken = data.draw(paged_schedules())
        page_size, pages, tables, lengths, seq_ids, positions = sched
        Q = len(seq_ids)
        if Q == 0:
            return
        ref_sched = (page_size, tables, lengths, seq_ids, positions)
        op = data.draw(st.sampled_from(["paged_mla", "paged_attention_backward", "paged_mla_backward"]))
        causal = data.draw(st.sampled_from([False, True] * 3 + [1]))
        scale = data.draw(st.sampled_from([0.5] * 20 + SCALARS))
        if op == "paged_attention_backward":
            Hkv = data.draw(st.integers(1, 2))
            Hq = Hkv * data.draw(st.sampled_from([1, 2])) + data.draw(st.sampled_from([0] * 8 + [1]))
            D, Dv = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))
            q = data.draw(arrays((Q, Hq, D)))
            kc = mostly_dense(data, (pages, page_size, Hkv, D), q)
            vc = mostly_dense(data, (pages, page_size, Hkv, Dv), q)
            dout = like(data, (Q, Hq, Dv) if often(data, 9) else (Q, Hq, Dv + 1), q)
            names = ("dq", "dk", "dv")
            need = tuple(n for n in names if data.draw(st.integers(0, 3))) or names
            if not often(data, 19):
                need = data.draw(st.sampled_from(["dq", ("dx",), (1,)]))
            inputs = [q, kc, vc, dout]

            def call():
                plan = _upload(sched, q)
                return plan.attention_backward(q, kc, vc, dout, scale, causal, need=need)

            def oracle():
                if Hq % Hkv:
                    raise ValueError("no oracle")
                fn = lambda a, b, c: ref_paged.attention(ref_sched, a, b, c, scale=scale, causal=causal)[0]  # noqa
                return tuple(gr if n in need else None for n, gr in zip(names, _grads(fn, [q, kc, vc], [dout])))
        else:
            H = data.draw(st.integers(1, 2))
            R, P = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 3))
            q = data.draw(arrays((Q, H, R)))
            qp = like(data, (Q, H, P), q)
            latent = mostly_dense(data, (pages, page_size, data.draw(st.sampled_from([1] * 9 + [2])), R), q)
            kp = mostly_dense(data, (pages, page_size, 1, P + (0 if often(data, 9) else 1)), q)
            inputs = [q, qp, latent, kp]
            fn = lambda a, b, c, d: ref_paged.mla(ref_sched, a, b, c, d, scale=scale, causal=causal)[0]  # noqa
            if op == "paged_mla":
                def call():
                    plan = _upload(sched, q)
                    return plan.mla(q, qp, latent, kp, scale, causal)

                oracle = lambda: fn(q, qp, latent, kp)
            else:
                dout = like(data, (Q, H, R) if often(data, 9) else (Q, H, R + 1), q)
                inputs.append(dout)
                names = ("dq", "dqp", "dlatent", "dkp")
                need = tuple(n for n in names if data.draw(st.integers(0, 3))) or names

                def call():
                    plan = _upload(sched, q)
                    return plan.mla_backward(q, qp, latent, kp, dout, scale, causal, need=need)

                def oracle():
                    grads = _grads(fn, [q, qp, latent, kp], [dout])
                    return tuple(gr if n in need else None for n, gr in zip(names, grads))
        check_call("paged_backward", _PAGED_OPS + (op,), call, oracle, inputs,
                   must_refuse=broken and f"a broken schedule ({broken})")

    case()


def fuzz_paged_append(examples):
    """plan.append: each query row's k/v row lands in its slot (the slot of its position in its
    sequence's pages), nothing else changes; two rows naming one physical slot (shared pages or
    repeated positions), wrong shapes or dtypes, and k/v that overlap the caches are refused with
    nothing written; after an append, plan.attention over the caches equals the dense reference."""
    @fuzz_cases(examples)
    def case(data):
        sched, broken = data.draw(paged_schedules())
        page_size, pages, tables, lengths, seq_ids, positions = sched
        Q = len(seq_ids)
        if Q == 0:
            return
        if not often(data, 4):  # a repeated (sequence, position): one slot written twice
            seq_ids, positions = seq_ids + [seq_ids[0]], positions + [positions[0]]
            sched = (page_size, pages, tables, lengths, seq_ids, positions)
            Q += 1
        Hkv = data.draw(st.integers(1, 2))
        D, Dv = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))
        kc = data.draw(arrays((pages, page_size, Hkv, D), dtypes=FLOATS * 3 + DTYPES))
        if often(data, 2):
            kc = _values(tuple(kc.shape), kc.dtype, data.draw(st.integers(0, 2**16)))
        vc = mostly_dense(data, (pages, page_size, Hkv, Dv), kc)
        if often(data, 5):  # else the drawn layouts stay (expanded or overlapping caches)
            kc, vc = kc.clone(), vc.clone()
        kind = data.draw(st.sampled_from(["fresh"] * 6 + ["k_in_cache", "wrong_shape"]))
        if kind == "k_in_cache" and kc.is_contiguous() and kc.numel() >= Q * Hkv * D:
            k = kc.view(-1)[: Q * Hkv * D].view(Q, Hkv, D)  # overlaps the cache it is written into
        else:
            k = mostly_dense(data, (Q, Hkv + (kind == "wrong_shape"), D), kc)
        v = mostly_dense(data, (Q, Hkv, Dv), kc)
        slot = lambda r: (int(tables[seq_ids[r]][positions[r] // page_size]), positions[r] % page_size)  # noqa
        try:
            slots = [slot(r) for r in range(Q)]
        except IndexError:
            slots = None  # a broken schedule: HostPlan refuses it
        must_refuse = broken and f"a broken schedule ({broken})"
        if not broken and len(set(slots)) < len(slots):
            must_refuse = f"two rows writing one slot ({slots})"

        def call():
            plan = _upload(sched, kc)
            return plan.append(k, v, kc, vc)

        def oracle():
            ek, ev = kc_before.double(), vc_before.double()
            for r, (p, o) in enumerate(slots):
                ek[p, o], ev[p, o] = k_before[r].double(), v_before[r].double()
            return ek, ev

        kc_before, vc_before, k_before, v_before = kc.clone(), vc.clone(), k.clone(), v.clone()
        outcome = stats["paged_append"]["ok"]
        check_call("paged_append", _PAGED_OPS + ("paged_append",), call, oracle, [k, v], written=[kc, vc],
                   must_refuse=must_refuse)
        if stats["paged_append"]["ok"] == outcome or not kc.dtype.is_floating_point:
            return
        # append then attend: the dense reference over the expected caches
        q = like(data, (Q, Hkv, D), kc)
        ek, ev = oracle()
        ref_sched = (page_size, tables, lengths, seq_ids, positions)
        call2 = lambda: _upload(sched, q).attention(q, kc, vc, 0.5, True)  # noqa: E731
        oracle2 = lambda: ref_paged.attention(ref_sched, q, ek, ev, scale=0.5, causal=True)[0]  # noqa: E731
        check_call("paged_append", _PAGED_OPS + ("paged_attention",), call2, oracle2, [q, kc, vc])

    case()


FAMILIES = {"norm": fuzz_norm, "pooling": fuzz_pooling, "interpolate": fuzz_interpolate,
            "attention": fuzz_attention, "moe": fuzz_moe, "conv": fuzz_conv, "grid_sample": fuzz_grid_sample,
            "ctc": fuzz_ctc, "backward": fuzz_backward, "gated_delta": fuzz_gated_delta, "paged": fuzz_paged,
            "moe_dispatch": fuzz_moe_dispatch, "moe_experts": fuzz_moe_experts, "moe_router": fuzz_moe_router,
            "gated_delta_backward": fuzz_gated_delta_backward, "paged_backward": fuzz_paged_more,
            "paged_append": fuzz_paged_append}

# The families whose cases cost most (autograd through the naive loops) run half the examples, so
# that the whole suite stays near a minute of CPU.
SHARE = {"gated_delta_backward": 0.5, "paged_backward": 0.5, "paged_append": 0.5}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--examples", type=int, default=200)
    ap.add_argument("--family", nargs="*", default=list(FAMILIES))
    args = ap.parse_args(argv)
    _poison_outputs()
    failed = []
    for name in args.family:
        start = time.process_time()
        try:
            FAMILIES[name](max(1, int(args.examples * SHARE.get(name, 1.0))))
        except Exception:  # noqa: BLE001 (hypothesis re-raises the shrunk failing case)
            failed.append(name)
            print(f"FAIL {name}:\n{traceback.format_exc()}", file=sys.stderr)
        s = stats[name]
        cases = sum(v for k, v in s.items() if k != "no oracle")
        print(f"fuzz {name}: {cases} calls, " + ", ".join(f"{k} {v}" for k, v in sorted(s.items())) +
              f" ({time.process_time() - start:.1f} s CPU)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

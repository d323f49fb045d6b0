"""Property-based fuzzing of rudnn's public functions (issue 27), run by tests/test_fuzz.py in a
subprocess so that a crash fails the test instead of killing pytest.

For every case, drawn by hypothesis (derandomized: the same cases on every run), the call must
either match an independent oracle (torch in float64 on the CPU) or raise a rudnn.Error whose
message starts with the op's name, and in both cases leave every input's storage byte for byte as
it was. Outputs given with out= are poisoned (NaN) first, so memory nobody wrote shows. The cases
mix valid and invalid shapes, dtypes, layouts (transposed, sliced, expanded, overlapping), scalars
and out= arrays that alias inputs.

    python tests/fuzz/driver.py [--examples N] [--family NAME ...]

prints one line per family (cases, results, error classes) and exits 1 if any property failed.
"""

from __future__ import annotations

import argparse
import collections
import math
import sys
import traceback
import warnings

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rudnn

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

def _storage_bytes(t):
    s = t.untyped_storage()
    snap = torch.empty(s.nbytes(), dtype=torch.uint8)
    snap.untyped_storage().copy_(s)
    return snap


def check_call(family, op, call, oracle, inputs, out=None):
    """Runs call(); checks the properties; records the outcome under `family`."""
    kept = [(t, _storage_bytes(t)) for t in inputs
            if isinstance(t, torch.Tensor) and (out is None or not _shares(t, out))]
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
        return
    stats[family]["ok"] += 1
    try:
        expected = oracle()
    except Exception:  # noqa: BLE001 (torch refuses what rudnn takes: no oracle for this case)
        stats[family]["no oracle"] += 1
        return
    results = result if isinstance(result, tuple) else (result,)
    expects = expected if isinstance(expected, tuple) else (expected,)
    for got, want in zip(results, expects):
        assert tuple(got.shape) == tuple(want.shape), f"{op}: shape {tuple(got.shape)} != {tuple(want.shape)}"
        if got.numel() == 0:
            continue
        g, w = got.double(), want.double()
        bad_nan = torch.isnan(g) & ~torch.isnan(w)
        assert not bad_nan.any(), f"{op}: NaN where the oracle is finite (unwritten or wrong memory)"
        tol = TOL.get(got.dtype, 1e-4)
        finite = torch.isfinite(w)
        err = (g[finite] - w[finite]).abs().max().item() if finite.any() else 0.0
        scale = max(1.0, w[finite].abs().max().item() if finite.any() else 1.0)
        assert err <= tol * scale, f"{op}: max error {err:.3g} > {tol * scale:.3g}"


def _shares(a, b):
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


# ---- families ----------------------------------------------------------------------------------------

def fuzz_norm(examples):
    @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
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
    @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
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
    @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
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
    @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
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
    @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
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

    @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
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
    @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
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
    @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
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


FAMILIES = {"norm": fuzz_norm, "pooling": fuzz_pooling, "interpolate": fuzz_interpolate,
            "attention": fuzz_attention, "moe": fuzz_moe, "conv": fuzz_conv, "grid_sample": fuzz_grid_sample,
            "ctc": fuzz_ctc}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--examples", type=int, default=200)
    ap.add_argument("--family", nargs="*", default=list(FAMILIES))
    args = ap.parse_args(argv)
    failed = []
    for name in args.family:
        try:
            FAMILIES[name](args.examples)
        except Exception:  # noqa: BLE001 (hypothesis re-raises the shrunk failing case)
            failed.append(name)
            print(f"FAIL {name}:\n{traceback.format_exc()}", file=sys.stderr)
        s = stats[name]
        cases = sum(v for k, v in s.items() if k != "no oracle")
        print(f"fuzz {name}: {cases} calls, " + ", ".join(f"{k} {v}" for k, v in sorted(s.items())))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

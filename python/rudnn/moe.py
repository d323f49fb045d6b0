"""Mixture of experts, local compute (SPEC section 4).

logits -> routing (`route`, `route_sigmoid_grouped`) -> `RoutingPlan.dispatch` -> SwiGLU experts
(`SwiGluExperts`) -> `DispatchedTokens.combine`, plus the first-order training chain.

The plan objects own arrays of the caller's framework (torch, CuPy, NumPy); libruDNN's
functions are stateless and receive them as tensors. Dispatched rows are grouped by expert
in stable token order: expert e owns rows ``offsets[e]:offsets[e + 1]`` of the dispatched
arrays, and no token is ever dropped.
"""

from __future__ import annotations

from . import _C
from . import _frameworks as fw
from ._args import flag, float32_number, integer
from .errors import ArgumentError, UnsupportedError

_EXPERTS_STRATEGIES = {"auto": 0, "tensor_core": 1, "scalar": 2}
_COMBINE_STRATEGIES = {"serial": 0, "plane": 1}
_SCORINGS = {"softmax": 0, "sigmoid": 1}


def _choice(table, value, op, name):
    if value not in table:
        raise ArgumentError(f"{op}: {name}: expected one of {', '.join(repr(k) for k in table)}, got {value!r}")
    return table[value]


def _indices_and_experts(op, expert_indices, num_experts):
    """The wrappers' dispatch takes (indices, num_experts) or a RoutingPlan."""
    if isinstance(expert_indices, RoutingPlan):
        if num_experts is not None and integer(op, "num_experts", num_experts) != expert_indices.num_experts:
            raise ArgumentError(f"{op}: num_experts: the plan routes to {expert_indices.num_experts} experts, "
                                f"got num_experts={num_experts}")
        return expert_indices.expert_indices, expert_indices.num_experts
    if num_experts is None:
        raise ArgumentError(f"{op}: num_experts: required when expert_indices is an array (or pass the RoutingPlan)")
    return expert_indices, integer(op, "num_experts", num_experts)


def _no_jax(op, *arrays):
    """The functional core below takes torch, CuPy and NumPy arrays; JAX arrays are routed to
    rudnn.jax.moe (XLA FFI) by the public functions and methods before they get here."""
    if any(fw.is_jax(a) for a in arrays):
        raise UnsupportedError(f"{op}: internal: JAX arrays must go through rudnn.jax.moe")


def _rj():
    from .jax import moe as rudnn_jax_moe

    return rudnn_jax_moe


class RoutingPlan:
    """The routing of T tokens to `top_k` of `num_experts` experts.

    expert_indices: uint32 [T, top_k]; weights: [T, top_k] (the logits dtype, or float32
    for a plan made by `into_training`). A plan unpacks as `(expert_indices, weights)`, so
    `indices, weights = route(...)` works with rudnn.moe, rudnn.torch.moe and rudnn.jax.moe alike;
    with JAX arrays a plan is a pytree (it passes through jax.jit; num_experts, scoring,
    renormalize and scale are static).
    """

    def __init__(self, expert_indices, weights, num_experts, *, scoring, renormalize, scale, logits=None):
        self.expert_indices = expert_indices
        self.weights = weights
        self.num_experts = int(num_experts)
        self.top_k = int(expert_indices.shape[1])
        self.scoring = scoring
        self.renormalize = bool(renormalize)
        self.scale = float(scale)
        self.logits = logits  # set for training plans: the logits the weights are differentiable in

    def __iter__(self):
        return iter((self.expert_indices, self.weights))

    def __repr__(self):
        return (f"RoutingPlan(tokens={self.num_tokens}, top_k={self.top_k}, num_experts={self.num_experts}, "
                f"scoring={self.scoring!r}, training={self.is_training})")

    @property
    def num_tokens(self):
        return int(self.expert_indices.shape[0])

    @property
    def is_training(self):
        return self.logits is not None

    def dispatch(self, x, *, stream=None):
        """Copies the rows of x [T, H] into expert-grouped order: a DispatchedTokens.

        Expert ids outside [0, E) are an ArgumentError when the ids are host arrays. Device ids
        are not read on the host (that would synchronize), so on CUDA the kernels define the
        result, the same on every run: such a slot gets no row (its row_of_slot is -1; offsets[E]
        counts the valid slots, and the rows from offsets[E] on belong to no token: token_of_row
        -1, gathered as zeros, zero expert outputs); every token with such a slot comes out of
        `combine` and `dispatch_backward` as NaN in every column (never a finite sum that lost a
        slot), the other tokens are exact; `combine_backward` gives NaN dweights at exactly those
        slots and a zero dy on the rows of no token. No kernel reads out of bounds."""
        T, k, E = self.num_tokens, self.top_k, self.num_experts
        if len(x.shape) != 2 or int(x.shape[0]) != T:
            from .errors import ShapeError

            raise ShapeError(f"moe.dispatch: x: expected shape [{T}, H] (the tokens of the plan), "
                             f"got {list(x.shape)}")
        if fw.is_jax(x) or fw.is_jax(self.expert_indices):
            return DispatchedTokens(self, *_rj().dispatch(x, self.expert_indices, E))
        call = fw.Call("moe.dispatch", {"x": x, "expert_indices": self.expert_indices}, stream)
        offsets, token_of_row, row_of_slot = _dispatch_plan(call, self.expert_indices, E)
        rows = _gather(call, x, token_of_row)
        return DispatchedTokens(self, rows, offsets, token_of_row, row_of_slot, stream)

    def into_training(self, logits, *, scoring=None, renormalize=None, scale=None, stream=None):
        """A plan with the same selection whose float32 weights are recomputed from `logits`
        by `selected_router_weights` (differentiable: see `router_backward`). Options default
        to those the plan was routed with."""
        scoring = self.scoring if scoring is None else scoring
        renormalize = self.renormalize if renormalize is None else renormalize
        scale = self.scale if scale is None else scale
        weights = selected_router_weights(logits, self.expert_indices, scoring=scoring, renormalize=renormalize,
                                          scale=scale, stream=stream)
        return RoutingPlan(self.expert_indices, weights, self.num_experts, scoring=scoring, renormalize=renormalize,
                           scale=scale, logits=logits)

    def router_backward(self, grad_weights, *, stream=None):
        """d loss / d logits [T, E] (the logits dtype) of a training plan, given d loss / d weights."""
        if self.logits is None:
            raise ArgumentError("RoutingPlan.router_backward: this plan has no logits; make it with into_training")
        return selected_router_backward(self.logits, self.expert_indices, grad_weights, scoring=self.scoring,
                                        renormalize=self.renormalize, scale=self.scale, stream=stream)


class DispatchedTokens:
    """Token rows grouped by expert: `x` [T * top_k, H], `offsets` int32 [E + 1] (expert e owns
    rows offsets[e]:offsets[e + 1]), `token_of_row` int32 [T * top_k] and `row_of_slot` int32
    [T, top_k] linking dispatched rows and (token, slot) pairs."""

    def __init__(self, plan, x, offsets, token_of_row, row_of_slot, stream=None):
        self.plan = plan
        self.x = x
        self.offsets = offsets
        self.token_of_row = token_of_row
        self.row_of_slot = row_of_slot
        self.stream = stream

    @property
    def num_tokens(self):
        return self.plan.num_tokens

    def combine(self, y, *, stream=None):
        """out[t] = sum_j weights[t, j] * y[row of (t, j)]: float32 accumulation, y's dtype.
        A token with a slot of no row (row_of_slot outside [0, N): a device expert id outside
        [0, E), see RoutingPlan.dispatch) is NaN in every column; host row_of_slot outside [0, N)
        is an ArgumentError."""
        if fw.is_jax(y):
            return _rj().combine(y, self.row_of_slot, self.plan.weights)
        stream = self.stream if stream is None else stream
        return _combine("moe.combine", y, self.row_of_slot, self.plan.weights, self.num_tokens, stream)

    def combine_backward(self, y, dout, strategy="plane", *, stream=None):
        """Gradients of `combine`: (dy [N, H] in y's dtype, dweights float32 [T, top_k]).
        dy of a row no slot names is 0; dweights of a slot of no row is NaN. Each row of y may be
        named by one slot at most (as a dispatch makes them): host row_of_slot naming a row twice
        is an ArgumentError (dy would need both slots' sum); device rows are not read on the host,
        so there distinct rows are the caller's promise: a row named twice gets, element by element,
        one of its slots' gradients, not their sum."""
        code = _choice(_COMBINE_STRATEGIES, strategy, "moe.combine_backward", "strategy")
        if fw.is_jax(y) or fw.is_jax(dout):
            return _rj().combine_backward(y, dout, self.row_of_slot, self.plan.weights, strategy)
        stream = self.stream if stream is None else stream
        return _combine_backward(y, dout, self.row_of_slot, self.plan.weights, code, stream)

    def dispatch_backward(self, dx_dispatched, *, stream=None):
        """Gradient of `dispatch`: dx[t] = sum_j dx_dispatched[row of (t, j)], [T, H] (NaN for a
        token with a slot of no row, as in `combine`)."""
        if fw.is_jax(dx_dispatched):
            return _rj().dispatch_backward(dx_dispatched, self.row_of_slot)
        stream = self.stream if stream is None else stream
        return _combine("moe.dispatch_backward", dx_dispatched, self.row_of_slot, None, self.num_tokens, stream)


class MoeTrainingCache:
    """What `SwiGluExperts.forward_dispatched_training` keeps for the backward: the dispatched
    input and the gate/up pre-activations a, b ([N, I], the input dtype)."""

    def __init__(self, experts, dispatched, gate_pre, up_pre, stream=None):
        self.experts = experts
        self.dispatched = dispatched
        self.gate_pre = gate_pre
        self.up_pre = up_pre
        self.stream = stream

    def backward(self, dy, strategy="auto", *, stream=None):
        """(dx_dispatched [N, H], dgate, dup, ddown): weight gradients float32, reduced over
        each expert's rows in a fixed order."""
        code = _choice(_EXPERTS_STRATEGIES, strategy, "MoeTrainingCache.backward", "strategy")
        stream = self.stream if stream is None else stream
        ex, d = self.experts, self.dispatched
        if fw.is_jax(dy):
            return _rj().swiglu_experts_backward(dy, d.x, d.offsets, ex.gate, ex.up, ex.down, self.gate_pre,
                                                 self.up_pre, strategy)
        return _experts_backward(ex.gate, ex.up, ex.down, dy, d.x, d.offsets, self.gate_pre, self.up_pre, code, stream)


class SwiGluExperts:
    """E bias-free SwiGLU experts: y = down · (silu(gate · x) * (up · x)).

    gate, up: [E, I, H]; down: [E, H, I]; one float dtype and device. Reuse one object
    across batches. Strategies: "auto" (default), "tensor_core", "scalar".

    fused_gate_up=True (I a multiple of 64) also keeps `gate_up` [E, 2I, H], gate and up
    interleaved by `interleave_gate_up`: the sm90 "tensor_core" forward (`forward_dispatched`, not
    the training forward) then computes gate · x and up · x in one grouped GEMM with the SwiGLU in
    its epilogue, bit for bit the result of the unfused path; every other path reads gate and up.
    This doubles the memory held for gate and up (gate and up stay too: the training forward, the
    backward and the other strategies read them). gate_up is made here, once, on the current
    stream: a forward on another stream must first wait for it. After gate or up change in place,
    set `experts.gate_up = interleave_gate_up(gate, up)` again. Without it `gate_up` is None.
    JAX arrays: gate_up is made by an XLA call; `forward_dispatched` reads it where it is not
    differentiated (under jax.grad it runs the training forward, which reads gate and up).
    """

    def __init__(self, gate, up, down, *, fused_gate_up=False):
        fused_gate_up = flag("SwiGluExperts", "fused_gate_up", fused_gate_up)
        self.gate, self.up, self.down = gate, up, down
        self.gate_up = None
        if fw.is_jax(gate):
            from .jax import _ffi

            _ffi.ensure_ready("SwiGluExperts")
            shape = tuple(int(s) for s in gate.shape)
            dtype = _ffi.spec(gate)[1]
            H = shape[-1] if shape else 0
            # gate_up's spec as interleave_gate_up would make it: its checks first, as for the other frameworks
            gate_up = None
            if fused_gate_up:
                gate_up = ((shape[0], 2 * shape[1], shape[2]) if len(shape) == 3 else (0,), dtype)
            _C.jax_validate_moe_experts(((0, H), dtype), _ffi.spec(gate), _ffi.spec(up), _ffi.spec(down), gate_up)
            if fused_gate_up:
                self.gate_up = _rj().interleave_gate_up(gate, up)
            return
        # Run the C++ checks once now (on zero rows: no work) so bad weights fail here.
        call = fw.Call("SwiGluExperts", {"gate": gate, "up": up, "down": down})
        if len(gate.shape) == 3:
            H = int(gate.shape[2])
            dtype = call.dtype_name(gate) if call.dtype_name(gate) in fw.FLOAT_DTYPES else "float32"
            x = call.empty((0, H), dtype)
            offsets = call.zeros((int(gate.shape[0]) + 1,), "int32")
            gate_up = _gate_up_output(call, gate) if fused_gate_up else None
            _run_experts(call, gate, up, down, x, offsets, call.empty((0, H), dtype), None, None, 2, gate_up)
            if fused_gate_up:
                _C.moe_interleave_gate_up(call.arg(gate), call.arg(up), call.arg(gate_up), call.stream)
                self.gate_up = gate_up
        else:
            from .errors import ShapeError

            raise ShapeError(f"SwiGluExperts: gate: expected 3 axes [E, I, H], got shape {list(gate.shape)}")

    @property
    def num_experts(self):
        return int(self.gate.shape[0])

    def forward_dispatched(self, d, strategy="auto", *, stream=None):
        """Expert outputs [N, H] for the dispatched rows of d (a DispatchedTokens)."""
        code = _choice(_EXPERTS_STRATEGIES, strategy, "SwiGluExperts.forward_dispatched", "strategy")
        if fw.is_jax(d.x):
            return _rj().swiglu_experts(d.x, d.offsets, self.gate, self.up, self.down, strategy, gate_up=self.gate_up)
        stream = d.stream if stream is None else stream
        return _experts_forward("SwiGluExperts.forward_dispatched", self.gate, self.up, self.down, d.x, d.offsets,
                                code, False, stream, self.gate_up)

    def forward_dispatched_training(self, d, strategy="auto", *, stream=None):
        """(y [N, H], MoeTrainingCache) for the backward."""
        code = _choice(_EXPERTS_STRATEGIES, strategy, "SwiGluExperts.forward_dispatched_training", "strategy")
        stream = d.stream if stream is None else stream
        if fw.is_jax(d.x):
            y, gate_pre, up_pre = _rj().swiglu_experts_training(d.x, d.offsets, self.gate, self.up, self.down,
                                                                strategy)
            return y, MoeTrainingCache(self, d, gate_pre, up_pre, stream)
        y, gate_pre, up_pre = _experts_forward("SwiGluExperts.forward_dispatched_training", self.gate, self.up,
                                               self.down, d.x, d.offsets, code, True, stream)
        return y, MoeTrainingCache(self, d, gate_pre, up_pre, stream)

    def __call__(self, x, logits, *, top_k, renormalize=True, strategy="auto", stream=None):
        """The whole layer: route(logits) -> dispatch(x) -> experts -> combine. [T, H] in x's
        dtype. Torch, CuPy and NumPy arrays take it as one call into libruDNN
        (moe_layer_forward: the steps' results bitwise, their intermediates in one workspace, a
        fraction of the host time of five calls); JAX arrays take the steps one by one."""
        if fw.is_jax(x) or fw.is_jax(logits):
            plan = route(logits, top_k, renormalize, stream=stream)
            d = plan.dispatch(x, stream=stream)
            return d.combine(self.forward_dispatched(d, strategy, stream=stream), stream=stream)
        op = "SwiGluExperts"
        k, renormalize = integer(op, "top_k", top_k), flag(op, "renormalize", renormalize)
        return self._layer(op, x, logits, None, k, renormalize, strategy, stream)

    def forward_sigmoid_grouped(self, x, logits, bias=None, *, top_k, groups, selected_groups, group_top_two=True,
                                renormalize=True, scale=1.0, strategy="auto", stream=None):
        """Like calling the experts, with `route_sigmoid_grouped(logits, bias, ...)` (one call into
        libruDNN as well, JAX arrays apart)."""
        if fw.is_jax(x) or fw.is_jax(logits):
            plan = route_sigmoid_grouped(logits, bias, top_k=top_k, groups=groups, selected_groups=selected_groups,
                                         group_top_two=group_top_two, renormalize=renormalize, scale=scale,
                                         stream=stream)
            d = plan.dispatch(x, stream=stream)
            return d.combine(self.forward_dispatched(d, strategy, stream=stream), stream=stream)
        op = "SwiGluExperts.forward_sigmoid_grouped"
        k, renormalize = integer(op, "top_k", top_k), flag(op, "renormalize", renormalize)
        grouped = dict(sigmoid_grouped=True, groups=integer(op, "groups", groups),
                       selected_groups=integer(op, "selected_groups", selected_groups),
                       group_top_two=flag(op, "group_top_two", group_top_two),
                       scale=float32_number(op, "scale", scale, "a finite value > 0"))
        return self._layer(op, x, logits, bias, k, renormalize, strategy, stream, grouped)

    def _layer(self, op, x, logits, bias, k, renormalize, strategy, stream, grouped=None):
        code = _choice(_EXPERTS_STRATEGIES, strategy, op, "strategy")
        call = fw.Call(op, {"x": x, "logits": logits, "gate": self.gate, "up": self.up, "down": self.down,
                            "gate_up": self.gate_up, "bias": bias}, stream, required=("x", "logits"))
        T, H = _rows_cols(x)
        out = call.empty((T, H), call.dtype_name(x) if call.dtype_name(x) in fw.FLOAT_DTYPES else "float32")
        _C.moe_layer_forward(call.arg(x), call.arg(logits), k, renormalize, call.arg(self.gate), call.arg(self.up),
                             call.arg(self.down), call.arg(self.gate_up), code, call.arg(out), None, call.stream,
                             call.workspace_alloc, bias=call.arg(bias), **(grouped or {}))
        return out


def _route_outputs(call, logits, T, k, E):
    """(indices, weights) [T, k]; empty for a top_k outside [1, E], which libruDNN then refuses
    (checked before anything of T x top_k is allocated)."""
    k = k if 1 <= k <= E else 0
    dtype = call.dtype_name(logits) if call.dtype_name(logits) in fw.FLOAT_DTYPES else "float32"
    return call.empty((T, k), "uint32"), call.empty((T, k), dtype)


def route(logits, top_k, renormalize=True, *, stream=None):
    """Softmax top-k routing of logits [T, E] (f32/f16/bf16): a RoutingPlan.

    Softmax over all experts in float32, top_k experts with ties to the lower id, optional
    renormalization of the selected weights, weights in the logits dtype. A row with a NaN or
    +inf logit, or only -inf logits, gets NaN weights.
    """
    op = "moe.route"
    k, renormalize = integer(op, "top_k", top_k), flag(op, "renormalize", renormalize)
    if fw.is_jax(logits):
        return _rj().route(logits, k, renormalize)
    call = fw.Call(op, {"logits": logits}, stream)
    T, E = _rows_cols(logits)
    indices, weights = _route_outputs(call, logits, T, k, E)
    _C.moe_route(call.arg(logits), k, renormalize, call.arg(indices), call.arg(weights), call.stream)
    return RoutingPlan(indices, weights, E, scoring="softmax", renormalize=renormalize, scale=1.0)


def route_sigmoid_grouped(logits, bias=None, *, top_k, groups, selected_groups, group_top_two=True, renormalize=True,
                          scale=1.0, stream=None):
    """DeepSeek-V3 routing: s = sigmoid(logits); bias (float32 [E], optional) is added for the
    selection only; the best `selected_groups` of `groups` expert groups (scored by the sum of
    their two best corrected scores, or their best) are kept and top_k is taken among their
    experts. Weights are s (renormalized if asked) times `scale`, in the logits dtype."""
    op = "moe.route_sigmoid_grouped"
    top_k, groups = integer(op, "top_k", top_k), integer(op, "groups", groups)
    selected_groups = integer(op, "selected_groups", selected_groups)
    group_top_two, renormalize = flag(op, "group_top_two", group_top_two), flag(op, "renormalize", renormalize)
    scale = float32_number(op, "scale", scale, "a finite value > 0")
    if fw.is_jax(logits):
        return _rj().route_sigmoid_grouped(logits, bias, top_k=top_k, groups=groups, selected_groups=selected_groups,
                                           group_top_two=group_top_two, renormalize=renormalize, scale=scale)
    call = fw.Call(op, {"logits": logits, "bias": bias}, stream)
    T, E = _rows_cols(logits)
    indices, weights = _route_outputs(call, logits, T, top_k, E)
    _C.moe_route_sigmoid_grouped(call.arg(logits), call.arg(bias), top_k, groups, selected_groups, group_top_two,
                                 renormalize, scale, call.arg(indices), call.arg(weights), call.stream)
    return RoutingPlan(indices, weights, E, scoring="sigmoid", renormalize=renormalize, scale=scale)


def selected_router_weights(logits, indices, scoring="softmax", renormalize=True, scale=1.0, *, stream=None):
    """float32 [T, k] weights of the experts `indices` [T, k] (uint32/int32/int64) chosen for
    logits [T, E]: softmax (over all E) or sigmoid scores, optionally renormalized over the k
    slots, times `scale`. A row with an index outside [0, E) is NaN."""
    renormalize = flag("moe.selected_router_weights", "renormalize", renormalize)
    scale = float32_number("moe.selected_router_weights", "scale", scale, "a finite value > 0")
    if fw.is_jax(logits):
        return _rj().selected_router_weights(logits, indices, scoring, renormalize, scale)
    code = _choice(_SCORINGS, scoring, "moe.selected_router_weights", "scoring")
    call = fw.Call("moe.selected_router_weights", {"logits": logits, "indices": indices}, stream)
    shape = tuple(int(s) for s in indices.shape) if len(indices.shape) == 2 else (0, 0)
    weights = call.empty(shape, "float32")
    _C.moe_selected_router_weights(call.arg(logits), call.arg(indices), code, renormalize, scale,
                                   call.arg(weights), call.stream)
    return weights


def selected_router_backward(logits, indices, grad_weights, scoring="softmax", renormalize=True, scale=1.0, *,
                             stream=None):
    """d loss / d logits [T, E] in the logits dtype, given d loss / d weights [T, k] of
    `selected_router_weights` (the selection itself gets no gradient)."""
    renormalize = flag("moe.selected_router_backward", "renormalize", renormalize)
    scale = float32_number("moe.selected_router_backward", "scale", scale, "a finite value > 0")
    if fw.is_jax(logits):
        return _rj().selected_router_backward(logits, indices, grad_weights, scoring, renormalize, scale)
    code = _choice(_SCORINGS, scoring, "moe.selected_router_backward", "scoring")
    call = fw.Call("moe.selected_router_backward", {"logits": logits, "indices": indices,
                                                    "grad_weights": grad_weights}, stream)
    dtype = call.dtype_name(logits) if call.dtype_name(logits) in fw.FLOAT_DTYPES else "float32"
    dlogits = call.empty(tuple(int(s) for s in logits.shape), dtype)
    _C.moe_selected_router_backward(call.arg(logits), call.arg(indices), call.arg(grad_weights), code,
                                    renormalize, scale, call.arg(dlogits), call.stream)
    return dlogits


def interleave_gate_up(gate, up, *, stream=None):
    """gate and up [E, I, H] interleaved into a new [E, 2I, H] array of their dtype and device:
    for every j in [0, I / 64), rows [128 j, 128 j + 64) of gate_up[e] are gate[e]'s rows
    [64 j, 64 j + 64) and rows [128 j + 64, 128 j + 128) are up[e]'s same rows. The layout of
    `SwiGluExperts(..., fused_gate_up=True).gate_up`. gate and up dense, one float dtype and
    device; I a multiple of 64 (UnsupportedError otherwise). JAX arrays go through an XLA call
    (differentiable: the gradient is de-interleaved into gate's and up's)."""
    op = "moe.interleave_gate_up"
    if fw.is_jax(gate) or fw.is_jax(up):
        return _rj().interleave_gate_up(gate, up)
    call = fw.Call(op, {"gate": gate, "up": up}, stream, required=("gate", "up"))
    gate_up = _gate_up_output(call, gate)
    _C.moe_interleave_gate_up(call.arg(gate), call.arg(up), call.arg(gate_up), call.stream)
    return gate_up


def _rows_cols(a):
    shape = tuple(int(s) for s in a.shape)
    return (shape[0], shape[1]) if len(shape) == 2 else (shape[0] if shape else 0, 0)


# ---- functional core (shared by the classes above and rudnn.torch.moe) -----------------------

def _dispatch_plan(call, expert_indices, num_experts):
    """(offsets [E+1], token_of_row [T*k], row_of_slot [T, k]) int32 of a selection."""
    T, k = (int(s) for s in expert_indices.shape)
    offsets = call.empty((num_experts + 1,), "int32")
    token_of_row = call.empty((T * k,), "int32")
    row_of_slot = call.empty((T, k), "int32")

    _C.moe_dispatch_plan(call.arg(expert_indices), num_experts, call.arg(offsets), call.arg(token_of_row),
                         call.arg(row_of_slot), None, call.stream, call.workspace_alloc)
    return offsets, token_of_row, row_of_slot


def _gather(call, x, token_of_row):
    rows = call.empty((int(token_of_row.shape[0]), int(x.shape[1])), call.dtype_name(x))
    _C.moe_gather_rows(call.arg(x), call.arg(token_of_row), call.arg(rows), call.stream)
    return rows


def _combine(op, y, row_of_slot, weights, num_tokens, stream):
    """Weighted (or, without weights, plain) sum of each token's dispatched rows: [T, H]."""
    _no_jax(op, y)
    call = fw.Call(op, {"y": y, "row_of_slot": row_of_slot, "weights": weights}, stream)
    hidden = int(y.shape[-1]) if len(y.shape) else 0
    out = call.empty((num_tokens, hidden), call.dtype_name(y) if call.dtype_name(y) in fw.FLOAT_DTYPES else "float32")
    _C.moe_combine(call.arg(y), call.arg(row_of_slot), call.arg(weights), call.arg(out), call.stream)
    return out


def _combine_backward(y, dout, row_of_slot, weights, code, stream):
    _no_jax("moe.combine_backward", y, dout)
    call = fw.Call("moe.combine_backward", {"y": y, "dout": dout, "row_of_slot": row_of_slot, "weights": weights},
                   stream)
    dy = call.empty(tuple(y.shape), call.dtype_name(y))
    dweights = call.empty(tuple(row_of_slot.shape), "float32")
    _C.moe_combine_backward(call.arg(y), call.arg(dout), call.arg(row_of_slot), call.arg(weights), call.arg(dy),
                            call.arg(dweights), code, call.stream)
    return dy, dweights


def _gate_up_output(call, gate):
    """The [E, 2I, H] array of interleave_gate_up; empty for a gate that is not [E, I, H], which
    libruDNN then refuses."""
    E, I, H = (int(s) for s in gate.shape) if len(gate.shape) == 3 else (0, 0, 0)
    dtype = call.dtype_name(gate) if call.dtype_name(gate) in fw.FLOAT_DTYPES else "float32"
    return call.empty((E, 2 * I, H), dtype)


def _run_experts(call, gate, up, down, x, offsets, y, gate_pre, up_pre, code, gate_up=None):
    # one export per array: the binding sizes the workspace and allocates it through the callback
    _C.moe_experts_forward(call.arg(x), call.arg(offsets), call.arg(gate), call.arg(up), call.arg(down), call.arg(y),
                           call.arg(gate_pre), call.arg(up_pre), code, None, call.stream, call.workspace_alloc,
                           gate_up=call.arg(gate_up))


def _experts_forward(op, gate, up, down, x, offsets, code, training, stream, gate_up=None):
    """y [N, H] (and, for training, the pre-activations a, b [N, I]); gate_up: see SwiGluExperts."""
    _no_jax(op, x)
    call = fw.Call(op, {"x": x, "offsets": offsets, "gate": gate, "up": up, "down": down, "gate_up": gate_up}, stream)
    dtype = call.dtype_name(x) if call.dtype_name(x) in fw.FLOAT_DTYPES else "float32"
    # rows no expert's segment covers (device offsets that do not tile the rows) come out zero:
    # libruDNN writes them, so the outputs need no fill here
    y = call.empty(tuple(x.shape), dtype)
    gate_pre = up_pre = None
    if training:
        inter = (int(x.shape[0]), int(gate.shape[1]))
        gate_pre, up_pre = call.empty(inter, dtype), call.empty(inter, dtype)
    _run_experts(call, gate, up, down, x, offsets, y, gate_pre, up_pre, code, gate_up)
    return (y, gate_pre, up_pre) if training else y


def _experts_backward(gate, up, down, dy, x, offsets, gate_pre, up_pre, code, stream):
    _no_jax("MoeTrainingCache.backward", dy)
    call = fw.Call("MoeTrainingCache.backward", {"dy": dy, "x": x, "gate": gate}, stream)
    dx = call.empty(tuple(x.shape), call.dtype_name(x))
    dgate = call.empty(tuple(gate.shape), "float32")
    dup = call.empty(tuple(up.shape), "float32")
    ddown = call.empty(tuple(down.shape), "float32")

    _C.moe_experts_backward(call.arg(dy), call.arg(x), call.arg(offsets), call.arg(gate), call.arg(up), call.arg(down),
                            call.arg(gate_pre), call.arg(up_pre), call.arg(dx), call.arg(dgate), call.arg(dup),
                            call.arg(ddown), code, None, call.stream, call.workspace_alloc)
    return dx, dgate, dup, ddown


__all__ = ["route", "route_sigmoid_grouped", "RoutingPlan", "DispatchedTokens", "SwiGluExperts", "MoeTrainingCache",
           "selected_router_weights", "selected_router_backward", "interleave_gate_up", "last_algorithm"]


def last_algorithm() -> str:
    """What the last experts forward or backward (SwiGluExperts, MoeTrainingCache.backward) on
    this thread ran: "cpu", "scalar", "tensor_core" or "tensor_core_fused" (Hopper's forward with
    SwiGLU in the gate/up GEMM's epilogue, for experts built with fused_gate_up) ("none" before
    any)."""
    return _C.moe_last_algorithm()

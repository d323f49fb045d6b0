"""The MoE dispatch and routing CUDA kernels' own source run on the CPU by host emulators and compared
bitwise with the CPU backend, which test_moe.py checks against the naive reference: the row gather, combine
and combine_backward (the "row gather and combine" section of cpp/src/moe/dispatch_cuda.cu:
16-byte packs or single elements, the batched slot loads of combine, the row claims that spare
combine_backward a zeroing of every row; tests/emulation/moe_combine_emu.cpp) and
the dispatch plan (its "dispatch plan" section: count walk, the parallel scans, place walk;
tests/emulation/moe_dispatch_emu.cpp). Skipped when g++ (C++20) or the CUDA toolkit's headers are
missing."""

import os
import subprocess

import pytest

from util import ROOT, build_emulator


def _kernels_source(mutation=None):
    src = open(os.path.join(ROOT, "cpp", "src", "moe", "dispatch_cuda.cu")).read()
    start = src.index("// ---- row gather and combine (tests/emulation/moe_combine_emu.cpp")
    end = src.index("// (tests/emulation/moe_combine_emu.cpp runs everything from the section mark above")
    body = src[start:end]
    if mutation:
        assert mutation[0] in body, mutation[0]
        body = body.replace(*mutation)
    return "namespace rudnn::moe {\nnamespace emu_k {\n" + body + "}\n}\n"


def test_gather_and_combine_kernels_match_the_cpu_backend():
    exe = build_emulator("moe_combine_emu.cpp", _kernels_source())
    result = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    lines = result.stdout.strip().splitlines()
    assert result.returncode == 0 and len(lines) == 8 and all(line.endswith(" ok") for line in lines), \
        result.stdout + result.stderr
    for lanes in ("lanes=1", "lanes=8", "lanes=4"):  # both paths ran, for 16- and 32-bit types
        assert any(lanes in line for line in lines), result.stdout


def test_combine_backward_emulator_catches_unchecked_claims():
    """A planted bug: a row counted as claimed without checking that its claim's slot points at
    it keeps its garbage (the emulator plants such claims in rows no slot points at)."""
    exe = build_emulator("moe_combine_emu.cpp", _kernels_source(
        ("claimed = s < slots && row_of_slot[s] == std::int64_t(blockIdx.x);", "claimed = s < slots;")))
    result = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and "MISMATCH" in result.stdout, result.stdout + result.stderr


def _run_uncovered(mutation=None):
    exe = build_emulator("moe_combine_emu.cpp", _kernels_source(mutation))
    result = subprocess.run([str(exe), "uncovered"], capture_output=True, text=True, timeout=300)
    return result, result.stdout.strip().splitlines()


def test_rows_no_expert_covers_are_zeroed_and_no_other_byte_written():
    """zero_uncovered_rows_kernel (the experts' outputs y, a, b, dx need no fill before the call):
    offsets that tile the rows (exactly, clamped past either end) leave every byte as it was;
    short, late, unordered and gapped offsets zero exactly the rows no segment_of covers, across
    each output's width and not the padding between rows; 300 experts over 1000 rows, several
    rows a block."""
    result, lines = _run_uncovered()
    assert result.returncode == 0 and len(lines) == 10 and all(line.endswith(" ok") for line in lines), \
        result.stdout + result.stderr
    zeroed = {line.split()[1]: line.split()[3] for line in lines}
    assert zeroed["tiled"] == zeroed["tiled_past_end"] == zeroed["unordered_covering"] == "zeroed=0", lines
    assert zeroed["unordered_gap"] == "zeroed=6" and zeroed["many_holes"] == "zeroed=4", lines


def test_uncovered_rows_emulator_catches_a_planted_bug():
    """A planted bug: the tiling test forgetting offsets[E] < N, so rows past the last expert keep
    whatever the output held."""
    result, lines = _run_uncovered(("(e == E && o < rows) || ", ""))
    assert result.returncode == 1 and any("short_end" in line and "MISMATCH" in line for line in lines), \
        result.stdout + result.stderr


# ---- routing (cpp/src/moe/route_cuda.cu) ---------------------------------------------------

def _kernels_text(source, start, end, mutation=None):
    """The text of cpp/src/moe/<source> from `start` to `end` (an anonymous namespace's kernels),
    with `mutation` (old, new) applied once, wrapped as namespace rudnn::moe::emu_k."""
    src = open(os.path.join(ROOT, "cpp", "src", "moe", source)).read()
    body = src[src.index(start):src.index(end)]
    if mutation:
        assert body.count(mutation[0]) == 1, mutation[0]
        body = body.replace(*mutation)
    return "namespace rudnn::moe {\nnamespace emu_k {\nusing namespace cuda;\n" + body + "}\n}\n"


def _run_emulator(emulator, kernels):
    """(result, its stdout lines) of tests/emulation/<emulator> built on the kernel text."""
    result = subprocess.run([str(build_emulator(emulator, kernels))], capture_output=True, text=True, timeout=600)
    return result, result.stdout.strip().splitlines()


def _run_route_emulator(mutation=None):
    return _run_emulator("moe_route_emu.cpp", _kernels_text("route_cuda.cu", "constexpr int kThreads = 128;",
                                                            "}  // namespace\n\nvoid route_cuda(", mutation))


def test_routing_kernels_match_the_cpu_backend():
    """route_softmax, route_sigmoid_grouped, selected_router and its backward, their own source on
    the CPU against the CPU backend: the same experts in the same slots (ties to the lower id),
    weights and dlogits within a rounding of their dtype (exactly 0 where the CPU's are: one
    renormalized slot); NaN, +inf and all -inf logits, E = 1024 with top_k = 64, DeepSeek-V3's
    grouped shape, repeated and invalid indices in all three index dtypes."""
    result, lines = _run_route_emulator()
    results = [line for line in lines if not line.startswith("  ")]
    assert result.returncode == 0 and len(results) == 11 and all(line.endswith(" ok") for line in results), \
        result.stdout + result.stderr


def test_routing_emulator_catches_a_planted_bug():
    """A planted bug: the renormalized backward forgetting the division by the selected sum."""
    result, lines = _run_route_emulator(("dp[j] = renormalize ? scale * (g - gq) / sum : scale * g;",
                                         "dp[j] = renormalize ? scale * (g - gq) : scale * g;"))
    assert result.returncode == 1 and any("dlogits" in line for line in lines), result.stdout + result.stderr


# ---- the scalar experts (cpp/src/moe/experts_scalar_cuda.cu) ---------------------------------

def _run_experts_emulator(mutation=None):
    return _run_emulator("moe_experts_emu.cpp", _kernels_text(
        "experts_scalar_cuda.cu", "constexpr int kTile = 16;",
        "}  // namespace\n\nstd::size_t experts_forward_workspace_bytes_cuda(", mutation))


def test_scalar_experts_kernels_match_the_cpu_backend():
    """The scalar strategy's kernels (row tiles found by binary search, 16x16 tiled products,
    SwiGLU forward and backward, per-expert weight gradients) in the launches of
    experts_forward_cuda and experts_backward_cuda, against the CPU backend: y, a, b, dx and the
    weight gradients; idle experts, segments ending inside a tile, sizes off the 16 grid, padded
    x and dy rows, every dtype."""
    result, lines = _run_experts_emulator()
    results = [line for line in lines if not line.startswith("  ")]
    assert result.returncode == 0 and len(results) == 4 and all(line.endswith(" ok") for line in results), \
        result.stdout + result.stderr


def test_scalar_experts_emulator_catches_a_planted_bug():
    """A planted bug: a row tile's expert found one too far when the binary search lands on an
    expert without rows (its first tile equals the next expert's)."""
    result, lines = _run_experts_emulator(("if (tile_offsets[mid] <= tile) lo = mid;",
                                           "if (tile_offsets[mid] < tile) lo = mid;"))
    assert result.returncode == 1 and "MISMATCH" in result.stdout, result.stdout + result.stderr


# ---- dispatch plan --------------------------------------------------------------------------

_PLAN_START = "// ---- dispatch plan (tests/emulation/moe_dispatch_emu.cpp"
_PLAN_END = "// (tests/emulation/moe_dispatch_emu.cpp runs everything from the dispatch plan mark"


def _plan_source(mutation=None):
    src = open(os.path.join(ROOT, "cpp", "src", "moe", "dispatch_cuda.cu")).read()
    body = src[src.index(_PLAN_START):src.index(_PLAN_END)]
    edit = "extern __shared__ int cursor[];"
    assert edit in body
    body = body.replace(edit, "int* cursor = reinterpret_cast<int*>(emu_smem);")
    if mutation:
        old, new = mutation
        assert body.count(old) >= 1, old
        body = body.replace(old, new, 1)
    return "namespace rudnn::moe {\nnamespace emu_k {\n" + body + "}\n}\n"


def _run_plan_emulator(mutation=None, quick=False):
    exe = build_emulator("moe_dispatch_emu.cpp", _plan_source(mutation))
    result = subprocess.run([str(exe)] + (["quick"] if quick else []), capture_output=True, text=True, timeout=600)
    return result, result.stdout.strip().splitlines()


def test_dispatch_plan_kernels_match_the_cpu_backend():
    """The count walk, the two scans and the place walk (or, for slots that fit one chunk, the
    single-launch plan) give the CPU backend's offsets and row order bitwise: small cases, E = 300
    and 1024 on both paths, two chunks, no tokens, and T = 100003 at k = 6 (1876 chunks of 320
    slots: the widest scan block) with invalid ids."""
    result, lines = _run_plan_emulator()
    assert result.returncode == 0 and len(lines) == 7 and all(line.endswith(" ok") for line in lines), \
        result.stdout + result.stderr
    assert any("chunks=1876 chunk=320" in line for line in lines), result.stdout
    assert any("E=1024 chunks=1 " in line for line in lines) and any("chunks=2 " in line for line in lines), lines


# Planted bugs the comparison must catch: a warp scan that skips the lane right below (wrong
# offsets and bases), and a place walk that marks all its chunk's rows as rows of no token.
@pytest.mark.parametrize("mutation", [("if (lane >= o) inclusive += below;", "if (lane > o) inclusive += below;"),
                                      ("std::max(begin, used)", "begin")],
                         ids=["scan_skips_a_lane", "marks_used_rows"])
def test_dispatch_plan_emulator_catches_a_planted_bug(mutation):
    result, lines = _run_plan_emulator(mutation, quick=True)
    assert result.returncode == 1 and any(line.endswith(" MISMATCH") for line in lines), result.stdout + result.stderr


# ---- expert ids outside [0, E) through the whole chain ------------------------------------------

def _run_invalid_ids_emulator(combine_mutation=None):
    exe = build_emulator("moe_invalid_ids_emu.cpp", _plan_source(),
                         extra_includes={"combine.inc": _kernels_source(combine_mutation)})
    result = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    return result, result.stdout.strip().splitlines()


def test_invalid_expert_ids_give_nan_tokens_on_the_cuda_kernels():
    """Device expert ids are not read on the host, so the CUDA kernels define the result of an id
    outside [0, E): the dispatch plan, gather, combine, dispatch_backward and combine_backward
    kernels' own source, run on planted ids (-1, E, E + 1000; int32, int64, uint32; one slot, a
    whole token, every slot, across chunk edges): the slot gets no row, every token with such a
    slot comes out of combine and dispatch_backward NaN in every column, every other token exact,
    dweights NaN exactly at those slots, dy zero on the rows of no token."""
    result, lines = _run_invalid_ids_emulator()
    assert result.returncode == 0 and len(lines) == 5 and all(line.endswith(" ok") for line in lines), \
        result.stdout + result.stderr
    assert any("nan_tokens=3 " in line and "all_invalid" in line for line in lines), result.stdout
    for lanes in ("lanes=1", "lanes=8", "lanes=4"):
        assert any(lanes in line for line in lines), result.stdout


def test_invalid_ids_emulator_catches_a_combine_that_skips_bad_slots():
    """A planted bug: combine skipping a slot with no row instead of making its token NaN (the
    silently wrong finite sum the definition rules out)."""
    result, lines = _run_invalid_ids_emulator(("        bad = true;\n        continue;", "        continue;"))
    assert result.returncode == 1 and any("is not NaN" in line for line in lines), result.stdout + result.stderr


# ---- fused SwiGLU epilogue (cpp/src/moe/swiglu_epilogue.hpp) ----------------------------------

def _swiglu_epilogue_run(mutation=None):
    text = open(os.path.join(ROOT, "cpp", "src", "moe", "swiglu_epilogue.hpp")).read()
    if mutation:
        assert text.count(mutation[0]) == 1, mutation[0]
        text = text.replace(*mutation)
    exe = build_emulator("moe_swiglu_epilogue_emu.cpp", text, needs_cutlass=True)
    result = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    return result, result.stdout.strip().splitlines()


def test_swiglu_epilogue_tile_store_pairs_gate_and_up_and_stays_in_bounds():
    """The fused gate/up GEMM's epilogue store, run on the CPU for every thread of both real
    TiledMmas (cooperative: 128-row tiles, 256 threads; ping-pong: 64-row tiles, 128 threads): the
    accumulator pairing it assumes holds, h = silu(a) * b is stored bitwise as the documented math
    gives it (a, b rounded first), and rows past the expert's, like the columns of h past the
    tile's 64, stay untouched (full tile, 3/5 of it, 1 row; bf16 and f16)."""
    result, lines = _swiglu_epilogue_run()
    assert result.returncode == 0 and len(lines) == 16 and all(line.endswith(" ok") for line in lines), \
        result.stdout + result.stderr
    for tile in ("128-row", "64-row"):
        assert sum(tile in line for line in lines) == 8, lines


@pytest.mark.parametrize("mutation", [
    # a and b swapped: silu(b) * a
    ("swiglu_of<Element>(acc(i), acc(i + kHalf))", "swiglu_of<Element>(acc(i + kHalf), acc(i))"),
    # rows past the expert's written (the next expert's rows in the GEMM's D)
    ("if (row < rows && col < cols) {", "if (col < cols) {"),
    # a and b not rounded to the element type first (fused and unfused would differ)
    ("const float a = static_cast<float>(Element(acc_a)), b = static_cast<float>(Element(acc_b));",
     "const float a = acc_a, b = acc_b;"),
], ids=["swapped", "rows", "unrounded"])
def test_swiglu_epilogue_emulator_catches_planted_bugs(mutation):
    result, lines = _swiglu_epilogue_run(mutation)
    assert result.returncode == 1 and "MISMATCH" in result.stdout, result.stdout + result.stderr

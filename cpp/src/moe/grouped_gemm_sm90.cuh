// The CUTLASS 3.x ptr-array grouped GEMM behind grouped_gemm_sm90.hpp. Included only by the
// per-dtype instantiation files (template-heavy: one instantiation per translation unit).
#pragma once

#include <string>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

#include "core/cuda_check.hpp"
#include "core/device.hpp"
#include "cutlass/epilogue/collective/default_epilogue_array.hpp"
#include "cutlass/epilogue/thread/linear_combination.h"

#include "moe/grouped_gemm_sm90.hpp"
#include "moe/problem.hpp"  // segment_of
#include "moe/swiglu_epilogue.hpp"

namespace rudnn::moe::sm90 {

using namespace cute;

// The CUTLASS layouts of each Layouts value (grouped_gemm_sm90.hpp), the output type and the
// source type (void: no source C, D = A · B).
template <Layouts L, class Element> struct LayoutsOf;
template <class Element> struct LayoutsOf<Layouts::nt, Element> {
  using A = cutlass::layout::RowMajor;     // [M, K], K contiguous
  using B = cutlass::layout::ColumnMajor;  // K x N with K contiguous: the [N, K] expert weights
  using ElementD = Element;
  using ElementC = void;
};
template <class Element> struct LayoutsOf<Layouts::nn, Element> {
  using A = cutlass::layout::RowMajor;
  using B = cutlass::layout::RowMajor;     // K x N with N contiguous
  using ElementD = float;
  using ElementC = void;
};
template <class Element> struct LayoutsOf<Layouts::nn_accumulate, Element> : LayoutsOf<Layouts::nn, Element> {
  using ElementD = Element;                // D = A · B + C, rounded once
  using ElementC = float;
};
template <class Element> struct LayoutsOf<Layouts::tn, Element> {
  using A = cutlass::layout::ColumnMajor;  // M x K with M contiguous: rows of activations, transposed
  using B = cutlass::layout::RowMajor;
  using ElementD = float;
  using ElementC = void;
};

template <class Element> struct LayoutsOf<Layouts::nt_swiglu, Element> : LayoutsOf<Layouts::nt, Element> {};
static_assert(kSwigluBlock == kMoeGateUpBlock, "the epilogue's gate/up blocks are moe_interleave_gate_up's");

// The epilogue of Layouts::nt_swiglu: CUTLASS's ptr-array epilogue without shared memory, its
// per-element operator replaced by store_swiglu_tile (swiglu_epilogue.hpp). The GEMM's N is 2I
// (gate_up's interleaved rows); D is h, [M, I], its row stride in dD. Each thread stores straight
// from its accumulators: half the tile's columns, two h values (4 bytes) per store.
template <class Element, class StrideD, int kRows>
class SwigluEpilogueArray
    : public cutlass::epilogue::collective::DefaultEpilogueArray<
          void, StrideD, StrideD,
          cutlass::epilogue::thread::LinearCombination<Element, 1, float, float,
                                                       cutlass::epilogue::thread::ScaleType::OnlyAlphaScaling,
                                                       cutlass::FloatRoundStyle::round_to_nearest, Element>,
          cutlass::epilogue::PtrArrayNoSmemWarpSpecialized> {
  using Base = typename SwigluEpilogueArray::DefaultEpilogueArray;

 public:
  using typename Base::Params;

  CUTLASS_HOST_DEVICE explicit SwigluEpilogueArray(Params const& params) : Base(params), params_(params) {}

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
            class TiledMma, class ResidueMNK>
  CUTLASS_HOST_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK, BlockCoordMNKL blk_coord_mnkl,
                                      cute::Tensor<FrgEngine, FrgLayout> const& accumulators, TiledMma tiled_mma,
                                      ResidueMNK, int thread_idx, char*) {
    static_assert(std::is_same_v<BlockShapeMNK, SwigluTile<kRows>>, "store_swiglu_tile's tile");
    static_assert(std::is_same_v<TiledMma, SwigluTiledMma<Element, kRows>>, "store_swiglu_tile's fragment layout");
    using InternalStrideD = cute::remove_pointer_t<StrideD>;
    static_assert(cute::is_static<cute::remove_cvref_t<decltype(get<1>(InternalStrideD{}))>>::value,
                  "row-major h: the leading dimension is the stride's first mode");
    const int rows = int(get<0>(problem_shape_mnkl)), cols = int(get<1>(problem_shape_mnkl)) / 2;
    const int m_block = int(get<0>(blk_coord_mnkl)), n_block = int(get<1>(blk_coord_mnkl));
    const int group = int(get<3>(blk_coord_mnkl));
    const std::int64_t ld = get<0>(params_.dD[group]);
    const int row0 = m_block * kRows, col0 = n_block * kSwigluBlock;
    Element* out = params_.ptr_D[group] + std::int64_t(row0) * ld + col0;
    store_swiglu_tile<Element>(tiled_mma, thread_idx, accumulators, out, ld, rows - row0, cols - col0);
  }

 private:
  Params params_;
};

// The tile shape, cluster shape and the kernel and epilogue schedules of each Schedule
// (grouped_gemm_sm90.hpp). Clusters only along N (multicast): N is the same for every group, so the
// two CTAs of a cluster always work on the same expert's rows (the grouped tile scheduler walks a
// group's tiles in cluster units) and share its A tiles; a cluster along M would pair tiles past a
// short segment's end with nothing to multicast.
template <Schedule S> struct ScheduleOf;
template <> struct ScheduleOf<Schedule::cooperative> {
  using TileShape = Shape<_128, _128, _64>;  // two consumer warpgroups stacked along M on one tile
  using ClusterShape = Shape<_1, _1, _1>;
  using Kernel = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using Epilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
};
template <> struct ScheduleOf<Schedule::pingpong> {
  using TileShape = Shape<_64, _128, _64>;  // one m64n128 warpgroup per tile, two tiles in flight
  using ClusterShape = Shape<_1, _1, _1>;
  using Kernel = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
  using Epilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
};
template <> struct ScheduleOf<Schedule::multicast> : ScheduleOf<Schedule::cooperative> {
  using ClusterShape = Shape<_1, _2, _1>;  // A multicast to the CTAs of two neighbouring N tiles
};
template <> struct ScheduleOf<Schedule::pingpong_wide> : ScheduleOf<Schedule::pingpong> {
  using TileShape = Shape<_128, _128, _64>;  // one warpgroup per 128x128 tile (128 accumulators a thread)
};

// The collective epilogue of each layout: CUTLASS's TMA epilogue (D = alpha A B + beta C, C
// row-major like D, or no source C when ElementC is void), or the SwiGLU one.
template <Layouts L, Schedule S, class Element, class LayoutD, class ElementD, int kAlignmentD>
struct EpilogueOf {
  using ElementC = typename LayoutsOf<L, Element>::ElementC;
  static constexpr int kAlignmentC = std::is_void_v<ElementC> ? kAlignmentD : 16 / int(sizeof(
                                         std::conditional_t<std::is_void_v<ElementC>, char, ElementC>));
  using type = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename ScheduleOf<S>::TileShape,
      typename ScheduleOf<S>::ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      ElementC, LayoutD*, kAlignmentC,
      ElementD, LayoutD*, kAlignmentD, typename ScheduleOf<S>::Epilogue,
      cutlass::epilogue::fusion::LinearCombination<ElementD, float, ElementC, float>>::CollectiveOp;
};
template <Schedule S, class Element, class LayoutD, class ElementD, int kAlignmentD>
struct EpilogueOf<Layouts::nt_swiglu, S, Element, LayoutD, ElementD, kAlignmentD> {
  static constexpr int kRows = size<0>(typename ScheduleOf<S>::TileShape{});
  using type = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<
      SwigluEpilogueArray<Element, cutlass::detail::TagToStrideC_t<LayoutD*>, kRows>>;
};

// D = A · B per group, fp32 accumulation, D row-major [M, N] (nt_swiglu: h [M, N / 2]).
template <Layouts L, class Element, Schedule S = Schedule::cooperative>
struct GroupedGemmConfig {
  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;  // (M, N, K) per group
  using LayoutA = typename LayoutsOf<L, Element>::A;
  using LayoutB = typename LayoutsOf<L, Element>::B;
  using LayoutD = cutlass::layout::RowMajor;
  using ElementD = typename LayoutsOf<L, Element>::ElementD;
  using ElementC = typename LayoutsOf<L, Element>::ElementC;
  static constexpr bool kHasSource = !std::is_void_v<ElementC>;
  static constexpr int kAlignment = 16 / sizeof(Element);  // TMA: 16-byte rows and bases
  static constexpr int kAlignmentD = 16 / sizeof(ElementD);
  using TileShape = typename ScheduleOf<S>::TileShape;
  using ClusterShape = typename ScheduleOf<S>::ClusterShape;
  using KernelSchedule = typename ScheduleOf<S>::Kernel;

  using CollectiveEpilogue = typename EpilogueOf<L, S, Element, LayoutD, ElementD, kAlignmentD>::type;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA*, kAlignment, Element, LayoutB*,
      kAlignment, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  using StrideC = typename Kernel::InternalStrideC;
  using Shape3 = typename ProblemShape::UnderlyingProblemShape;
};

// The per-group argument arrays, carved from the front of the workspace.
template <class Config>
struct GroupArrays {
  using Element = typename Config::Gemm::ElementA;
  using ElementD = typename Config::ElementD;
  using ElementC = std::conditional_t<Config::kHasSource, typename Config::ElementC, char>;
  typename Config::Shape3* shapes;
  const Element** a;
  const Element** b;
  ElementD** d;
  const ElementC** c;  // the source C (Config::kHasSource only)
  typename Config::StrideA* stride_a;
  typename Config::StrideB* stride_b;
  typename Config::StrideD* stride_d;
  typename Config::StrideC* stride_c;

  static std::size_t align(std::size_t v) { return (v + 255) / 256 * 256; }
  static std::size_t bytes(int groups) {
    const std::size_t g = std::size_t(groups);
    return align(g * sizeof(typename Config::Shape3)) + 4 * align(g * sizeof(void*)) +
           align(g * sizeof(typename Config::StrideA)) + align(g * sizeof(typename Config::StrideB)) +
           align(g * sizeof(typename Config::StrideD)) + align(g * sizeof(typename Config::StrideC));
  }
  static GroupArrays carve(void* workspace, int groups) {
    const std::size_t g = std::size_t(groups);
    char* p = static_cast<char*>(workspace);
    GroupArrays r;
    auto take = [&](std::size_t n) {
      char* q = p;
      p += align(n);
      return q;
    };
    r.shapes = reinterpret_cast<typename Config::Shape3*>(take(g * sizeof(typename Config::Shape3)));
    r.a = reinterpret_cast<const Element**>(take(g * sizeof(void*)));
    r.b = reinterpret_cast<const Element**>(take(g * sizeof(void*)));
    r.d = reinterpret_cast<ElementD**>(take(g * sizeof(void*)));
    r.c = reinterpret_cast<const ElementC**>(take(g * sizeof(void*)));
    r.stride_a = reinterpret_cast<typename Config::StrideA*>(take(g * sizeof(typename Config::StrideA)));
    r.stride_b = reinterpret_cast<typename Config::StrideB*>(take(g * sizeof(typename Config::StrideB)));
    r.stride_d = reinterpret_cast<typename Config::StrideD*>(take(g * sizeof(typename Config::StrideD)));
    r.stride_c = reinterpret_cast<typename Config::StrideC*>(take(g * sizeof(typename Config::StrideC)));
    return r;
  }
};

// A stride with its one dynamic mode (the leading dimension) set to `ld`; the other modes are
// static (1 for the contiguous mode, 0 for the batch mode).
template <class Stride>
CUTE_HOST_DEVICE Stride leading_stride(std::int64_t ld) {
  Stride s{};
  if constexpr (cute::is_static<cute::remove_cvref_t<decltype(get<0>(s))>>::value)
    get<1>(s) = ld;
  else
    get<0>(s) = ld;
  return s;
}

template <class T>
CUTE_HOST_DEVICE T* place(const Operand& op, int e, std::int64_t lo) {
  char* base = static_cast<char*>(const_cast<void*>(op.base));
  const std::int64_t offset = op.at == Placement::segment ? lo * op.ld : e * op.expert_stride;
  return reinterpret_cast<T*>(base) + offset;
}

// One thread per group: problem size, pointers and strides of expert e = g % E, operand set
// g / E. Offsets are clamped to [0, rows] and made non-decreasing (never trusted). A group
// whose expert has no rows gets M = 0: no tiles, nothing read or written.
template <class Config>
__global__ void build_group_arrays_kernel(SegmentGemm g, GroupArrays<Config> arrays) {
  using Element = typename GroupArrays<Config>::Element;
  using ElementD = typename GroupArrays<Config>::ElementD;
  const int group = blockIdx.x * blockDim.x + threadIdx.x;
  if (group >= g.experts * g.sets) return;
  const int e = group % g.experts;
  const OperandSet& op = g.set[group / g.experts];
  const Segment rows = segment_of(g.offsets, e, g.rows);
  const std::int64_t lo = rows.begin;
  const int count = int(rows.end - rows.begin);
  const int m = count == 0 ? 0 : op.m < 0 ? count : op.m;
  arrays.shapes[group] = typename Config::Shape3{m, op.n < 0 ? count : op.n, op.k < 0 ? count : op.k};
  arrays.a[group] = place<const Element>(op.a, e, lo);
  arrays.b[group] = place<const Element>(op.b, e, lo);
  arrays.d[group] = place<ElementD>(op.d, e, lo);
  arrays.stride_a[group] = leading_stride<typename Config::StrideA>(op.a.ld);
  arrays.stride_b[group] = leading_stride<typename Config::StrideB>(op.b.ld);
  arrays.stride_d[group] = leading_stride<typename Config::StrideD>(op.d.ld);
  if constexpr (Config::kHasSource) {
    arrays.c[group] = place<const typename Config::ElementC>(op.c, e, lo);
    arrays.stride_c[group] = leading_stride<typename Config::StrideC>(op.c.ld);
  }
}

template <class Config>
typename Config::Gemm::Arguments make_arguments(const GroupArrays<Config>& arrays, int groups, int device) {
  cutlass::KernelHardwareInfo hw;
  hw.device_id = device;
  hw.sm_count = core::device_props(device).sm_count;
  typename Config::Gemm::Arguments args;
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.problem_shape = {groups, arrays.shapes, nullptr};  // sizes live on the device only
  args.mainloop = {arrays.a, arrays.stride_a, arrays.b, arrays.stride_b};
  args.epilogue.thread.alpha = 1.0f;
  if constexpr (Config::kHasSource) {  // D = A · B + C
    args.epilogue.thread.beta = 1.0f;
    args.epilogue.ptr_C = arrays.c;
    args.epilogue.dC = arrays.stride_c;
  } else {
    args.epilogue.thread.beta = 0.0f;
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = nullptr;
  }
  args.epilogue.ptr_D = arrays.d;
  args.epilogue.dD = arrays.stride_d;
  args.hw_info = hw;
  return args;
}

inline void check_status(cutlass::Status status, const char* what) {
  if (status != cutlass::Status::kSuccess)
    throw Error(ErrorKind::cuda, std::string("SwiGluExperts (tensor_core): CUTLASS ") + what + " failed: " +
                                     cutlassGetStatusString(status));
}

template <Layouts L, class Element, Schedule S = Schedule::cooperative>
std::size_t workspace_bytes_impl(int groups, int device) {
  using Config = GroupedGemmConfig<L, Element, S>;
  const GroupArrays<Config> none{};
  const auto args = make_arguments<Config>(none, groups, device);
  return GroupArrays<Config>::bytes(groups) + GroupArrays<Config>::align(Config::Gemm::get_workspace_size(args));
}

template <Layouts L, class Element, Schedule S = Schedule::cooperative>
void run_impl(const SegmentGemm& g, void* workspace, std::size_t workspace_size, int device, cudaStream_t stream) {
  using Config = GroupedGemmConfig<L, Element, S>;
  const int groups = g.experts * g.sets;
  const GroupArrays<Config> arrays = GroupArrays<Config>::carve(workspace, groups);
  build_group_arrays_kernel<Config><<<(groups + 127) / 128, 128, 0, stream>>>(g, arrays);
  RUDNN_CUDA_CHECK_LAUNCH(build_group_arrays_kernel);
  const auto args = make_arguments<Config>(arrays, groups, device);
  const std::size_t arrays_bytes = GroupArrays<Config>::bytes(groups);
  if (workspace_size < arrays_bytes + Config::Gemm::get_workspace_size(args))
    throw Error(ErrorKind::value, "SwiGluExperts (tensor_core): workspace too small");
  typename Config::Gemm gemm;
  check_status(gemm.can_implement(args), "can_implement");
  check_status(gemm.initialize(args, static_cast<char*>(workspace) + arrays_bytes, stream), "initialize");
  check_status(gemm.run(stream), "run");
  RUDNN_CUDA_CHECK_LAUNCH(grouped_gemm);
}

}  // namespace rudnn::moe::sm90

// The two functions grouped_gemm_sm90.hpp declares for one instantiation, defined in its own
// translation unit (grouped_gemm_sm90_<NAME>_<DTYPE>.cu: CUTLASS 3.x kernels compile slowly, and
// separate files build in parallel).
#define RUDNN_SM90_GEMM_DEFINE(NAME, DTYPE, LAYOUTS, SCHEDULE, ELEMENT)                                       \
  namespace rudnn::moe::sm90::detail {                                                                     \
  std::size_t workspace_bytes_##NAME##_##DTYPE(int groups, int device) {                                   \
    return workspace_bytes_impl<Layouts::LAYOUTS, ELEMENT, Schedule::SCHEDULE>(groups, device);            \
  }                                                                                                        \
  void run_##NAME##_##DTYPE(const SegmentGemm& g, void* workspace, std::size_t workspace_size, int device, \
                            cudaStream_t stream) {                                                         \
    run_impl<Layouts::LAYOUTS, ELEMENT, Schedule::SCHEDULE>(g, workspace, workspace_size, device, stream); \
  }                                                                                                        \
  }

// The CUTLASS 2.x grouped GEMM behind grouped_gemm_sm80.hpp (included by the per-dtype files).
#pragma once

#include <string>

#include "cutlass/cutlass.h"
#include "cutlass/epilogue/thread/linear_combination.h"
#include "cutlass/gemm/device/gemm_grouped.h"
#include "cutlass/gemm/kernel/default_gemm_grouped.h"

#include "core/cuda_check.hpp"
#include "moe/grouped_gemm_sm80.hpp"

namespace rudnn::moe::sm80 {

template <class Element>
struct GroupedGemmConfig {
  static constexpr int kAlignment = 8;  // 16-byte vector loads (cp.async)
  using Epilogue = cutlass::epilogue::thread::LinearCombination<Element, kAlignment, float, float>;
  // 128x128x32 block tiles of four 64x64 warp tiles, 16x8x16 mma.sync, 4 cp.async stages.
  using Kernel = typename cutlass::gemm::kernel::DefaultGemmGrouped<
      Element, cutlass::layout::RowMajor, cutlass::ComplexTransform::kNone, kAlignment,     // A
      Element, cutlass::layout::ColumnMajor, cutlass::ComplexTransform::kNone, kAlignment,  // B: [N, K] weights
      Element, cutlass::layout::RowMajor, float, cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
      cutlass::gemm::GemmShape<128, 128, 32>, cutlass::gemm::GemmShape<64, 64, 32>,
      cutlass::gemm::GemmShape<16, 8, 16>, Epilogue, cutlass::gemm::threadblock::GemmBatchedIdentityThreadblockSwizzle,
      4, cutlass::gemm::kernel::GroupScheduleMode::kDeviceOnly>::GemmKernel;
  using Gemm = cutlass::gemm::device::GemmGrouped<Kernel>;
};

template <class Element>
struct GroupArrays {
  cutlass::gemm::GemmCoord* shapes;
  Element** a;
  Element** b;
  Element** d;
  std::int64_t* lda;
  std::int64_t* ldb;
  std::int64_t* ldd;

  static std::size_t align(std::size_t v) { return (v + 255) / 256 * 256; }
  static std::size_t bytes(int groups) {
    const std::size_t g = std::size_t(groups);
    return align(g * sizeof(cutlass::gemm::GemmCoord)) + 3 * align(g * sizeof(void*)) + 3 * align(g * 8);
  }
  static GroupArrays carve(void* workspace, int groups) {
    const std::size_t g = std::size_t(groups);
    char* p = static_cast<char*>(workspace);
    auto take = [&](std::size_t n) {
      char* q = p;
      p += align(n);
      return q;
    };
    GroupArrays r;
    r.shapes = reinterpret_cast<cutlass::gemm::GemmCoord*>(take(g * sizeof(cutlass::gemm::GemmCoord)));
    r.a = reinterpret_cast<Element**>(take(g * sizeof(void*)));
    r.b = reinterpret_cast<Element**>(take(g * sizeof(void*)));
    r.d = reinterpret_cast<Element**>(take(g * sizeof(void*)));
    r.lda = reinterpret_cast<std::int64_t*>(take(g * 8));
    r.ldb = reinterpret_cast<std::int64_t*>(take(g * 8));
    r.ldd = reinterpret_cast<std::int64_t*>(take(g * 8));
    return r;
  }
};

// One thread per group, as in the sm90 builder: rows of expert e = g % E, operand set g / E.
template <class Element>
__global__ void build_group_arrays_kernel(sm90::SegmentGemm g, GroupArrays<Element> arrays) {
  const int group = blockIdx.x * blockDim.x + threadIdx.x;
  if (group >= g.experts * g.sets) return;
  const int e = group % g.experts;
  const sm90::OperandSet& op = g.set[group / g.experts];
  const std::int64_t lo = min(max(std::int64_t(g.offsets[e]), std::int64_t(0)), g.rows);
  const std::int64_t hi = min(max(std::int64_t(g.offsets[e + 1]), lo), g.rows);
  auto at = [&](const sm90::Operand& o) {
    const std::int64_t offset = o.at == sm90::Placement::segment ? lo * o.ld : e * o.expert_stride;
    return static_cast<Element*>(const_cast<void*>(o.base)) + offset;
  };
  arrays.shapes[group] = cutlass::gemm::GemmCoord(int(hi - lo), op.n, op.k);
  arrays.a[group] = at(op.a);
  arrays.b[group] = at(op.b);
  arrays.d[group] = at(op.d);
  arrays.lda[group] = op.a.ld;
  arrays.ldb[group] = op.b.ld;
  arrays.ldd[group] = op.d.ld;
}

inline void check_status(cutlass::Status status, const char* what) {
  if (status != cutlass::Status::kSuccess)
    throw Error(ErrorKind::cuda, std::string("SwiGluExperts (tensor_core, sm80): CUTLASS ") + what + " failed: " +
                                     cutlassGetStatusString(status));
}

template <class Element>
std::size_t workspace_bytes_impl(int groups) {
  return GroupArrays<Element>::bytes(groups);  // kDeviceOnly scheduling needs no CUTLASS workspace
}

template <class Element>
void run_impl(const sm90::SegmentGemm& g, void* workspace, std::size_t workspace_size, cudaStream_t stream) {
  using Config = GroupedGemmConfig<Element>;
  const int groups = g.experts * g.sets;
  if (workspace_size < GroupArrays<Element>::bytes(groups))
    throw Error(ErrorKind::value, "SwiGluExperts (tensor_core, sm80): workspace too small");
  const GroupArrays<Element> arrays = GroupArrays<Element>::carve(workspace, groups);
  build_group_arrays_kernel<Element><<<(groups + 127) / 128, 128, 0, stream>>>(g, arrays);
  RUDNN_CUDA_CHECK_LAUNCH(build_group_arrays_kernel);
  // Persistent blocks: as many as fit on the device at once (occupancy is a host query).
  static const int blocks_per_sm = Config::Gemm::maximum_active_blocks();
  if (blocks_per_sm <= 0) check_status(cutlass::Status::kErrorInternal, "maximum_active_blocks");
  int device = 0, sm_count = 0;
  RUDNN_CUDA_CHECK(cudaGetDevice(&device));
  RUDNN_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  typename Config::Epilogue::Params epilogue(1.0f, 0.0f);
  typename Config::Gemm::Arguments args(arrays.shapes, groups, blocks_per_sm * sm_count, epilogue, arrays.a, arrays.b,
                                        arrays.d, arrays.d, arrays.lda, arrays.ldb, arrays.ldd, arrays.ldd);
  typename Config::Gemm gemm;
  check_status(gemm.initialize(args, nullptr, stream), "initialize");
  check_status(gemm.run(stream), "run");
  RUDNN_CUDA_CHECK_LAUNCH(grouped_gemm_sm80);
}

}  // namespace rudnn::moe::sm80

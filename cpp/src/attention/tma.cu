// encode_tma (tma.hpp): cuTensorMapEncodeTiled through the runtime's driver entry point, so the
// library needs no link to the driver library (CPU-only machines load it without one).
#include <cuda_runtime_api.h>
#include <cudaTypedefs.h>

#include <string>

#include "attention/tma.hpp"
#include "core/check.hpp"
#include "core/cuda_check.hpp"

namespace rudnn::attention {

namespace {

PFN_cuTensorMapEncodeTiled_v12000 driver_encode_tiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    RUDNN_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
#else
    RUDNN_CUDA_CHECK(cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &found));
#endif
    if (found != cudaDriverEntryPointSuccess || fn == nullptr)
      core::fail(ErrorKind::cuda, "attention: the CUDA driver has no cuTensorMapEncodeTiled (TMA needs driver >= 12.0)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

}  // namespace

CUtensorMap encode_tma(const TmaTensor4d& t, DType dtype) {
  CUtensorMap map;
  const cuuint64_t dims[4] = {t.dims[0], t.dims[1], t.dims[2], t.dims[3]};
  const cuuint64_t strides[3] = {t.strides_bytes[0], t.strides_bytes[1], t.strides_bytes[2]};
  const cuuint32_t box[4] = {t.box[0], t.box[1], t.box[2], t.box[3]};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUresult result = driver_encode_tiled()(
      &map, dtype == DType::f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4,
      const_cast<void*>(t.base), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS)
    core::fail(ErrorKind::cuda, "attention: cuTensorMapEncodeTiled failed (CUresult " + std::to_string(int(result)) +
                                    ") for dims (" + std::to_string(t.dims[0]) + ", " + std::to_string(t.dims[1]) +
                                    ", " + std::to_string(t.dims[2]) + ", " + std::to_string(t.dims[3]) + ")");
  return map;
}

}  // namespace rudnn::attention

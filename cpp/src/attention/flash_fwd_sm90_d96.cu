// Flash forward (sm90a kernel: wgmma for both GEMMs, 64-byte swizzled rows) for head dim 96, float16
// and bfloat16. The kernel body exists only in the sm_90a pass; the sm_80 pass compiles an empty stub.
#include "attention/flash_sm90.cuh"
#include "attention/kernels.hpp"

namespace rudnn::attention {

void flash_forward_sm90_d96(const Problem& p, const void* q, const void* k, const void* v, void* out, float* lse,
                            Stream stream) {
  flash::with_element_type(p.dtype, [&](auto e) {
    flash::launch_forward_sm90<decltype(e), 96, 96>(p, q, k, v, out, lse, stream);
  });
}

}  // namespace rudnn::attention

// Flash forward (sm80 CuTe kernel) for head dim 128, float16 and bfloat16.
#include "attention/flash_sm80.cuh"
#include "attention/kernels.hpp"

namespace rudnn::attention {

void flash_forward_sm80_d128(const Problem& p, const void* q, const void* k, const void* v, void* out, float* lse,
                             Stream stream) {
  flash::with_element_type(p.dtype, [&](auto e) {
    flash::launch_forward_sm80<decltype(e), 128>(p, q, k, v, out, lse, stream);
  });
}

}  // namespace rudnn::attention

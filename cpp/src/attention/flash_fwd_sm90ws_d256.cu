// Flash forward (sm90a warp-specialized kernel: TMA producer, two wgmma consumer
// warpgroups) for head dim 256, float16 and bfloat16. The kernel body exists only in the sm_90a
// pass; the sm_80 pass compiles an empty stub.
#include "attention/flash_sm90_ws.cuh"
#include "attention/kernels.hpp"

namespace rudnn::attention {

void flash_forward_sm90ws_d256(const Problem& p, const void* q, const void* k, const void* v, void* out, float* lse,
                               Stream stream) {
  flash::with_element_type(p.dtype, [&](auto e) {
    flash::launch_forward_sm90ws<decltype(e), 256, 256>(p, q, k, v, out, lse, stream);
  });
}

}  // namespace rudnn::attention

// Flash backward, warp-specialized sm90a generation, for head dim 64, float16 and
// bfloat16; the kernel bodies are compiled for sm_90a only.
#include "attention/flash_bwd_sm90_ws.cuh"
#include "attention/kernels.hpp"

namespace rudnn::attention {

void flash_backward_sm90ws_d64(const BackwardProblem& bp, const void* dout, const void* q, const void* k,
                               const void* v, const void* out, const float* lse, void* dq, void* dk, void* dv,
                               void* workspace, Stream stream) {
  flash::with_element_type(bp.fwd.dtype, [&](auto e) {
    flash::launch_backward_sm90ws<decltype(e), 64, 64>(bp, dout, q, k, v, out, lse, dq, dk, dv,
                                                       static_cast<float*>(workspace), stream);
  });
}

}  // namespace rudnn::attention

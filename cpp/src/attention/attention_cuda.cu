// CUDA side of attention: picks the kernels for a strategy and launches them.
//   "fallback"  fallback_cuda.cu (any dtype, head dim and option; deterministic backward)
//   "flash"     fused tensor-core kernels; not in this build yet, so asking for it is an
//               UnsupportedError and "auto" / "autotune" run the fallback (the only candidate).
#include <string>

#include "attention/kernels.hpp"
#include "core/check.hpp"

namespace rudnn::attention {

namespace {

// Why the flash kernels cannot serve `p` (empty: they can).
std::string flash_unsupported_reason(const Problem& p) {
  (void)p;
  return "this build of libruDNN has no flash attention kernel yet (use strategy 'fallback' or 'auto')";
}

enum class Kernels { fallback };

Kernels choose(const Problem& p, AttentionStrategy strategy, const char* op) {
  if (strategy == AttentionStrategy::flash) {
    const std::string why = flash_unsupported_reason(p);
    if (!why.empty()) core::fail(ErrorKind::unsupported, std::string(op) + ": strategy 'flash': " + why);
  }
  return Kernels::fallback;
}

}  // namespace

std::size_t forward_workspace_bytes_cuda(const Problem& p, AttentionStrategy strategy) {
  choose(p, strategy, "attention");
  return 0;
}

std::size_t backward_workspace_bytes_cuda(const BackwardProblem& bp, AttentionStrategy strategy) {
  choose(bp.fwd, strategy, "attention_backward");
  return fallback_backward_workspace_bytes(bp.fwd);
}

const char* forward_cuda(const AttentionForwardArgs& a, const Problem& p, const Tensor* workspace, Stream stream) {
  (void)workspace;
  choose(p, a.options.strategy, "attention");
  fallback_forward(p, a.q.data, a.k.data, a.v.data, a.out.data, a.lse ? a.lse->ptr<float>() : nullptr, stream);
  return "fallback";
}

const char* backward_cuda(const AttentionBackwardArgs& a, const BackwardProblem& bp, const Tensor* workspace,
                          Stream stream) {
  choose(bp.fwd, a.options.strategy, "attention_backward");
  fallback_backward(bp, a.dout.data, a.q.data, a.k.data, a.v.data, a.out.data, a.lse.ptr<float>(), a.dq.data,
                    a.dk.data, a.dv.data, workspace ? workspace->data : nullptr, stream);
  return "fallback";
}

}  // namespace rudnn::attention

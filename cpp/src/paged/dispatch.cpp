// Public entry points of the paged family: validate once, then run the backend of the
// tensors' device. The backward has both backends (backward_cuda.cu); the forward and append
// raise UnsupportedError on CUDA tensors until their kernels land.
#include <string>

#include "core/backend.hpp"
#include "paged/problem.hpp"

namespace rudnn {

namespace {

thread_local const char* last_algorithm = "none";

[[noreturn]] void no_cuda_yet(const char* op) {
  core::fail(ErrorKind::unsupported, std::string(op) + ": the CUDA backend of the paged family is not built yet; "
                                                       "run it on CPU tensors (the reference backend)");
}

}  // namespace

void paged_attention(const PagedAttentionArgs& args, const Tensor* workspace, Stream) {
  const paged::Problem p = paged::validate_attention(args, workspace);
  core::on_device(args.q.device, "paged_attention",
                  [&] {
                    paged::forward_cpu(p, workspace);
                    last_algorithm = "cpu";
                  },
                  [&] { no_cuda_yet("paged_attention"); });
}

void paged_mla(const PagedMlaArgs& args, const Tensor* workspace, Stream) {
  const paged::Problem p = paged::validate_mla(args, workspace);
  core::on_device(args.q.device, "paged_mla",
                  [&] {
                    paged::forward_cpu(p, workspace);
                    last_algorithm = "cpu";
                  },
                  [&] { no_cuda_yet("paged_mla"); });
}

namespace {

// One backward entry for attention and MLA: the CPU reference (ordered or not), or CUDA.
void run_backward(const paged::BackwardProblem& p, const Tensor& q, const Tensor* workspace, Stream stream,
                  const char* op) {
  core::on_device(q.device, op,
                  [&] {
                    if (p.ordered) {
                      paged::backward_ordered_cpu(p);
                      last_algorithm = "cpu_ordered";
                    } else {
                      paged::backward_cpu(p);
                      last_algorithm = "cpu";
                    }
                  },
                  [&] {
                    core::expect_workspace(workspace, q, "q", paged::backward_workspace_bytes_cuda(p), op);
                    last_algorithm = paged::backward_cuda(p, workspace, stream);
                  });
}

std::size_t backward_bytes(const paged::BackwardProblem& p, const Device& device, const char* op) {
  std::size_t bytes = 0;
  core::on_device(device, op, [] {}, [&] { bytes = paged::backward_workspace_bytes_cuda(p); });
  return bytes;
}

}  // namespace

std::size_t paged_attention_backward_workspace_bytes(const PagedAttentionBackwardArgs& args) {
  return backward_bytes(paged::validate_attention_backward(args), args.q.device, "paged_attention_backward");
}

std::size_t paged_mla_backward_workspace_bytes(const PagedMlaBackwardArgs& args) {
  return backward_bytes(paged::validate_mla_backward(args), args.q.device, "paged_mla_backward");
}

void paged_attention_backward(const PagedAttentionBackwardArgs& args, const Tensor* workspace, Stream stream) {
  const paged::BackwardProblem p = paged::validate_attention_backward(args);
  run_backward(p, args.q, workspace, stream, "paged_attention_backward");
}

void paged_mla_backward(const PagedMlaBackwardArgs& args, const Tensor* workspace, Stream stream) {
  const paged::BackwardProblem p = paged::validate_mla_backward(args);
  run_backward(p, args.q, workspace, stream, "paged_mla_backward");
}

void paged_append(const PagedAppendArgs& args, Stream) {
  const paged::AppendProblem p = paged::validate_append(args);
  core::on_device(args.k.device, "paged_append",
                  [&] {
                    paged::append_cpu(args, p);
                    last_algorithm = "cpu";
                  },
                  [&] { no_cuda_yet("paged_append"); });
}

const char* paged_last_algorithm() { return last_algorithm; }

}  // namespace rudnn

// Public entry points of the paged family: validate once, then run the backend of the
// tensors' device. Every op has a CUDA backend: the forward and append in forward_cuda.cu, the
// backward (atomic and ordered) in backward_cuda.cu.
#include <string>

#include "core/backend.hpp"
#include "paged/problem.hpp"
#if RUDNN_WITH_CUDA
#include "paged/cuda_backend.hpp"
#endif

namespace rudnn {

namespace {

thread_local const char* last_algorithm = "none";

// The CUDA forward of a validated problem (only reached in a build with CUDA).
void forward_on_cuda(const paged::Problem& p, const Tensor* workspace, Stream stream) {
#if RUDNN_WITH_CUDA
  last_algorithm = paged::cuda::forward_cuda(p, workspace, static_cast<cudaStream_t>(stream));
#else
  (void)p, (void)workspace, (void)stream;
#endif
}

}  // namespace

namespace {

int default_splits(const paged::Problem& p, const Device& device, std::int64_t max_length) {
  int splits = 1;
  core::on_device(device, "paged_default_splits", [] {},
                  [&] {
#if RUDNN_WITH_CUDA
                    splits = paged::cuda::default_splits_cuda(p, max_length);
#else
                    (void)p, (void)max_length;
#endif
                  });
  return splits;
}

}  // namespace

int paged_attention_default_splits(const PagedAttentionArgs& args, std::int64_t max_length) {
  PagedAttentionArgs one = args;
  one.splits = 1;
  return default_splits(paged::validate_attention(one, nullptr), args.q.device, max_length);
}

int paged_mla_default_splits(const PagedMlaArgs& args, std::int64_t max_length) {
  PagedMlaArgs one = args;
  one.splits = 1;
  return default_splits(paged::validate_mla(one, nullptr), args.q.device, max_length);
}

void paged_attention(const PagedAttentionArgs& args, const Tensor* workspace, Stream stream) {
  const paged::Problem p = paged::validate_attention(args, workspace);
  core::on_device(args.q.device, "paged_attention",
                  [&] {
                    paged::forward_cpu(p, workspace);
                    last_algorithm = "cpu";
                  },
                  [&] { forward_on_cuda(p, workspace, stream); });
}

void paged_mla(const PagedMlaArgs& args, const Tensor* workspace, Stream stream) {
  const paged::Problem p = paged::validate_mla(args, workspace);
  core::on_device(args.q.device, "paged_mla",
                  [&] {
                    paged::forward_cpu(p, workspace);
                    last_algorithm = "cpu";
                  },
                  [&] { forward_on_cuda(p, workspace, stream); });
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
#if RUDNN_WITH_CUDA
                    core::expect_workspace(workspace, q, "q", paged::cuda::backward_workspace_bytes(p), op);
                    last_algorithm = paged::cuda::backward_cuda(p, workspace, static_cast<cudaStream_t>(stream));
#else
                    (void)workspace, (void)stream;
#endif
                  });
}

std::size_t backward_bytes(const paged::BackwardProblem& p, const Device& device, const char* op) {
  std::size_t bytes = 0;
#if RUDNN_WITH_CUDA
  core::on_device(device, op, [] {}, [&] { bytes = paged::cuda::backward_workspace_bytes(p); });
#else
  (void)p, (void)device, (void)op;
#endif
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

void paged_append(const PagedAppendArgs& args, Stream stream) {
  const paged::AppendProblem p = paged::validate_append(args);
  core::on_device(args.k.device, "paged_append",
                  [&] {
                    paged::append_cpu(args, p);
                    last_algorithm = "cpu";
                  },
                  [&] {
#if RUDNN_WITH_CUDA
                    last_algorithm = paged::cuda::append_cuda(args, p, static_cast<cudaStream_t>(stream));
#else
                    (void)stream;
#endif
                  });
}

const char* paged_last_algorithm() { return last_algorithm; }

}  // namespace rudnn

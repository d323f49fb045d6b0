// Public entry points of the paged family: validate once, then run the backend of the
// tensors' device. The forward and append have a CUDA backend (forward_cuda.cu); on CUDA
// tensors the backward raises UnsupportedError for now.
#include <string>

#include "core/backend.hpp"
#include "paged/problem.hpp"
#if RUDNN_WITH_CUDA
#include "paged/cuda_backend.hpp"
#endif

namespace rudnn {

namespace {

thread_local const char* last_algorithm = "none";

[[noreturn]] void no_cuda_yet(const char* op) {
  core::fail(ErrorKind::unsupported, std::string(op) + ": the CUDA backward of the paged family is not built yet; "
                                                       "run it on CPU tensors (the reference backend)");
}

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

void paged_attention_backward(const PagedAttentionBackwardArgs& args, Stream) {
  const paged::BackwardProblem p = paged::validate_attention_backward(args);
  core::on_device(args.q.device, "paged_attention_backward",
                  [&] {
                    paged::backward_cpu(p);
                    last_algorithm = "cpu";
                  },
                  [&] { no_cuda_yet("paged_attention_backward"); });
}

void paged_mla_backward(const PagedMlaBackwardArgs& args, Stream) {
  const paged::BackwardProblem p = paged::validate_mla_backward(args);
  core::on_device(args.q.device, "paged_mla_backward",
                  [&] {
                    paged::backward_cpu(p);
                    last_algorithm = "cpu";
                  },
                  [&] { no_cuda_yet("paged_mla_backward"); });
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

// Public entry points of the paged family: validate once, then run the backend of the
// tensors' device. This milestone has the CPU reference backend only; on CUDA tensors the
// ops raise UnsupportedError (the validated Problem is what the CUDA kernels will take).
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

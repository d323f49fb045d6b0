// The "implicit_gemm" strategy of the convolution family: CUTLASS's own implicit-GEMM
// convolution kernels on packed channels-last tensors, and the pure decision of which kernel
// (if any) takes a validated call.
//
// Kernels (one instantiation per op, dtype and spatial rank; see the *_sm80.cu / *_sm90.cu files):
//   sm80  CUTLASS 2.x (cutlass/conv/device/implicit_gemm_convolution.h): mma.sync tensor cores,
//         cp.async multistage mainloop, "optimized" iterators. NDHWC kernels serve 1-D, 2-D and
//         3-D fprop and wgrad (leading axes of size 1); dgrad has an NHWC kernel for any stride
//         (1-D, 2-D) and an NDHWC one for stride 1 (3-D). Compiled for sm_80 (SASS) and
//         compute_80 (PTX): they run on every GPU from sm_80 up. float32 tensors run these
//         kernels as TF32 (16x8x8 mma.sync: inputs rounded to TF32, float32 accumulation) on
//         every GPU, Hopper included (no sm90 TF32 kernel is built).
//   sm90  CUTLASS 3.x convolution collective builder (TMA im2col loads, wgmma, warp-specialized
//         cooperative kernel), NDHWC kernels serving every rank. Compiled for sm_90a only.
// Both accumulate in float32 and write x's dtype. fprop adds the bias in the epilogue. wgrad
// runs without split-K (each output tile sums its whole reduction in one block, in a fixed
// order): bitwise deterministic run to run.
//
// Tensors that are not packed channels-last (NCHW, channels-first torch tensors, any other
// strides, a 16-byte-misaligned base) are copied into the caller's workspace first (and the
// output back): one transpose each way. Packed NHWC / torch channels_last tensors run in place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "conv/problem.hpp"

namespace rudnn::conv::ig {

// Which implicit-GEMM kernel family runs a call; none: the direct kernels.
enum class Kernel { none, sm80, sm90 };

// The GPU generation of a device for these kernels: sm90 on compute capability 9.0 (sm_90a),
// sm80 on any other from 8.0 up (the sm80 kernels' PTX), none below.
Kernel kernel_family(int cc_major, int cc_minor);

// A problem in CUTLASS's terms, axes (d, h, w); a 1-D or 2-D problem has leading size-1 axes.
// pad_after is the upper padding that gives `out` (CUTLASS 3.x takes both and computes out).
struct Extents {
  int n = 1, c = 1, k = 1;
  int in[kAxes] = {1, 1, 1}, out[kAxes] = {1, 1, 1}, kernel[kAxes] = {1, 1, 1};
  int pad_before[kAxes] = {0, 0, 0}, pad_after[kAxes] = {0, 0, 0};
  int stride[kAxes] = {1, 1, 1}, dilation[kAxes] = {1, 1, 1};
  // Whether the depth axis is used (else the NHWC kernels of a rank-2 problem can run it).
  bool deep() const { return in[0] != 1 || out[0] != 1 || kernel[0] != 1; }
};

// The base addresses a plan checks for 16-byte alignment (null: absent).
struct Bases {
  const void* x = nullptr;  // x or dx
  const void* y = nullptr;  // y or dy
  const void* w = nullptr;  // w or dw
  const void* bias = nullptr;
};

// The decision for one validated call. kernel == none: why says why (for UnsupportedError and
// for "auto", which then runs direct). Otherwise the copies of tensors that are not packed
// channels-last go through the workspace, laid out as x, w, y, bias at the offsets below.
struct Plan {
  Kernel kernel = Kernel::none;
  std::string why;
  Extents shape;
  bool copy_x = false, copy_w = false, copy_y = false, copy_bias = false;
  std::size_t x_at = 0, w_at = 0, y_at = 0, bias_at = 0;  // byte offsets into the workspace
  std::size_t workspace_bytes = 0;
  const char* name() const;  // "implicit_gemm_sm80", "implicit_gemm_sm90" or "direct"
};

// Pure: the plan for problem p of op (forward, data_backward, weight_backward) in dtype, on a
// device of compute capability cc_major.cc_minor (0.0: no CUDA device). Checks groups == 1,
// f16/bf16/f32 (f32 as TF32), input and output channels multiples of 16 bytes, the kernels' limits
// on filter size, padding, dilation and stride, and 32-bit tensor sizes.
Plan plan(const Problem& p, Op op, DType dtype, int cc_major, int cc_minor, const Bases& bases);

// The caller's tensors of one call, for run() (null where the op has none).
struct Operands {
  const void* x = nullptr;  // x (forward, wgrad)
  const void* w = nullptr;  // w (forward, dgrad)
  const void* y = nullptr;  // dy (dgrad, wgrad)
  void* out = nullptr;      // y, dx or dw
  const void* bias = nullptr;
};

#if RUDNN_WITH_CUDA
// One kernel call on packed channels-last operands. fprop: a = x, b = w, d = y (bias optional);
// dgrad: a = dy, b = w, d = dx; wgrad: a = dy, b = x, d = dw.
struct Call {
  Extents s;
  DType dtype = DType::bf16;
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;
  const void* bias = nullptr;
  int device = 0;
  Stream stream = nullptr;
};

// Each returns false (with CUTLASS's reason in *why) when its kernel's can_implement refuses
// the problem, having launched nothing; a failing initialize or run throws rudnn::Error(cuda).
bool fprop_sm80(const Call& c, std::string* why);
bool dgrad_sm80(const Call& c, std::string* why);
bool wgrad_sm80(const Call& c, std::string* why);
bool fprop_sm90(const Call& c, std::string* why);
bool dgrad_sm90(const Call& c, std::string* why);
bool wgrad_sm90(const Call& c, std::string* why);

// Runs a plan (kernel != none) for the validated call: the copies in, the kernel, the copy out.
// Returns false, having written nothing, when the kernel refuses the problem (why says why).
bool run(const Plan& plan, const Problem& p, Op op, DType dtype, const Operands& t, void* workspace, int device,
         Stream stream, std::string* why);
#endif

}  // namespace rudnn::conv::ig

// RMSNorm of a small float32 batch on the CPU through libruDNN's C++ API, checked
// against a plain loop; then a bad call, which must throw rudnn::Error(shape).
#include <rudnn/norm.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  const std::int64_t rows = 3, hidden = 5;
  std::vector<float> x(rows * hidden), w(hidden), y(rows * hidden), rstd(rows);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.7f * float(i)) * 3.0f;
  for (std::size_t j = 0; j < w.size(); ++j) w[j] = 0.5f + 0.25f * float(j);

  const rudnn::Device cpu{rudnn::DeviceType::cpu, 0};
  const std::int64_t shape[] = {rows, hidden};
  const std::int64_t param_shape[] = {hidden};
  const rudnn::Tensor weight = rudnn::Tensor::contiguous(w.data(), rudnn::DType::f32, cpu, param_shape, 1);
  const rudnn::Tensor stats = rudnn::Tensor::contiguous(rstd.data(), rudnn::DType::f32, cpu, shape, 1);

  rudnn::NormForwardArgs args;
  args.kind = rudnn::NormKind::rms;
  args.x = rudnn::Tensor::contiguous(x.data(), rudnn::DType::f32, cpu, shape, 2);
  args.y = rudnn::Tensor::contiguous(y.data(), rudnn::DType::f32, cpu, shape, 2);
  args.weight = &weight;
  args.rstd = &stats;
  args.eps = 1e-6f;
  rudnn::norm_forward(args);

  double worst = 0.0;
  for (std::int64_t r = 0; r < rows; ++r) {
    double sq = 0.0;
    for (std::int64_t j = 0; j < hidden; ++j) sq += double(x[r * hidden + j]) * x[r * hidden + j];
    const double expected_rstd = 1.0 / std::sqrt(sq / hidden + 1e-6);
    worst = std::fmax(worst, std::fabs(rstd[r] - expected_rstd) / expected_rstd);
    for (std::int64_t j = 0; j < hidden; ++j) {
      const double expected = x[r * hidden + j] * expected_rstd * w[j];
      worst = std::fmax(worst, std::fabs(y[r * hidden + j] - expected) / (std::fabs(expected) + 1e-6));
    }
  }
  std::printf("rms_norm on the CPU: max relative error %.3g\n", worst);
  if (!(worst < 1e-5)) return 1;

  const std::int64_t bad_shape[] = {hidden + 1};
  const rudnn::Tensor bad = rudnn::Tensor::contiguous(w.data(), rudnn::DType::f32, cpu, bad_shape, 1);
  args.weight = &bad;
  try {
    rudnn::norm_forward(args);
  } catch (const rudnn::Error& e) {
    std::printf("bad weight rejected: %s\n", e.what());
    return e.kind() == rudnn::ErrorKind::shape ? 0 : 1;
  }
  std::printf("bad weight was not rejected\n");
  return 1;
}

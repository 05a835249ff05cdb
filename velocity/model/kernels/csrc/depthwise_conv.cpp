// A depthwise Conv1d without padding, channels first, in C++ (built by
// velocity/model/kernels/cpu_kernels.py): the stateful vocoder's ConvNeXt blocks run one on each
// window (velocity.tts.stateful_decoder). torch's call (oneDNN) costs more than its arithmetic at
// these sizes: a few hundred channels of a few dozen to a few hundred positions, 7 taps.
//
// Each output is the bias, then each tap's product added in tap order (fused multiply-adds where
// the compiler makes them): torch's conv within float32 rounding, not bit for bit.
#include "common.h"

// x: [B, C, L]; w: [C, 1, K]; b: [C] (empty: none); taps `dilation` apart -> [B, C, L - dilation (K - 1)]
at::Tensor depthwise_conv1d(at::Tensor x, at::Tensor w, at::Tensor b, int64_t dilation) {
  TORCH_CHECK(x.dim() == 3 && x.is_contiguous() && x.scalar_type() == at::kFloat, "x: contiguous float32 [B, C, L]");
  const int64_t B = x.size(0), C = x.size(1), L = x.size(2), K = w.size(-1), n = L - dilation * (K - 1);
  TORCH_CHECK(w.is_contiguous() && w.scalar_type() == at::kFloat && w.numel() == C * K, "w: contiguous float32 [C, 1, K]");
  TORCH_CHECK(b.numel() == 0 || (b.numel() == C && b.is_contiguous() && b.scalar_type() == at::kFloat), "b: float32 [C] or empty");
  TORCH_CHECK(dilation >= 1 && n >= 0, "depthwise_conv1d: the window is shorter than the taps' reach");
  auto y = at::empty({B, C, n}, x.options());
  const float *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>();
  const float* bp = b.numel() ? b.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, B * C, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {                   // row r: window r / C's channel r % C
      const int64_t c = r % C;
      const float* xr = xp + r * L;
      const float* wr = wp + c * K;
      float* yr = yp + r * n;
      const float bias = bp ? bp[c] : 0.f;
      for (int64_t t = 0; t < n; ++t) yr[t] = bias;
      for (int64_t k = 0; k < K; ++k) {
        const float wk = wr[k];
        const float* xk = xr + k * dilation;
        #pragma omp simd
        for (int64_t t = 0; t < n; ++t) yr[t] += wk * xk[t];
      }
    }
  });
  return y;
}

// The CPU decoder layer's row operations in C++ (built by velocity/model/kernels/cpu_kernels.py), between
// its linears: int8 (Int8Linear) or float32 (F32Linear, on the C++ f32_gemm).
//
// On CPU much of a step outside its linears was many small operator calls between them, each
// more Python and dispatch than arithmetic: RMSNorm, the residual adds, RoPE, SiLU-and-mul, and
// for int8 the linears' own input scaling (abs, amax, divide) and output scaling. Here each
// stretch between two linears is one call. For int8 (`scaled`) it also leaves its output's rows
// scaled into [-1, 1] with their scales, the input Int8Linear's op takes
// (velocity.model.layers.int8_linear); for float32 the rows stay as they are and their scales are ones.
// LlamaBody.forward_rows runs them, for decodes and prefills alike (a prefill's tokens are rows
// that each attend up to their own position: ModelRunner's in_place_prefill).
//
// The same arithmetic as the torch path, in another order and with fused multiply-adds where the
// compiler makes them, and SiLU's exp vectorized (within 2 ulp): equal within float rounding, which
// an int8 row can move by one step (tests/test_int8.py and tests/test_layers.py bound both).
//
// The linears themselves: int8_gemm.cpp, f32_gemm.cpp.
#include "common.h"
#include "paged_decode.h"
#include "vec.h"

// p[i] /= max |p| (at least 1e-30); the divisor into *s: Int8Linear's row scale
static inline void scale_row(float* p, float* s, int64_t n) {
  const float m = row_absmax(p, n);
  *s = m;
  #pragma omp simd
  for (int64_t i = 0; i < n; ++i) p[i] /= m;
}

// x: [T, H] the residual stream, updated in place by y * ys first (y: [T, H] a linear's output
// before its row scales ys [T, 1]; empty: nothing to add); w: [H] -> (rms_norm(x) * w [T, H], its
// rows scaled into [-1, 1] when `scaled`; the scales [T, 1])
std::vector<at::Tensor> add_norm_scale(at::Tensor x, at::Tensor y, at::Tensor ys, at::Tensor w,
                                       double eps, bool scaled) {
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous() && x.scalar_type() == at::kFloat, "contiguous float32 x, w");
  const int64_t T = x.size(0), H = x.size(1);
  const bool add = y.numel() > 0;
  TORCH_CHECK(!add || (y.is_contiguous() && y.sizes() == x.sizes() && ys.numel() == T), "y: [T, H], ys: [T, 1]");
  auto out = at::empty_like(x);
  auto s = at::ones({T, 1}, x.options());
  float *xp = x.data_ptr<float>(), *op = out.data_ptr<float>(), *sp = s.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  const float* yp = add ? y.data_ptr<float>() : nullptr;
  const float* ysp = add ? ys.data_ptr<float>() : nullptr;
  at::parallel_for(0, T, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* xr = xp + t * H;
      if (add) {
        const float* yr = yp + t * H;
        const float f = ysp[t];
        #pragma omp simd
        for (int64_t i = 0; i < H; ++i) xr[i] += yr[i] * f;
      }
      float ss = 0.f;
      #pragma omp simd reduction(+:ss)
      for (int64_t i = 0; i < H; ++i) ss += xr[i] * xr[i];
      const float r = 1.f / std::sqrt(ss / H + (float)eps);
      float* o = op + t * H;
      #pragma omp simd
      for (int64_t i = 0; i < H; ++i) o[i] = wp[i] * (xr[i] * r);
      if (scaled) scale_row(o, sp + t, H);
    }
  });
  return {out, s};
}

// y: [T, (Hq + 2 Hkv) D] the qkv linear's output before its row scales ys [T, 1]; cos, sin: [T, D]
// (HF's rotate_half layout) -> (attention over the paged cache (this step's k, v written first)
// [T, Hq D], rows scaled into [-1, 1] when `scaled`; the scales [T, 1]). y is rotated in place.
std::vector<at::Tensor> rope_attend_scale(at::Tensor y, at::Tensor ys, at::Tensor cos, at::Tensor sin,
                                          at::Tensor slot_mapping, at::Tensor k_cache, at::Tensor v_cache,
                                          at::Tensor block_tables, at::Tensor context_lens, double scale,
                                          int64_t Hq, int64_t Hkv, bool scaled) {
  TORCH_CHECK(y.is_contiguous() && cos.is_contiguous() && sin.is_contiguous(), "contiguous y, cos, sin");
  const int64_t T = y.size(0), W = y.size(1), D = cos.size(1), half = D / 2;
  TORCH_CHECK(W == (Hq + 2 * Hkv) * D && cos.size(0) == T, "y: [T, (Hq + 2 Hkv) D], cos: [T, D]");
  float* yp = y.data_ptr<float>();
  const float *ysp = ys.data_ptr<float>(), *cp = cos.data_ptr<float>(), *snp = sin.data_ptr<float>();
  at::parallel_for(0, T, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* row = yp + t * W;
      const float f = ysp[t];
      #pragma omp simd
      for (int64_t i = 0; i < W; ++i) row[i] *= f;
      const float *c = cp + t * D, *sn = snp + t * D;
      for (int64_t h = 0; h < Hq + Hkv; ++h) {               // q's heads, then k's
        float* x = row + h * D;
        #pragma omp simd
        for (int64_t d = 0; d < half; ++d) {
          const float a = x[d], b = x[d + half];
          x[d] = a * c[d] + (-b) * sn[d];
          x[d + half] = b * c[d + half] + a * sn[d + half];
        }
      }
    }
  });
  auto q = y.narrow(1, 0, Hq * D).view({T, Hq, D});
  auto k = y.narrow(1, Hq * D, Hkv * D).view({T, Hkv, D});
  auto v = y.narrow(1, (Hq + Hkv) * D, Hkv * D).view({T, Hkv, D});
  auto o = paged_decode(q, k, v, slot_mapping, k_cache, v_cache, block_tables, context_lens, scale).view({T, Hq * D});
  auto s = at::ones({T, 1}, y.options());
  float *op = o.data_ptr<float>(), *sp = s.data_ptr<float>();
  if (scaled)
    for (int64_t t = 0; t < T; ++t) scale_row(op + t * Hq * D, sp + t, Hq * D);
  return {o, s};
}

// y: [T, 2 I] the gate_up linear's output before its row scales ys [T, 1] -> (silu(gate) * up
// [T, I], rows scaled into [-1, 1] when `scaled`; the scales [T, 1]). exp256: vec.h
std::vector<at::Tensor> silu_mul_scale(at::Tensor y, at::Tensor ys, bool scaled) {
  TORCH_CHECK(y.is_contiguous() && y.scalar_type() == at::kFloat, "contiguous float32 y");
  const int64_t T = y.size(0), I = y.size(1) / 2;
  auto out = at::empty({T, I}, y.options());
  auto s = at::ones({T, 1}, y.options());
  const float *yp = y.data_ptr<float>(), *ysp = ys.data_ptr<float>();
  float *op = out.data_ptr<float>(), *sp = s.data_ptr<float>();
  at::parallel_for(0, T, 4, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* g = yp + t * 2 * I;
      const float f = ysp[t];
      float* o = op + t * I;
      int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
      const __m256 fv = _mm256_set1_ps(f), one = _mm256_set1_ps(1.f);
      for (; i + 8 <= I; i += 8) {
        const __m256 gate = _mm256_mul_ps(_mm256_loadu_ps(g + i), fv), up = _mm256_mul_ps(_mm256_loadu_ps(g + I + i), fv);
        const __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), gate));
        _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_div_ps(gate, _mm256_add_ps(one, e)), up));
      }
#endif
      for (; i < I; ++i) {
        const float gate = g[i] * f, up = g[I + i] * f;
        o[i] = gate / (1.f + std::exp(-gate)) * up;
      }
      if (scaled) scale_row(o, sp + t, I);
    }
  });
  return {out, s};
}

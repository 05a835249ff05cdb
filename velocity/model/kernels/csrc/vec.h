// Vector helpers more than one kernel file uses.
#pragma once

#include "common.h"

// a row's max |p| (a maximum: any order), at least 1e-30: Int8Linear's row scale
static inline float row_absmax(const float* p, int64_t n) {
  float m = 0.f;
  #pragma omp simd reduction(max:m)
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(p[i]));
  return std::max(m, 1e-30f);
}

#if defined(__AVX2__) && defined(__FMA__)
// exp of 8 floats: 2^n e^r with n = round(x log2 e) and |r| <= ln 2 / 2 (ln 2 in two parts), e^r by
// Cephes's degree-7 polynomial (within 2 ulp of std::exp); x clamped to [-87.3, 88.7]: 0 and inf are
// reached as their nearest finite values, which is all silu needs
static inline __m256 exp256(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.7f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  // 2^n: n (|n| <= 127 here) into the exponent field; n = 128 (x near 88.7) as 2 * 2^127
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i hi = _mm256_cmpgt_epi32(ni, _mm256_set1_epi32(127));
  const __m256 pow2 = _mm256_castsi256_ps(_mm256_slli_epi32(
      _mm256_add_epi32(_mm256_sub_epi32(ni, _mm256_and_si256(hi, _mm256_set1_epi32(1))), _mm256_set1_epi32(127)), 23));
  y = _mm256_mul_ps(y, pow2);
  return _mm256_blendv_ps(y, _mm256_add_ps(y, y), _mm256_castsi256_ps(hi));
}
#endif

// The float32 linears' GEMM in C++ (built by velocity/model/kernels/cpu_kernels.py), where the kernels are
// built with AVX2 and FMA or AVX-512 (`f32_gemm_lanes`); F32Linear (velocity.model.f32_linear) runs
// on it, on its weights laid out [ceil(N / 16), K, 16].
//
// A decode step multiplies one row per running sequence by every weight, so at a few rows it is
// bound by reading the weights. Packed in blocks of 16 output channels, each block's weights lie
// front to back, one input's 16 weights in each 64 bytes: one row reads the whole matrix once, in
// order, with no horizontal sums (AVX2: two registers a block). Rows share each weight load in
// tiles (kRows), so a prefill's many rows run from the cache as a blocked GEMM does; where a block
// has several tiles, they bring the thread's next block into L2 as they go, so the weights' stream
// runs under the multiply-adds instead of between them. The same float32
// arithmetic as nn.Linear in another summation order (outputs differ from it by float rounding):
// each output one chain of fused multiply-adds over the inputs in order, so a row's output is the
// same, bit for bit, alone or beside any other rows (oneDNN's and MKL's may differ between batch
// sizes). One chain a register keeps up with the memory at one row (its multiply-adds' latency
// allows more than two cores read).
#include "common.h"

#if defined(__AVX512F__)
using fvec = __m512;
constexpr int kLanes = 16;
constexpr int64_t kRows = 12;          // rows that share each weight load (12 accumulators of 32 registers)
static inline fvec vload(const float* p) { return _mm512_loadu_ps(p); }
static inline void vstore(float* p, fvec v) { _mm512_storeu_ps(p, v); }
static inline fvec vzero() { return _mm512_setzero_ps(); }
static inline fvec vset1(float x) { return _mm512_set1_ps(x); }
static inline fvec vfma(fvec a, fvec b, fvec c) { return _mm512_fmadd_ps(a, b, c); }
static inline fvec vadd(fvec a, fvec b) { return _mm512_add_ps(a, b); }
#elif defined(__AVX2__) && defined(__FMA__)
using fvec = __m256;
constexpr int kLanes = 8;
constexpr int64_t kRows = 6;           // 12 accumulators, 2 weights and a broadcast of 16 registers
static inline fvec vload(const float* p) { return _mm256_loadu_ps(p); }
static inline void vstore(float* p, fvec v) { _mm256_storeu_ps(p, v); }
static inline fvec vzero() { return _mm256_setzero_ps(); }
static inline fvec vset1(float x) { return _mm256_set1_ps(x); }
static inline fvec vfma(fvec a, fvec b, fvec c) { return _mm256_fmadd_ps(a, b, c); }
static inline fvec vadd(fvec a, fvec b) { return _mm256_add_ps(a, b); }
#else
constexpr int kLanes = 0;
constexpr int64_t kRows = 1;
#endif
int64_t f32_gemm_lanes() { return kLanes; }

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
constexpr int kVecs = 16 / kLanes;     // registers a block of 16 outputs fills

// R rows (x's rows ldx apart) by one block, each weight load shared by the R rows -> out [R, 16].
// pf (or nullptr): where this tile's share of the next block starts; one line of it goes into L2
// every `every` inputs.
template <int64_t R>
static inline void block_rows(const float* x, int64_t ldx, const float* wb, int64_t K, float* out,
                              const float* pf, int64_t every) {
  fvec acc[R][kVecs];
  for (auto& a : acc) for (auto& v : a) v = vzero();
  int64_t wait = 0;
  for (int64_t k = 0; k < K; ++k) {
    _mm_prefetch((const char*)(wb + k * 16 + 256), _MM_HINT_T0);
    if (pf && --wait <= 0) { wait = every; _mm_prefetch((const char*)pf, _MM_HINT_T1); pf += 16; }
    fvec w[kVecs];
    for (int j = 0; j < kVecs; ++j) w[j] = vload(wb + k * 16 + j * kLanes);
    for (int64_t i = 0; i < R; ++i) {
      const fvec xb = vset1(x[i * ldx + k]);
      for (int j = 0; j < kVecs; ++j) acc[i][j] = vfma(xb, w[j], acc[i][j]);
    }
  }
  for (int64_t i = 0; i < R; ++i)
    for (int j = 0; j < kVecs; ++j) vstore(out + i * 16 + j * kLanes, acc[i][j]);
}

template <int64_t... Rs>
static inline void block_tile(int64_t rows, const float* x, int64_t ldx, const float* wb, int64_t K, float* out,
                              const float* pf, int64_t every, std::integer_sequence<int64_t, Rs...>) {
  // the tile's row count a constant, so its sums stay in registers
  ((rows == Rs + 1 ? (block_rows<Rs + 1>(x, ldx, wb, K, out, pf, every), 0) : 0), ...);
}
#endif

// x: [T, K] float32; wp: [NB, K, 16] (w [N, K] in blocks of 16 outputs, zero rows padding N to 16 NB); bias:
// [N] or empty -> [T, N]: x w^T + bias
at::Tensor f32_gemm(at::Tensor x, at::Tensor wp, at::Tensor bias, int64_t N) {
  TORCH_CHECK(kLanes > 0, "f32_gemm: built without AVX2 and FMA (f32_gemm_lanes() is 0)");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kFloat, "x: contiguous float32 [T, K]");
  TORCH_CHECK(wp.dim() == 3 && wp.is_contiguous() && wp.scalar_type() == at::kFloat && wp.size(2) == 16
              && wp.size(1) == x.size(1) && N > 16 * (wp.size(0) - 1) && N <= 16 * wp.size(0),
              "wp: float32 [ceil(N / 16), K, 16] (F32Linear's layout of [N, K] weights), K = x's columns");
  TORCH_CHECK(bias.numel() == 0 || (bias.numel() == N && bias.is_contiguous() && bias.scalar_type() == at::kFloat),
              "bias: float32 [N] or empty");
  const int64_t T = x.size(0), K = x.size(1), NB = wp.size(0);
  auto out = at::empty({T, N}, x.options());
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
  if (T == 0) return out;
  const float* xp = x.data_ptr<float>();
  const float* w0 = wp.data_ptr<float>();
  const float* bp = bias.numel() ? bias.data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  const int64_t tiles = (T + kRows - 1) / kRows, share = (K + tiles - 1) / tiles;
  at::parallel_for(0, NB, 1, [&](int64_t b0, int64_t b1) {
    float tile[kRows * 16];
    for (int64_t b = b0; b < b1; ++b) {
      const float* wb = w0 + b * K * 16;
      const int64_t n0 = b * 16, cols = std::min<int64_t>(16, N - n0);
      for (int64_t t0 = 0; t0 < T; t0 += kRows) {
        const int64_t rows = std::min(kRows, T - t0);
        // several tiles: each brings its share of the thread's next block into L2 while it
        // computes from the cache, so the weights' stream runs under the multiply-adds, not
        // between them (one tile leaves that to the hardware's prefetcher)
        const float* pf = tiles > 1 && b + 1 < b1 ? wb + (K + t0 / kRows * share) * 16 : nullptr;
        block_tile(rows, xp + t0 * K, K, wb, K, tile, pf, tiles, std::make_integer_sequence<int64_t, kRows>{});
        for (int64_t i = 0; i < rows; ++i) {
          float* o = op + (t0 + i) * N + n0;
          for (int64_t c = 0; c < cols; ++c) o[c] = bp ? tile[i * 16 + c] + bp[n0 + c] : tile[i * 16 + c];
        }
      }
    }
  });
#endif
  return out;
}

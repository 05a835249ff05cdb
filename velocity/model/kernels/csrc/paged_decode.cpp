// Paged decode attention in C++ (built by velocity/model/kernels/cpu_kernels.py): reads each cached key
// and value once, straight from the paged cache, instead of gathering them into a padded copy first
// (the torch path in velocity.model.layers.attention stays the reference; tests compare the two).
// layer_rows' rope_attend_scale calls it (paged_decode.h).
//
// Each sequence's tokens are split in kHalves ranges, a task each, and the ranges' softmax partials
// are merged in order: one sequence alone reads its cache on two threads, and the ranges follow its
// length alone, so its output is the same, bit for bit, alone, in a batch and on any thread count.
//
// The cache is float32, float16 or int8 (EngineConfig.kv_cache_dtype). float16: half the bytes to
// read, each row rounded to float16 as it is written and converted back as it is read. int8: about
// a quarter, each head's D values of a token divided by their scale (max |x| / 127) and rounded,
// the scale's 4 bytes after them (a head D + 4 bytes wide: kInt8ScaleBytes); pass 1 sums q against
// the int8 values and multiplies by the key's scale, pass 2 folds the value's scale into its weight.
// With AVX2 the float16 and int8 rows are read by code of their own, 8 lanes at a time (16 with
// AVX-512): two sums a head in pass 1, a head's output in registers over kRows token rows in pass
// 2; the float32 cache keeps its arithmetic. Either cache's rows are prefetched a few tokens ahead, pass 1 sends each key's value
// row toward L2 for pass 2, and pass 2 sends the thread's next task's keys toward L2 for its pass 1
// (prefetches change no sum and no order).
#include "common.h"
#include "vec.h"

#ifdef __F16C__
static inline __m256 half8(const at::Half* p) {          // 8 float16 values as float32, exactly
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
#endif

// an int8 cache's head: D values, then its scale's float32 bytes
constexpr int64_t kInt8ScaleBytes = 4;

// a cache's head width in its elements: D, or D + kInt8ScaleBytes for int8
template <typename T>
static constexpr int64_t head_width(int64_t D) { return std::is_same_v<T, int8_t> ? D + kInt8ScaleBytes : D; }

// the scale stored after an int8 head's D values
static inline float head_scale(const int8_t* head, int64_t D) {
  float s;
  std::memcpy(&s, head + D, sizeof s);
  return s;
}

// a cache row into float32 (float32 caches are read in place: see cache_row)
static inline void half_to_float(const at::Half* s, float* d, int64_t n) {
  int64_t i = 0;
#ifdef __F16C__
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, half8(s + i));
#endif
  for (; i < n; ++i) d[i] = float(s[i]);
}

// a token's float32 row (H heads of D) into a cache row: float32 copied, float16 rounded to nearest
// (as torch's .half()) after clamping to float16's finite range; int8 per head: scale = max |x| /
// 127 (max |x| at least 1e-30), round(x / scale) to nearest even, the scale after the values. Each
// as velocity.model.layers.attention's torch path writes it (as_cache), bit for bit
// (with F16C and AVX2: 8 at a time, the same roundings: IEEE division, round to nearest even)
static inline void store_row(float* d, const float* s, int64_t H, int64_t D) { std::memcpy(d, s, H * D * sizeof(float)); }
static inline void store_row(at::Half* d, const float* s, int64_t H, int64_t D) {
  int64_t i = 0;
#ifdef __F16C__
  const __m256 lo = _mm256_set1_ps(-65504.f), hi = _mm256_set1_ps(65504.f);
  for (; i + 8 <= H * D; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm256_cvtps_ph(_mm256_min_ps(hi, _mm256_max_ps(lo, _mm256_loadu_ps(s + i))), _MM_FROUND_TO_NEAREST_INT));   // NaN stays NaN
#endif
  for (; i < H * D; ++i) d[i] = at::Half(std::min(std::max(s[i], -65504.f), 65504.f));
}
static inline void store_row(int8_t* d, const float* s, int64_t H, int64_t D) {
  for (int64_t h = 0; h < H; ++h, s += D, d += D + kInt8ScaleBytes) {
    const float scale = row_absmax(s, D) / 127.f;
    int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
    const __m256 sv = _mm256_set1_ps(scale), lo = _mm256_set1_ps(-127.f), hi = _mm256_set1_ps(127.f);
    for (; i + 8 <= D; i += 8) {
      const __m256 r = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(s + i), sv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      const __m256i q = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi));
      const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));   // 8 int16, in order
      _mm_storel_epi64(reinterpret_cast<__m128i*>(d + i), _mm_packs_epi16(w, w));                       // 8 int8
    }
#endif
    for (; i < D; ++i)
      d[i] = (int8_t)std::min(127.f, std::max(-127.f, std::nearbyint(s[i] / scale)));
    std::memcpy(d + D, &scale, sizeof scale);
  }
}

// token row r of a cache (H heads) as float32 [H, D]: in place for float32, converted into buf else
static inline const float* cache_row(const float* r, float*, int64_t, int64_t) { return r; }
static inline const float* cache_row(const at::Half* r, float* buf, int64_t H, int64_t D) { half_to_float(r, buf, H * D); return buf; }
static inline const float* cache_row(const int8_t* r, float* buf, int64_t H, int64_t D) {
  for (int64_t h = 0; h < H; ++h, r += D + kInt8ScaleBytes) {
    const float scale = head_scale(r, D);
    for (int64_t i = 0; i < D; ++i) buf[h * D + i] = float(r[i]) * scale;
  }
  return buf;
}

// a cache row of n values on its way toward the core (hint: _MM_HINT_T0 into L1, _MM_HINT_T1 into L2)
template <int Hint, typename T>
static inline void prefetch_row(const T* row, int64_t n) {
  const char* r = reinterpret_cast<const char*>(row);
  for (int64_t l = 0; l < n * (int64_t)sizeof(T); l += 64) _mm_prefetch(r + l, static_cast<_mm_hint>(Hint));
}

#if defined(__AVX2__) && defined(__FMA__)
static inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#endif

// the float16 rows' vector: 16 float32 lanes with AVX-512, else 8 with AVX2
#ifdef __AVX512F__
struct Lanes {
  using V = __m512;
  static constexpr int64_t n = 16;
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V load(const at::Half* p) {                      // float16 values as float32, exactly
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static V load(const int8_t* p) {                        // int8 values as float32, exactly
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static float sum(V v) { return _mm512_reduce_add_ps(v); }
  static __m128 sum4(V a, V b, V c, V d) {                // each vector's sum, in one: (sum a, sum b, sum c, sum d)
    const V ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
    const V cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
    V x = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));   // a's, b's, c's, d's 4
    x = _mm512_add_ps(x, _mm512_permute_ps(x, 0xB1));
    x = _mm512_add_ps(x, _mm512_permute_ps(x, 0x4E));
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), x));
  }
};
#elif defined(__AVX2__) && defined(__FMA__)
struct Lanes {
  using V = __m256;
  static constexpr int64_t n = 8;
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V load(const at::Half* p) { return half8(p); }
  static V load(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static float sum(V v) { return hsum8(v); }
  static __m128 sum4(V a, V b, V c, V d) {                // each vector's sum, in one: (sum a, sum b, sum c, sum d)
    const V x = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  }
};
#endif

// pass 1 for one cached token row (all kv heads): scores[h * hs] = sc * q[h] . row[h / group], h < Hq
template <typename T>
static inline void row_scores(const float* q, const T* row, float* scores, int64_t hs, int64_t Hq, int64_t group,
                              int64_t D, float sc, float* buf) {
#if defined(__AVX2__) && defined(__FMA__)
  constexpr int64_t L = Lanes::n;
  if (!std::is_same_v<T, float> && D % (2 * L) == 0) {   // two sums a head, each row converted as it is read
    using V = Lanes::V;
    for (int64_t h = 0; h < Hq; ++h) {
      const T* kv = row + (h / group) * head_width<T>(D);
      const float* qv = q + h * D;
      V a0 = Lanes::mul(Lanes::load(qv), Lanes::load(kv));
      V a1 = Lanes::mul(Lanes::load(qv + L), Lanes::load(kv + L));
      for (int64_t d = 2 * L; d < D; d += 2 * L) {
        a0 = Lanes::fmadd(Lanes::load(qv + d), Lanes::load(kv + d), a0);
        a1 = Lanes::fmadd(Lanes::load(qv + d + L), Lanes::load(kv + d + L), a1);
      }
      float dot = Lanes::sum(Lanes::add(a0, a1));
      if constexpr (std::is_same_v<T, int8_t>) dot *= head_scale(kv, D);
      scores[h * hs] = dot * sc;
    }
    return;
  }
#endif
  const float* r = cache_row(row, buf, Hq / group, D);
  for (int64_t h = 0; h < Hq; ++h) {
    const float* kv = r + (h / group) * D;
    const float* qv = q + h * D;
    float s = 0.f;
    #pragma omp simd reduction(+:s)
    for (int64_t d = 0; d < D; ++d) s += qv[d] * kv[d];
    scores[h * hs] = s * sc;
  }
}

#if defined(__AVX2__) && defined(__FMA__)
// pass 1 for 4 cached token rows of a float16 or int8 cache at once (D a multiple of the lanes):
// scores[h * hs + j] = sc * q[h] . rows[j][h / group], j < 4. A head's q is loaded once for the 4,
// and their 4 sums reduced together
template <typename T>
static inline void rows_scores4(const float* q, const T* const* rows, float* scores, int64_t hs, int64_t Hq,
                                int64_t group, int64_t D, float sc) {
  constexpr int64_t L = Lanes::n;
  using V = Lanes::V;
  const __m128 scv = _mm_set1_ps(sc);
  for (int64_t h = 0; h < Hq; ++h) {
    const int64_t off = (h / group) * head_width<T>(D);
    const float* qv = q + h * D;
    V qd = Lanes::load(qv);
    V a0 = Lanes::mul(qd, Lanes::load(rows[0] + off)), a1 = Lanes::mul(qd, Lanes::load(rows[1] + off));
    V a2 = Lanes::mul(qd, Lanes::load(rows[2] + off)), a3 = Lanes::mul(qd, Lanes::load(rows[3] + off));
    for (int64_t d = L; d < D; d += L) {
      qd = Lanes::load(qv + d);
      a0 = Lanes::fmadd(qd, Lanes::load(rows[0] + off + d), a0);
      a1 = Lanes::fmadd(qd, Lanes::load(rows[1] + off + d), a1);
      a2 = Lanes::fmadd(qd, Lanes::load(rows[2] + off + d), a2);
      a3 = Lanes::fmadd(qd, Lanes::load(rows[3] + off + d), a3);
    }
    __m128 dot = Lanes::sum4(a0, a1, a2, a3);
    if constexpr (std::is_same_v<T, int8_t>)
      dot = _mm_mul_ps(dot, _mm_setr_ps(head_scale(rows[0] + off, D), head_scale(rows[1] + off, D),
                                        head_scale(rows[2] + off, D), head_scale(rows[3] + off, D)));
    _mm_storeu_ps(scores + h * hs, _mm_mul_ps(dot, scv));
  }
}
#endif

// pass 2 for m <= kMaxRows cached token rows, in order: o[h] += e[h * hs + j] * rows[j][h / group], j < m
constexpr int64_t kMaxRows = 4;
template <typename T>
static inline void rows_axpy(const T* const* rows, const float* e, int64_t hs, int64_t m, float* o, int64_t Hq,
                             int64_t group, int64_t D, float* buf) {
#if defined(__AVX2__) && defined(__FMA__)
  constexpr int64_t L = Lanes::n;
  if (!std::is_same_v<T, float> && D % L == 0) {          // o [D] of a head in registers for the m rows
    for (int64_t h = 0; h < Hq; ++h) {
      float* oh = o + h * D;
      const int64_t off = (h / group) * head_width<T>(D);
      float w[kMaxRows];                                   // each row's weight: int8's times its value scale
      for (int64_t j = 0; j < m; ++j) {
        w[j] = e[h * hs + j];
        if constexpr (std::is_same_v<T, int8_t>) w[j] *= head_scale(rows[j] + off, D);
      }
      for (int64_t d = 0; d < D; d += L) {
        auto acc = Lanes::load(oh + d);
        for (int64_t j = 0; j < m; ++j)
          acc = Lanes::fmadd(Lanes::set1(w[j]), Lanes::load(rows[j] + off + d), acc);
        Lanes::store(oh + d, acc);
      }
    }
    return;
  }
#endif
  for (int64_t j = 0; j < m; ++j) {
    const float* r = cache_row(rows[j], buf, Hq / group, D);
    for (int64_t h = 0; h < Hq; ++h) {
      const float ej = e[h * hs + j];
      const float* vv = r + (h / group) * D;
      float* oh = o + h * D;
      #pragma omp simd
      for (int64_t d = 0; d < D; ++d) oh[d] += ej * vv[d];
    }
  }
}

// one head's scores s [n] -> their exps in place (exp(s - max)); (the max, the exps' sum). float16
// and int8 caches with AVX2: 8 at a time (exp256, within 2 ulp); float32: std::exp, in order
template <typename T>
static inline std::pair<float, float> softmax_parts(float* s, int64_t n) {
  float mx = -INFINITY, sum = 0.f;
  int64_t t = 0;
#if defined(__AVX2__) && defined(__FMA__)
  if (!std::is_same_v<T, float> && n >= 8) {
    __m256 m8 = _mm256_set1_ps(-INFINITY);
    for (; t + 8 <= n; t += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(s + t));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    mx = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    for (; t < n; ++t) mx = std::max(mx, s[t]);
    const __m256 mv = _mm256_set1_ps(mx);
    __m256 s8 = _mm256_setzero_ps();
    for (t = 0; t + 8 <= n; t += 8) {
      const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + t), mv));
      _mm256_storeu_ps(s + t, e);
      s8 = _mm256_add_ps(s8, e);
    }
    sum = hsum8(s8);
    for (; t < n; ++t) { s[t] = std::exp(s[t] - mx); sum += s[t]; }
    return {mx, sum};
  }
#endif
  for (t = 0; t < n; ++t) mx = std::max(mx, s[t]);
  for (t = 0; t < n; ++t) {
    s[t] = std::exp(s[t] - mx);
    sum += s[t];
  }
  return {mx, sum};
}

template <typename T>
at::Tensor paged_decode_as(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor slot_mapping,
                           at::Tensor k_cache, at::Tensor v_cache,
                           at::Tensor block_tables, at::Tensor context_lens, double scale);

// q: [B, Hq, D]; k, v: [B, Hkv, D], this step's, written first at slot_mapping [B]; k_cache, v_cache:
// [N, S, Hkv, D] (int8: [N, S, Hkv, D + kInt8ScaleBytes]); block_tables: [B, W]; context_lens: [B]
// -> [B, Hq, D]. q, k and v may be row slices of a wider tensor (any stride between rows; each
// row's heads contiguous). Each cached token row (all heads) is read once, front to back.
at::Tensor paged_decode(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor slot_mapping,
                        at::Tensor k_cache, at::Tensor v_cache,
                        at::Tensor block_tables, at::Tensor context_lens, double scale) {
  const auto dt = k_cache.scalar_type();
  TORCH_CHECK(v_cache.scalar_type() == dt && (dt == at::kFloat || dt == at::kHalf || dt == at::kChar),
              "k_cache, v_cache: both float32, both float16 or both int8");
  if (dt == at::kHalf)
    return paged_decode_as<at::Half>(q, k, v, slot_mapping, k_cache, v_cache, block_tables, context_lens, scale);
  if (dt == at::kChar)
    return paged_decode_as<int8_t>(q, k, v, slot_mapping, k_cache, v_cache, block_tables, context_lens, scale);
  return paged_decode_as<float>(q, k, v, slot_mapping, k_cache, v_cache, block_tables, context_lens, scale);
}

template <typename T>
at::Tensor paged_decode_as(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor slot_mapping,
                           at::Tensor k_cache, at::Tensor v_cache,
                           at::Tensor block_tables, at::Tensor context_lens, double scale) {
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && block_tables.is_contiguous()
              && context_lens.is_contiguous() && slot_mapping.is_contiguous(), "contiguous caches and tables expected");
  for (const auto& t : {q, k, v})
    TORCH_CHECK(t.scalar_type() == at::kFloat && t.dim() == 3 && t.stride(2) == 1 && t.stride(1) == t.size(2),
                "q, k, v: float32 [B, H, D] with each row's heads contiguous");
  const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2);
  const int64_t S = k_cache.size(1), Hkv = k_cache.size(2), W = block_tables.size(1);
  TORCH_CHECK(k_cache.size(3) == head_width<T>(D) && v_cache.sizes() == k_cache.sizes() && k.size(1) == Hkv,
              "k_cache, v_cache: [N, S, Hkv, D] (int8: D + 4) for q's D");
  const int64_t group = Hq / Hkv, row_n = Hkv * head_width<T>(D);   // a token row: all heads
  T* kcw = k_cache.data_ptr<T>();
  T* vcw = v_cache.data_ptr<T>();
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  at::parallel_for(0, B, 8, [&](int64_t b0, int64_t b1) {   // this step's keys and values into their slots
    for (int64_t b = b0; b < b1; ++b) {
      store_row(kcw + slots[b] * row_n, k.data_ptr<float>() + b * k.stride(0), Hkv, D);
      store_row(vcw + slots[b] * row_n, v.data_ptr<float>() + b * v.stride(0), Hkv, D);
    }
  });
  const int64_t q_stride = q.stride(0);
  auto out = at::empty({B, Hq, D}, q.options());
  // each sequence's tokens in kHalves ranges, a task each, merged in order: one sequence alone
  // reads its cache on two threads, and a sequence's result does not depend on the batch or the
  // thread count. Per task and head: its scores' max, their exps' sum, the exps times v summed.
  constexpr int64_t kHalves = 2, kAhead = 2, kRows = kMaxRows;   // pass 2 adds kRows token rows into o at a time
  auto part = at::empty({B, kHalves, Hq, D}, q.options()), stats = at::empty({B, kHalves, Hq, 2}, q.options());
  const float* qp = q.data_ptr<float>();
  const T* kp = k_cache.data_ptr<T>();
  const T* vp = v_cache.data_ptr<T>();
  const int64_t* bt = block_tables.data_ptr<int64_t>();
  const int64_t* cl = context_lens.data_ptr<int64_t>();
  float *pp = part.data_ptr<float>(), *st = stats.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float sc = (float)scale;
  // task i: its sequence b and range c's tokens [t0, t1)
  auto task = [&](int64_t i, int64_t& b, int64_t& c, int64_t& t0, int64_t& t1) {
    const int64_t j = i / kHalves;
    b = j % 2 == 0 ? j / 2 : B - 1 - j / 2;
    c = i % kHalves;
    t0 = cl[b] * c / kHalves;
    t1 = cl[b] * (c + 1) / kHalves;
  };
  // each thread takes a contiguous range of tasks: alternating short and long rows (a prefill's
  // first and last tokens) keeps their work even
  at::parallel_for(0, B * kHalves, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, buf(Hkv * D);
    for (int64_t i = begin; i < end; ++i) {
      int64_t b, c, t0, t1;
      task(i, b, c, t0, t1);
      const int64_t n = t1 - t0;
      const float* qb = qp + b * q_stride;
      const int64_t* table = bt + b * W;
      // the row kAhead on, into L1 meanwhile; pass 1 also sends the value row of the key it reads
      // toward L2, so that pass 2 (this range's values, at most a few hundred KB) finds them there
      auto token_row = [&](const T* cache, int64_t t) {
        if (t + kAhead < t1) {
          const int64_t u = t + kAhead, at = (table[u / S] * S + u % S) * row_n;
          prefetch_row<_MM_HINT_T0>(cache + at, row_n);
          if (cache == kp) prefetch_row<_MM_HINT_T1>(vp + at, row_n);
        }
        return cache + (table[t / S] * S + t % S) * row_n;
      };
      float* pb = pp + (b * kHalves + c) * Hq * D;          // per head: o [D]
      float* sb = st + (b * kHalves + c) * Hq * 2;          // per head: the max, the sum
      scores.assign(n * Hq, 0.f);
      int64_t t = t0;                                      // pass 1: q . k for every head
#if defined(__AVX2__) && defined(__FMA__)
      if (!std::is_same_v<T, float> && D % Lanes::n == 0)   // 4 token rows at a time
        for (; t + 4 <= t1; t += 4) {
          const T* rows[4];
          for (int64_t j = 0; j < 4; ++j) rows[j] = token_row(kp, t + j);
          rows_scores4(qb, rows, scores.data() + (t - t0), n, Hq, group, D, sc);
        }
#endif
      for (; t < t1; ++t)
        row_scores(qb, token_row(kp, t), scores.data() + (t - t0), n, Hq, group, D, sc, buf.data());
      for (int64_t h = 0; h < Hq; ++h) {                  // per head: the max, the exps, their sum
        float* sh = scores.data() + h * n;
        const auto [mx, sum] = softmax_parts<T>(sh, n);
        sb[2 * h] = mx;
        sb[2 * h + 1] = sum;
      }
      std::fill(pb, pb + Hq * D, 0.f);
      // pass 2 reads this task's values from L2, so the memory would idle: meanwhile the thread's
      // next task's keys go toward L2, spread over pass 2's steps (pass 1 then finds them there)
      int64_t nb = 0, nc = 0, nu = 0, nt1 = 0;
      if (i + 1 < end) task(i + 1, nb, nc, nu, nt1);
      const int64_t* ntable = bt + nb * W;
      const int64_t steps = (n + kRows - 1) / kRows, per = steps ? (nt1 - nu + steps - 1) / steps : 0;
      for (int64_t t = t0; t < t1; t += kRows) {          // pass 2: the exps times v, summed in order
        const int64_t m = std::min(kRows, t1 - t);
        const T* rows[kRows];
        for (int64_t j = 0; j < m; ++j) rows[j] = token_row(vp, t + j);
        for (int64_t e = 0; e < per && nu < nt1; ++e, ++nu)
          prefetch_row<_MM_HINT_T1>(kp + (ntable[nu / S] * S + nu % S) * row_n, row_n);
        rows_axpy(rows, scores.data() + (t - t0), n, m, pb, Hq, group, D, buf.data());
      }
    }
  });
  for (int64_t b = 0; b < B; ++b)                     // the ranges merged: softmax over all of them
    for (int64_t h = 0; h < Hq; ++h) {
      const float* sh = st + b * kHalves * Hq * 2 + h * 2;      // range c's at sh[c * Hq * 2]
      float mx = -INFINITY;
      for (int64_t c = 0; c < kHalves; ++c) mx = std::max(mx, sh[c * Hq * 2]);
      float w[kHalves], sum = 0.f;
      for (int64_t c = 0; c < kHalves; ++c) {
        w[c] = sh[c * Hq * 2 + 1] > 0.f ? std::exp(sh[c * Hq * 2] - mx) : 0.f;   // an empty range weighs nothing
        sum += w[c] * sh[c * Hq * 2 + 1];
      }
      const float* oh = pp + b * kHalves * Hq * D + h * D;      // range c's at oh[c * Hq * D]
      float* o = op + (b * Hq + h) * D;
      for (int64_t d = 0; d < D; ++d) {
        float acc = 0.f;
        for (int64_t c = 0; c < kHalves; ++c) acc += w[c] * oh[c * Hq * D + d];
        o[d] = acc / sum;
      }
    }
  return out;
}


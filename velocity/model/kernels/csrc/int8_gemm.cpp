// The int8 linears' GEMM in C++ (built by velocity/model/kernels/cpu_kernels.py), where the kernels are
// built with AVX-512 VNNI or AVX2 (`int8_gemm_bits`); Int8Linear (velocity.model.layers.int8_linear) runs
// on it there, on weights in `int8_pack`'s layout.
//
// Each row is quantized as fbgemm quantizes it (round(L x + L + 1), uint8; L = 127 with VNNI, 63
// with AVX2, where fbgemm's pairs of products in int16 need 7-bit rows) and its products summed in
// int32 as fbgemm sums them. Where the CPU has AMX (and a --cpu-isa cap leaves it in:
// `int8_gemm_amx`), the sums are tdpbusd's on 16-row tiles: int8_pack's layout is the one its
// second operand reads, two row blocks beside two blocks of 16 channels, so each weight is read
// once for up to 32 rows. Elsewhere the 16 output channels of each 64 bytes of weights are summed
// in the lanes of one register (AVX2: two), with no horizontal sums: at one row it reads the
// weights once, front to back, nearer the memory bound than fbgemm's op; with more rows, 8 rows
// (AVX2: 4) share each weight load. Every path sums the same integers exactly, so a row's output
// is the same on each (docs/benchmarks.md measures them: "int8 on CPU", "Where a CPU step goes").
// Elsewhere Int8Linear keeps fbgemm.
#include "common.h"
#include "vec.h"

// The row width int8_gemm is built for: 8 bits with AVX-512 VNNI (4 products summed in int32), 7
// with AVX2 alone (pairs of products summed in int16, which 7-bit rows keep from saturating, as
// fbgemm's reduce_range does), 0 where neither is in the compiler's flags (-march=native, less
// what a --cpu-isa cap leaves out): no int8_gemm.
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
constexpr int64_t kGemmBits = 8;
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int64_t kGemmBits = 7;
#else
constexpr int64_t kGemmBits = 0;
#endif
int64_t int8_gemm_bits() { return kGemmBits; }

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
// 16 channels' zero-point sums: each channel's weights summed, times the rows' zero point Z
static inline __m512i zero_sums(const int32_t* wsum, float Z) {
  return _mm512_mullo_epi32(_mm512_loadu_si512(wsum), _mm512_set1_epi32((int)Z));
}

// 16 channels' outputs of one row from their int32 sums: (sums - zero) as float32, times the
// scales (every path's last step, so each gives a row the same outputs)
static inline void store_sums(float* o, __m512i acc, __m512i zero, __m512 scale) {
  _mm512_storeu_ps(o, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc, zero)), scale));
}
#endif

#if defined(__AMX_INT8__) && defined(__AMX_TILE__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <sys/syscall.h>
#include <unistd.h>
#define VELOCITY_AMX 1
// Linux hands a process the AMX tiles' state only once it asks (arch_prctl ARCH_REQ_XCOMP_PERM for
// XTILEDATA); a kernel or hypervisor that refuses leaves the VNNI path
static bool amx_granted() {
  static const bool granted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  return granted;
}

// Every tile 16 rows of 64 bytes: tmm0-3 int32 sums (row block r, column block n: tmm(2 r + n)),
// tmm4-5 two row blocks of uint8 rows, tmm6-7 two column blocks' weights (int8_pack's 16 groups of 4
// inputs: the layout tdpbusd reads)
static void amx_configure() {
  alignas(64) uint8_t cfg[64] = {};
  cfg[0] = 1;                                     // palette 1
  for (int t = 0; t < 8; ++t) {
    cfg[16 + 2 * t] = 64;                         // bytes a row
    cfg[48 + t] = 16;                             // rows
  }
  _tile_loadconfig(cfg);
}

// the sums of RB row blocks (16 rows each, a: the first's, rows K bytes apart) by NC column blocks
// (w: the first's packed weights, G groups of 64 bytes each) into c: [RB * 2 + NC][16][16] int32
template <int RB, int NC>
static void amx_dot(const uint8_t* a, int64_t K, const int8_t* w, int64_t G, int32_t* c) {
  _tile_zero(0);
  if constexpr (NC > 1) _tile_zero(1);
  if constexpr (RB > 1) _tile_zero(2);
  if constexpr (RB > 1 && NC > 1) _tile_zero(3);
  for (int64_t k = 0; k < K; k += 64) {          // 64 inputs: 16 groups of 4, 1 KB of each block's weights
    _tile_loadd(4, a + k, K);
    _tile_loadd(6, w + k * 16, 64);
    if constexpr (RB > 1) _tile_loadd(5, a + 16 * K + k, K);
    if constexpr (NC > 1) _tile_loadd(7, w + G * 64 + k * 16, 64);
    _tile_dpbusd(0, 4, 6);
    if constexpr (NC > 1) _tile_dpbusd(1, 4, 7);
    if constexpr (RB > 1) _tile_dpbusd(2, 5, 6);
    if constexpr (RB > 1 && NC > 1) _tile_dpbusd(3, 5, 7);
  }
  _tile_stored(0, c, 64);
  if constexpr (NC > 1) _tile_stored(1, c + 256, 64);
  if constexpr (RB > 1) _tile_stored(2, c + 512, 64);
  if constexpr (RB > 1 && NC > 1) _tile_stored(3, c + 768, 64);
}
#endif

// True where int8_gemm runs on AMX's tiles (inputs a multiple of 64): built with AMX and granted them
int64_t int8_gemm_amx() {
#ifdef VELOCITY_AMX
  return amx_granted();
#else
  return false;
#endif
}

// w: [N, K] int8 -> [N / 16, K / 4, 16, 4]: each 64 bytes hold 16 output channels' weights for one
// group of 4 inputs, the layout _mm512_dpbusd_epi32 sums into 16 lanes (AVX2: two halves of 8)
at::Tensor int8_pack(at::Tensor w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kChar, "w: int8 [N, K]");
  const int64_t N = w.size(0), K = w.size(1);
  TORCH_CHECK(N % 16 == 0 && K % 4 == 0, "int8_pack: N a multiple of 16 and K of 4, got ", N, " x ", K);
  return w.contiguous().view({N / 16, 16, K / 4, 4}).permute({0, 2, 1, 3}).contiguous();
}

// q[i] = round(x[i] L + Z) clamped to [0, 2 L + 1] as uint8: fbgemm's rounding, of the product and
// sum in one step (fused), ties to even
static void quantize_rows(const float* x, uint8_t* q, int64_t n, float L, float Z) {
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 l = _mm256_set1_ps(L), z = _mm256_set1_ps(Z), lo = _mm256_setzero_ps(), hi = _mm256_set1_ps(2 * L + 1);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);   // the packs' dwords back in row order
  for (; i + 32 <= n; i += 32) {
    __m256i v[4];
    for (int j = 0; j < 4; ++j) {
      const __m256 r = _mm256_round_ps(_mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8 * j), l, z),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      v[j] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi));
    }
    const __m256i b = _mm256_packus_epi16(_mm256_packus_epi32(v[0], v[1]), _mm256_packus_epi32(v[2], v[3]));
    _mm256_storeu_si256((__m256i*)(q + i), _mm256_permutevar8x32_epi32(b, order));
  }
#endif
  for (; i < n; ++i) q[i] = (uint8_t)std::min(2 * L + 1, std::max(0.f, std::nearbyint(std::fma(x[i], L, Z))));
}

// x: [T, K] float32 rows scaled into [-1, 1]; wp: int8_pack(w) of w [N, K] (per output channel
// scale s, symmetric); wsum: [N] int32, each row of w summed; ws: [N] float32, s / L -> [T, N]
// float32: sum_k (q_k - Z) w[n, k] * ws[n], q = round(L x + Z) with L = 2^(bits - 1) - 1 and Z = L + 1
// (fbgemm's quint8, scale 1 / L, zero point Z, rounded as fbgemm rounds): the output before the
// rows' scales (Int8Linear.scaled)
at::Tensor int8_gemm(at::Tensor x, at::Tensor wp, at::Tensor wsum, at::Tensor ws) {
  TORCH_CHECK(kGemmBits > 0, "int8_gemm: built without AVX-512 VNNI or AVX2 (int8_gemm_bits() is 0)");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kFloat, "x: contiguous float32 [T, K]");
  TORCH_CHECK(wp.dim() == 4 && wp.is_contiguous() && wp.size(2) == 16 && wp.size(3) == 4 && wp.size(1) * 4 == x.size(1),
              "wp: int8_pack of [N, K] weights, K = x's columns");
  const int64_t T = x.size(0), K = x.size(1), G = K / 4, NB = wp.size(0), N = NB * 16;
  TORCH_CHECK(wsum.numel() == N && ws.numel() == N, "wsum, ws: [N]");
  auto out = at::empty({T, N}, x.options());
  if (T == 0) return out;
  constexpr float L = kGemmBits ? (1 << (kGemmBits - 1)) - 1 : 1, Z = L + 1;
  // the rows as uint8, 4 to an int32 (one broadcast a group); for AMX's tiles padded to whole
  // blocks of 16 rows, the padding zero (its sums are not stored)
  const bool amx = int8_gemm_amx() && K % 64 == 0;
  const int64_t rows = amx ? (T + 15) / 16 * 16 : T;
  std::unique_ptr<int32_t[]> qx(new int32_t[rows * G]);
  uint8_t* q8 = reinterpret_cast<uint8_t*>(qx.get());
  std::memset(q8 + T * K, 0, (rows - T) * K);
  const float* xp = x.data_ptr<float>();
  at::parallel_for(0, T, 8, [&](int64_t t0, int64_t t1) { quantize_rows(xp + t0 * K, q8 + t0 * K, (t1 - t0) * K, L, Z); });
  const int8_t* wb0 = wp.data_ptr<int8_t>();
  const int32_t* sp = wsum.data_ptr<int32_t>();
  const float* sc = ws.data_ptr<float>();
  float* op = out.data_ptr<float>();
#ifdef VELOCITY_AMX
  if (amx) {
    // a pair of row blocks beside a pair of column blocks in the tiles: each weight read once for 32 rows
    const int64_t RBS = rows / 16;
    at::parallel_for(0, (NB + 1) / 2, 1, [&](int64_t p0, int64_t p1) {
      amx_configure();
      alignas(64) int32_t c[4 * 256];
      for (int64_t b = 2 * p0; b < std::min(NB, 2 * p1); b += 2) {
        const int nc = std::min<int64_t>(2, NB - b);
        const __m512i zero[2] = {zero_sums(sp + b * 16, Z), nc > 1 ? zero_sums(sp + b * 16 + 16, Z) : _mm512_setzero_si512()};
        const __m512 scale[2] = {_mm512_loadu_ps(sc + b * 16), nc > 1 ? _mm512_loadu_ps(sc + b * 16 + 16) : _mm512_setzero_ps()};
        for (int64_t r = 0; r < RBS; r += 2) {
          const int rb = std::min<int64_t>(2, RBS - r);
          const uint8_t* a = q8 + r * 16 * K;
          const int8_t* w = wb0 + b * G * 64;
          if (rb > 1 && nc > 1) amx_dot<2, 2>(a, K, w, G, c);
          else if (rb > 1) amx_dot<2, 1>(a, K, w, G, c);
          else if (nc > 1) amx_dot<1, 2>(a, K, w, G, c);
          else amx_dot<1, 1>(a, K, w, G, c);
          for (int i = 0; i < rb; ++i)
            for (int n = 0; n < nc; ++n)
              for (int64_t m = 0, t = (r + i) * 16; m < 16 && t < T; ++m, ++t) {
                store_sums(op + t * N + (b + n) * 16, _mm512_load_si512(c + (2 * i + n) * 256 + m * 16), zero[n], scale[n]);
              }
        }
      }
      _tile_release();
    });
    return out;
  }
#endif
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  constexpr int64_t TB = 8;                       // rows that share each load of 64 weight bytes
  at::parallel_for(0, NB, 4, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int8_t* wb = wb0 + b * G * 64;
      const __m512i zero = zero_sums(sp + b * 16, Z);
      const __m512 scale = _mm512_loadu_ps(sc + b * 16);
      for (int64_t t0 = 0; t0 < T; t0 += TB) {
        const int64_t tn = std::min(TB, T - t0);
        const int32_t* xq = qx.get() + t0 * G;
        __m512i acc[TB];
        for (int64_t i = 0; i < TB; ++i) acc[i] = _mm512_setzero_si512();
        // the rows' dot products, the count a constant for a full block (its sums stay in registers)
        auto dot = [&](auto rows) {
          for (int64_t g = 0; g < G; ++g) {
            const __m512i w = _mm512_loadu_si512(wb + g * 64);
            for (int64_t i = 0; i < rows; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], _mm512_set1_epi32(xq[i * G + g]), w);
          }
        };
        if (tn == TB) dot(std::integral_constant<int64_t, TB>{}); else dot(tn);
        for (int64_t i = 0; i < tn; ++i)
          store_sums(op + (t0 + i) * N + b * 16, acc[i], zero, scale);
      }
    }
  });
#elif defined(__AVX2__) && defined(__FMA__)
  constexpr int64_t TB = 4;                       // rows that share each load (2 x 8 sums a row: 8 registers)
  const __m256i ones = _mm256_set1_epi16(1);
  const int64_t tiles = (T + TB - 1) / TB, share = (G + tiles - 1) / tiles;
  at::parallel_for(0, NB, 4, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int8_t* wb = wb0 + b * G * 64;
      __m256i zero[2];
      __m256 scale[2];
      for (int h = 0; h < 2; ++h) {
        zero[h] = _mm256_mullo_epi32(_mm256_loadu_si256((const __m256i*)(sp + b * 16 + h * 8)),
                                     _mm256_set1_epi32((int)Z));
        scale[h] = _mm256_loadu_ps(sc + b * 16 + h * 8);
      }
      for (int64_t t0 = 0; t0 < T; t0 += TB) {
        const int64_t tn = std::min(TB, T - t0);
        const int32_t* xq = qx.get() + t0 * G;
        // several tiles: each brings its share of the thread's next block into L2 as it goes, one
        // 64-byte group every `tiles` groups, so the weights' stream runs under the arithmetic
        // (as f32_gemm does)
        const int8_t* pf = tiles > 1 && b + 1 < b1 ? wb + (G + t0 / TB * share) * 64 : nullptr;
        int64_t wait = 0;
        __m256i acc[2 * TB];
        for (int64_t i = 0; i < 2 * TB; ++i) acc[i] = _mm256_setzero_si256();
        // per half of 8 channels: pairs of products in int16 (at most 2 x 127 x 127 with 7-bit
        // rows: no saturation), the pairs summed into int32 by a multiply-add with ones
        auto sums = [&](__m256i q, __m256i w) { return _mm256_madd_epi16(_mm256_maddubs_epi16(q, w), ones); };
        auto dot = [&](auto rows) {
          int64_t g = 0;
          if (rows > 1)          // two groups a pass, their sums added first: fewer dependent adds
            for (; g + 2 <= G; g += 2) {
              _mm_prefetch((const char*)(wb + g * 64 + 1024), _MM_HINT_T0);   // 16 groups ahead
              _mm_prefetch((const char*)(wb + g * 64 + 1088), _MM_HINT_T0);
              if (pf && (wait -= 2) <= 0) { wait += tiles; _mm_prefetch((const char*)pf, _MM_HINT_T1); pf += 64; }
              const __m256i* w = (const __m256i*)(wb + g * 64);
              const __m256i w0 = _mm256_loadu_si256(w), w1 = _mm256_loadu_si256(w + 1);
              const __m256i w2 = _mm256_loadu_si256(w + 2), w3 = _mm256_loadu_si256(w + 3);
              for (int64_t i = 0; i < rows; ++i) {
                const __m256i q = _mm256_set1_epi32(xq[i * G + g]), r = _mm256_set1_epi32(xq[i * G + g + 1]);
                acc[2 * i] = _mm256_add_epi32(acc[2 * i], _mm256_add_epi32(sums(q, w0), sums(r, w2)));
                acc[2 * i + 1] = _mm256_add_epi32(acc[2 * i + 1], _mm256_add_epi32(sums(q, w1), sums(r, w3)));
              }
            }
          for (; g < G; ++g) {   // one row (a decode at batch 1: memory-bound) or the last group
            _mm_prefetch((const char*)(wb + g * 64 + 1024), _MM_HINT_T0);
            if (pf && --wait <= 0) { wait = tiles; _mm_prefetch((const char*)pf, _MM_HINT_T1); pf += 64; }
            const __m256i w0 = _mm256_loadu_si256((const __m256i*)(wb + g * 64));
            const __m256i w1 = _mm256_loadu_si256((const __m256i*)(wb + g * 64 + 32));
            for (int64_t i = 0; i < rows; ++i) {
              const __m256i q = _mm256_set1_epi32(xq[i * G + g]);
              acc[2 * i] = _mm256_add_epi32(acc[2 * i], sums(q, w0));
              acc[2 * i + 1] = _mm256_add_epi32(acc[2 * i + 1], sums(q, w1));
            }
          }
        };
        if (tn == TB) dot(std::integral_constant<int64_t, TB>{});
        else if (tn == 1) dot(std::integral_constant<int64_t, 1>{});      // a decode at batch 1: its sums in registers
        else dot(tn);
        for (int64_t i = 0; i < tn; ++i)
          for (int h = 0; h < 2; ++h)
            _mm256_storeu_ps(op + (t0 + i) * N + b * 16 + h * 8,
                             _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(acc[2 * i + h], zero[h])), scale[h]));
      }
    }
  });
#endif
  return out;
}

// Int8Linear.forward on int8_gemm in one call: each row of x [T, K] divided by its own max |x| (at
// least 1e-30), int8_gemm on those rows, each output row multiplied back by it and the bias [N]
// (empty: none) added; the same float32 operations, in the same order, as the layer's torch ones
// (x.abs().amax(), x / r, y * r, y + bias), so its outputs are theirs bit for bit
at::Tensor int8_linear(at::Tensor x, at::Tensor wp, at::Tensor wsum, at::Tensor ws, at::Tensor bias) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kFloat, "x: contiguous float32 [T, K]");
  const int64_t T = x.size(0), K = x.size(1);
  auto xs = at::empty_like(x);
  std::vector<float> r(T);
  const float* xp = x.data_ptr<float>();
  float* sp = xs.data_ptr<float>();
  at::parallel_for(0, T, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* row = xp + t * K;
      const float rt = r[t] = row_absmax(row, K);
      #pragma omp simd
      for (int64_t k = 0; k < K; ++k) sp[t * K + k] = row[k] / rt;
    }
  });
  auto out = int8_gemm(xs, wp, wsum, ws);
  const int64_t N = out.size(1);
  TORCH_CHECK(bias.numel() == 0 || (bias.numel() == N && bias.is_contiguous() && bias.scalar_type() == at::kFloat),
              "bias: float32 [N] or empty");
  float* op = out.data_ptr<float>();
  const float* bp = bias.numel() ? bias.data_ptr<float>() : nullptr;
  at::parallel_for(0, T, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* y = op + t * N;
      const float rt = r[t];
      for (int64_t n = 0; n < N; ++n) y[n] *= rt;
      if (bp)
        for (int64_t n = 0; n < N; ++n) y[n] += bp[n];
    }
  });
  return out;
}


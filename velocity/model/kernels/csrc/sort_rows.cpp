// The sampler's sort of each row (sort_rows: a radix sort, rows in parallel), and whether this
// build has OpenMP (built_with_openmp).
#include "common.h"

// x: [R, V] float32 -> (x's rows sorted ascending [R, V], their c largest values descending [R, c],
// and those values' ids [R, c]). Per row an LSD radix sort, 8 bits a pass, of (key, id) pairs: the
// key orders as the float does; stable, so of equal values the higher id comes first among the c.
std::vector<at::Tensor> sort_rows(at::Tensor x, int64_t c) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kFloat, "contiguous [R, V] float32 expected");
  const int64_t R = x.size(0), V = x.size(1);
  TORCH_CHECK(0 < c && c <= V && V < (int64_t(1) << 32), "need 0 < c <= V < 2^32");
  auto asc = at::empty_like(x);
  auto top = at::empty({R, c}, x.options());
  auto ids = at::empty({R, c}, x.options().dtype(at::kLong));
  const uint32_t* xp = reinterpret_cast<const uint32_t*>(x.data_ptr<float>());
  uint32_t* ap = reinterpret_cast<uint32_t*>(asc.data_ptr<float>());
  uint32_t* tp = reinterpret_cast<uint32_t*>(top.data_ptr<float>());
  int64_t* ip = ids.data_ptr<int64_t>();
  at::parallel_for(0, R, 1, [&](int64_t begin, int64_t end) {
    std::vector<uint64_t> buf_a(V), buf_b(V);
    for (int64_t r = begin; r < end; ++r) {
      const uint32_t* in = xp + r * V;
      uint32_t hist[4][256];
      std::memset(hist, 0, sizeof hist);
      for (int64_t i = 0; i < V; ++i) {      // key: negative floats all bits flipped, others the sign bit
        const uint32_t k = in[i] ^ ((in[i] >> 31) ? 0xFFFFFFFFu : 0x80000000u);
        buf_a[i] = (uint64_t(k) << 32) | uint64_t(i);
        for (int p = 0; p < 4; ++p) ++hist[p][(k >> (8 * p)) & 255];
      }
      uint64_t *src = buf_a.data(), *dst = buf_b.data();
      for (int p = 0; p < 4; ++p) {
        const int shift = 32 + 8 * p;
        uint32_t* h = hist[p];
        if (h[(src[0] >> shift) & 255] == uint32_t(V)) continue;      // every key has this digit
        uint32_t sum = 0;
        for (int j = 0; j < 256; ++j) { const uint32_t n = h[j]; h[j] = sum; sum += n; }
        for (int64_t i = 0; i < V; ++i) dst[h[(src[i] >> shift) & 255]++] = src[i];
        std::swap(src, dst);
      }
      uint32_t* out = ap + r * V;
      for (int64_t i = 0; i < V; ++i) {
        const uint32_t k = uint32_t(src[i] >> 32);
        out[i] = k ^ ((k >> 31) ? 0x80000000u : 0xFFFFFFFFu);
      }
      for (int64_t j = 0; j < c; ++j) {
        tp[r * c + j] = out[V - 1 - j];
        ip[r * c + j] = int64_t(src[V - 1 - j] & 0xFFFFFFFFu);
      }
    }
  });
  return {asc, top, ids};
}

// at::parallel_for splits work across threads only where this file is built with OpenMP.
bool built_with_openmp() {
#ifdef _OPENMP
  return true;
#else
  return false;
#endif
}

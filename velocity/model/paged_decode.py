"""Paged decode attention in C++ (built with velocity.model.cpu_kernels): reads each cached key
and value once, straight from the paged cache, instead of gathering them into a padded copy first
(the torch path in velocity.model.attention stays the reference; tests compare the two).
layer_rows' rope_attend_scale calls it, so its source comes before theirs.

Each sequence's tokens are split in kHalves ranges, a task each, and the ranges' softmax partials
are merged in order: one sequence alone reads its cache on two threads, and the ranges follow its
length alone, so its output is the same, bit for bit, alone, in a batch and on any thread count.
"""

SOURCE = r"""
// q: [B, Hq, D]; k, v: [B, Hkv, D], this step's, written first at slot_mapping [B]; k_cache, v_cache:
// [N, S, Hkv, D]; block_tables: [B, W]; context_lens: [B] -> [B, Hq, D]. q, k and v may be row
// slices of a wider tensor (any stride between rows; each row's heads contiguous).
// Each cached token row (all heads) is read once, front to back.
at::Tensor paged_decode(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor slot_mapping,
                        at::Tensor k_cache, at::Tensor v_cache,
                        at::Tensor block_tables, at::Tensor context_lens, double scale) {
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && block_tables.is_contiguous()
              && context_lens.is_contiguous() && slot_mapping.is_contiguous(), "contiguous caches and tables expected");
  for (const auto& t : {q, k, v})
    TORCH_CHECK(t.scalar_type() == at::kFloat && t.dim() == 3 && t.stride(2) == 1 && t.stride(1) == t.size(2),
                "q, k, v: float32 [B, H, D] with each row's heads contiguous");
  const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2);
  const int64_t S = k_cache.size(1), Hkv = k_cache.size(2), W = block_tables.size(1);
  const int64_t group = Hq / Hkv, row = Hkv * D;
  float* kcw = k_cache.data_ptr<float>();
  float* vcw = v_cache.data_ptr<float>();
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {                   // this step's keys and values into their slots
    std::memcpy(kcw + slots[b] * row, k.data_ptr<float>() + b * k.stride(0), row * sizeof(float));
    std::memcpy(vcw + slots[b] * row, v.data_ptr<float>() + b * v.stride(0), row * sizeof(float));
  }
  const int64_t q_stride = q.stride(0);
  auto out = at::empty({B, Hq, D}, q.options());
  // each sequence's tokens in kHalves ranges, a task each, merged in order: one sequence alone
  // reads its cache on two threads, and a sequence's result does not depend on the batch or the
  // thread count. Per task and head: its scores' max, their exps' sum, the exps times v summed.
  constexpr int64_t kHalves = 2;
  auto part = at::empty({B, kHalves, Hq, D}, q.options()), stats = at::empty({B, kHalves, Hq, 2}, q.options());
  const float* qp = q.data_ptr<float>();
  const float* kp = k_cache.data_ptr<float>();
  const float* vp = v_cache.data_ptr<float>();
  const int64_t* bt = block_tables.data_ptr<int64_t>();
  const int64_t* cl = context_lens.data_ptr<int64_t>();
  float *pp = part.data_ptr<float>(), *st = stats.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float sc = (float)scale;
  // each thread takes a contiguous range of tasks: alternating short and long rows (a prefill's
  // first and last tokens) keeps their work even
  at::parallel_for(0, B * kHalves, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t j = i / kHalves, b = j % 2 == 0 ? j / 2 : B - 1 - j / 2, c = i % kHalves;
      const int64_t t0 = cl[b] * c / kHalves, t1 = cl[b] * (c + 1) / kHalves, n = t1 - t0;
      const float* qb = qp + b * q_stride;
      const int64_t* table = bt + b * W;
      auto token_row = [&](const float* cache, int64_t t) { return cache + (table[t / S] * S + t % S) * Hkv * D; };
      float* pb = pp + (b * kHalves + c) * Hq * D;          // per head: o [D]
      float* sb = st + (b * kHalves + c) * Hq * 2;          // per head: the max, the sum
      scores.assign(n * Hq, 0.f);
      for (int64_t t = t0; t < t1; ++t) {                 // pass 1: q . k for every head
        const float* row = token_row(kp, t);
        for (int64_t h = 0; h < Hq; ++h) {
          const float* kv = row + (h / group) * D;
          const float* qv = qb + h * D;
          float s = 0.f;
          #pragma omp simd reduction(+:s)
          for (int64_t d = 0; d < D; ++d) s += qv[d] * kv[d];
          scores[(t - t0) * Hq + h] = s * sc;
        }
      }
      for (int64_t h = 0; h < Hq; ++h) {
        float mx = -INFINITY, sum = 0.f;
        for (int64_t t = 0; t < n; ++t) mx = std::max(mx, scores[t * Hq + h]);
        for (int64_t t = 0; t < n; ++t) {
          const float e = std::exp(scores[t * Hq + h] - mx);
          scores[t * Hq + h] = e;
          sum += e;
        }
        sb[2 * h] = mx;
        sb[2 * h + 1] = sum;
      }
      std::fill(pb, pb + Hq * D, 0.f);
      for (int64_t t = t0; t < t1; ++t) {                 // pass 2: the exps times v, summed
        const float* row = token_row(vp, t);
        for (int64_t h = 0; h < Hq; ++h) {
          const float e = scores[(t - t0) * Hq + h];
          const float* vv = row + (h / group) * D;
          float* o = pb + h * D;
          #pragma omp simd
          for (int64_t d = 0; d < D; ++d) o[d] += e * vv[d];
        }
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

"""

FUNCTIONS = ["paged_decode"]

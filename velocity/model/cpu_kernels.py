"""An optional C++ kernel for paged decode attention on CPU, built with torch's cpp_extension
(needs g++ and ninja) by scripts/setup.sh, or on first use. It reads each cached key and value
once, straight from the paged cache, instead of gathering them into a padded copy first.
The torch path in attention.py stays the reference; tests compare the two.

The build (about 30 s) is cached inside the Python environment (sys.prefix/velocity-kernels), so
checkouts with venvs of their own never rebuild each other's; torch's default cache is used
where that folder is not writable.

    python -m velocity.model.cpu_kernels     # build now; exit 1 (with the reason) if it cannot
"""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <vector>

// q: [B, Hq, D]; k_cache, v_cache: [N, S, Hkv, D]; block_tables: [B, W]; context_lens: [B] -> [B, Hq, D]
// One task per sequence; each cached token row (all heads) is read once, front to back.
torch::Tensor paged_decode(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                           torch::Tensor block_tables, torch::Tensor context_lens, double scale) {
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous()
              && block_tables.is_contiguous() && context_lens.is_contiguous(), "contiguous inputs expected");
  const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2);
  const int64_t S = k_cache.size(1), Hkv = k_cache.size(2), W = block_tables.size(1);
  const int64_t group = Hq / Hkv;
  auto out = torch::zeros_like(q);
  const float* qp = q.data_ptr<float>();
  const float* kp = k_cache.data_ptr<float>();
  const float* vp = v_cache.data_ptr<float>();
  const int64_t* bt = block_tables.data_ptr<int64_t>();
  const int64_t* cl = context_lens.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  const float sc = (float)scale;
  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, mx(Hq), sum(Hq);
    for (int64_t b = begin; b < end; ++b) {
      const int64_t ctx = cl[b];
      const float* qb = qp + b * Hq * D;
      scores.assign(ctx * Hq, 0.f);
      for (int64_t t = 0; t < ctx; ++t) {                 // pass 1: q . k for every head
        const float* row = kp + (bt[b * W + t / S] * S + t % S) * Hkv * D;
        for (int64_t h = 0; h < Hq; ++h) {
          const float* kv = row + (h / group) * D;
          const float* qv = qb + h * D;
          float s = 0.f;
          #pragma omp simd reduction(+:s)
          for (int64_t d = 0; d < D; ++d) s += qv[d] * kv[d];
          scores[t * Hq + h] = s * sc;
        }
      }
      for (int64_t h = 0; h < Hq; ++h) { mx[h] = -INFINITY; sum[h] = 0.f; }
      for (int64_t t = 0; t < ctx; ++t)
        for (int64_t h = 0; h < Hq; ++h) mx[h] = std::max(mx[h], scores[t * Hq + h]);
      for (int64_t t = 0; t < ctx; ++t)
        for (int64_t h = 0; h < Hq; ++h) {
          const float e = std::exp(scores[t * Hq + h] - mx[h]);
          scores[t * Hq + h] = e;
          sum[h] += e;
        }
      float* ob = op + b * Hq * D;
      for (int64_t t = 0; t < ctx; ++t) {                 // pass 2: weighted sum of v
        const float* row = vp + (bt[b * W + t / S] * S + t % S) * Hkv * D;
        for (int64_t h = 0; h < Hq; ++h) {
          const float p = scores[t * Hq + h] / sum[h];
          const float* vv = row + (h / group) * D;
          float* o = ob + h * D;
          #pragma omp simd
          for (int64_t d = 0; d < D; ++d) o[d] += p * vv[d];
        }
      }
    }
  });
  return out;
}
"""

_kernel = None
_tried = False


def paged_decode_kernel():
    """The compiled kernel, or None where it cannot be built (EngineConfig.cpu_kernel=False, in
    serving VELOCITY_CPU_KERNEL=0, does without it)."""
    global _kernel, _tried
    if _tried:
        return _kernel
    _tried = True
    try:
        from torch.utils.cpp_extension import load_inline

        _kernel = load_inline(name="velocity_paged_decode_v2", cpp_sources=SOURCE, functions=["paged_decode"],
                              extra_cflags=["-O3", "-fopenmp-simd", "-march=native"], verbose=False,
                              build_directory=build_directory()).paged_decode
        logger.info("using the C++ paged decode attention kernel")
    except Exception as e:   # no compiler or ninja: the torch path serves
        logger.warning("C++ paged decode attention kernel unavailable, using the slower torch path: %s "
                       "(install g++, e.g. apt-get install g++, then rerun scripts/setup.sh; "
                       "VELOCITY_CPU_KERNEL=0 turns the kernel off)", (str(e).strip().splitlines() or [repr(e)])[-1])
    return _kernel


def build_directory() -> str | None:
    """sys.prefix/velocity-kernels/<python>-<torch> where writable, else None (torch's default)."""
    d = Path(sys.prefix) / "velocity-kernels" / f"py{sys.version_info[0]}{sys.version_info[1]}-torch{torch.__version__}"
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return str(d) if os.access(d, os.W_OK) else None


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sys.exit(0 if paged_decode_kernel() is not None else 1)

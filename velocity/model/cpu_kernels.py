"""Optional C++ kernels for CPU, built with torch's cpp_extension (needs g++ and ninja) by
scripts/setup.sh, or on first use:
- paged decode attention (velocity.model.paged_decode);
- sort_rows: the sampler's sort of each row's values, with the ids of the row's c best (a radix
  sort, rows in parallel: numpy sorts values alone but on one thread, torch orders indices too);
- the decoder layer's row operations between its linears (velocity.model.layer_rows), and the
  linears themselves where built with AVX2 or AVX-512: int8 (velocity.model.int8_gemm, AVX-512
  VNNI or AVX2) and float32 (velocity.model.f32_gemm).

The build is cached inside the Python environment (sys.prefix/velocity-kernels), so
checkouts with venvs of their own never rebuild each other's; torch's default cache is used
where that folder is not writable. A built module is named by a hash of its source, flags
(-march=native, less what a --cpu-isa cap leaves out: velocity.model.cpu_isa), torch version and
the CPU, and a later process imports it straight from its file: no build step (ninja) runs at
load time, so the two ninja binaries a machine may have (Debian's on PATH, the venv's) can never
make one process see another's build as stale and rebuild it.

    python -m velocity.model.cpu_kernels     # build now; exit 1 (with the reason) if it cannot
"""
from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import sys
from pathlib import Path

import torch

from velocity.model import f32_gemm, int8_gemm, layer_rows, paged_decode
from velocity.model.cpu_isa import compiler_flags

logger = logging.getLogger(__name__)

# Only the headers the kernels use: torch/extension.h (the whole C++ frontend) would be most of
# the build's time, spent parsing.
SOURCE = r"""
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/Exceptions.h>
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

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
"""

_module = None
_tried = False
CFLAGS = ["-O3", "-fopenmp", *compiler_flags()]    # -fopenmp: without it at::parallel_for runs on one thread
SOURCES = SOURCE + paged_decode.SOURCE + layer_rows.SOURCE + int8_gemm.SOURCE + f32_gemm.SOURCE
FUNCTIONS = [*paged_decode.FUNCTIONS, "sort_rows", "built_with_openmp", *layer_rows.FUNCTIONS, *int8_gemm.FUNCTIONS,
             *f32_gemm.FUNCTIONS]


def module_name() -> str:
    """velocity_cpu_kernels_<hash of the source, flags, torch version and this CPU's model and flags>."""
    try:
        cpu = [ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith(("model name", "flags"))][:2]
    except OSError:
        cpu = []
    key = "\n".join([SOURCES, *CFLAGS, *FUNCTIONS, torch.__version__, *cpu])
    return "velocity_cpu_kernels_" + hashlib.sha256(key.encode()).hexdigest()[:16]


def load_built(name: str, folder: str | None):
    """The module built before into folder (name.so), imported from its file; None if there is none."""
    path = Path(folder or "") / f"{name}.so"
    if not folder or not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(name: str, folder: str | None):
    """Compile SOURCES with a pybind11 module of FUNCTIONS into folder (None: torch's default) and
    import it. cpp_extension's load_inline would put torch/extension.h in front of the source."""
    import tempfile

    from torch.utils.cpp_extension import load

    # wrap_pybind_function: a failed TORCH_CHECK is a RuntimeError with its message, as load_inline makes it
    binds = "\n".join(f'  m.def("{f}", torch::wrap_pybind_function({f}));' for f in FUNCTIONS)
    source = Path(folder or tempfile.mkdtemp(prefix="velocity-kernels-")) / f"{name}.cpp"
    source.write_text(f"{SOURCES}\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{\n{binds}\n}}\n")
    return load(name=name, sources=[str(source)], extra_cflags=CFLAGS, extra_ldflags=["-fopenmp"], verbose=False,
                build_directory=folder)


def kernels():
    """The compiled module (paged_decode, sort_rows, layer_rows' and the GEMMs' functions), or None where it cannot be
    built (EngineConfig.cpu_kernel=False, in serving VELOCITY_CPU_KERNEL=0, does without it).
    Imported from the file an earlier build left (scripts/setup.sh builds it), else built now."""
    global _module, _tried
    if _tried:
        return _module
    _tried = True
    name, folder = module_name(), build_directory()
    try:
        _module = load_built(name, folder)
        if _module is None:
            logger.info("building the C++ CPU kernels (once)")
            _module = build(name, folder)
        logger.info("using the C++ CPU kernels (paged decode attention, the sampler's sort, the layer's rows, "
                    "the int8 and float32 GEMMs)")
    except Exception as e:   # no compiler or ninja: the torch and numpy paths serve
        logger.warning("C++ CPU kernels unavailable, using the slower torch paths: %s "
                       "(install g++, e.g. apt-get install g++, then rerun scripts/setup.sh; "
                       "VELOCITY_CPU_KERNEL=0 turns the kernels off)", (str(e).strip().splitlines() or [repr(e)])[-1])
    return _module


def paged_decode_kernel():
    """paged_decode(q, k, v, slot_mapping, k_cache, v_cache, block_tables, context_lens, scale), or None."""
    m = kernels()
    return None if m is None else m.paged_decode


def sort_rows_kernel():
    """sort_rows(x [R, V] float32, c) -> (ascending rows, the c largest descending, their ids), or None."""
    m = kernels()
    return None if m is None else m.sort_rows


def row_kernels(body) -> object | None:
    """The module for body.forward_rows (velocity.model.layer_rows) where the linears of the
    LlamaBody's layers are all Int8Linears or all F32Linears, none with a bias; else None."""
    from velocity.model.int8_linear import Int8Linear
    from velocity.model.packed_linear import F32Linear

    linears = [m for layer in body.layers for m in layer.modules() if hasattr(m, "in_features")]   # every kind
    kinds = {type(m) for m in linears}
    if not (kinds == {Int8Linear} or kinds == {F32Linear}) or any(_has_bias(m) for m in linears):
        return None
    return kernels()


def _has_bias(linear) -> bool:
    return linear.bias is not None and linear.bias.numel() > 0


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
    sys.exit(0 if kernels() is not None else 1)

"""Optional C++ kernels for CPU (velocity/model/kernels/csrc/), built with torch's cpp_extension (needs g++
and ninja) by scripts/setup.sh, or on first use:
- paged decode attention (csrc/paged_decode.cpp);
- sort_rows: the sampler's sort of each row's values, with the ids of the row's c best (a radix
  sort, rows in parallel: numpy sorts values alone but on one thread, torch orders indices too;
  csrc/sort_rows.cpp);
- the decoder layer's row operations between its linears (csrc/layer_rows.cpp), and the linears
  themselves where built with AVX2 or AVX-512: int8 (csrc/int8_gemm.cpp, AMX, AVX-512 VNNI or AVX2) and
  float32 (csrc/f32_gemm.cpp).

The build is cached inside the Python environment (sys.prefix/velocity-kernels), so
checkouts with venvs of their own never rebuild each other's; torch's default cache is used
where that folder is not writable. A built module is named by a hash of its files, flags
(-march=native, less what a --cpu-isa cap leaves out: velocity.model.kernels.cpu_isa), torch version and
the CPU, and a later process imports it straight from its file: no build step (ninja) runs at
load time, so the two ninja binaries a machine may have (Debian's on PATH, the venv's) can never
make one process see another's build as stale and rebuild it.

    python -m velocity.model.kernels.cpu_kernels     # build now; exit 1 (with the reason) if it cannot
"""
from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import sys
from pathlib import Path

import torch

from velocity.model.kernels.cpu_isa import compiler_flags

logger = logging.getLogger(__name__)

_module = None
_tried = False
CFLAGS = ["-O3", "-fopenmp", *compiler_flags()]    # -fopenmp: without it at::parallel_for runs on one thread
CSRC = Path(__file__).with_name("csrc")               # the kernels' files; kernels.cpp includes the others
SOURCES = "".join(f.read_text() for f in sorted(CSRC.glob("*.[ch]*")))


def module_name() -> str:
    """velocity_cpu_kernels_<hash of the source, flags, torch version and this CPU's model and flags>."""
    try:
        cpu = [ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith(("model name", "flags"))][:2]
    except OSError:
        cpu = []
    key = "\n".join([SOURCES, *CFLAGS, torch.__version__, *cpu])
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
    """Compile csrc/kernels.cpp (one translation unit: it includes each kernel's file and binds
    their functions) into folder (None: torch's default) and import it. cpp_extension's
    load_inline would put torch/extension.h in front of the source."""
    from torch.utils.cpp_extension import load

    return load(name=name, sources=[str(CSRC / "kernels.cpp")], extra_include_paths=[str(CSRC)], extra_cflags=CFLAGS,
                extra_ldflags=["-fopenmp"], verbose=False, build_directory=folder)


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

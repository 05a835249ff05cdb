"""Which x86 vector instructions this process's CPU code runs: the CPU's own, or fewer where
the libraries are capped to them.

torch's kernels (ATen), fbgemm (int8), oneDNN (the prepacked float32 linears) and MKL each pick
their code path from the CPU, and each can be capped by its own variable. `scripts/serve.sh
--cpu-isa avx2` sets all four together (CAP_VARIABLES), so one machine with AVX-512 can measure
what an AVX2-only machine runs; `--cpu-isa avx512` leaves AVX-512 and VNNI but no AMX. ATen's
capability stands for the AVX2 cap, oneDNN's variable for the AMX one: the int8 rows' width and
the C++ kernels' compiler flags (their int8 GEMM's AMX tiles) follow them.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path

import torch

# --cpu-isa NAME -> the variables that cap ATen, fbgemm, oneDNN and MKL to it
CAP_VARIABLES = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
             "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "avx512": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_FP16", "MKL_ENABLE_INSTRUCTIONS": "AVX512_E3"},
}
AMX_FLAGS = ("amx_tile", "amx_int8")       # what the int8 GEMM's tiles need (/proc/cpuinfo's names)


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (/proc/cpuinfo; empty where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def capability() -> str:
    """ATen's vector capability in this process: "AVX512", "AVX2" or "DEFAULT" (ATEN_CPU_CAPABILITY caps it)."""
    return torch.backends.cpu.get_cpu_capability()


def cpu_has_amx() -> bool:
    """The CPU has AMX's int8 tiles (whether or not a cap leaves them out)."""
    return all(f in cpu_flags() for f in AMX_FLAGS)


def has_amx() -> bool:
    """AMX's int8 tiles in use: the CPU has them, and neither cap leaves them out (ATen's below
    AVX-512, or oneDNN's ONEDNN_MAX_CPU_ISA naming an ISA without AMX)."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    return cpu_has_amx() and capability() == "AVX512" and (not cap or cap in ("ALL", "DEFAULT") or "AMX" in cap)


def capped() -> bool:
    """True where the CPU has AVX-512 (or AMX) but this process runs less (a --cpu-isa cap)."""
    return ("avx512f" in cpu_flags() and capability() != "AVX512") or (cpu_has_amx() and not has_amx())


def has_vnni() -> bool:
    """AVX-512 VNNI in use: int8 products accumulate in 32 bits (fbgemm's VNNI path)."""
    return "avx512_vnni" in cpu_flags() and capability() == "AVX512"


def compiler_flags() -> list[str]:
    """-march flags for the C++ kernels: this CPU, less what the cap leaves out."""
    cap = capability()
    return (["-march=native"] + (["-mno-avx512f"] if cap != "AVX512" else []) + (["-mno-avx2"] if cap == "DEFAULT" else [])
            + (["-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16"] if cpu_has_amx() and not has_amx() else []))


def describe() -> str:
    """"AVX-512, VNNI, AMX", "AVX2", or "AVX2 (capped; the CPU has AVX-512, VNNI)": for logs and benchmark records."""
    flags = cpu_flags()
    own = [label for label, flag in (("AVX-512", "avx512f"), ("VNNI", "avx512_vnni"), ("AVX-VNNI", "avx_vnni"),
                                     ("AMX", "amx_int8")) if flag in flags] or (["AVX2"] if "avx2" in flags else [])
    if not capped():
        return ", ".join(own)
    run = {"AVX512": "AVX-512, VNNI", "AVX2": "AVX2"}.get(capability(), "no AVX2")
    return f"{run} (capped; the CPU has {', '.join(own)})"

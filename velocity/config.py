"""Engine configuration."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class EngineConfig:
    """Everything the engine needs to start; validated in __post_init__."""

    model: str
    device: str = "auto"                  # "auto" -> cuda when available, else cpu
    dtype: str = "auto"                   # "auto" -> float32 on cpu, bfloat16 on cuda
    block_size: int = 16
    num_kv_blocks: int | None = None      # None: sized from the memory budget below
    kv_cache_bytes: int = 1 << 30         # CPU KV budget when num_kv_blocks is None
    kv_cache_dtype: str = "auto"          # "auto": float16 under int8 on CPU, else the model's dtype; "float32";
                                          # "float16", "int8": a CPU float32 model's cache in half the bytes,
                                          # or about a quarter (device.kv_dtype)
    gpu_memory_utilization: float = 0.85  # CUDA: fraction of the GPU the engine may fill
    swap_space_bytes: int = 256 << 20     # CPU swap space for preempted sequences
    preemption_mode: str = "recompute"    # "recompute" | "swap"
    watermark: float = 0.01               # fraction of blocks kept free when admitting prefills
    max_num_seqs: int = 64
    max_num_batched_tokens: int | None = None  # tokens per step; None: 4096 (see token_budget)
    # prompt tokens a step takes beside running decodes (a longer prompt goes alone): a burst of new
    # requests is taken over several steps instead of one that holds up every running stream; 0: no cap
    max_prefill_tokens: int = 0
    max_model_len: int | None = None      # None: the model's max positions
    enforce_eager: bool = False           # True: no CUDA graphs
    pack_cpu_weights: bool = True         # CPU float32: linears on packed weights (the C++ f32_gemm, else oneDNN)
    quantize: str = "none"                # "int8": CPU float32, the transformer layers' linears on int8 weights
    cpu_kernel: bool = True               # CPU: the C++ kernels (decode attention, the sampler's sort, the layer's rows, the GEMMs)
    gpu_kernels: bool = True              # CUDA: the decoder layer on the Triton kernels (velocity.model.kernels.gpu_kernels)
    graph_sampler: bool = True            # CUDA graphs on the GPU kernels: ChatTTS's sampler inside the decode graphs
    enable_prefix_caching: bool = True

    def token_budget(self, max_model_len: int) -> int:
        """Tokens one step may hold: max_num_batched_tokens (default 4096), raised to max_model_len
        so that any prompt fits. The scheduler keeps to it; the worker profiles it on CUDA."""
        return max(self.max_num_batched_tokens or 4096, max_model_len)

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_prefill_tokens < 0:
            raise ValueError(f"max_prefill_tokens must be >= 0 (0: no cap), got {self.max_prefill_tokens}")
        if self.preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"preemption_mode must be 'recompute' or 'swap', got {self.preemption_mode!r}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.quantize not in ("none", "int8"):
            raise ValueError(f"quantize must be 'none' or 'int8', got {self.quantize!r}")
        if self.kv_cache_dtype not in ("auto", "float32", "float16", "int8"):
            raise ValueError(f"kv_cache_dtype must be 'auto', 'float32', 'float16' or 'int8', got {self.kv_cache_dtype!r}")
        if self.dtype not in ("auto", "float32", "float16", "bfloat16"):
            raise ValueError(f"dtype must be auto, float32, float16 or bfloat16, got {self.dtype!r}")

"""One device: loads the model, sizes and owns the KV cache, runs steps and samples."""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from velocity.config import EngineConfig
from velocity.engine.scheduler import SchedulerOutput
from velocity.model.layers.attention import AttentionMetadata, build_attn_mask
from velocity.model.kernels import cpu_isa, gpu_kernels
from velocity.model.kernels.cpu_kernels import kernels, paged_decode_kernel, sort_rows_kernel
from velocity.model.loading.loader import load_model
from velocity.model.layers.int8_linear import Int8Linear, quantize_linears, require_int8
from velocity.model.networks.llama import LlamaLayer, row_kernels
from velocity.model.layers.packed_linear import can_pack, pack_linears
from velocity.engine.graph_sampler import GraphSampler
from velocity.engine.sampler import Sampler, to_device
from velocity.engine.cache_engine import CacheEngine, bytes_per_block
from velocity.device import kv_dtype, resolve_device, resolve_dtype
from velocity.engine.model_runner import ModelRunner
from velocity.engine.sampling_rows import SamplingBatches
from velocity.engine.tokens_home import TokensHome

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Launch:
    """A batch queued by Worker.launch: its hidden states, and each head's sampled rows on their way
    to the host (head name or None where the decode graph sampled them, the batch rows, [b, K])."""
    hidden: torch.Tensor                                  # [B, H]
    picks: list[tuple[str | None, range | list[int], torch.Tensor]]


class Worker:
    """Model + KV cache + runner + sampler on one device."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.kv_dtype = kv_dtype(config.kv_cache_dtype, self.device, self.dtype, config.quantize)
        if config.quantize == "int8":
            require_int8(self.device, self.dtype, "the engine", "VELOCITY_QUANTIZE")
        self.model = load_model(config.model, self.device, self.dtype)
        if self.device.type == "cpu":
            logger.info("CPU vector instructions: %s", cpu_isa.describe())
        if config.quantize == "int8":
            n = quantize_linears(self.model, LlamaLayer, kernels() if config.cpu_kernel else None)
            on_cpp = sum(m.gemm is not None for m in self.model.modules() if isinstance(m, Int8Linear))
            logger.info("CPU: %d linears of the transformer layers on int8 weights (quantize=int8; %d of them "
                        "on the C++ int8_gemm, the rest on fbgemm)", n, on_cpp)
        # (on a CPU only under Triton's interpreter, which the tests use)
        fused = config.gpu_kernels and (self.device.type == "cuda" or gpu_kernels.interpreted()) \
            and self._use_gpu_kernels()
        if config.pack_cpu_weights and can_pack(self.device, self.dtype):
            if hasattr(self.model, "fuse_code_heads"):
                self.model.fuse_code_heads()            # one prepacked call for all codebooks
            cpp = kernels() if config.cpu_kernel else None
            n = pack_linears(self.model, cpp)
            logger.info("CPU: %d float32 linears on %s", n, "the C++ f32_gemm" if cpp is not None
                        and cpp.f32_gemm_lanes() else "oneDNN-prepacked weights")
        rows = None                                      # the layer's other operations in C++, decodes and prefills
        if self.device.type == "cpu" and config.cpu_kernel and not fused:
            rows = self.model.model.rows = row_kernels(self.model.model)
        model_max = self.model.max_positions
        self.max_model_len = min(config.max_model_len or model_max, model_max)
        block_bytes = bytes_per_block(self.model, config.block_size, self.kv_dtype)
        self.num_blocks = config.num_kv_blocks or self._blocks_from_budget(block_bytes)
        if self.num_blocks < 1:
            raise ValueError("no memory left for the KV cache: lower max_num_batched_tokens or raise the budget")
        self.num_cpu_blocks = config.swap_space_bytes // block_bytes if config.preemption_mode == "swap" else 0
        # A sequence can never outgrow the whole cache.
        self.max_model_len = min(self.max_model_len, self.num_blocks * config.block_size)
        self.cache = CacheEngine(self.model, self.num_blocks, self.num_cpu_blocks, config.block_size,
                                 self.device, self.kv_dtype)
        use_graphs = self.device.type == "cuda" and not config.enforce_eager
        cpu_f32 = self.device.type == "cpu" and self.dtype == torch.float32
        kernel = paged_decode_kernel() if cpu_f32 and config.cpu_kernel else None
        self.runner = ModelRunner(self.model, config.block_size, self.cache.scratch_block, self.max_model_len,
                                  config.max_num_seqs, self.device, use_graphs, kernel, gpu_kernels_in_place=fused,
                                  graph_sampler=self._graph_sampler() if use_graphs and fused else None,
                                  row_prefill=rows is not None)
        self.sampler = Sampler(sort_rows_kernel() if self.device.type == "cpu" and config.cpu_kernel else None)
        self.batches = SamplingBatches()                 # the eager sampler's inputs, kept between steps
        K = max(h.num_codebooks for h in self.model.heads.values())
        self.home = TokensHome(config.max_num_seqs * K, self.device)     # a step's tokens to the host

    def between_layers(self, fn: Callable[[], None] | None) -> None:
        """fn runs before each decoder layer of a CPU step on the C++ rows (LlamaBody.between_layers)."""
        self.model.model.between_layers = fn

    def _use_gpu_kernels(self) -> bool:
        """The decoder layer on the Triton kernels, and the code heads as one GEMM; False (logged) where
        Triton cannot be imported."""
        K = gpu_kernels.load()
        if K is None:
            logger.warning("Triton cannot be imported: the GPU decoder layer runs eager (about 40 kernels a "
                           "layer, not 9). Install the gpu extra (pip install 'velocity-tts[gpu]') or the CUDA "
                           "wheel of torch, which carries Triton; VELOCITY_GPU_KERNELS=0 silences this")
            return False
        if (why := K.self_check(self.device, self.dtype)) is not None:
            logger.warning("the GPU kernels failed their check (%s): the GPU decoder layer runs eager", why)
            return False
        self.model.model.kernels = K
        if hasattr(self.model, "fuse_code_heads"):
            self.model.fuse_code_heads()                # the code heads as one GEMM
        logger.info("GPU: the decoder layer on the Triton kernels (velocity.model.kernels.gpu_kernels)")
        return True

    def _graph_sampler(self) -> GraphSampler | None:
        """The sampler inside the decode graphs, for a model whose default head samples in ChatTTS's
        style with a repetition window (ChatTTS's audio head); None where the setting is off."""
        name = self.model.default_head
        head = self.model.heads[name]
        if not self.config.graph_sampler or head.sampling_style != "chattts" or not head.repetition_window:
            return None
        probe = torch.zeros(1, self.model.config.hidden_size, device=self.device, dtype=self.dtype)
        V = head.fn(probe).shape[-1]
        return GraphSampler(name, head.num_codebooks, V, head.repetition_window, head.stop_ids)

    def _blocks_from_budget(self, block_bytes: int) -> int:
        if self.device.type != "cuda":
            return self.config.kv_cache_bytes // block_bytes
        # CUDA: profile a forward of a full token budget, then take a share of what is left.
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        self.profile_run(self.config.token_budget(self.max_model_len))
        free, total = torch.cuda.mem_get_info()
        used = total - free
        peak = torch.cuda.max_memory_allocated()
        budget = total * self.config.gpu_memory_utilization - used - (peak - torch.cuda.memory_allocated())
        logger.info("GPU memory: total %.1f GiB, in use %.1f GiB, activation peak %.1f GiB",
                    total / 2**30, used / 2**30, peak / 2**30)
        return int(budget // block_bytes)

    @torch.inference_mode()
    def profile_run(self, num_tokens: int) -> None:
        """One prefill of num_tokens on a throwaway cache, to measure activation memory."""
        S = self.config.block_size
        nb = -(-num_tokens // S)
        tmp = CacheEngine(self.model, nb, 0, S, self.device, self.kv_dtype)
        pos = torch.arange(num_tokens, device=self.device)
        md = AttentionMetadata(slot_mapping=pos, block_tables=torch.arange(nb, device=self.device)[None],
                               attn_mask=build_attn_mask(pos[None], nb * S), q_index=pos[None])
        self.model(self.model.token_tensor([self.model.pad_token] * num_tokens, self.device), pos, md)
        del tmp
        torch.cuda.synchronize()

    @torch.inference_mode()
    def launch(self, out: SchedulerOutput) -> Launch:
        """Swap blocks, queue the batch and the sampling of one token per sequence with its own
        head, and the tokens' copy to the host. On CUDA nothing here waits for the device (unless the eager
        sampler must), so the caller's host work runs beside the step until collect."""
        self.cache.swap_out(out.swap_out)
        self.cache.swap_in(out.swap_in)
        hidden = self.runner.run(out.seqs)                        # [B, H]
        self.home.start()
        if self.runner.codes is not None:                         # the decode graph sampled them too
            return Launch(hidden, [(None, range(len(out.seqs)), self.home.send(self.runner.codes))])
        groups: dict[str, list[int]] = {}
        for i, seq in enumerate(out.seqs):
            groups.setdefault(seq.head, []).append(i)
        picks = []
        for name, rows in groups.items():
            head = self.model.heads[name]
            some = len(rows) < len(out.seqs)
            logits = head.fn(hidden[to_device(torch.tensor(rows), hidden.device)] if some else hidden)   # [b, K, V]
            batch = self.batches.batch(name, [out.seqs[i] for i in rows], logits.shape[1], logits.shape[2],
                                       head.stop_ids, head.sampling_style, head.repetition_window, hidden.device)
            picks.append((name, rows, self.home.send(self.sampler(logits, batch))))      # [b, K]
        return Launch(hidden, picks)

    def collect(self, launch: Launch) -> tuple[list, torch.Tensor]:
        """Wait for the launched batch's tokens on the host.
        -> (the tokens, the last hidden states [B, H])"""
        self.home.wait()
        tokens: list = [None] * len(launch.hidden)
        for name, rows, picked in launch.picks:
            picked = picked.numpy()                                                   # [b, K]
            if name is not None:
                self.batches.sampled(name, picked)
            for i, t in zip(rows, picked.tolist()):
                tokens[i] = t[0] if len(t) == 1 else tuple(t)
        return tokens, launch.hidden

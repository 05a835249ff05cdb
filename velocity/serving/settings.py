"""The one place serving is configured: environment variables (set by scripts/serve.sh or the
Docker image) with these defaults."""
from __future__ import annotations

import os
from dataclasses import dataclass, fields

from velocity.tts.chunking import ChunkSchedule


@dataclass(slots=True)
class Settings:
    weights: str = "checkpoints/demo-tiny"   # VELOCITY_WEIGHTS: a ChatTTS release folder
    device: str = "auto"                     # VELOCITY_DEVICE: auto (cuda if present), cpu, cuda, cuda:1
    dtype: str = "auto"                      # VELOCITY_DTYPE: auto (bf16 on cuda, fp32 on cpu), float32, ...
    kv_cache_bytes: int = 1 << 30            # VELOCITY_KV_CACHE_BYTES: CPU KV budget
    # float16: on CPU the llm's KV cache in half the bytes, its keys and values rounded to float16:
    # twice the tokens in the budget and less to read each step, and the output is no longer the
    # reference's (docs/benchmarks.md, "A float16 KV cache on CPU"). auto: float16 with
    # VELOCITY_QUANTIZE=int8 (not the reference's either), else the model's dtype. float32: int8's
    # linears beside a float32 cache.
    kv_cache_dtype: str = "auto"             # VELOCITY_KV_CACHE_DTYPE: auto, float32, float16 or int8
    gpu_memory_utilization: float = 0.85     # VELOCITY_GPU_MEMORY_UTILIZATION
    max_num_seqs: int = 64                   # VELOCITY_MAX_NUM_SEQS
    # Prompt tokens an engine step takes beside the running streams' frames (a longer prompt goes
    # alone): a burst of new requests is admitted over several steps. 0: no cap, a burst's prompts in
    # one step, which measured best on the tiny checkpoint (docs/benchmarks.md, "A burst of new
    # requests"); a cap helps where a prompt token costs much of a step (the full model on CPU).
    max_prefill_tokens: int = 0              # VELOCITY_MAX_PREFILL_TOKENS
    # The chunk sizes in frames (46.875 a second): the first, the second, and each later one
    # `growth` times the one before, up to the largest. A stream's first audio waits for its first
    # chunk and the lookahead past it; each later chunk's frames should generate while the audio
    # before it plays. Defaults by device and weights (the choice and its measure: docs/benchmarks.md,
    # "Chunks on CPU"): a GPU 12, 36, x2; CPU int8 4, 5, x1.4; CPU float32 4, 36, x2.
    chunk_first: int = 0                     # VELOCITY_CHUNK_FIRST: frames in the first audio chunk (0: 12 on a GPU, 4 on CPU)
    chunk_rest: int = 0                      # VELOCITY_CHUNK_REST: frames in the second chunk (0: 5 for int8 on CPU, else 36)
    chunk_growth: float = 0.0                # VELOCITY_CHUNK_GROWTH: in [1, 4] (0: 1.4 for int8 on CPU, else 2)
    chunk_largest: int = 144                 # VELOCITY_CHUNK_LARGEST: later chunks grow up to this (3 s)
    lookahead: int = 16                      # VELOCITY_LOOKAHEAD: frames past a chunk before it is cut
    left_context: int = 52                   # VELOCITY_LEFT_CONTEXT: frames of context before a chunk
    # Sentences after the one being spoken that generate at the same time (their frames held
    # until it ends): the next sentence's audio is ready when the current one's ends. 0: one by one.
    sentences_ahead: int = 2                 # VELOCITY_SENTENCES_AHEAD
    # Audio a stream may have generated but not yet decoded, or not yet read by a gateway's client
    # that fell behind (the `pace` model) (seconds; 0: no bound). A stream that has this much
    # waiting pauses in the scheduler, keeping its KV blocks, and the batch goes to streams that
    # need frames. At least one largest chunk and its lookahead.
    backlog_seconds: float = 6.0             # VELOCITY_BACKLOG_SECONDS
    # A stream of the tts ensemble that sent nothing for this long sends a probe, on which the
    # vocoder learns of a client's cancel (velocity.serving.boards.stream_board): a client that leaves
    # is noticed within about this long plus the llm's 20 ms look at the board.
    cancel_probe_seconds: float = 0.25       # VELOCITY_CANCEL_PROBE_SECONDS
    # The probes of all streams together, at most per second (0: no bound): each is a request
    # through Triton's ensemble to the vocoder, and many quiet streams probing at the rate above
    # crowd out the work (docs/benchmarks.md, "A burst of cancels"). With more streams than this
    # allows, each probes every (streams / this) seconds, and a leaving client is noticed within
    # about that long.
    cancel_probes_per_second: float = 256.0  # VELOCITY_CANCEL_PROBES_PER_SECOND
    max_text_chars: int = 2000               # VELOCITY_MAX_TEXT_CHARS
    max_new_tokens: int = 2048               # VELOCITY_MAX_NEW_TOKENS: upper limit per request
    max_sample_seconds: float = 20.0         # VELOCITY_MAX_SAMPLE_SECONDS: the longest SPEAKER_SAMPLE
    voices: str = ""                         # VELOCITY_VOICES: a voices file or folder (default: <weights>/voices.json)
    default_voice: str = "amber"             # VELOCITY_DEFAULT_VOICE: for requests that name no voice ("": none)
    lexicon: str = ""                        # VELOCITY_LEXICON: a pronunciation lexicon (default: <weights>/lexicon.json)
    # On: a text of several sentences without a voice sample keeps its first sentence's voice, as the
    # reference speaks it (velocity.tts.carry_over); the first sentence is generated twice, and the
    # first audio waits for it. A request's VOICE_CARRY_OVER overrides it.
    voice_carry_over: bool = False           # VELOCITY_VOICE_CARRY_OVER
    # Requests in flight in the llm (running, waiting, or between sentences); one more is refused
    # with UNAVAILABLE ("server busy") instead of queueing without bound. 0: no limit.
    max_concurrent_requests: int = 256       # VELOCITY_MAX_CONCURRENT_REQUESTS
    # Of them, requests from direct Triton callers (CLIENT not signed by this server's gateway or
    # Wyoming server: perf_analyzer, tritonclient, tts_offline's callers), so that they cannot take
    # the slots the gateway's clients need. -1: half of VELOCITY_MAX_CONCURRENT_REQUESTS; 0: no cap
    # of their own.
    max_direct_requests: int = -1            # VELOCITY_MAX_DIRECT_REQUESTS
    run_dir: str = ""                        # VELOCITY_RUN_DIR: set by serve.sh for the drain handshake
    # The key the gateway and Wyoming show Triton (velocity.serving.wire.triton_key); "": the run folder's
    triton_key: str = ""                     # VELOCITY_TRITON_KEY
    # CPU threads per model process. The llm and the vocoder run at the same time in separate
    # processes; two full OpenMP pools on the same cores spin against each other.
    # Default: the vocoder one thread, the llm the other cores.
    llm_threads: int = 0                     # VELOCITY_LLM_THREADS (0: all cores but the vocoder's)
    vocoder_threads: int = 1                 # VELOCITY_VOCODER_THREADS
    # On: the llm also takes the vocoder's threads while no vocoder decodes (velocity.serving.boards.core_board)
    lend_vocoder_cores: bool = True          # VELOCITY_LEND_VOCODER_CORES
    # Queued chunks the vocoder decodes in one call: of one length, or on CPU streams' chunks (one
    # each) through their stateful decoders together (0: 32 on a GPU, 1 on CPU, where a batch of
    # the chunked decode costs what its chunks do one by one and only delays the most urgent, and
    # the stateful decoders' batch gives more chunks a second but a stream's audio only within
    # float32's rounding of its own, not bit for bit: docs/benchmarks.md, "The vocoder's streams
    # together")
    vocoder_batch: int = 0                   # VELOCITY_VOCODER_BATCH
    # On: on CPU, each stream's chunks go through a decoder of its own that keeps each layer's
    # input between chunks (velocity.serving.vocoder.stream_decoders): no chunk decodes its left context
    # again, audio as near a whole decode as the chunked decode's, for more of the vocoder's
    # memory (its cost and gain: docs/benchmarks.md, "The stateful streaming decode"). Off: the
    # chunked decode. The GPU batches chunks across streams instead.
    vocoder_stateful: bool = True            # VELOCITY_VOCODER_STATEFUL
    pack_cpu_weights: bool = True            # VELOCITY_PACK_CPU_WEIGHTS: on: packed llm and vocoder weights on CPU (C++ f32_gemm, else oneDNN)
    # int8: the llm's transformer layers on int8 weights and per-token int8 activations (CPU):
    # faster decode steps, a little more perplexity on a real model, and the output is no longer
    # the reference's (docs/benchmarks.md "int8 on CPU")
    quantize: str = "none"                   # VELOCITY_QUANTIZE: none or int8
    # int8: the vocoder's ConvNeXt linears on int8 weights (CPU): faster decoding, not the float32
    # decode's audio (docs/benchmarks.md "int8 on CPU" has both)
    vocoder_quantize: str = "none"           # VELOCITY_VOCODER_QUANTIZE: none or int8
    cpu_kernel: bool = True                  # VELOCITY_CPU_KERNEL: on: the C++ CPU kernels (attention, sort, layer rows, GEMMs)
    gpu_kernels: bool = True                 # VELOCITY_GPU_KERNELS: on: the decoder layer on the Triton kernels (CUDA)
    graph_sampler: bool = True               # VELOCITY_GRAPH_SAMPLER: on: ChatTTS's sampler inside the decode graphs (CUDA)
    # on: the llm launches each step before the last step's outputs go to their streams, so that
    # on a GPU the streams' host work runs while the device steps (their outputs come a step
    # later); auto: on with CUDA, off on CPU, where the step holds the cores and it would only delay
    overlap_steps: str = "auto"              # VELOCITY_OVERLAP_STEPS: auto, on or off
    log_level: str = "INFO"                  # VELOCITY_LOG_LEVEL: velocity's lines in the server log
    # the OpenAI-compatible gateway (velocity-tts-gateway)
    gateway_api_keys: str = ""               # VELOCITY_GATEWAY_API_KEYS: comma-separated keys ("": open)
    gateway_api_keys_file: str = ""          # VELOCITY_GATEWAY_API_KEYS_FILE: one key per line
    gateway_max_body_bytes: int = 4 << 20    # VELOCITY_GATEWAY_MAX_BODY_BYTES: larger requests get 413
    gateway_cors_origins: str = ""           # VELOCITY_GATEWAY_CORS_ORIGINS: comma-separated ("": no CORS)
    # web pages (origins) besides the gateway's own that may open its WebSockets ("*": any)
    gateway_origins: str = ""                # VELOCITY_GATEWAY_ORIGINS: comma-separated
    # An input over VELOCITY_MAX_TEXT_CHARS: off refuses it (400, as the server would); on speaks it
    # in pieces within the limit, cut at paragraphs and sentences, two generating at once, in order.
    gateway_long_text: bool = False          # VELOCITY_GATEWAY_LONG_TEXT
    gateway_long_text_max_chars: int = 100_000   # VELOCITY_GATEWAY_LONG_TEXT_MAX_CHARS: the whole of a long text
    # A client that takes nothing of its audio for this long is gone: its speech is stopped (its
    # unread audio past the sockets' buffers is a few sentences: see velocity.gateway.sentences)
    gateway_send_timeout: float = 30.0       # VELOCITY_GATEWAY_SEND_TIMEOUT: seconds
    # The kernel's send buffer of each client connection (0: the OS's, which grows to MBs, minutes
    # of audio): with the pipe's few sentences, how far a client may fall behind in reading
    gateway_send_buffer_bytes: int = 128 << 10   # VELOCITY_GATEWAY_SEND_BUFFER_BYTES
    # Fair share (velocity.gateway.fair): a client is its API key, else its address; 0: no cap
    gateway_max_streams_per_client: int = 64     # VELOCITY_GATEWAY_MAX_STREAMS_PER_CLIENT: Triton streams at once
    gateway_max_sockets_per_client: int = 32     # VELOCITY_GATEWAY_MAX_SOCKETS_PER_CLIENT
    gateway_max_sockets: int = 1024              # VELOCITY_GATEWAY_MAX_SOCKETS: all clients' WebSockets
    gateway_idle_timeout: float = 60.0           # VELOCITY_GATEWAY_IDLE_TIMEOUT: seconds a silent socket stays
    gateway_refusal_delay: float = 1.0           # VELOCITY_GATEWAY_REFUSAL_DELAY: seconds before a 503 past a cap
    gateway_http: str = "httptools"              # VELOCITY_GATEWAY_HTTP: uvicorn's HTTP/1.1 parser, httptools (C) or h11
    gateway_health_url: str = ""                 # VELOCITY_GATEWAY_HEALTH_URL: serve.sh's health port (names a dead part)
    # The seed of requests that name none (an agent framework's OpenAI client sends none): the
    # same text then gives the same audio. -1: each such request samples afresh.
    gateway_default_seed: int = -1           # VELOCITY_GATEWAY_DEFAULT_SEED

    @classmethod
    def from_env(cls) -> "Settings":
        s = cls()
        for f in fields(cls):
            raw = os.environ.get(f"VELOCITY_{f.name.upper()}")
            if raw is not None:
                try:
                    setattr(s, f.name, parse(raw, type(getattr(s, f.name))))
                except ValueError as e:
                    raise ValueError(f"VELOCITY_{f.name.upper()}={raw!r}: {e}") from e
        return s

    def configure_logging(self) -> None:
        """velocity's log lines to stderr, which Triton's python stubs share with the server log."""
        import logging
        import sys

        root = logging.getLogger("velocity")
        if not any(getattr(h, "velocity", False) for h in root.handlers):
            h = logging.StreamHandler(sys.stderr)
            h.velocity = True
            h.setFormatter(logging.Formatter("[velocity] %(levelname)s %(name)s: %(message)s"))
            root.addHandler(h)
            root.propagate = False
        root.setLevel(self.log_level.upper())

    def set_threads(self, model: str) -> int:
        """Set torch's CPU threads for the llm or vocoder process; returns the number."""
        import torch
        torch.set_num_threads(max(1, self.vocoder_threads) if model == "vocoder" else self.llm_own_threads())
        return torch.get_num_threads()

    def llm_own_threads(self) -> int:
        """The llm's CPU threads while a vocoder decodes: VELOCITY_LLM_THREADS, or the cores but the vocoder's."""
        return max(1, self.llm_threads or (os.cpu_count() or 1) - self.vocoder_threads)

    def threads_lent(self, own: int) -> int:
        """The llm's threads while the vocoder is idle: its own and the vocoder's, within the cores."""
        return max(own, min(os.cpu_count() or 1, own + self.vocoder_threads))

    def engine_config(self):
        """The llm's velocity.config.EngineConfig from these settings."""
        from velocity.config import EngineConfig
        return EngineConfig(model=self.weights, device=self.device, dtype=self.dtype, kv_cache_bytes=self.kv_cache_bytes,
                            kv_cache_dtype=self.kv_cache_dtype,
                            gpu_memory_utilization=self.gpu_memory_utilization, max_num_seqs=self.max_num_seqs,
                            max_prefill_tokens=self.max_prefill_tokens,
                            pack_cpu_weights=self.pack_cpu_weights, cpu_kernel=self.cpu_kernel,
                            gpu_kernels=self.gpu_kernels, graph_sampler=self.graph_sampler, quantize=self.quantize)

    def overlap(self, device_type: str) -> bool:
        """Whether the llm overlaps its streams' work with the next step (VELOCITY_OVERLAP_STEPS)."""
        word = self.overlap_steps.strip().lower()
        if word == "auto":
            return device_type == "cuda"
        if word not in ON + OFF:
            raise ValueError(f"VELOCITY_OVERLAP_STEPS={self.overlap_steps!r}: it takes auto, on or off")
        return word in ON

    def direct_limit(self) -> int:
        """Requests in flight from direct Triton callers at most (0: no cap of their own)."""
        if self.max_direct_requests >= 0:
            return self.max_direct_requests
        return -(-self.max_concurrent_requests // 2)

    def backlog_frames(self) -> int:
        """VELOCITY_BACKLOG_SECONDS in frames (0: no bound), raised to one largest chunk and its
        lookahead: below that a stream could pause before it has the frames for its next chunk."""
        from velocity.tts.chunking import FRAMES_PER_SECOND
        if self.backlog_seconds <= 0:
            return 0
        return max(round(self.backlog_seconds * FRAMES_PER_SECOND), self.schedule(gpu=True).largest + self.lookahead + 1)

    def schedule(self, gpu: bool) -> ChunkSchedule:
        """The chunk sizes for a llm on a GPU or on CPU (the defaults above)."""
        near_real_time = not gpu and self.quantize == "int8"     # a CPU stream about as fast as its audio
        rest = self.chunk_rest or (5 if near_real_time else 36)
        # a VELOCITY_CHUNK_REST above the largest chunk means chunks of that size, no growth
        return ChunkSchedule(self.chunk_first or (12 if gpu else 4), rest, max(self.chunk_largest, rest),
                             self.chunk_growth or (1.4 if near_real_time else 2.0))


ON = ("1", "true", "yes", "on")
OFF = ("0", "false", "no", "off")


def parse(raw: str, kind: type) -> object:
    """A variable's text as its setting's type; an on/off setting takes 1/0, true/false, yes/no or
    on/off (bool("0") would be True)."""
    if kind is not bool:
        return kind(raw)
    word = raw.strip().lower()
    if word not in ON + OFF:
        raise ValueError(f"an on/off setting takes {', '.join(ON)} or {', '.join(OFF)}")
    return word in ON

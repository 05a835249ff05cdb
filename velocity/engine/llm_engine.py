"""The synchronous engine: requests in, one scheduled batch per step, incremental outputs out."""
from __future__ import annotations

import logging
import time
from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np

from velocity.config import EngineConfig
from velocity.engine.block_manager import BlockManager
from velocity.engine.scheduler import Scheduler, SchedulerOutput
from velocity.engine.sequence import Sequence, Token
from velocity.sampling_params import SamplingParams
from velocity.engine.worker import Worker

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class RequestOutput:
    """A request's state after a step: what is new, and everything generated so far (token_ids,
    copied only when read: the output shares its sequence's list, which only grows)."""

    request_id: str
    generated: list[Token] = field(default_factory=list, repr=False)   # the sequence's own list
    num_tokens: int = 0                                                  # its length at this output
    new_token_ids: list[Token] = field(default_factory=list)
    # requests with return_hidden: the final-norm hidden state that sampled each new token,
    # float32 [len(new_token_ids), H] (the reference's `hiddens`, which its Decoder turns into mel)
    new_hidden: np.ndarray | None = None
    hidden: np.ndarray | None = None     # LLM.generate(return_hidden=True): all tokens' hidden states
    finished: bool = False
    finish_reason: str | None = None     # "stop" | "length" | "abort" | "error"
    error: str | None = None

    @property
    def token_ids(self) -> list[Token]:
        """Everything generated up to this output."""
        return self.generated[:self.num_tokens]


@dataclass
class EngineStats:
    running: int
    waiting: int
    swapped: int
    kv_blocks_used: int
    kv_blocks_free: int
    preemptions: int
    prefix_cache_hits: int
    paused: int = 0
    clients: int = 0              # distinct clients among the requests


class LLMEngine:
    """add_request / step / abort / has_unfinished over a Worker, a Scheduler and a BlockManager."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.worker = Worker(config)
        self.max_model_len = self.worker.max_model_len
        self.block_manager = BlockManager(self.worker.num_blocks, config.block_size, self.worker.num_cpu_blocks,
                                          config.watermark, config.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.token_budget(self.max_model_len),
                                   config.preemption_mode, config.max_prefill_tokens)
        self.requests: dict[str, Sequence] = {}
        self.num_paused = 0                       # of them, paused (pause)
        self.sampled = dict.fromkeys(self.worker.model.heads, 0)   # tokens sampled by each head, all steps
        self._launched: tuple | None = None       # (the batch, its Worker.launch or the error) until collect
        # seconds in the worker's launch and collect, all steps: the model, its heads and the sampler
        # with their inputs (on a GPU, their launch and the wait for the tokens); the rest of a step
        # is the engine's and its caller's host work
        self.worker_seconds = 0.0

    def validate(self, prompt: list[Token], params: SamplingParams, head: str | None = None,
                 speaker: object = None) -> None:
        """Raise ValueError naming what is wrong with a request."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling params must be SamplingParams, got {type(params).__name__}")
        params.validate()
        model = self.worker.model
        h = model.heads.get(head or model.default_head)
        if h is None:
            raise ValueError(f"head must be one of {sorted(model.heads)}, got {head!r}")
        params.temperatures(h.num_codebooks)           # raises if a per-codebook list has the wrong length
        if len(prompt) == 0:
            raise ValueError("prompt must hold at least one token")
        if len(prompt) >= self.max_model_len:
            raise ValueError(f"prompt length {len(prompt)} must be below max_model_len={self.max_model_len}")
        model.check_prompt(prompt)
        if speaker is not None:
            model.check_speaker(speaker)

    def add_request(self, request_id: str, prompt_token_ids: list[Token], params: SamplingParams,
                    head: str | None = None, speaker: object = None, return_hidden: bool = False,
                    client: Hashable = None) -> None:
        """Queue a request. speaker (audio models): a speaker embedding for this request alone.
        return_hidden: each output's new_hidden holds the hidden states of its new tokens.
        client: who asked; the scheduler shares the batch fairly between clients."""
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        self.validate(prompt_token_ids, params, head)
        model = self.worker.model
        checked = None if speaker is None else model.check_speaker(speaker)     # once per request
        spk, salt = (None, None) if checked is None else (checked.row, checked.digest)
        seq = Sequence(request_id, prompt_token_ids, params, cache_salt=salt,
                       head=head or model.default_head, speaker=spk, return_hidden=return_hidden,
                       client=client)
        seq.stop_ids = params.stops(model.heads[seq.head].stop_ids)
        self.requests[request_id] = seq
        self.scheduler.add(seq)

    def abort(self, request_id: str) -> RequestOutput | None:
        """Finish a request now; its KV blocks are free when this returns."""
        seq = self.requests.pop(request_id, None)
        if seq is None:
            return None
        self.num_paused -= seq.paused
        self.scheduler.finish(seq, "abort")
        return self._output(seq, [])

    def hold(self, request_id: str, tokens: int) -> None:
        """The request's next output once `tokens` more are generated than its outputs have held
        (it ends sooner: then), with every token since its last; 0 or 1: an output every step."""
        if (seq := self.requests.get(request_id)) is not None:
            seq.report_at = seq.reported + tokens

    def flush(self, request_id: str) -> RequestOutput | None:
        """An output now of what the request generated since its last (held, hold); None: nothing."""
        seq = self.requests.get(request_id)
        if seq is None or seq.reported == len(seq.output_token_ids):
            return None
        return self._report(seq, None, None)

    def unreported(self, request_id: str) -> int:
        """Tokens the request generated that no output has held yet (hold)."""
        seq = self.requests.get(request_id)
        return 0 if seq is None else len(seq.output_token_ids) - seq.reported

    def pause(self, request_id: str, paused: bool = True) -> None:
        """Leave a request out of the steps (it keeps its KV blocks) until paused again with False."""
        if (seq := self.requests.get(request_id)) is not None and seq.paused != paused:
            seq.paused = paused
            self.num_paused += 1 if paused else -1

    @property
    def model(self):
        """The model the engine runs (its config, speaker check, code counts)."""
        return self.worker.model

    @property
    def device(self):
        """The torch device it runs on."""
        return self.worker.device

    def has_unfinished(self) -> bool:
        """Requests left to run, or a launched batch not yet collected."""
        return self._launched is not None or self.scheduler.has_unfinished()

    def step(self) -> list[RequestOutput]:
        """Run one scheduled batch; one output per request (but those held: hold)."""
        return self.collect() if self.launch() else []

    @property
    def in_flight(self) -> bool:
        """A batch was launched and its outputs are not collected yet."""
        return self._launched is not None

    def launch(self) -> bool:
        """step's first half: schedule a batch and queue it on the device; False: nothing to run.
        Until collect(), add_request, abort and pause may be called (an aborted request's row is
        computed and dropped); on CUDA the step runs on the device meanwhile."""
        assert self._launched is None, "collect() the launched batch first"
        sched = self.scheduler.schedule()
        if sched.is_empty:
            return False
        t = time.perf_counter()
        try:
            launched = self.worker.launch(sched)
        except Exception as e:            # collect() fails the batch, as a failure there would
            launched = e
        self.worker_seconds += time.perf_counter() - t
        self._launched = sched, launched
        return True

    def collect(self) -> list[RequestOutput]:
        """step's second half: wait for the launched batch's tokens, append them, stop the sequences
        that end; one output per request still running when it was launched, but for those held
        (hold) ([]: none launched)."""
        if self._launched is None:
            return []
        sched, launched = self._launched
        self._launched = None
        seqs = sched.seqs
        try:
            if isinstance(launched, Exception):
                raise launched
            t = time.perf_counter()
            tokens, hidden = self.worker.collect(launched)
            self.worker_seconds += time.perf_counter() - t
            sampled = self.sampled
            for name, picked, _ in launched.picks:      # (None: the decode graph's, the default head)
                sampled[name or self.worker.model.default_head] += len(picked)
            want = [i for i, seq in enumerate(seqs) if seq.return_hidden]
            # one device-to-host copy for the rows that asked: each row's [1, H], None for the others
            rows: list = [None] * len(seqs)
            if len(want) == len(rows):
                rows = list(hidden.float().cpu().numpy()[:, None])
            elif want:
                for i, h in zip(want, hidden[want].float().cpu().numpy()[:, None]):
                    rows[i] = h
        except Exception as e:
            # Fail this batch's requests, not the engine; their KV can't be trusted for reuse.
            logger.error("engine step failed; failing %d requests", len(seqs), exc_info=e)
            outputs = []
            for seq in seqs:
                if seq.is_finished:                     # aborted since the launch
                    continue
                self.block_manager.forget_hashes(seq)
                self.requests.pop(seq.request_id, None)
                self.scheduler.finish(seq, "error")
                outputs.append(self._output(seq, []))
                outputs[-1].error = f"engine step failed: {e}"
            return outputs
        outputs = []
        check_stop = self.check_stop
        for i, (seq, tok) in enumerate(zip(seqs, tokens)):
            if seq.is_finished:                         # aborted since the launch: its row is dropped
                continue
            seq.num_computed_tokens = len(seq)
            seq.append(tok)
            reason = check_stop(seq, tok)
            if reason:
                self.requests.pop(seq.request_id, None)
                self.scheduler.finish(seq, reason)
            if reason is None and len(seq.output_token_ids) < seq.report_at:   # held (hold)
                if rows[i] is not None:
                    seq.unreported_hidden.append(rows[i])
                continue
            outputs.append(self._report(seq, rows[i], reason))
        return outputs

    def _report(self, seq: Sequence, row: np.ndarray | None, reason: str | None) -> RequestOutput:
        """The output of a sequence's tokens since its last: row, the newest one's hidden state
        ([1, H]; None: none or none new), after those held (hold)."""
        gen = seq.output_token_ids
        n = len(gen)
        new, seq.reported = gen[seq.reported:], n
        if seq.unreported_hidden:                      # held steps' rows first
            held, seq.unreported_hidden = seq.unreported_hidden, []
            row = np.concatenate(held if row is None else held + [row])
        return RequestOutput(seq.request_id, gen, n, new, row, None, reason is not None, reason)

    def check_stop(self, seq: Sequence, tok: Token) -> str | None:
        """An audio frame stops when any of its codes is a stop token (seq.stop_ids)."""
        p, stops = seq.params, seq.stop_ids
        n = len(seq.output_token_ids)
        if stops and n >= p.min_new_tokens and (
                not stops.isdisjoint(tok) if type(tok) is tuple else tok in stops):
            return "stop"
        if n >= p.max_new_tokens or len(seq) >= self.max_model_len:
            return "length"
        return None

    def _output(self, seq: Sequence, new: list[Token]) -> RequestOutput:
        return RequestOutput(seq.request_id, seq.output_token_ids, len(seq.output_token_ids), new,
                             finished=seq.is_finished, finish_reason=seq.finish_reason)

    def stats(self) -> EngineStats:
        s, bm = self.scheduler, self.block_manager
        return EngineStats(len(s.running), len(s.waiting), len(s.swapped), bm.num_used_blocks,
                           bm.num_free_blocks, s.num_preemptions, bm.num_prefix_hits, self.num_paused,
                           len({seq.client for seq in self.requests.values()}))

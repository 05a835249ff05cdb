"""A request's sequence: its tokens, status, KV block table and sampling parameters."""
from __future__ import annotations

import enum
import itertools
import time
from collections.abc import Hashable

import numpy as np

from velocity.sampling_params import SamplingParams

# A token is an int for text models, or a tuple of num_vq codes for audio frames.
Token = Hashable


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"


_seq_ids = itertools.count()


class Sequence:
    """One generated sequence. Tokens before num_computed_tokens have KV in the cache."""

    def __init__(self, request_id: str, prompt_token_ids: list[Token], params: SamplingParams,
                 cache_salt: Hashable = None, head: str = "text", speaker: object = None,
                 return_hidden: bool = False, client: Hashable = None) -> None:
        self.seq_id = next(_seq_ids)
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[Token] = []
        # output_token_ids as an int64 array [capacity, codes per token], brought up to date when read
        self._out, self._out_n = np.empty((0, 1), dtype=np.int64), 0
        self._len = len(self.prompt_token_ids)      # len(self), kept by append
        self.params = params
        # Anything besides the tokens that changes the KV (a speaker vector's digest):
        # it seeds the prefix-cache hash chain, so different salts never share blocks.
        self.cache_salt = cache_salt
        self.head = head                   # which output head samples its tokens
        self.speaker = speaker             # audio models: the speaker embedding (a tensor), or None
        self.return_hidden = return_hidden # outputs carry the hidden state that sampled each token
        self.client = client               # whose request (the scheduler's fair share); None: one anonymous client
        self.stop_ids: frozenset[int] = frozenset()   # tokens that end it (LLMEngine.add_request sets them)
        self.status = SequenceStatus.WAITING
        self.paused = False                # skipped by the scheduler (keeps its blocks) until resumed
        # outputs (LLMEngine.hold): generated tokens already in one, and the count it waits for
        # before its next (0: every step); the hidden rows of the tokens not yet in one
        self.reported, self.report_at = 0, 0
        self.unreported_hidden: list[np.ndarray] = []
        self.finish_reason: str | None = None
        self.block_table: list[int] = []
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0         # prompt tokens found in the prefix cache
        self.arrival_time = time.monotonic()

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        return f"Sequence({self.request_id!r}, len={len(self)}, {self.status.value})"

    @property
    def token_ids(self) -> list[Token]:
        return self.prompt_token_ids + self.output_token_ids

    def token(self, i: int) -> Token:
        p = len(self.prompt_token_ids)
        return self.prompt_token_ids[i] if i < p else self.output_token_ids[i - p]

    @property
    def num_new_tokens(self) -> int:
        """Tokens the next step must compute (whole uncomputed tail for a prefill, 1 for a decode)."""
        return len(self) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append(self, token: Token) -> None:
        """Add a generated token (the only way tokens are added: it keeps len() and output_array)."""
        self.output_token_ids.append(token)
        self._len += 1

    def output_array(self) -> np.ndarray:
        """The generated tokens as int64 [n, codes per token] (a view; the sampler's penalty history).
        The tokens added since the last call are written in here, at once."""
        out, done, n = self._out, self._out_n, len(self.output_token_ids)
        assert self._len == len(self.prompt_token_ids) + n, "tokens added without Sequence.append"
        if n > done:
            if n > len(out):                           # grow by doubling
                first = self.output_token_ids[0]
                grown = np.empty((max(16, 2 * n), len(first) if isinstance(first, tuple) else 1), dtype=np.int64)
                grown[:done] = out[:done]
                self._out = out = grown
            out[done:n] = np.array(self.output_token_ids[done:n], dtype=np.int64).reshape(n - done, -1)
            self._out_n = n
        return out[:n]

    def finish(self, reason: str) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason

"""The stream board: what the vocoder tells the llm about each stream, through shared memory.

Triton 2.51 does not tell a running step of an ensemble (the llm) that its client cancelled:
only the requests of later steps that start after the cancel carry it (the vocoder's next chunk
sees `is_cancelled()`). And the llm cannot see how far behind it the vocoder is. So each stream
the llm starts through the `tts` ensemble takes a slot on this board (a memory-mapped file, one
per server, beside the core board), its chunks carry the slot's reference (STREAM), and the
vocoder writes into the slot:

- `state`: CANCELLED when a chunk or a probe of the stream arrives cancelled (the client left),
  FAILED when the vocoder could not decode one of its chunks;
- `decoded`: the frames of the stream's audio decoded so far.

The `pace` model writes a third field for the gateway, `taken`: the frames of the stream's audio
its client has read, once the client falls behind (-1 until then: the stream is paced by the
vocoder alone). The vocoder returns each chunk's reference (the ensemble's STREAM output) so that
the gateway can name the stream.

The llm polls the slots of its streams: it aborts a cancelled one, ends a failed one with an
error, and pauses one that has too much audio generated but not yet decoded, or not yet taken by
its client (the backlog bound).
When the llm ends a stream early itself (deadline, shutdown) it marks it ENDED. The vocoder
decodes no queued chunk of a stream that is not LIVE, even after the llm closed its slot: a
closed slot keeps its token and state until it is reused. A reference is `token * SLOTS + slot`;
a slot gets a new random token whenever it is reused (slots in round robin), so a late chunk of
an ended stream never reads or writes another stream's slot, and a client that knows its own
reference cannot guess another's (1 in 2**32 a try). Free of torch and Triton.
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path

import numpy as np

from velocity.serving.boards.core_board import flocked, map_file

SLOTS = 4096                  # streams at once (VELOCITY_MAX_CONCURRENT_REQUESTS is 256 by default)
LIVE, CANCELLED, FAILED, ENDED = 0, 1, 2, 3


class StreamBoard:
    """Slots of live streams: the llm opens and closes them, the vocoder marks and advances them."""

    def __init__(self, path: str | Path, slots: int = SLOTS) -> None:
        self.path, self.slots = Path(path), slots
        off_state = 8 + 4 * slots                          # [next number: int64][tokens: uint32 * slots]
        off_decoded = -(-(off_state + 2 * slots) // 8) * 8  # [states, used: uint8 * slots][decoded, taken: int64 * slots]
        size = off_decoded + 16 * slots
        self._fd, self._mm = map_file(self.path, size)
        self._next = np.ndarray((1,), np.int64, self._mm, 0)
        self.tokens = np.ndarray((slots,), np.uint32, self._mm, 8)
        self.state = np.ndarray((slots,), np.uint8, self._mm, off_state)
        self.used = np.ndarray((slots,), np.uint8, self._mm, off_state + slots)
        self.decoded = np.ndarray((slots,), np.int64, self._mm, off_decoded)
        self.taken = np.ndarray((slots,), np.int64, self._mm, off_decoded + 8 * slots)

    def _locked(self):
        return flocked(self._fd)

    def _slot(self, ref: int) -> int | None:
        """The slot `ref` names while its stream holds it, else None."""
        token, slot = divmod(int(ref), self.slots)
        return slot if ref > 0 and slot < self.slots and int(self.tokens[slot]) == token else None

    # -- llm side --------------------------------------------------------------------
    def open(self) -> int | None:
        """A slot for a new stream: its reference (> 0), or None when every slot is taken."""
        with self._locked():
            n = int(self._next[0])
            free = np.flatnonzero(self.used == 0)
            if not len(free):
                return None
            slot = int(free[np.searchsorted(free, n % self.slots) % len(free)])    # round robin
            token = int(self.tokens[slot])
            while token == int(self.tokens[slot]):
                token = 1 + secrets.randbelow(0xFFFFFFFF)
            self._next[0] = n + 1
            self.tokens[slot] = token
            self.state[slot], self.decoded[slot], self.taken[slot], self.used[slot] = LIVE, 0, -1, 1
            return token * self.slots + slot

    def close(self, ref: int) -> None:
        """The stream ended: its slot may be reused (its state stays until then)."""
        with self._locked():
            if (slot := self._slot(ref)) is not None:
                self.used[slot] = 0

    def read(self, ref: int) -> tuple[int, int, int]:
        """(state, frames decoded, frames its client took or -1) of the stream."""
        slot = self._slot(ref)
        return (LIVE, 0, -1) if slot is None else (int(self.state[slot]), int(self.decoded[slot]), int(self.taken[slot]))

    def in_use(self) -> int:
        return int(np.count_nonzero(self.used))

    def mark(self, ref: int, state: int) -> None:
        """CANCELLED or FAILED (the vocoder: the llm ends the stream at its next look) or ENDED (the
        llm ended it early); a stream's first mark stays."""
        if (slot := self._slot(ref)) is not None and not self.state[slot]:
            self.state[slot] = state

    # -- vocoder side ----------------------------------------------------------------
    def ended(self, ref: int) -> bool:
        """The stream was cancelled or failed (its queued chunks need no decoding)."""
        slot = self._slot(ref)
        return slot is not None and bool(self.state[slot])

    def gone(self, ref: int) -> bool:
        """The stream is over however it ended: marked, closed by the llm, or its slot reused."""
        slot = self._slot(ref)
        return slot is None or bool(self.state[slot]) or not self.used[slot]

    def decoded_to(self, ref: int, frame: int) -> None:
        """The stream's audio is decoded up to `frame` (chunks come in order; max() keeps it so)."""
        if (slot := self._slot(ref)) is not None and frame > self.decoded[slot]:
            self.decoded[slot] = frame

    # -- pace side (the gateway) ---------------------------------------------------------
    def took(self, ref: int, frames: int) -> bool:
        """The stream's client has read `frames` of its audio (-1: it keeps up, pace by the vocoder
        alone); False when no live stream has this reference."""
        slot = self._slot(ref)
        if slot is None or not self.used[slot]:
            return False
        self.taken[slot] = max(-1, int(frames))
        return True

    def close_file(self, unlink: bool = False) -> None:
        """Unmap; unlink: also remove the file (the llm, at finalize)."""
        del self._next, self.tokens, self.state, self.used, self.decoded, self.taken   # views of the map: before it closes
        self._mm.close()
        os.close(self._fd)
        if unlink:
            self.path.unlink(missing_ok=True)

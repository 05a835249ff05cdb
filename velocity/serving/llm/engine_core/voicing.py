"""Voice carry-over off the core's loop: its decoders loaded once, each stream's sample of its first
sentence made on a thread of its own and handed back to the loop, which a socket wakes."""
from __future__ import annotations

import logging
import queue
import socket
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger("velocity.llm")


class Voicing:
    """The voicing thread and the carrier (velocity.tts.carry_over.VoiceCarrier) of one core."""

    def __init__(self, weights: str) -> None:
        self.weights = weights
        self._carrier = None
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="llm-voicing")
        self.done: queue.SimpleQueue = queue.SimpleQueue()       # (stream, sample or None: failed)
        self.wake, self._wake_w = socket.socketpair()            # readable when a sample is done
        self.wake.setblocking(False)

    def carrier(self):
        """The decoders and the voice encoder, on the CPU, loaded at the first call."""
        from velocity.tts.carry_over import VoiceCarrier

        if self._carrier is None:
            self._carrier = VoiceCarrier.load(self.weights)
            log.info("voice carry-over: the decoders and the voice encoder are loaded")
        return self._carrier

    def sample(self, stream, first: tuple) -> None:
        """The sample of the stream's first sentence, made on the voicing thread: decoding its audio
        in the loop would hold up every stream's step."""
        def run() -> None:
            try:
                sample = stream.sentences.carry.sample(*first)
            except Exception:
                log.exception("stream %s: voice carry-over failed", stream.key)
                sample = None
            self.done.put((stream, sample))
            self._wake_w.send(b"x")

        self.pool.submit(run)

    def take(self) -> list[tuple]:
        """The (stream, sample or None) pairs done since the last call."""
        try:
            while self.wake.recv(4096):
                pass
        except BlockingIOError:
            pass
        got = []
        while True:
            try:
                got.append(self.done.get_nowait())
            except queue.Empty:
                return got

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

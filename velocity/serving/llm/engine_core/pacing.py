"""When the core's streams sit out steps (Pacer): paused while enough of a stream's audio waits for
the vocoder, and held while it is well ahead of real time and another stream waits for its first
audio (CoreStream.pace applies both to its engine requests)."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from velocity.serving.llm.engine_core.stream import CoreStream

PACE_EVERY = 0.05        # seconds between looks at every stream's backlog (a sentence ahead grows each step)
                         # and, while one waits for its first audio, at every stream's lead


class Pacer:
    """backlog: frames a stream may have waiting at the vocoder (0: no bound); lead: seconds of audio
    ahead of real time past which a stream is held while another starts (0: never)."""

    def __init__(self, backlog: int, lead: float) -> None:
        self.backlog, self.lead = backlog, max(0.0, lead)
        self.starting: set[int] = set()          # streams that have run but sent no chunk yet
        self.due = False                         # a pass before the next step
        self.last = time.monotonic()

    def first_audio(self, stream: "CoreStream", sent: bool) -> None:
        """A stream's output before its first chunk went out (sent False), or with it (True)."""
        if sent:
            stream.first_at = time.monotonic()
            self.gone(stream.key)
        elif stream.key not in self.starting:
            self.starting.add(stream.key)
            self.due = True

    def gone(self, key: int) -> None:
        """The stream sent its first chunk, or ended before it."""
        if key in self.starting:
            self.starting.discard(key)
            self.due = True

    def wanted(self, now: float) -> bool:
        """A pass is due: something changed, or PACE_EVERY went by with a bound or a start to watch."""
        return self.due or (bool(self.backlog or self.starting) and now - self.last >= PACE_EVERY)

    def run(self, streams: list["CoreStream"], now: float) -> None:
        """Every stream's pauses: for its backlog at the vocoder (those the vocoder follows), and,
        while some stream is starting, held if it is more than `lead` seconds of audio ahead of
        real time (the new stream's first steps then run without it: on CPU a step's time grows
        with its batch). A held stream resumes once no stream is starting, or once real time has
        caught up with it."""
        self.due, self.last = False, now
        lead = self.lead if self.starting else 0.0
        for stream in streams:
            held = bool(lead) and stream.lead(now) > lead
            if held or stream.held or (stream.ref and self.backlog):
                stream.held = held
                stream.pace(self.backlog if stream.ref else 0)

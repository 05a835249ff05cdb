"""The engine core's loop (EngineCore), in a process of its own: the stub's commands applied
between steps, one engine step, each output handed to its stream (velocity.serving.llm.engine_core.
stream), and one Report back to the stub with the chunks that became ready.

Nothing here waits for the Triton server: the core has no python-backend object, and its only
peer is the stub's socket. What it says (wire) is the stub's to send on.
"""
from __future__ import annotations

import contextlib
import gc
import logging
import os
import time
from collections import deque
from multiprocessing.connection import wait

from velocity.serving.wire.client_tag import load_key
from velocity.serving.llm.engine_core.stream import CoreStream
from velocity.serving.llm.engine_core.voicing import Voicing
from velocity.serving.llm.engine_core.wire import Channel, Report
from velocity.serving.llm.llm_inputs import LLMInputs, check_prompts
from velocity.serving.wire.protocol import STREAM_FAILED
from velocity.serving.settings import Settings

log = logging.getLogger("velocity.llm")
REPORT_EVERY = 0.1       # seconds between the core's reports when no event needs one sooner
START_S = 0.002          # seconds of new requests' checks and plans between two steps (one at least)
PACE_EVERY = 0.05        # seconds between its looks at every stream's backlog (a sentence ahead grows each step)


class EngineCore:
    """The llm's engine and its streams, driven by the stub's commands over `channel`."""

    def __init__(self, settings: Settings, channel: Channel, core_board: str) -> None:
        import torch

        from velocity.device import resolve_device
        from velocity.engine.llm_engine import LLMEngine
        from velocity.serving.boards.core_board import CoreBoard, ThreadLender
        from velocity.tts.frontend import TextFrontend

        s = self.settings = settings
        self.channel = channel
        self.client_key = load_key(s.run_dir)            # which CLIENT values the gateway signed
        own = s.set_threads("llm")
        self.lender, self.cores = None, None
        if s.lend_vocoder_cores and resolve_device(s.device).type == "cpu":
            # all cores while no vocoder decodes (velocity.serving.boards.core_board)
            self.cores = CoreBoard(core_board)
            self.lender = ThreadLender(self.cores, own, s.threads_lent(own), torch.set_num_threads)
        self.engine = LLMEngine(s.engine_config())
        if self.lender is not None:
            self.engine.worker.between_layers(self.lender.check)
        self.overlap = s.overlap(self.engine.device.type)     # launch a step before the last one's outputs go out
        log.info("llm: the streams' work on each step's outputs %s", "beside the next step (overlapped)"
                 if self.overlap else "between steps")
        self.frontend = TextFrontend(s.weights)          # the tokenizer, for text refine
        self.voicing = Voicing(s.weights)               # voice carry-over's samples, off the loop
        if s.voice_carry_over:
            self.voicing.carrier()
        model = self.engine.model
        self.end_code, self.num_vq = model.num_audio_tokens - 1, model.num_vq
        self.schedule = s.schedule(gpu=self.engine.device.type == "cuda")     # every stream's chunk sizes
        self.backlog = s.backlog_frames()
        self.streams: dict[int, CoreStream] = {}
        self.pending: deque = deque()                    # start commands not yet taken (START_S a loop)
        self.owner: dict[str, tuple[CoreStream, int]] = {}   # engine request -> (its stream, its sentence)
        self.report = Report()
        self.totals = self.report.totals
        self._running = True
        self.idle = False                          # every request is paused: the loop waits for a command
        # what the start made (the model, the tokenizer) lives as long as the process: the garbage
        # collector need not walk it again at each collection (as vLLM's engine core does)
        gc.collect()
        gc.freeze()

    def info(self) -> dict:
        """What the stub needs to know of the engine."""
        return {"num_vq": self.num_vq, "device": self.engine.device.type, "pid": os.getpid()}

    # -- the streams' side ------------------------------------------------------------
    def add(self, rid: str, stream: CoreStream, sentence: int, prompt: list, params, kwargs: dict) -> None:
        self.owner[rid] = (stream, sentence)
        self.engine.add_request(rid, prompt, params, client=stream.client, **kwargs)

    def abort(self, rid: str) -> None:
        self.owner.pop(rid, None)
        self.engine.abort(rid)

    def emit(self, event: tuple) -> None:
        self.report.events.append(event)

    def finished(self, stream: CoreStream, event: tuple) -> None:
        self.streams.pop(stream.key, None)
        self.emit(event)

    def voice(self, stream: CoreStream, first: tuple) -> None:
        """Voice carry-over's sample of the stream's first sentence, off the loop (Voicing)."""
        self.voicing.sample(stream, first)

    # -- commands ---------------------------------------------------------------------
    def apply(self, commands: list) -> None:
        for cmd in commands:
            kind = cmd[0]
            if kind == "start":
                self.pending.append(cmd[1:])
            elif kind == "stop":
                if (stream := self.streams.pop(cmd[1], None)) is not None:
                    stream.over = True
                    stream.abort_all()
                else:                            # not taken yet: dropped
                    self.pending = deque(c for c in self.pending if c[0] != cmd[1])
            elif kind == "progress":
                for key, done in cmd[1]:
                    if (stream := self.streams.get(key)) is not None:
                        stream.done_frames = done
                        if self.backlog:
                            stream.pace(self.backlog)
            elif kind == "shutdown":
                self._running = False

    def _start_pending(self) -> None:
        """Start queued requests for START_S seconds (one at least): checking and planning a burst
        of them at once would hold up every running stream's next step."""
        end = time.perf_counter() + START_S
        while self.pending:
            self._start(*self.pending.popleft())
            if time.perf_counter() >= end:
                break
        self.idle = False

    def _start(self, key: int, ref: int, inputs: LLMInputs) -> None:
        """Check a request as the engine will, plan its refine or carry-over, start its stream; a
        ValueError names the input, and the stub answers with it."""
        try:
            check_prompts(inputs, self.engine.validate)
            speaker = self._speaker(inputs.speaker, "SPEAKER_VECTOR")    # once: every sentence reuses it
            speakers = None if inputs.speakers is None else [self._speaker(v, f"SENTENCE_SPEAKERS, sentence {i}")
                                                              for i, v in enumerate(inputs.speakers)]
            refine = None if inputs.refine is None else self.frontend.refine_plan(
                inputs.refine_prompts, inputs.refine, inputs.code_prefix, inputs.frames)
            carry = None if inputs.carry_prompts is None else self.voicing.carrier().plan(inputs.carry_prompts)
            stream = CoreStream(self, key, ref, inputs, speaker, refine, carry, speakers)
        except ValueError as e:
            self.emit(("reject", key, str(e), True))
            return
        except Exception as e:
            log.exception("llm: could not start a request")
            self.emit(("reject", key, f"llm: internal error ({e}); see the server log", False))
            return
        self.streams[key] = stream
        try:
            stream.start_requests()
        except Exception:                        # checked before, so our fault
            log.exception("llm: could not start stream %s", key)
            stream.finish(("end", key, STREAM_FAILED))

    def _speaker(self, v, what: str):
        """A sentence's speaker vector, checked and normalised as SPEAKER_VECTOR's (None: none)."""
        import torch

        if v is None:
            return None
        try:
            return self.engine.model.check_speaker(torch.from_numpy(v))
        except ValueError as e:
            raise ValueError(f"{what}: {e}") from e

    # -- the loop ---------------------------------------------------------------------
    def run(self) -> None:
        """Until the stub says shutdown (or is gone): commands, a step, a report."""
        last_report = last_pace = time.monotonic()
        while self._running:
            busy = (self.engine.has_unfinished() and not self.idle) or bool(self.pending)
            if busy:
                waiting = self.channel.poll(0)
            else:                                # nothing to step: until a command or a voice sample
                waiting = self.channel.sock in wait([self.channel.sock, self.voicing.wake], REPORT_EVERY)
            if waiting:
                while True:                      # every command waiting, then a step
                    self.apply(self.channel.recv())
                    if not self.channel.poll(0):
                        break
                self.idle = False
            self._take_voiced()
            if self.pending:                     # a burst of requests: START_S of them a loop
                self._start_pending()
            if self.engine.has_unfinished() and not self.idle:
                self.idle = not self._step()     # every request paused: wait for a command
            now = time.monotonic()
            if self.backlog and now - last_pace >= PACE_EVERY:
                last_pace = now
                for stream in list(self.streams.values()):
                    if stream.ref:
                        stream.pace(self.backlog)
                self.idle = False
            if self.report.events or now - last_report >= REPORT_EVERY:
                last_report = now
                self._send_report()
        self._shutdown()

    def _step(self) -> bool:
        """One engine step and its outputs to their streams; False when every request is paused.
        Overlapped (VELOCITY_OVERLAP_STEPS), the next batch is launched before this one's outputs
        go to their streams, so that on a GPU the streams' work runs beside the next step."""
        t = time.perf_counter()
        engine = self.engine
        launched, outputs = False, []
        try:
            with self.lender() if self.lender is not None else contextlib.nullcontext():
                if self.overlap:
                    outputs = engine.collect()
                    launched = engine.launch()
                else:                            # (a step's outputs may all be held: LLMEngine.hold)
                    launched = engine.launch()
                    outputs = engine.collect() if launched else []
        except Exception:  # a bug in scheduling: fail everyone rather than hang them
            log.exception("engine loop failed; aborting all requests")
            # (a collected step's outputs still go out: the requests it finished are not left to abort)
            outputs += [engine.abort(r) for r in list(engine.requests)]
        if not outputs and not launched:
            return False
        owner = self.owner
        for out in outputs:
            got = owner.pop(out.request_id, None) if out.finished else owner.get(out.request_id)
            if got is not None and not got[0].over:
                got[0].on_output(got[1], out)
        tot = self.totals
        tot.steps += 1
        tot.step_seconds += time.perf_counter() - t
        return True

    def _take_voiced(self) -> None:
        for stream, sample in self.voicing.take():
            if sample is None:
                stream.finish(("end", stream.key, STREAM_FAILED))
            else:
                stream.voiced(sample)
            self.idle = False

    def _send_report(self) -> None:
        st, tot = self.engine.stats(), self.totals
        tot.running, tot.waiting, tot.kv_used, tot.kv_free = st.running, st.waiting + st.swapped, \
            st.kv_blocks_used, st.kv_blocks_free
        tot.preemptions, tot.paused, tot.clients = st.preemptions, st.paused, st.clients
        tot.frames = self.engine.sampled[self.engine.model.default_head]     # the audio head's
        tot.lent_steps = self.lender.lent_steps if self.lender is not None else 0
        tot.worker_seconds = self.engine.worker_seconds
        report, self.report = self.report, Report(totals=tot)
        self.channel.send(report)

    def _shutdown(self) -> None:
        """Abort what is left (its KV blocks free), tell the stub, close."""
        for stream in list(self.streams.values()):
            stream.finish(("end", stream.key, None))
        self._send_report()
        self.voicing.shutdown()
        if self.cores is not None:
            self.cores.close(unlink=True)     # whichever of llm and vocoder stops last finds it gone


def serve(settings: Settings, channel: Channel, core_board: str) -> None:
    """The core process's life: start the engine, say ready (or why not), run until told to stop.
    core_board: the file the vocoder marks while it decodes (velocity.serving.boards.core_board)."""
    import traceback

    try:
        core = EngineCore(settings, channel, core_board)
    except Exception as e:
        log.exception("the engine core could not start")
        channel.send(("failed", f"{type(e).__name__}: {e}", traceback.format_exc()))
        return
    channel.send(("ready", core.info()))
    try:
        core.run()
    except (EOFError, OSError):                   # the stub is gone: nothing to tell
        log.warning("the llm stub closed its socket: the engine core stops")

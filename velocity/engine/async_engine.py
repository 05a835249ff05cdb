"""AsyncLLMEngine: the engine loop on a background thread, requests as async iterators."""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable

from velocity.config import EngineConfig
from velocity.engine.llm_engine import LLMEngine, RequestOutput
from velocity.engine.sequence import Token
from velocity.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

Callback = Callable[[RequestOutput], None]


class AsyncLLMEngine:
    """Thread-safe front of LLMEngine. add_request/abort may be called from any thread; the
    engine thread applies them between steps and calls each request's callback with every
    incremental output. `generate` wraps that as an async iterator for asyncio code.
    before_step, if given, runs on the engine thread before every step (the server uses it to
    lend the llm the vocoder's idle CPU cores: velocity.serving.boards.core_board)."""

    def __init__(self, config: EngineConfig | None = None, engine: LLMEngine | None = None,
                 before_step: Callable[[], None] | None = None) -> None:
        self.engine = engine or LLMEngine(config)
        self.model = self.engine.model             # the model the engine runs
        self.device = self.engine.device           # the torch device it runs on
        self.validate = self.engine.validate       # a request's check, from any thread (reads only)
        self.stats = self.engine.stats             # the engine's counts, from any thread (reads only)
        self.before_step = before_step
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._callbacks: dict[str, Callback] = {}
        self._wake = threading.Event()
        self._stopped = False
        self.steps, self.step_seconds = 0, 0.0       # engine steps, and seconds spent in them and their callbacks
        self._thread = threading.Thread(target=self._loop, name="velocity-engine", daemon=True)
        self._thread.start()

    # -- any thread ------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: list[Token], params: SamplingParams, callback: Callback,
                    **kwargs) -> None:
        """Validate now (raises ValueError), then queue the request for the engine thread.
        kwargs go to LLMEngine.add_request (head=, speaker=, return_hidden=)."""
        if self._stopped:
            raise RuntimeError("engine is shut down")
        self.engine.validate(prompt, params, kwargs.get("head"), kwargs.get("speaker"))
        self._commands.put(("add", request_id, prompt, params, callback, kwargs))
        self._wake.set()

    def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))
        self._wake.set()

    def pause(self, request_id: str, paused: bool = True) -> None:
        """Leave the request out of the steps, keeping its KV blocks (paused=False: take it back)."""
        self._commands.put(("pause", request_id, paused))
        self._wake.set()

    async def generate(self, request_id: str, prompt: list[Token], params: SamplingParams,
                       **kwargs) -> AsyncIterator[RequestOutput]:
        """Yield the request's outputs as they are produced; leaving the loop early aborts it."""
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self.add_request(request_id, prompt, params, lambda o: loop.call_soon_threadsafe(q.put_nowait, o),
                         **kwargs)
        finished = False
        try:
            while not finished:
                out = await q.get()
                finished = out.finished
                if out.error:
                    raise RuntimeError(out.error)
                yield out
        finally:
            if not finished:
                self.abort(request_id)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Abort whatever is left and stop the engine thread."""
        self._stopped = True
        self._commands.put(("stop",))
        self._wake.set()
        self._thread.join(timeout)

    # -- engine thread ---------------------------------------------------------------
    def _apply_commands(self) -> bool:
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return True
            if cmd[0] == "add":
                _, rid, prompt, params, cb, kwargs = cmd
                try:
                    self.engine.add_request(rid, prompt, params, **kwargs)
                    self._callbacks[rid] = cb
                except Exception as e:  # e.g. a duplicate id: tell that request, go on
                    cb(RequestOutput(rid, finished=True, finish_reason="error", error=str(e)))
            elif cmd[0] == "abort":
                self._emit(self.engine.abort(cmd[1]))
            elif cmd[0] == "pause":
                self.engine.pause(cmd[1], cmd[2])
            else:
                for rid in list(self.engine.requests):
                    self._emit(self.engine.abort(rid))
                return False

    def _emit(self, out: RequestOutput | None) -> None:
        if out is None:
            return
        cb = self._callbacks.pop(out.request_id, None) if out.finished else self._callbacks.get(out.request_id)
        if cb is not None:
            try:
                cb(out)
            except Exception:
                logger.exception("callback of request %s failed; aborting it", out.request_id)
                if not out.finished:
                    self._emit(self.engine.abort(out.request_id))

    def _loop(self) -> None:
        while self._apply_commands():
            if not self.engine.has_unfinished():
                self._wake.wait()
                self._wake.clear()
                continue
            t = time.perf_counter()
            try:
                if self.before_step is not None:
                    self.before_step()
                outputs = self.engine.step()
            except Exception:  # a bug in scheduling: fail everyone rather than hang them
                logger.exception("engine loop failed; aborting all requests")
                outputs = [self.engine.abort(r) for r in list(self.engine.requests)]
            if not outputs:              # every request is paused: wait for a command
                self._wake.wait()
                self._wake.clear()
                continue
            for out in outputs:
                self._emit(out)
            self.steps += 1
            self.step_seconds += time.perf_counter() - t

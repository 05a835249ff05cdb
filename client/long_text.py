"""A text over the server's limit (a book, a long article) as a pipeline of requests.

The text is cut at paragraphs, then at sentences, into pieces of at most `limit` characters
(velocity.tts.text_pieces.split_long, which the gateway's long texts use too); `speak_long` keeps `in_flight` of them generating at once and writes their
audio to the WAV in order as it comes, with a progress bar (sentences and audio seconds). A
progress file beside the WAV (`<out>.progress.json`) records the pieces written; `resume`
continues from there after an interruption, with the same text and settings.
"""
from __future__ import annotations

import hashlib
import json
import logging
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from velocity.tts.text_pieces import sentences_in

log = logging.getLogger("velocity-tts-client")
_END = object()
class Progress:
    """<out>.progress.json: the pieces written and the samples they hold, for this text and these settings."""

    def __init__(self, out: str, pieces: list[str], values: dict) -> None:
        self.path = Path(out + ".progress.json")
        key = json.dumps({"pieces": pieces, "values": {k: v for k, v in values.items() if k != "TEXT"}},
                         sort_keys=True, default=repr)
        self.key = hashlib.sha256(key.encode()).hexdigest()

    def load(self) -> tuple[int, int]:
        """(pieces done, samples) of an earlier run of the same job; ValueError if it was another job."""
        if not self.path.is_file():
            return 0, 0
        got = json.loads(self.path.read_text())
        if got.get("key") != self.key:
            raise ValueError(f"{self.path} belongs to another text or other settings: remove it, or drop --resume")
        return got["pieces"], got["samples"]

    def save(self, pieces: int, samples: int) -> None:
        self.path.write_text(json.dumps({"key": self.key, "pieces": pieces, "samples": samples}))

    def done(self) -> None:
        self.path.unlink(missing_ok=True)


def speak_long(stream: Callable[[dict], Iterator[tuple[int, np.ndarray]]], values: dict, pieces: list[str],
               out: str, subtype: str, in_flight: int = 2, resume: bool = False, rate: int = 24000) -> dict:
    """Speak `pieces` in order, `in_flight` requests at once (stream(values) -> (chunk index, audio)
    of one request), appending to the WAV at `out`; returns the figures (audio seconds, seconds,
    stall: the seconds a listener from the first audio would have waited mid-stream)."""
    import soundfile as sf
    from tqdm.auto import tqdm

    progress = Progress(out, pieces, values)
    start, samples = progress.load() if resume else (0, 0)
    if start:
        wav = sf.SoundFile(out, "r+")
        wav.seek(samples)
        wav.truncate(samples)
        log.info("resuming %s after %d of %d pieces (%.1f s of audio)", out, start, len(pieces), samples / rate)
    else:
        wav = sf.SoundFile(out, "w", rate, 1, subtype)
    queues = [queue.Queue() for _ in pieces]
    stop = threading.Event()
    places = threading.Semaphore(in_flight)

    def generate(k: int) -> None:
        try:
            gen = stream(values | {"TEXT": pieces[k]})
            try:
                for item in gen:
                    if stop.is_set():
                        break
                    queues[k].put(item)
            finally:
                gen.close()                                 # cancels a stream left early
            queues[k].put(_END)
        except Exception as e:
            queues[k].put(e)
        finally:
            places.release()

    def feeder() -> None:
        for k in range(start, len(pieces)):
            places.acquire()
            if stop.is_set():
                places.release()
                return
            threading.Thread(target=generate, args=(k,), daemon=True).start()

    threading.Thread(target=feeder, daemon=True).start()
    t0, first, end, stall = time.perf_counter(), None, None, 0.0
    total = sum(sentences_in(p) for p in pieces)
    bar = tqdm(total=total, initial=sum(sentences_in(p) for p in pieces[:start]), unit="sentence",
               desc=Path(out).name, dynamic_ncols=True)
    try:
        for k in range(start, len(pieces)):
            pending, nxt = {}, 0
            while True:
                item = queues[k].get()
                if item is _END:
                    break
                if isinstance(item, Exception):
                    raise item
                pending[item[0]] = item[1]
                while nxt in pending:
                    audio = pending.pop(nxt)
                    nxt += 1
                    now = time.perf_counter() - t0
                    first = now if first is None else first
                    if end is not None and now > end:
                        stall += now - end
                    end = (now if end is None else max(end, now)) + len(audio) / rate
                    wav.write(audio)
                    samples += len(audio)
                    bar.set_postfix_str(f"{samples / rate:.1f} s of audio")
            wav.flush()
            progress.save(k + 1, samples)
            bar.update(sentences_in(pieces[k]))
    finally:
        stop.set()
        bar.close()
        wav.close()
    progress.done()
    took = time.perf_counter() - t0
    return {"pieces": len(pieces), "audio_s": samples / rate, "seconds": took, "first_audio_s": first,
            "stall_s": stall}


def run_long(args, url: str, values: dict, subtype: str) -> int:
    """velocity-tts-client's long-text mode: a text over --max-chars as pieces in a pipeline over
    gRPC streams into the WAV (soundfile `subtype`); the exit status."""
    from client.triton import ServerError, stream_grpc
    from velocity.tts.text_pieces import split_long

    if args.out == "-" or args.http or args.offline:
        log.error("error: a text over --max-chars (%d) goes out in pieces over gRPC streams into a WAV file: "
                  "give -o FILE, without --http or --offline (or raise --max-chars to the server's limit)",
                  args.max_chars)
        return 2
    pieces = split_long(values["TEXT"], args.max_chars)
    try:
        got = speak_long(lambda v: stream_grpc(url, v, retries=args.retries, deadline=args.timeout, key=args.api_key), values, pieces,
                         args.out, subtype, args.in_flight, args.resume)
    except ServerError as e:
        hint = f" (the server's limit is lower: pass --max-chars {m.group(1)})" if (
            m := re.search(r"the limit is (\d+)", str(e))) else ""
        log.error("error: %s%s; --resume continues from the last piece written", e, hint)
        return 1
    except ValueError as e:
        log.error("error: %s", e)
        return 2
    except KeyboardInterrupt:
        log.error("interrupted: the requests are cancelled; --resume continues from the last piece written")
        return 130
    log.info("%s: %.2f s of audio from %d pieces in %.1f s (%.2f audio s/s); first audio after %.3f s, stalls %.2f s",
             args.out, got["audio_s"], got["pieces"], got["seconds"], got["audio_s"] / got["seconds"],
             got["first_audio_s"] or float("nan"), got["stall_s"])
    return 0

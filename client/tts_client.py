"""Streaming TTS client: text in, a WAV file out, written as chunks arrive.

    velocity-tts-client "Hello world." -o hello.wav               # gRPC stream through `tts`
    velocity-tts-client --file story.txt -o story.wav --seed 7
    velocity-tts-client "Hello." -o h.wav --http                  # HTTP generate_stream (SSE)
    velocity-tts-client "Hello." -o h.wav --offline               # tts_offline, one response
    velocity-tts-client "Hello." -o - | aplay                      # a WAV stream to stdout, as it comes
    velocity-tts-client --file book.txt -o book.wav --resume      # over the text limit: pieces in a pipeline
    velocity-tts-client "Hello." --api-key "$(cat RUN_DIR/triton_key)" # a server with API keys

Prints time to first audio, total time, audio seconds and the real-time factor. The WAV is
16-bit PCM (`--format float` for 32-bit float). Any failure prints one line and exits non-zero.
Ctrl-C, or a reader of stdout that goes away (exit 141), cancels the request: the server stops
its work on it within a second. A text over --max-chars (the server's default limit) is cut at
paragraphs and sentences into pieces sent --in-flight at a time, written in order with a progress
bar; --resume continues an interrupted one (client/long_text.py).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from client.http_stream import stream_http
from client.triton import ServerError, list_voices, offline_grpc, stream_grpc
from client.wav import SAMPLE_RATE, WAV_FORMATS, open_wav
from velocity.tts.audio_file import looks_like_audio

log = logging.getLogger("velocity-tts-client")


@dataclass
class Result:
    """One request's audio and timings (seconds from sending)."""
    audio: np.ndarray
    chunk_times: list[float] = field(default_factory=list)
    total: float = 0.0
    playable: list[tuple[float, float]] = field(default_factory=list)   # (time, seconds) of each chunk in order

    @property
    def stall(self) -> float:
        """Seconds a listener who starts playing at the first chunk waits mid-stream (see `stall`)."""
        return stall(self.playable)

    @property
    def seconds(self) -> float:
        return len(self.audio) / SAMPLE_RATE

    @property
    def first_audio(self) -> float | None:
        return self.chunk_times[0] if self.chunk_times else None

    @property
    def rtf(self) -> float:
        return self.total / self.seconds if self.seconds else float("inf")


def stall(playable: list[tuple[float, float]]) -> float:
    """Chunks in play order as (when it could play, its seconds of audio) -> the seconds a
    listener who starts at the first chunk waits for audio: each chunk's arrival past the end of
    the audio before it, summed (0: no gap heard)."""
    waited, end = 0.0, None
    for t, seconds in playable:
        if end is not None and t > end:
            waited += t - end
        end = (t if end is None else max(end, t)) + seconds
    return waited


def synthesize(chunks: Iterator[tuple[int, np.ndarray]], wav_path: str | None = None,
               subtype: str = "PCM_16") -> Result:
    """Collect chunks in index order, appending each to the WAV file ("-": stdout) as soon as it is
    next in line. Whatever happens, the chunk source is closed (a gRPC stream is cancelled; the
    server stops its work on it)."""
    t0 = time.perf_counter()
    res = Result(np.zeros(0, np.float32))
    pending: dict[int, np.ndarray] = {}
    parts: list[np.ndarray] = []
    out = None       # opened at the first chunk: a failed request leaves no file behind
    try:
        for idx, audio in chunks:
            res.chunk_times.append(time.perf_counter() - t0)
            pending[idx] = audio
            while len(parts) in pending:
                parts.append(pending.pop(len(parts)))
                res.playable.append((res.chunk_times[-1], len(parts[-1]) / SAMPLE_RATE))
                if wav_path:
                    out = out or open_wav(wav_path, subtype)
                    out.write(parts[-1])
                    out.flush()
    finally:
        if out is not None:
            out.close()
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    if pending:
        raise ServerError(f"chunks {sorted(pending)} arrived but chunk {len(parts)} never did")
    res.total = time.perf_counter() - t0
    res.audio = np.concatenate(parts) if parts else res.audio
    return res


VOICE_FLAGS = ("SPEAKER", "SPEAKER_SEED", "VOICE")     # one of them at most


def add_input_flags(ap: argparse.ArgumentParser) -> None:
    """An option for each request input that has one (velocity.serving.wire.input_table: its type, choices
    and help); unset options are not sent, so the server's defaults apply."""
    from velocity.serving.wire.input_table import INPUTS, JSON

    voice = ap.add_mutually_exclusive_group()
    for i in INPUTS:
        if i.cli_flag is None:
            continue
        group = voice if i.name in VOICE_FLAGS else ap
        help = i.describe().replace("%", "%%")
        if i.dtype == "BOOL":
            group.add_argument(i.cli_flag, dest=i.name, action="store_true", default=None, help=help)
        elif i.binary:
            group.add_argument(i.cli_flag, dest=i.name, metavar="FILE", help=help + " (here: the file)")
        elif i.json:
            group.add_argument(i.cli_flag, dest=i.name, metavar="JSON|FILE", type=json_text,
                               help=help + " (here: the JSON, or a file holding it)")
        else:
            group.add_argument(i.cli_flag, dest=i.name, type=JSON[i.dtype], choices=i.choices or None, help=help)


def json_text(value: str) -> str:
    """An option's JSON: the value itself, or the text of the file it names."""
    path = Path(value)
    return path.read_text(encoding="utf-8") if not value.lstrip().startswith(("{", "[")) and path.is_file() else value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="velocity-tts-client", description=__doc__.split("\n")[0])
    ap.add_argument("text", nargs="?", help="text to speak (or --file)")
    ap.add_argument("--file", help="read the text from this UTF-8 file")
    ap.add_argument("-o", "--out", default="out.wav", help="WAV file to write (default out.wav; -: stdout, as it comes)")
    ap.add_argument("--url", default=None, help="server address (default localhost:8001 gRPC, localhost:8000 HTTP)")
    ap.add_argument("--timeout", type=float, default=None,
                    help="gRPC stream: seconds the server may take for the request (Triton's request timeout): past it "
                         "the server stops it and the client reports the error")
    ap.add_argument("--api-key", default=os.environ.get("VELOCITY_TRITON_KEY", ""),
                    help="the server's Triton key, where it has API keys (default: $VELOCITY_TRITON_KEY; "
                         "serve.sh names the file that holds it)")
    ap.add_argument("--retries", type=int, default=0,
                    help="gRPC stream: send a request refused before its first chunk (busy, draining, not serving) "
                         "again, up to this many times (behind a balancer: to another replica)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--http", action="store_true", help="HTTP generate_stream instead of a gRPC stream")
    mode.add_argument("--offline", action="store_true", help="tts_offline: the whole waveform in one response")
    ap.add_argument("--list-voices", action="store_true", help="print the server's voices and exit")
    ap.add_argument("--words", action="store_true",
                    help="print each word's estimated start and end (seconds) as its audio comes (a stream only)")
    ap.add_argument("--max-chars", type=int, default=2000,
                    help="a longer text is sent in pieces of at most this many characters, cut at paragraphs and "
                         "sentences (default 2000: the server's default VELOCITY_MAX_TEXT_CHARS)")
    ap.add_argument("--in-flight", type=int, default=2, help="pieces of a long text generating at once (default 2)")
    ap.add_argument("--resume", action="store_true",
                    help="a long text: continue the WAV an interrupted run left (its <out>.progress.json)")
    add_input_flags(ap)
    ap.add_argument("--format", choices=sorted(WAV_FORMATS), default="pcm16",
                    help="WAV samples: pcm16 (default; what every player and Python's wave module read) "
                         "or float (32-bit, the server's exact output)")
    args = ap.parse_args(argv)
    if args.list_voices:
        return args
    if (args.text is None) == (args.file is None):
        ap.error("give the text as an argument or with --file (one of them)")
    return args


def read_text(args: argparse.Namespace) -> str:
    if args.file is None:
        return args.text
    try:
        return Path(args.file).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"--file {args.file} is not UTF-8 text ({e.reason} at byte {e.start}); "
                         "convert it, e.g. iconv -t UTF-8") from e
    except OSError as e:
        raise ValueError(f"cannot read --file {args.file}: {e.strerror}") from e


def read_sample(path: str | None, http: bool) -> bytes | str | None:
    """--sample: an audio file's bytes, or the sample string a text file holds."""
    if path is None:
        return None
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ValueError(f"cannot read --sample {path}: {e.strerror}") from e
    if not looks_like_audio(data):
        try:
            return data.decode("utf-8").strip()
        except UnicodeDecodeError as e:
            raise ValueError(f"--sample {path} is neither a WAV, FLAC, Ogg or AIFF file nor a sample string") from e
    if http:
        raise ValueError("--http sends JSON, which cannot carry audio bytes: make a sample string first "
                         f"(velocity-tts-voice {path} -o voice.txt) and pass --sample voice.txt")
    return data


def check_out(path: str) -> None:
    """Fail before the request when the WAV cannot be written where asked."""
    if path == "-":
        return
    folder = Path(path).resolve().parent
    if not folder.is_dir():
        raise ValueError(f"cannot write {path}: the folder {folder} does not exist")
    if Path(path).is_dir():
        raise ValueError(f"cannot write {path}: it is a folder")


def printing_words(source: Iterator, next_words) -> Iterator:
    """source's chunks, each chunk's words (next_words()) printed as it comes: start, end
    (seconds of the stream's audio) and the word, on stderr (stdout may be the WAV)."""
    for item in source:
        for w in next_words():
            print(f"{w['start'] / 24000:8.3f} {w['end'] / 24000:8.3f}  {w['word']}", file=sys.stderr, flush=True)
        yield item


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.list_voices:
        try:
            listing = list_voices(args.url or "localhost:8001", args.api_key)
        except ServerError as e:
            log.error("error: %s", e)
            return 1
        for v in listing["voices"]:
            mark = " (default)" if v["name"] == listing["default"] else ""
            print(f"{v['name']}{mark}\t{v['kind']}\t{v['source']}\t{v['sample_text']}".rstrip())
        return 0
    try:
        text = read_text(args)
        sample = read_sample(args.SPEAKER_SAMPLE, args.http)
        check_out(args.out)
    except ValueError as e:
        log.error("error: %s", e)
        return 2
    from velocity.serving.wire.input_table import INPUTS

    values = {i.name: getattr(args, i.name) for i in INPUTS if i.cli_flag} | {"TEXT": text, "SPEAKER_SAMPLE": sample}
    url = args.url or ("localhost:8000" if args.http else "localhost:8001")
    if len(text) > args.max_chars or args.resume:
        from client.long_text import run_long
        return run_long(args, url, values, WAV_FORMATS[args.format])
    if args.words and args.offline:
        log.error("error: --words needs a stream: tts_offline has no word timing (drop --offline)")
        return 2
    refined, words = [], []
    marks = [] if args.words and not args.http else None
    source = stream_http(url, values, key=args.api_key, words=words if args.words else None) if args.http else \
        offline_grpc(url, values, args.api_key) if args.offline else \
        stream_grpc(url, values, texts=refined, retries=args.retries, deadline=args.timeout, key=args.api_key,
                    marks=marks)
    if args.words:
        source = printing_words(source, lambda: words.pop(0) if words else marks.pop(0)[4] if marks else [])
    try:
        res = synthesize(source, args.out, WAV_FORMATS[args.format])
    except ServerError as e:
        log.error("error: %s", e)
        return 1
    except KeyboardInterrupt:
        log.error("interrupted: the request is cancelled")
        return 130
    except BrokenPipeError:                      # the reader of -o - went away
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())    # no second error at exit
        log.error("stdout was closed: the request is cancelled")
        return 141
    except Exception as e:                       # one line, never a traceback or a hang
        log.error("error: %s: %s", type(e).__name__, e)
        return 1
    if refined:
        log.info("refined text: %s", " ".join(refined))
    log.info("%s: %.2f s of audio in %d chunk(s); first audio after %.3f s, total %.3f s, RTF %.3f",
             args.out, res.seconds, len(res.chunk_times), res.first_audio or float("nan"), res.total, res.rtf)
    return 0


if __name__ == "__main__":
    sys.exit(main())


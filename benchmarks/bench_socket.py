"""The WebSocket for voice agents (/v1/audio/speech/stream) as an agent uses it: text arrives
token by token at an LLM's pace, and the user talks over it. Measures, in rounds:
- per sentence, the seconds from the text message that completes it to its first audio, and
  the silence a listener who plays from the first audio hears before it (later sentences wait
  for the ones before them to be heard, so their gap, not their wait, is what matters);
- after a cancel, the seconds to the last audio byte received and to an idle server (no request
  active, no KV block used: the llm's gauges, four times a second, so 0.3 s is the least shown).
Writes JSON and a PNG.

    .venv/bin/python benchmarks/bench_socket.py --gateway http://localhost:8080 \\
        --metrics http://localhost:8002/metrics --rounds 4 --out docs/benchmarks/socket/tiny
"""
from __future__ import annotations

import argparse
import itertools
import json
import logging
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import ROOT, bench_texts, finish, save, summary  # noqa: E402
from benchmarks.bench_hangup import idle  # noqa: E402

log = logging.getLogger("bench_socket")


def url_of(gateway: str) -> str:
    return gateway.replace("http://", "ws://").replace("https://", "wss://").rstrip("/") + "/v1/audio/speech/stream"


def speak(gateway: str, text: str, seed: int, tokens_per_s: float, max_new_tokens: int) -> list[dict]:
    """Text sent token by token at tokens_per_s; per sentence: its text and the seconds from its
    completing token to its first audio."""
    from websockets.sync.client import connect

    tokens = re.findall(r"\S+\s*", text)
    frames: list[tuple[float, int]] = []             # (arrival, samples before it)
    sent_at: list[float] = []
    marks: list[dict] = []
    with connect(url_of(gateway), max_size=None) as ws:
        ws.send(json.dumps({"type": "setup", "model": "tts-1", "voice": "amber", "seed": seed,
                            "max_new_tokens": max_new_tokens}))
        assert json.loads(ws.recv(timeout=60))["type"] == "ready"
        samples, t0 = 0, time.perf_counter()
        for k, tok in enumerate(tokens):
            while time.perf_counter() < t0 + k / tokens_per_s:            # the LLM's pace; read meanwhile
                try:
                    m = ws.recv(timeout=max(0.001, t0 + k / tokens_per_s - time.perf_counter()))
                except TimeoutError:
                    break
                samples = _take(m, frames, marks, samples)
            ws.send(json.dumps({"type": "text", "text": tok}))
            sent_at.append(time.perf_counter())
        ws.send(json.dumps({"type": "close"}))
        closed_at = time.perf_counter()
        while True:
            m = ws.recv(timeout=600)
            samples = _take(m, frames, marks, samples)
            if isinstance(m, str) and json.loads(m)["type"] == "done":
                break
    # a sentence is complete with the token that holds the space after its end mark (the last
    # one, with close)
    cum, joined, pos, out = list(itertools.accumulate(map(len, tokens))), "".join(tokens), 0, []
    heard = gaps(frames, samples, 24000)
    for mk in marks:
        pos = joined.index(mk["text"], pos) + len(mk["text"])
        k = next((k for k, c in enumerate(cum) if c > pos), None)
        i = next(i for i, (_, before) in enumerate(frames) if before >= mk["start"])
        out.append({"text": mk["text"], "after_s": frames[i][0] - (closed_at if k is None else sent_at[k]),
                    "gap_before_s": heard[i], "audio_s": (mk["end"] - mk["start"]) / mk["sample_rate"]})
    return out


def gaps(frames: list[tuple[float, int]], samples: int, rate: int) -> list[float]:
    """For each audio message, the silence a listener who plays from the first audio hears before it."""
    out, end = [], None
    for k, (t, before) in enumerate(frames):
        n = (frames[k + 1][1] if k + 1 < len(frames) else samples) - before
        out.append(0.0 if end is None else max(0.0, t - end))
        end = (t if end is None else max(end, t)) + n / rate
    return out


def _take(m, frames: list, marks: list, samples: int) -> int:
    if isinstance(m, bytes):
        frames.append((time.perf_counter(), samples))
        return samples + len(m) // 2
    msg = json.loads(m)
    if msg["type"] == "sentence":
        marks.append(msg)
    elif msg["type"] == "error":
        raise RuntimeError(msg["message"])
    return samples


def cancel(gateway: str, metrics: str, text: str, seed: int) -> dict:
    """A long text, flushed; cancel at its first audio: seconds to the last audio byte and to idle."""
    from websockets.sync.client import connect

    with connect(url_of(gateway), max_size=None) as ws:
        ws.send(json.dumps({"type": "setup", "model": "tts-1", "voice": "amber", "seed": seed}))
        json.loads(ws.recv(timeout=60))
        ws.send(json.dumps({"type": "text", "text": text}))
        ws.send(json.dumps({"type": "flush"}))
        while not isinstance(ws.recv(timeout=600), bytes):
            pass
        ws.send(json.dumps({"type": "cancel"}))
        t0 = last = time.perf_counter()
        while True:
            m = ws.recv(timeout=60)
            if isinstance(m, bytes):
                last = time.perf_counter()
            elif json.loads(m)["type"] == "cancelled":
                got = time.perf_counter()
                break
        while not idle(metrics):
            time.sleep(0.02)
        return {"last_audio_s": last - t0, "cancelled_s": got - t0, "idle_s": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gateway", default="http://localhost:8080")
    ap.add_argument("--metrics", default="http://localhost:8002/metrics")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--sentences", type=int, default=4, help="shipped sentences per streamed text")
    ap.add_argument("--tokens-per-s", type=float, default=20.0, help="the LLM's pace, in words")
    ap.add_argument("--max-new-tokens", type=int, default=200,
                    help="frames per sentence at most (the demo weights' sentences run to it: 200 is 4.3 s)")
    ap.add_argument("--label", default="", help="what the server runs (for the figure)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "socket" / "socket"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    texts = [t for t in bench_texts() if t.isascii()]
    rounds = []
    for r in range(args.rounds):
        text = " ".join(texts[(r * args.sentences + k) % len(texts)] for k in range(args.sentences))
        sentences = speak(args.gateway, text, r, args.tokens_per_s, args.max_new_tokens)
        cut = cancel(args.gateway, args.metrics, " ".join(texts), r)
        rounds.append({"sentences": sentences, "cancel": cut})
        log.info("round %d: first audio after the sentence's last word %s s; cancel %s", r + 1,
                 [round(s["after_s"], 3) for s in sentences], json.dumps({k: round(v, 3) for k, v in cut.items()}))
    first = [rd["sentences"][0]["after_s"] for rd in rounds]
    later = [s["gap_before_s"] for rd in rounds for s in rd["sentences"][1:]]
    res = {"label": args.label, "tokens_per_s": args.tokens_per_s, "sentences_per_text": args.sentences,
           "max_new_tokens": args.max_new_tokens,
           "rounds": rounds, "first_sentence_s": summary(first), "later_sentences_gap_s": summary(later),
           "cancel": {k: statistics.median(rd["cancel"][k] for rd in rounds)
                      for k in ("last_audio_s", "cancelled_s", "idle_s")}}
    out = Path(args.out)
    save(res, out, plot)
    log.info("first sentence: %s; silence before later ones: %s; cancel (median): %s; wrote %s and .png",
             json.dumps(res["first_sentence_s"]), json.dumps(res["later_sentences_gap_s"]), json.dumps(res["cancel"]),
             out.with_suffix(".json"))


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    first = [rd["sentences"][0]["after_s"] for rd in res["rounds"]]
    later = [s["gap_before_s"] for rd in res["rounds"] for s in rd["sentences"][1:]]
    a.scatter([0] * len(first), first, color="tab:blue")
    a.scatter([1] * len(later), later, color="tab:orange")
    a.set_xticks([0, 1], ["first sentence:\nlast word -> first audio", "later sentences:\nsilence heard before"])
    a.set(ylabel="seconds", title=f"text at {res['tokens_per_s']:g} words/s", ylim=(0, None), xlim=(-0.5, 1.5))
    keys = ("last_audio_s", "cancelled_s", "idle_s")
    for k, key in enumerate(keys):
        b.scatter([k] * len(res["rounds"]), [rd["cancel"][key] for rd in res["rounds"]], color="tab:blue")
    b.set_xticks(range(len(keys)), ["last audio byte", '"cancelled"', "server idle"])
    b.set(ylabel="seconds after cancel", title="barge-in", ylim=(0, None))
    finish(fig, path, res)


if __name__ == "__main__":
    main()

"""Voice-agent frameworks against our own API, through the same gateway: seconds to the first
audio and to the end of one sentence for the official `openai` client (streamed), Pipecat's
OpenAITTSService and ElevenLabsTTSService (its WebSocket) in a pipeline and LiveKit's openai.TTS
(benchmarks/agents.py), in paired
rounds (ABBA). What a framework adds over a plain request. Writes JSON and a PNG.

    .venv/bin/python benchmarks/bench_agents.py --gateway http://localhost:8080 --rounds 4 \\
        --out docs/benchmarks/agents/tiny
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.agents import livekit_synthesize, pipecat_pipeline  # noqa: E402
from benchmarks.harness import ROOT, arms_plot, median_ratio, medians, paired_rounds, save  # noqa: E402

log = logging.getLogger("bench_agents")
ARMS = ("openai", "pipecat", "pipecat-elevenlabs", "livekit")


def openai_client(gateway: str, text: str) -> tuple[float, float]:
    """(first audio, end) in seconds for a streamed request with the official client."""
    import openai

    api = openai.OpenAI(base_url=gateway + "/v1", api_key="unused", max_retries=0)
    t0, first = time.perf_counter(), None
    with api.audio.speech.with_streaming_response.create(model="tts-1", voice="alloy", input=text,
                                                         response_format="pcm") as r:
        for _ in r.iter_bytes(4096):
            first = first or time.perf_counter()
    return (first or t0) - t0, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gateway", default="http://localhost:8080")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--text", default="Hello there, how are you today?")
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "agents" / "agents"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    def run(arm: str) -> dict:
        t0 = time.perf_counter()
        if arm == "openai":
            first, end = openai_client(args.gateway, args.text)
        elif arm == "livekit":
            first = livekit_synthesize(args.gateway, args.text)[2]
            end = time.perf_counter() - t0
        else:
            first = pipecat_pipeline(args.gateway, args.text,
                                     service="elevenlabs" if arm == "pipecat-elevenlabs" else "openai")[2]
            end = time.perf_counter() - t0
        log.info("%s: first audio %.3f s, end %.3f s", arm, first, end)
        return {"first_audio_s": first, "end_s": end}

    rounds = paired_rounds(list(ARMS), args.rounds, run)
    res = {"label": args.label, "text": args.text, "arms": list(ARMS), "rounds": rounds,
           "median": medians(rounds, ("first_audio_s", "end_s")),
           "first_audio_over_openai": {a: median_ratio(rounds, a, "openai", lambda x: x["first_audio_s"])
                                       for a in ARMS[1:]}}
    out = Path(args.out)
    save(res, out, plot)
    log.info("median: %s; first audio over the openai client's: %s; wrote %s and .png", json.dumps(res["median"]),
             json.dumps(res["first_audio_over_openai"]), out.with_suffix(".json"))


def plot(res: dict, path: Path) -> None:
    names = {"openai": "openai client", "pipecat": "Pipecat (OpenAI)", "pipecat-elevenlabs": "Pipecat (ElevenLabs)",
             "livekit": "LiveKit"}
    arms_plot(res, path, "first_audio_s", names, "seconds to the first audio",
              f"one sentence through the gateway: {res['text']!r}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""One client at its cap through ElevenLabs' WebSocket, another client beside it, then every socket
of the first dropped at once: the second's first audio beside the flood over its idle one, and
the seconds from the drop to an idle server.

    .venv/bin/python benchmarks/bench_socket_flood.py --rounds 3 --baseline-rev 3af5e51

A server (serve.sh: Triton and the gateway) of this tree, and of a baseline revision, on the tiny
demo checkpoint. Client A (127.0.0.2) opens --sockets ElevenLabs sockets of --contexts contexts,
each context a long text (the gateway's per-client cap of 64 streams holds the rest back), reads
them (or, with --no-read, never), and after --hold seconds drops every socket (no close frame).
The server runs --max-num-seqs sequences a step (16: fewer than the client's cap, a
small server). Client B (127.0.0.3) posts a one-sentence /v1/audio/speech alone before the flood and once during
it, from a process of its own (beside A's readers it would share their GIL). Idle: no request active and no KV block used. Paired rounds (ABBA); JSON and a PNG.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import (ROOT, by_arm, exit_on_sigterm, hardware,  # noqa: E402
                                paired_rounds, rounds_panels, save, trees)
from benchmarks.server import TritonServer, http_status, start_servers, wait_for  # noqa: E402

log = logging.getLogger("bench_socket_flood")
LONG = "This sentence goes on for a while and then some more. " * 6


def first_audio(gateway: str, source: str, seed: int) -> float:
    """Seconds to the first audio bytes of one short speech request from address `source`."""
    u = urlparse(gateway)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120, source_address=(source, 0))
    t0 = time.perf_counter()
    conn.request("POST", "/v1/audio/speech", json.dumps({"model": "tts-1", "voice": "amber", "seed": seed,
                                                         "input": "Am I heard beside the flood?",
                                                         "response_format": "pcm"}),
                 {"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"B's request: {r.status} {r.read()[:300]!r}")
    r.read1(1)
    took = time.perf_counter() - t0
    r.read()
    conn.close()
    return took


def first_audio_apart(gateway: str, source: str, seed: int) -> float:
    """first_audio in a process of its own, as another client's would be: in this one the flood's
    readers would hold its GIL (the child's start is not timed)."""
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); from benchmarks.bench_socket_flood import first_audio; "
            f"print(first_audio({gateway!r}, {source!r}, {seed}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    if out.returncode:
        raise RuntimeError(f"B's request failed: {out.stderr[-2000:]}")
    return float(out.stdout.split()[-1])


def idle(server: TritonServer) -> bool:
    from client.triton import parse_metric
    try:
        m = server.metrics()
    except OSError:
        return False
    return parse_metric(m, "velocity_active_requests") == 0 and parse_metric(m, "velocity_kv_blocks_used") == 0


def one_round(server: TritonServer, args: argparse.Namespace, seed: int) -> dict:
    import websockets

    wait_for(lambda: idle(server), 30)
    alone = first_audio_apart(server.gateway_url, "127.0.0.3", seed)
    url = server.gateway_url.replace("http://", "ws://") + \
        "/v1/text-to-speech/amber/multi-stream-input?output_format=pcm_24000"

    async def flood() -> tuple[float, float, float, int]:
        socks = [await websockets.connect(url, max_size=None, open_timeout=30) for _ in range(args.sockets)]
        for ws in socks:
            for c in range(args.contexts):
                await ws.send(json.dumps({"text": LONG, "context_id": f"c{c}"}))
                await ws.send(json.dumps({"context_id": f"c{c}", "flush": True}))
        read = [0]

        async def drain(ws) -> None:
            with contextlib.suppress(Exception):
                while True:
                    await ws.recv()
                    read[0] += 1

        readers = [asyncio.create_task(drain(ws)) for ws in socks] if args.read else []
        await asyncio.sleep(args.hold / 2)
        beside = await asyncio.to_thread(first_audio_apart, server.gateway_url, "127.0.0.3", seed + 1)
        await asyncio.sleep(args.hold / 2)
        active = float(server.metric("velocity_active_requests"))
        dropped = time.monotonic()
        for ws in socks:
            ws.transport.abort()                  # dropped: no close frame, as a dead client
        for r in readers:
            r.cancel()
        return beside, active, dropped, read[0]

    beside, active, dropped, read = asyncio.run(flood())
    was_idle = wait_for(lambda: idle(server), 60)
    return {"first_audio_alone_s": alone, "first_audio_beside_s": beside, "beside_over_alone": beside / alone,
            "llm_requests_active": active, "messages_read": read,
            "idle_after_s": time.monotonic() - dropped if was_idle else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sockets", type=int, default=18)
    ap.add_argument("--contexts", type=int, default=5)
    ap.add_argument("--max-num-seqs", type=int, default=16,
                    help="the server's VELOCITY_MAX_NUM_SEQS: fewer than one client's cap, a small server")
    ap.add_argument("--hold", type=float, default=6.0, help="seconds the flood runs before the drop")
    ap.add_argument("--no-read", dest="read", action="store_false", help="client A never reads its audio")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline-rev", help="git revision of a second server, in alternating rounds")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "hangup" / "socket_flood"))
    args = ap.parse_args()
    exit_on_sigterm()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from velocity.demo.checkpoint import write_checkpoint

    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-socket-flood-")))
        weights = str(write_checkpoint(tmp / "tiny", "tiny", seed=0))
        roots, labels = trees(stack, args.baseline_rev)
        env = {"VELOCITY_WEIGHTS": weights, "VELOCITY_MAX_NUM_SEQS": str(args.max_num_seqs)}
        servers = start_servers(stack, roots, tmp, lambda name: env)
        for s in servers.values():
            wait_for(lambda: http_status(s.gateway_url + "/health") == 200, 60)
        seeds = iter(range(0, 1000, 2))
        rounds = paired_rounds(sorted(roots), args.rounds, lambda name: one_round(servers[name], args, next(seeds)))
    res = {"hardware": hardware(), "max_num_seqs": args.max_num_seqs, "sockets": args.sockets, "contexts": args.contexts, "hold_s": args.hold,
           "read": args.read, "labels": labels, "rounds": rounds, "summary": {}}
    for name, xs in by_arm(rounds).items():
        idles = [x["idle_after_s"] for x in xs]
        res["summary"][name] = m = {"idle_after_s_max": None if None in idles else max(idles),
                                    "beside_over_alone_max": max(x["beside_over_alone"] for x in xs),
                                    "beside_over_alone_p50": statistics.median(x["beside_over_alone"] for x in xs)}
        log.info("%s: idle %s s after the drop (rounds: %s); B's first audio beside the flood %.2fx its idle "
                 "(worst %.2fx)", labels[name], m["idle_after_s_max"], [round(i or -1, 2) for i in idles],
                 m["beside_over_alone_p50"], m["beside_over_alone_max"])
    log.info("wrote %s and its .png", save(res, Path(args.out), plot))


def plot(res: dict, path: Path) -> None:
    rounds_panels(res, path, [("idle_after_s", "s from the drop to an idle server", 2),
                              ("beside_over_alone", "B's first audio beside the flood / alone", 2)],
                  f"{res['sockets']} ElevenLabs sockets x {res['contexts']} contexts from one client, dropped at once")


if __name__ == "__main__":
    main()

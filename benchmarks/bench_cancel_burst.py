"""A burst of cancels against a real server: N `tts` streams over gRPC (tritonclient's aio client,
as the gateway opens them), each read to its first audio chunk, then all cancelled at once, as a
client that drops every socket does. Per round: whether the server lived through it
(/v2/health/live and ready), the seconds until it was idle (no request active, no KV block used)
and how many streams got audio first. In rounds against a server of this checkout on the tiny demo
checkpoint (or of --baseline-rev REV's tree); writes JSON and a PNG.

    .venv/bin/python benchmarks/bench_cancel_burst.py --streams 256 --rounds 6 --out docs/benchmarks/cancel_burst/tiny
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import ROOT, cpu_model, finish, save  # noqa: E402
from client.triton import parse_metric  # noqa: E402

log = logging.getLogger("bench_cancel_burst")


async def burst(url: str, n: int, first_within: float) -> int:
    """n streams, each to its first chunk (or first_within seconds), then all cancelled at once:
    the number that had audio."""
    import tritonclient.grpc.aio as grpcclient

    from velocity.serving.input_table import make_inputs

    client = grpcclient.InferenceServerClient(url)
    got = asyncio.Event()
    heard = 0

    async def one(i: int) -> None:
        nonlocal heard

        async def requests():
            yield {"model_name": "tts", "inputs": make_inputs(grpcclient, {"TEXT": f"Stream {i} says a long sentence "
                                                                               "that goes on and on for a while.",
                                                                       "VOICE": "amber", "SEED": i}),
                   "enable_empty_final_response": True}

        async for result, error in client.stream_infer(requests()):
            if error is None and result.as_numpy("WAVEFORM") is not None:
                heard += 1
                if heard == n:
                    got.set()
                await asyncio.Event().wait()          # hold the stream open until cancelled

    tasks = [asyncio.create_task(one(i)) for i in range(n)]
    try:
        await asyncio.wait_for(got.wait(), first_within)
    except asyncio.TimeoutError:
        pass
    for t in tasks:                                   # the burst: every stream cancelled at once
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await client.close()
    return heard


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline-rev", help="run the rounds against a server of this git revision instead")
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--first-within", type=float, default=30.0, help="seconds to wait for the streams' first audio")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "cancel_burst" / "tiny"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import contextlib
    import tempfile

    from benchmarks.harness import baseline_tree, revision
    from benchmarks.server import TritonServer, wait_for
    from velocity.demo.checkpoint import write_checkpoint

    d = Path(tempfile.mkdtemp())
    ckpt = write_checkpoint(d / "tiny", "tiny", seed=0)
    rounds, crashed, tail = [], False, ""
    with (baseline_tree(args.baseline_rev) if args.baseline_rev else contextlib.nullcontext(ROOT)) as tree:
        server = TritonServer(repo=Path(tree) / "model_repository", log_path=d / "server.log", root=Path(tree),
                              env={"VELOCITY_WEIGHTS": str(ckpt), "VELOCITY_MAX_NUM_SEQS": str(args.streams),
                                   "VELOCITY_MAX_CONCURRENT_REQUESTS": str(args.streams)})
        server.start(timeout=400)

        def idle() -> bool:
            try:
                m = server.metrics()
            except OSError:
                return False
            return parse_metric(m, "velocity_active_requests") == 0 and parse_metric(m, "velocity_kv_blocks_used") == 0

        try:
            for r in range(args.rounds):
                t0 = time.monotonic()
                heard = asyncio.run(burst(server.grpc_url, args.streams, args.first_within))
                left = time.monotonic()
                was_idle = wait_for(lambda: idle() or not server.health("live"), 30) and idle()
                row = {"round": r, "streams": args.streams, "heard": heard, "burst_s": left - t0,
                       "alive": server.health("live") and server.ready(),
                       "idle_after_s": time.monotonic() - left if was_idle else None}
                log.info("round %d: %d of %d streams heard, %s, idle %s s after the cancels", r, heard, args.streams,
                         "alive" if row["alive"] else "THE SERVER DIED", row["idle_after_s"])
                rounds.append(row)
                if not row["alive"]:
                    crashed, tail = True, server.log()[-3000:]
                    break
        finally:
            server.stop()
    res = {"hardware": cpu_model(), "revision": args.baseline_rev or revision(), "streams": args.streams,
           "rounds": rounds, "server_died": crashed, "server_log_tail": tail}
    save(res, Path(args.out), plot)
    print(json.dumps({k: v for k, v in res.items() if k != "server_log_tail"}))


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    xs = [r["round"] for r in res["rounds"]]
    ax.bar(xs, [r["idle_after_s"] or 0 for r in res["rounds"]],
           color=["tab:green" if r["alive"] else "tab:red" for r in res["rounds"]])
    ax.set_xlabel("round (red: the server died)")
    ax.set_ylabel("s from the cancels to an idle server")
    ax.set_title(f"{res['streams']} streams cancelled at once ({res['hardware']})")
    finish(fig, path, res, dpi=110)


if __name__ == "__main__":
    main()

"""A burst of cancels against a real server: N `tts` streams over gRPC (tritonclient's aio client,
as the gateway opens them), each read to its first audio chunk, then all cancelled at once, as a
client that drops every socket does. Per round: whether the server lived through it
(/v2/health/live and ready), the seconds until every stream had its first audio, the seconds from
the cancels until it was idle (no request active, no KV block used), and the vocoder's executions
in the round (chunks and the llm's probes). Against a server of this checkout on the tiny demo
checkpoint; with --baseline-rev REV or --baseline-env NAME=VALUE, against a second server too
(REV's tree, or this checkout with those settings), the two in alternating rounds (ABBA).
Writes JSON and a PNG.

    .venv/bin/python benchmarks/bench_cancel_burst.py --streams 256 --rounds 6 --out docs/benchmarks/cancel_burst/tiny
    .venv/bin/python benchmarks/bench_cancel_burst.py --baseline-env VELOCITY_CANCEL_PROBES_PER_SECOND=0
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
from benchmarks.harness import ROOT, cpu_model, finish, save, setting_pairs  # noqa: E402
from client.triton import model_metric, parse_metric  # noqa: E402

log = logging.getLogger("bench_cancel_burst")


async def burst(url: str, n: int, first_within: float) -> int:
    """n streams, each to its first chunk (or first_within seconds), then all cancelled at once:
    the number that had audio."""
    import tritonclient.grpc.aio as grpcclient

    from velocity.serving.wire.input_table import make_inputs

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
    base = ap.add_mutually_exclusive_group()
    base.add_argument("--baseline-rev", help="a second server of this git revision, in alternating rounds")
    base.add_argument("--baseline-env", action="append", metavar="NAME=VALUE",
                      help="a second server of this checkout with these settings, in alternating rounds")
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=4, help="rounds of each server")
    ap.add_argument("--first-within", type=float, default=60.0, help="seconds to wait for the streams' first audio")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "cancel_burst" / "tiny"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import contextlib
    import tempfile

    from benchmarks.harness import alternating, baseline_tree, revision
    from benchmarks.server import TritonServer, wait_for
    from velocity.demo.checkpoint import write_checkpoint

    d = Path(tempfile.mkdtemp())
    ckpt = write_checkpoint(d / "tiny", "tiny", seed=0)
    env = {"VELOCITY_WEIGHTS": str(ckpt), "VELOCITY_MAX_NUM_SEQS": str(args.streams),
           "VELOCITY_MAX_CONCURRENT_REQUESTS": str(args.streams),
           "VELOCITY_MAX_DIRECT_REQUESTS": "0"}
    arms = ["this"] + (["baseline"] if args.baseline_rev or args.baseline_env else [])
    baseline_env = setting_pairs(args.baseline_env, "--baseline-env")
    rounds, crashed, tail = [{} for _ in range(args.rounds)], False, ""
    with (baseline_tree(args.baseline_rev) if args.baseline_rev else contextlib.nullcontext(ROOT)) as tree:
        servers = {"this": TritonServer(repo=ROOT / "model_repository", log_path=d / "this.log", root=ROOT, env=env)}
        if "baseline" in arms:
            servers["baseline"] = TritonServer(repo=Path(tree) / "model_repository", log_path=d / "baseline.log",
                                               root=Path(tree), env=env | baseline_env)

        def idle(server) -> bool:
            try:
                m = server.metrics()
            except OSError:
                return False
            return parse_metric(m, "velocity_active_requests") == 0 and parse_metric(m, "velocity_kv_blocks_used") == 0

        def executions(server) -> float:
            return model_metric(server.metrics(), "nv_inference_exec_count", "vocoder")

        try:
            for s in servers.values():
                s.start(timeout=400)
            for r, arm in alternating(arms, args.rounds):
                server = servers[arm]
                before, t0 = executions(server), time.monotonic()
                heard = asyncio.run(burst(server.grpc_url, args.streams, args.first_within))
                left = time.monotonic()
                was_idle = wait_for(lambda: idle(server) or not server.health("live"), 30) and idle(server)
                row = {"streams": args.streams, "heard": heard, "burst_s": left - t0,
                       "alive": server.health("live") and server.ready(),
                       "idle_after_s": time.monotonic() - left if was_idle else None,
                       "vocoder_executions": executions(server) - before if server.health("live") else None}
                log.info("round %d, %s: %d of %d streams heard in %.1f s, %s, idle %s s after the cancels, "
                         "%s vocoder executions", r, arm, heard, args.streams, row["burst_s"],
                         "alive" if row["alive"] else "THE SERVER DIED", row["idle_after_s"], row["vocoder_executions"])
                rounds[r][arm] = row
                if not row["alive"]:
                    crashed, tail = True, server.log()[-3000:]
                    break
        finally:
            for s in servers.values():
                s.stop()
    res = {"hardware": cpu_model(), "revision": revision(), "arms": arms, "baseline_rev": args.baseline_rev,
           "baseline_env": baseline_env, "streams": args.streams, "rounds": [rd for rd in rounds if rd],
           "server_died": crashed, "server_log_tail": tail}
    save(res, Path(args.out), plot)
    print(json.dumps({k: v for k, v in res.items() if k != "server_log_tail"}))


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for k, arm in enumerate(res["arms"]):
        rows = [rd[arm] for rd in res["rounds"] if arm in rd]
        for ax, key in zip(axes, ("burst_s", "idle_after_s")):
            ax.scatter([k] * len(rows), [r[key] or 0 for r in rows],
                       color=["tab:green" if r["alive"] else "tab:red" for r in rows])
    names = {"this": "this checkout", "baseline": res.get("baseline_rev") or
             " ".join(f"{k}={v}" for k, v in (res.get("baseline_env") or {}).items()) or "baseline"}
    for ax, label in zip(axes, ("s until every stream had audio", "s from the cancels to an idle server")):
        ax.set_xticks(range(len(res["arms"])), [names[a] for a in res["arms"]], fontsize=7)
        ax.set(ylabel=label, ylim=(0, None))
    fig.suptitle(f"{res['streams']} streams, then all cancelled (red: the server died)")
    finish(fig, path, res, dpi=110)


if __name__ == "__main__":
    main()

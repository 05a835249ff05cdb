#!/usr/bin/env python
"""Admission against the running streams' pace: a burst of new requests while others stream.

    .venv/bin/python benchmarks/bench_burst.py --running 64 --burst 128 --rounds 3 --baseline-rev 3af5e51

Servers of this tree (and of a baseline revision) on the tiny demo checkpoint, each cutting a
chunk every 8 frames (VELOCITY_CHUNK_*), so that a stream's chunks show its pace. `--running`
streams go straight to the llm model (bench_host's requests: each runs all its frames); once every
one has its third chunk, `--burst` new ones come at once. Per running stream, its largest gap
between two chunks from the burst until every new stream has its first chunk, over its median gap
in the 3 s after that (the pace of the larger batch: its steps are longer for its size): 1.0 is
its pace kept, and a burst whose prompts all go into one step shows as that step's length. Also
the gaps before and after, and the burst's first audio (p50, p99). Paired rounds (ABBA); JSON and
a PNG.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.bench_host import LLM_INPUTS, frontend_outputs, lasting, server_env, texts_of  # noqa: E402
from benchmarks.harness import (ROOT, by_arm, exit_on_sigterm, hardware,  # noqa: E402
                                paired_rounds, pct, rounds_panels, save, setting_pairs, trees)
from benchmarks.server import TritonServer, start_servers  # noqa: E402

log = logging.getLogger("bench_burst")
CHUNKS = {"VELOCITY_CHUNK_FIRST": "4", "VELOCITY_CHUNK_REST": "8", "VELOCITY_CHUNK_GROWTH": "1",
          "VELOCITY_CHUNK_LARGEST": "8"}
AFTER_S = 3.0                         # seconds after the burst whose gaps count


async def stream(client, inputs: list, times: list[float]) -> None:
    """One llm request; the time of each chunk it gets."""
    async def requests():
        yield {"model_name": "llm", "inputs": inputs, "enable_empty_final_response": True}

    async for result, err in client.stream_infer(inputs_iterator=requests()):
        if err is not None:
            raise RuntimeError(str(err))
        response = result.get_response()
        if response.outputs:
            times.append(time.perf_counter())
        if response.parameters["triton_final_response"].bool_param:
            return


def one_burst(server: TritonServer, llm_inputs: list[dict], running: int, burst: int) -> dict:
    import tritonclient.grpc as grpcclient
    import tritonclient.grpc.aio as aioclient

    from client.triton import array_inputs

    inputs = [array_inputs(grpcclient, {k: v for k, v in x.items() if k in LLM_INPUTS}) for x in llm_inputs]

    async def main() -> tuple[list, list, float, float]:
        client = aioclient.InferenceServerClient(server.grpc_url)
        ran = [[] for _ in range(running)]
        came = [[] for _ in range(burst)]
        tasks = [asyncio.create_task(stream(client, inputs[i], ran[i])) for i in range(running)]
        while min(len(t) for t in ran) < 3:
            await asyncio.sleep(0.01)
        t_burst = time.perf_counter()
        tasks += [asyncio.create_task(stream(client, inputs[running + j], came[j])) for j in range(burst)]
        await asyncio.gather(*tasks)
        await client.close()
        return ran, came, t_burst

    ran, came, t_burst = asyncio.run(main())
    admitted = max(c[0] for c in came if c)          # every new stream has its first chunk
    ratios, gaps, befores, settled = [], [], [], []
    for t in ran:
        pairs = list(zip(t, t[1:]))
        before = [b - a for a, b in pairs if b <= t_burst]
        during = [b - a for a, b in pairs if t_burst < b <= admitted + 0.5]
        after = [b - a for a, b in pairs if admitted + 0.5 < b <= admitted + 0.5 + AFTER_S]
        if before and during and after:
            # against the pace of the batch the burst joined (its steps are longer for its size)
            ratios.append(max(during) / statistics.median(after))
            gaps.append(max(during))
            befores.append(statistics.median(before))
            settled.append(statistics.median(after))
    firsts = [c[0] - t_burst for c in came if c]
    return {"pace_ratio_max": max(ratios), "pace_ratio_p50": statistics.median(ratios),
            "largest_gap_ms": 1e3 * max(gaps), "gap_before_ms": 1e3 * statistics.median(befores),
            "gap_after_ms": 1e3 * statistics.median(settled), "admitted_s": admitted - t_burst,
            "burst_first_audio_p50_s": pct(firsts, 50), "burst_first_audio_p99_s": pct(firsts, 99)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--running", type=int, default=64)
    ap.add_argument("--burst", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=300)
    ap.add_argument("--baseline-rev", help="git revision of the baseline server (none: this tree alone)")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="this tree's server also gets these")
    ap.add_argument("--baseline-env", action="append", default=[], metavar="NAME=VALUE",
                    help="the baseline's server also gets these (with --baseline-rev HEAD: one lever's share)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "host" / "burst"))
    args = ap.parse_args()
    exit_on_sigterm()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from velocity.demo.checkpoint import write_checkpoint

    n = args.running + args.burst
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-burst-")))
        weights = str(write_checkpoint(tmp / "tiny", "tiny", seed=0, small_audio=True))
        roots, labels = trees(stack, args.baseline_rev)
        extra = {"this": (args.env, "--env"), "baseline": (args.baseline_env, "--baseline-env")}
        labels = {name: " ".join([label, *extra[name][0]]) for name, label in labels.items()}
        servers = start_servers(stack, roots, tmp, lambda name: server_env(weights, n) | CHUNKS
                                | setting_pairs(*extra[name]), gateway_port=0)
        llm_inputs = lasting(frontend_outputs(servers["this"].grpc_url, 3 * n, texts_of(2), args.max_new_tokens),
                             weights, args.max_new_tokens, n)
        rounds = paired_rounds(sorted(roots), args.rounds,
                               lambda name: one_burst(servers[name], llm_inputs, args.running, args.burst))
    res = {"hardware": hardware(), "running": args.running, "burst": args.burst, "labels": labels,
           "env": {"this": args.env, "baseline": args.baseline_env},
           "rounds": rounds, "summary": {}}
    for name, xs in by_arm(rounds).items():
        m = res["summary"][name] = {k: statistics.median(x[k] for x in xs) for k in xs[0]}
        m["pace_ratio_max_worst"] = max(x["pace_ratio_max"] for x in xs)
        log.info("%s: %d running, a burst of %d: their largest chunk gap %.0f ms, %.0f ms before, %.0f ms after "
                 "(%.1fx the pace after, worst round %.1fx); all admitted in %.2f s, the burst's first audio p50 "
                 "%.2f s, p99 %.2f s", labels[name], args.running, args.burst, m["largest_gap_ms"], m["gap_before_ms"],
                 m["gap_after_ms"], m["pace_ratio_max"], m["pace_ratio_max_worst"], m["admitted_s"],
                 m["burst_first_audio_p50_s"], m["burst_first_audio_p99_s"])
    log.info("wrote %s and its .png", save(res, Path(args.out), plot))


def plot(res: dict, path: Path) -> None:
    rounds_panels(res, path, [("pace_ratio_max", "running streams' largest chunk gap / their pace after", 1),
                              ("burst_first_audio_p99_s", "the burst's first audio p99 (s)", None)],
                  f"{res['running']} streams running, a burst of {res['burst']} (tiny checkpoint)")


if __name__ == "__main__":
    main()

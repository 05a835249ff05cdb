"""First-response and total latency per concurrency from perf_analyzer's --profile-export-file.

    python -m benchmarks.perf_report docs/benchmarks/perf_tts_stream.json [more.json ...]

perf_analyzer's own latency for a streaming model runs to the last response; time to first
audio is the first response timestamp minus the request timestamp, computed here.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def report(path: str) -> list[dict]:
    rows = []
    for exp in json.loads(Path(path).read_text())["experiments"]:
        reqs = [r for r in exp["requests"] if r.get("response_timestamps")]
        first = np.array([(r["response_timestamps"][0] - r["timestamp"]) / 1e6 for r in reqs])
        total = np.array([(r["response_timestamps"][-1] - r["timestamp"]) / 1e6 for r in reqs])
        rows.append({"file": path, "mode": exp["experiment"]["mode"], "value": exp["experiment"]["value"],
                     "requests": len(reqs), "responses_per_request": float(np.mean([len(r["response_timestamps"])
                                                                                   for r in reqs])) if reqs else 0,
                     "first_response_ms": {q: float(np.percentile(first, p)) for q, p in [("p50", 50), ("p90", 90), ("p99", 99)]}
                     if reqs else None,
                     "total_ms": {q: float(np.percentile(total, p)) for q, p in [("p50", 50), ("p99", 99)]} if reqs else None})
    return rows


def main(paths: list[str]) -> None:
    rows = [r for p in paths for r in report(p)]
    for r in rows:
        f, t = r["first_response_ms"] or {}, r["total_ms"] or {}
        print(f"{r['file']}: {r['mode']} {r['value']}: {r['requests']} requests, {r['responses_per_request']:.1f} "
              f"responses each; first response p50 {f.get('p50', float('nan')):.0f} ms p99 {f.get('p99', float('nan')):.0f} ms; "
              f"last response p50 {t.get('p50', float('nan')):.0f} ms")
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])

#!/usr/bin/env bash
# perf_analyzer against a running server: `tts` over gRPC --streaming and `tts_offline`
# (unary), with the shipped input data (benchmarks/perf_data.json: ten sentences, 60 frames max).
# Time to first audio comes from --profile-export-file (perf_analyzer's own latency for a
# stream runs to the last response): see benchmarks/perf_report.py.
#
#   scripts/perf_analyzer.sh                       # localhost:8001, concurrency 1, 2 and 4
#   URL=host:8001 CONCURRENCY="1 8" REQUESTS=32 OUT=/tmp/pa scripts/perf_analyzer.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
URL="${URL:-localhost:8001}"
CONCURRENCY="${CONCURRENCY:-1 2 4}"
REQUESTS="${REQUESTS:-16}"           # requests measured per concurrency level
OUT="${OUT:-$ROOT/docs/benchmarks/perf_analyzer}"
DATA="${DATA:-$ROOT/benchmarks/perf_data.json}"
mkdir -p "$OUT"
# The tritonclient 2.51 wheel's perf_analyzer needs two libraries that setup.sh links.
export LD_LIBRARY_PATH="$VENV/triton/perf_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
PA="$(command -v perf_analyzer || echo "$VENV/bin/perf_analyzer")"
# A fixed request count per level (one run per level: perf_analyzer allows no range with it):
# TTS requests are long and vary with the text, so stabilisation windows would rarely agree.
exports=()
for c in $CONCURRENCY; do
    for model in tts tts_offline; do
        f="$OUT/${model}_c$c"
        rm -f "$f.json" "$f.csv"                 # perf_analyzer won't overwrite its export
        echo "== $model, concurrency $c =="
        flags=(-m "$model" -u "$URL" -i grpc --input-data "$DATA" --concurrency-range "$c" --request-count "$REQUESTS"
               --profile-export-file "$f.json" -f "$f.csv")
        [[ "$model" == tts ]] && flags+=(--streaming)
        "$PA" "${flags[@]}" | grep -E "Concurrency:|Avg request latency|throughput" || true
        exports+=("$f.json")
    done
done
"$VENV/bin/python" -m benchmarks.perf_report "${exports[@]}" | tee "$OUT/summary.txt" | grep -v '^[][{} ]'

#!/usr/bin/env bash
# perf_analyzer against a running server: `tts` over gRPC --streaming and `tts_offline`
# (unary), with the shipped input data (benchmarks/perf_data.json: ten sentences, 60 frames max).
# Time to first audio comes from --profile-export-file (perf_analyzer's own latency for a
# stream runs to the last response): see benchmarks/perf_report.py.
#
#   scripts/perf_analyzer.sh                       # localhost:8001, concurrency 1, 2 and 4
#   URL=host:8001 CONCURRENCY="1 8" REQUESTS=32 OUT=/tmp/pa scripts/perf_analyzer.sh
#   KEY_FILE=/tmp/velocity-serve.XXXXXX/triton_key scripts/perf_analyzer.sh   # a server with API keys
#
# A server with API keys asks for the Triton key on gRPC, and perf_analyzer sends no header there
# (its -H is HTTP's): with KEY_FILE (or VELOCITY_TRITON_KEY) set, it goes through a relay on this
# machine's loopback that adds the key (client/key_proxy.py), started here and stopped at the end.
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
KEY_FILE="${KEY_FILE:-}"
if [[ -n "$KEY_FILE" || -n "${VELOCITY_TRITON_KEY:-}" ]]; then
    proxy_out="$(mktemp)"
    "$VENV/bin/python" -m client.key_proxy --to "$URL" ${KEY_FILE:+--key-file "$KEY_FILE"} > "$proxy_out" 2>&1 &
    proxy_pid=$!
    trap 'kill "$proxy_pid" 2>/dev/null || true; rm -f "$proxy_out"' EXIT
    for _ in $(seq 100); do grep -q '^port ' "$proxy_out" && break; kill -0 "$proxy_pid" 2>/dev/null || break; sleep 0.1; done
    grep -q '^port ' "$proxy_out" || { cat "$proxy_out" >&2; exit 2; }
    URL="127.0.0.1:$(sed -n 's/^port //p' "$proxy_out")"
    echo "[perf_analyzer] through the key relay on $URL"
fi
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

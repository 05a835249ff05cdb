#!/usr/bin/env bash
# Serve model_repository/ with a real Triton Inference Server, in the foreground.
#
#   scripts/serve.sh [--weights DIR] [--http-port N] [--grpc-port N] [--metrics-port N]
#                    [--health-port N] [--gateway-port N] [--wyoming-port N] [--bind ADDRESS]
#                    [--model-repository DIR] [--cpu-isa avx2|avx512] [-- extra tritonserver flags]
#
# Each flag can also be set by environment: VELOCITY_WEIGHTS, HTTP_PORT, GRPC_PORT,
# METRICS_PORT, HEALTH_PORT, GATEWAY_PORT, BIND (default 127.0.0.1, this machine only; 0.0.0.0:
# every interface, what a server for other machines asks), MODEL_REPOSITORY. GATEWAY_PORT (default 8080) serves the OpenAI speech API
# and the web page (velocity-tts-gateway) beside Triton, when the repository has `tts`; 0: none.
# WYOMING_PORT (default 0: none; Home Assistant's is 10200) serves Wyoming (velocity-tts-wyoming).
# Without weights it serves the demo checkpoint (built on first use: noise, not speech); a
# folder without the release's files stops it at once with the reason. A model that fails to
# load (corrupt weights) leaves the server up and not ready, with the reason in the log,
# instead of ending it. HEALTH_PORT (default 8003) answers /v2/health/ready like Triton but 503
# while draining: point load balancers there. Uses the `tritonserver`
# on PATH when there is one (the NGC container), else the one in the nvidia-pytriton wheel.
# Ctrl-C or SIGTERM drains, then stops: new requests are refused (UNAVAILABLE), live streams
# get DRAIN_TIMEOUT seconds (default 20) to finish and are then ended with an UNAVAILABLE
# error, then the server and every python stub process stop: they run in a process group of
# their own, which is signalled as a whole (EXIT_TIMEOUT, default 30, bounds that part), and
# last the gateway and Wyoming, which serve their streams until Triton has ended them.
# A second Ctrl-C (SIGINT) skips the drain; a repeated SIGTERM does not. A shell started in
# the background without job control starts this with SIGINT ignored: send it SIGTERM.
# A part that dies (a model's python process, or tritonserver) is seen by the watchdog on
# HEALTH_PORT within a fraction of a second: live streams end with an error, readiness turns
# 503, and the server is started again at once (1, 2, 4 ... 30 s apart while it dies before it
# is ready; RESTARTS such in a row, default 10, then this exits; 0: for ever). HEALTH_PORT's /v2/health/live fails
# once the server has not been ready for LIVE_GRACE seconds (default 300); its /metrics counts
# velocity_part_failures_total{part}.
# --cpu-isa avx2 (or CPU_ISA) caps torch, fbgemm, oneDNN and MKL to AVX2 code: what an AVX2-only
# machine runs, measured on one with AVX-512 (velocity/model/kernels/cpu_isa.py; the llm logs the ISA);
# --cpu-isa avx512 keeps AVX-512 and VNNI but leaves out AMX (oneDNN's, MKL's and the int8 GEMM's tiles).
# Triton's operator APIs (logging, trace, shared-memory, model-repository) need the operator key
# on both ports (header velocity-admin-key; gRPC: triton-grpc-protocol-velocity-admin-key):
# VELOCITY_ADMIN_KEY, else one made at each start in the run folder (mode 600; the log names it).
# With API keys (VELOCITY_GATEWAY_API_KEYS or _FILE) or VELOCITY_TRITON_KEY, Triton's inference,
# metadata and config need the Triton key on both ports (header velocity-key): VELOCITY_TRITON_KEY,
# else one made at each start in the run folder; without keys, HTTP inference needs
# `velocity-key: local`, which no web page can send (docs/operations.md#security).
# EXIT_WITH_PID: stop as on SIGTERM once that process has ended (the tests and benchmarks give
# their own, so that a runner that dies leaves no server behind).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
DEMO="$ROOT/checkpoints/demo-tiny"
WEIGHTS="${VELOCITY_WEIGHTS:-}"
HTTP_PORT="${HTTP_PORT:-8000}"
GRPC_PORT="${GRPC_PORT:-8001}"
METRICS_PORT="${METRICS_PORT:-8002}"
HEALTH_PORT="${HEALTH_PORT:-8003}"
GATEWAY_PORT="${GATEWAY_PORT:-8080}"
WYOMING_PORT="${WYOMING_PORT:-0}"
BIND="${BIND:-127.0.0.1}"
REPO="${MODEL_REPOSITORY:-$ROOT/model_repository}"
EXIT_TIMEOUT="${EXIT_TIMEOUT:-30}"
CPU_ISA="${CPU_ISA:-}"
DRAIN_TIMEOUT="${DRAIN_TIMEOUT:-20}"
RESTARTS="${RESTARTS:-10}"
LIVE_GRACE="${LIVE_GRACE:-300}"
extra=()

usage() { sed -n '2,42p' "$0" | sed 's/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        --weights) WEIGHTS="$2"; shift 2 ;;
        --http-port) HTTP_PORT="$2"; shift 2 ;;
        --grpc-port) GRPC_PORT="$2"; shift 2 ;;
        --metrics-port) METRICS_PORT="$2"; shift 2 ;;
        --health-port) HEALTH_PORT="$2"; shift 2 ;;
        --gateway-port) GATEWAY_PORT="$2"; shift 2 ;;
        --wyoming-port) WYOMING_PORT="$2"; shift 2 ;;
        --bind) BIND="$2"; shift 2 ;;
        --model-repository) REPO="$2"; shift 2 ;;
        --cpu-isa) CPU_ISA="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        --) shift; extra=("$@"); break ;;
        *) echo "serve.sh: unknown flag '$1' (try --help)" >&2; exit 2 ;;
    esac
done

case "$CPU_ISA" in
    "") ;;
    avx2) export ATEN_CPU_CAPABILITY=avx2 FBGEMM_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 ;;
    avx512) export ONEDNN_MAX_CPU_ISA=AVX512_CORE_FP16 MKL_ENABLE_INSTRUCTIONS=AVX512_E3 ;;
    *) echo "serve.sh: --cpu-isa must be avx2 or avx512 (or unset: the CPU's own), got '$CPU_ISA'" >&2; exit 2 ;;
esac

args=(--model-repository="$REPO" --http-port="$HTTP_PORT" --grpc-port="$GRPC_PORT"
      --metrics-port="$METRICS_PORT" --exit-timeout-secs="$EXIT_TIMEOUT"
      --http-address="$BIND" --grpc-address="$BIND" --metrics-address="$BIND" --exit-on-error=false
      --disable-auto-complete-config --model-load-thread-count=8)
# The configs are whole (scripts/gen_inputs.py writes the request table's inputs into them):
# auto-complete would start each Python model once more in a stub of its own, at every start.
# Every model of the repository (7) loads on its own thread (Triton's default is 4).
if command -v tritonserver >/dev/null 2>&1; then
    server="$(command -v tritonserver)"          # NGC container: its own python backend
else
    [[ -x "$VENV/bin/python" ]] || { echo "serve.sh: no tritonserver on PATH and no $VENV; run scripts/setup.sh first" >&2; exit 1; }
    site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    server="$site/pytriton/tritonserver/bin/tritonserver"
    [[ -x "$server" ]] || { echo "serve.sh: $server missing; run scripts/setup.sh" >&2; exit 1; }
    export LD_LIBRARY_PATH="$site/nvidia_pytriton.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    args+=(--backend-directory="$VENV/triton/backends")
fi
# The python stub finds the venv's packages through the venv's bin/ first on PATH.
[[ -d "$VENV/bin" ]] && export PATH="$VENV/bin:$PATH"
PYTHON="$(command -v python3 || command -v python)"
[[ -x "$VENV/bin/python" ]] && PYTHON="$VENV/bin/python"
# Our models read the weights; a repository without them (tests/model_repository) needs none.
needs_weights=0
for m in text_frontend llm vocoder; do [[ -d "$REPO/$m" ]] && needs_weights=1; done
WEIGHTS="${WEIGHTS:-$DEMO}"
if [[ $needs_weights == 1 ]]; then
    if [[ "$(realpath -m "$WEIGHTS")" == "$(realpath -m "$DEMO")" ]]; then
        # the demo is ours: (re)built when missing or written by an older velocity
        "$PYTHON" "$ROOT/scripts/make_demo_checkpoint.py" --size tiny --out "$WEIGHTS" --unless-current \
            | sed 's/^/[serve] /'
    elif ! why="$("$PYTHON" -m velocity.release "$WEIGHTS" 2>&1)"; then
        echo "serve.sh: $why" >&2
        exit 2
    fi
fi
export VELOCITY_WEIGHTS="$(realpath -m "$WEIGHTS")"
# The drain handshake with the llm model (velocity/serving/lifecycle/drain.py) goes through this folder.
export VELOCITY_RUN_DIR="$(mktemp -d "${TMPDIR:-/tmp}/velocity-serve.XXXXXX")"
# The operator's APIs (logging, trace, shared memory, the model repository's load and unload)
# need the operator key on both of Triton's ports, always: VELOCITY_ADMIN_KEY, else a key made
# at this start and written to the run folder (mode 600), which only this user can read.
random_hex() { od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'; }     # $1 random bytes, as hex
# header_key NAME VALUE: VALUE, else a new random key, printed; a VALUE that cannot be a header
# value stops serve.sh (its run folder removed), naming the variable NAME
header_key() {
    local key="${2:-$(random_hex 24)}"
    if [[ ! "$key" =~ ^[A-Za-z0-9._~-]{16,256}$ ]]; then
        echo "serve.sh: $1 must be 16 to 256 of A-Z a-z 0-9 . _ ~ - (it goes in a header)" >&2
        rm -rf "$VELOCITY_RUN_DIR"
        return 2
    fi
    printf '%s' "$key"
}
ADMIN_KEY="$(header_key VELOCITY_ADMIN_KEY "${VELOCITY_ADMIN_KEY:-}")" || exit 2
(umask 077; printf '%s\n' "$ADMIN_KEY" > "$VELOCITY_RUN_DIR/admin_key"
 random_hex 32 > "$VELOCITY_RUN_DIR/client_key")   # velocity/serving/wire/client_tag.py
ADMIN_APIS="logging,trace,shared-memory,model-repository"
args+=(--http-restricted-api="$ADMIN_APIS:velocity-admin-key=$ADMIN_KEY"
       --grpc-restricted-protocol="$ADMIN_APIS:velocity-admin-key=$ADMIN_KEY")
unset ADMIN_KEY VELOCITY_ADMIN_KEY          # the models and tools that follow need none of it
# The Triton key (velocity/serving/wire/triton_key.py), header velocity-key: with API keys set, or
# VELOCITY_TRITON_KEY given, Triton's inference, metadata and model config need it on both ports
# (VELOCITY_TRITON_KEY, else one made at this start); without keys it is the word "local", and
# only HTTP inference asks for it: no web page can send it without a preflight, which Triton refuses.
api_keys="${VELOCITY_GATEWAY_API_KEYS:-}"
if [[ -n "${api_keys//[ ,]/}${VELOCITY_GATEWAY_API_KEYS_FILE:-}${VELOCITY_TRITON_KEY:-}" ]]; then
    TRITON_KEY="$(header_key VELOCITY_TRITON_KEY "${VELOCITY_TRITON_KEY:-}")" || exit 2
    KEYED_APIS="inference,metadata,model-config"
    args+=(--http-restricted-api="$KEYED_APIS:velocity-key=$TRITON_KEY"
           --grpc-restricted-protocol="$KEYED_APIS:velocity-key=$TRITON_KEY")
else
    TRITON_KEY=local
    args+=(--http-restricted-api="inference:velocity-key=$TRITON_KEY")
fi
(umask 077; printf '%s\n' "$TRITON_KEY" > "$VELOCITY_RUN_DIR/triton_key")
# The python backend's shared-memory regions (1 MiB+ each in /dev/shm) outlive a server that
# crashes or is killed; named after this run, they are removed on exit whatever happened.
shm_prefix=""
if [[ " ${extra[*]} " != *shm-region-prefix-name* ]]; then
    shm_prefix="velocity_${VELOCITY_RUN_DIR##*.}_"
    args+=(--backend-config="python,shm-region-prefix-name=$shm_prefix")
fi
health_pid=""
watch_pid=""                    # the EXIT_WITH_PID watcher
front_pids=()                   # the gateway and Wyoming: stopped last, given 10 s each
cleanup() {
    [[ -z "$watch_pid" ]] || kill "$watch_pid" 2>/dev/null || true
    [[ -z "$health_pid" ]] || kill "$health_pid" 2>/dev/null || true
    for p in "${front_pids[@]}"; do
        kill "$p" 2>/dev/null || continue
        for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null || true
    done
    rm -rf "$VELOCITY_RUN_DIR"
    [[ -z "$shm_prefix" ]] || rm -f /dev/shm/"$shm_prefix"*
}
trap cleanup EXIT

echo "[serve] tritonserver: $server"
echo "[serve] models:       $REPO"
echo "[serve] weights:      $VELOCITY_WEIGHTS"
host="$BIND"; local_host="$BIND"
if [[ "$BIND" == 0.0.0.0 ]]; then local_host="127.0.0.1"; fi
[[ "$BIND" == 0.0.0.0 || "$BIND" == 127.0.0.1 ]] && host="localhost"
if [[ "$BIND" == 127.0.0.1 ]]; then
    echo "[serve] listening on this machine only (--bind 0.0.0.0: every interface, for other machines)"
else
    echo "[serve] listening on $BIND (every port below; see docs/operations.md#security)"
fi
echo "[serve] gRPC    $host:$GRPC_PORT"
echo "[serve] HTTP    http://$host:$HTTP_PORT"
echo "[serve] metrics http://$host:$METRICS_PORT/metrics"
echo "[serve] ready   http://$host:$HEALTH_PORT/v2/health/ready   (503 while draining or restarting: for load balancers)"
gateway=0; wyoming=0
[[ "$GATEWAY_PORT" != 0 && -d "$REPO/tts" ]] && gateway=1
[[ "$WYOMING_PORT" != 0 && -d "$REPO/tts" ]] && wyoming=1
[[ $gateway == 1 ]] && echo "[serve] OpenAI  http://$host:$GATEWAY_PORT/v1/audio/speech   (web page: http://$host:$GATEWAY_PORT/)"
[[ $wyoming == 1 ]] && echo "[serve] Wyoming tcp://$host:$WYOMING_PORT"
[[ -z "$shm_prefix" ]] || echo "[serve] shared memory: /dev/shm/$shm_prefix*"
echo "[serve] operator key: $VELOCITY_RUN_DIR/admin_key   (Triton's logging, trace, shared-memory and model-repository APIs: header velocity-admin-key)"
if [[ "$TRITON_KEY" == local ]]; then
    echo "[serve] Triton key: local   (HTTP inference: header velocity-key: local; gRPC needs none, no API keys are set)"
else
    echo "[serve] Triton key: $VELOCITY_RUN_DIR/triton_key   (inference, metadata and config on gRPC and HTTP: header velocity-key)"
fi
unset TRITON_KEY

start_server() {
    # a stale llm's drain files and the dead server's shared memory go first
    rm -f "$VELOCITY_RUN_DIR"/serving.* "$VELOCITY_RUN_DIR"/failed "$VELOCITY_RUN_DIR"/told.* "$VELOCITY_RUN_DIR"/relayed.*
    [[ -z "$shm_prefix" ]] || rm -f /dev/shm/"$shm_prefix"*
    setsid "$server" "${args[@]}" "${extra[@]}" &
    pid=$!                     # setsid makes the server its own process-group leader
    echo "$pid" > "$VELOCITY_RUN_DIR/triton.pid.tmp"     # the watchdog's (velocity/serving/lifecycle/watchdog.py)
    mv "$VELOCITY_RUN_DIR/triton.pid.tmp" "$VELOCITY_RUN_DIR/triton.pid"
}
start_server
"$PYTHON" -m velocity.serving.lifecycle.health --port "$HEALTH_PORT" --bind "$BIND" --live-grace "$LIVE_GRACE" \
    --triton "http://$local_host:$HTTP_PORT" --run-dir "$VELOCITY_RUN_DIR" &
health_pid=$!
# the gateways ask the health port which part died, to tell their clients
export VELOCITY_GATEWAY_HEALTH_URL="${VELOCITY_GATEWAY_HEALTH_URL:-http://$local_host:$HEALTH_PORT}"
if [[ $gateway == 1 ]]; then
    # a session of its own, so a Ctrl-C reaches it only after the drain, from cleanup
    setsid "$PYTHON" -m velocity.gateway.app --triton "$local_host:$GRPC_PORT" --host "$BIND" --port "$GATEWAY_PORT" &
    front_pids+=($!)
fi
if [[ $wyoming == 1 ]]; then
    setsid "$PYTHON" -m velocity.gateway.wyoming_server --triton "$local_host:$GRPC_PORT" \
        --uri "tcp://$BIND:$WYOMING_PORT" &
    front_pids+=($!)
fi
drain() {
    compgen -G "$VELOCITY_RUN_DIR/serving.*" >/dev/null || return 0   # no llm is serving
    echo "[serve] draining: new requests refused, live streams get ${DRAIN_TIMEOUT}s to finish"
    echo "$DRAIN_TIMEOUT" > "$VELOCITY_RUN_DIR/draining.tmp"
    mv "$VELOCITY_RUN_DIR/draining.tmp" "$VELOCITY_RUN_DIR/draining"
    for _ in $(seq $(((DRAIN_TIMEOUT + 5) * 10))); do
        [[ $hurry == 1 ]] && { echo "[serve] second Ctrl-C: not waiting for the drain"; return 0; }
        compgen -G "$VELOCITY_RUN_DIR/serving.*" >/dev/null || { echo "[serve] drained"; return 0; }
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    echo "[serve] drain not confirmed after $((DRAIN_TIMEOUT + 5))s; stopping anyway"
}
hurry=0
stop() {
    # A second Ctrl-C stops now. Another SIGTERM does not: `kill -- -PGID`, systemd and `timeout`
    # signal the whole group, and make passes its SIGTERM on, so one stop request arrives twice.
    touch "$VELOCITY_RUN_DIR/stopping"   # HEALTH_PORT answers 503 from now on
    trap 'hurry=1' INT
    trap 'echo "[serve] SIGTERM again: still draining (Ctrl-C or SIGINT stops at once)"' TERM
    drain
    echo "[serve] stopping (process group $pid)"
    kill -TERM -- "-$pid" 2>/dev/null || true
    for _ in $(seq $((EXIT_TIMEOUT * 10 + 50))); do
        kill -0 -- "-$pid" 2>/dev/null || break
        [[ $hurry == 1 ]] && { echo "[serve] second Ctrl-C: not waiting for the unload"; break; }
        sleep 0.1
    done
    kill -KILL -- "-$pid" 2>/dev/null || true
}
trap 'stop; exit 130' INT
trap 'stop; exit 143' TERM
if [[ -n "${EXIT_WITH_PID:-}" ]]; then
    ( while kill -0 "$EXIT_WITH_PID" 2>/dev/null; do sleep 0.5; done
      echo "[serve] process $EXIT_WITH_PID (EXIT_WITH_PID) has ended: stopping"; kill -TERM $$ ) &
    watch_pid=$!
fi
set +e
# The server stopped by itself after it had been ready (a crash, or the watchdog's kill after a
# model's process died): start it again at once; one that dies before it is ready again waits
# 1, 2, 4 ... 30 s, until RESTARTS in a row (0: for ever). The gateway answers 503 meanwhile.
backoff=1; failures=0
while true; do
    wait "$pid"; rc=$?
    kill -KILL -- "-$pid" 2>/dev/null || true   # no stub of its group outlives it
    [[ -e "$VELOCITY_RUN_DIR/stopping" ]] && exit "$rc"
    [[ -e "$VELOCITY_RUN_DIR/served" ]] || exit "$rc"      # never ready: a start that fails, not a death
    if [[ "$(cat "$VELOCITY_RUN_DIR/served")" == "$pid" ]]; then
        delay=0; backoff=1; failures=0         # it served: a death, not a crash loop
    else
        delay=$backoff; failures=$((failures + 1)); backoff=$(( backoff * 2 > 30 ? 30 : backoff * 2 ))
    fi
    if [[ "$RESTARTS" != 0 && $failures -ge $RESTARTS ]]; then
        echo "[serve] tritonserver stopped (exit $rc) $failures times in a row before it was ready; giving up" >&2
        exit "$rc"
    fi
    echo "[serve] tritonserver stopped (exit $rc); starting it again in ${delay}s" >&2
    for _ in $(seq $((delay * 10))); do
        [[ -e "$VELOCITY_RUN_DIR/stopping" ]] && exit "$rc"
        sleep 0.1
    done
    start_server
done

#!/usr/bin/env bash
# GPU figures on a machine with python3 + torch (CUDA) but no network and no Triton, from the
# repository root, with .device/ made by scripts/device_bundle.sh next to the tree:
#
#   PARTS=triton scripts/device_sweep.sh   # benchmarks.sweep through a real Triton server (levels
#                                          # LEVELS, default 1,8,32) + the in-process baseline;
#                                          # it reports "streams in real time" (p99 RTF < 1 and p99
#                                          # first audio < 0.5 s). For issue #34's sweep:
#                                          # VELOCITY_MAX_NUM_SEQS=512 LEVELS=1,8,32,64,128,256,512
#   PARTS=step   scripts/device_sweep.sh   # benchmarks/bench_step.py: the engine's decode step,
#                                          # A/B against .device/baseline_velocity.tar if there,
#                                          # with the torch profiler over PROFILE (20) more steps
#   PARTS=lever  scripts/device_sweep.sh   # bench_step.py: this tree against itself with the
#                                          # EngineConfig settings LEVER (default graph_sampler=0):
#                                          # one lever's share of the step, with the profile
#   PARTS=tests  scripts/device_sweep.sh   # the CUDA tests (tests/unit/engine/test_cuda_graphs.py,
#                                          # tests/unit/model/test_gpu_kernels.py, the graph sampler's and
#                                          # the overlapped steps'; they skip on a CPU-only machine)
#   PARTS=inprocess scripts/device_sweep.sh # benchmarks.sweep --in-process-only at LEVELS (default
#                                          # 1,8,32,64): the pipeline without the server
#   PARTS=overhead scripts/device_sweep.sh # benchmarks/bench_ab.py --arms triton,in-process at
#                                          # AB_LEVELS (default "1 32"), ROUNDS paired rounds (2)
#   PARTS=ab scripts/device_sweep.sh       # benchmarks/bench_ab.py --arms baseline,triton: this tree's
#                                          # server against .device/baseline_velocity.tar's, AB_LEVELS
#                                          # (the baseline's server: BASELINE_GPU_MEMORY, 0.85)
#   PARTS=other scripts/device_sweep.sh    # bench_ab.py --arms triton,other: this tree's server
#                                          # against a second one of this tree with OTHER_ENV (e.g.
#                                          # "VELOCITY_CHUNK_FIRST=4 VELOCITY_CHUNK_REST=12", or
#                                          # "VELOCITY_OVERLAP_STEPS=off" for the overlap's gain), AB_LEVELS
#                                          # (its share OTHER_GPU_MEMORY, 0.85: the llm counts the
#                                          # first server's memory as in use, as the baseline's does)
#   PARTS=reference scripts/device_sweep.sh # benchmarks/bench_reference.py on the GPU: the reference
#                                          # (.device/ref's wheels in this python) against velocity,
#                                          # 16 texts of 120 frames, ROUNDS rounds (default 1)
#
# The Triton part needs numpy<2 in the python stubs: the pytriton wheel's 2.51 stub reads every
# input tensor wrongly under numpy 2 (on 2026-11-24 a TYPE_STRING input's length came back as its
# first byte repeated, 0x08080808, and the stub aborted). The server's path no longer imports
# transformers (whose image build, 5.17, needs numpy 2), so that part puts .device/numpy1.tar.xz's numpy 1
# first on every path of this python, and takes it away after. NGC images pair their stub with
# their numpy.
#
# With the `device` tool: run(command="PARTS=triton bash scripts/device_sweep.sh",
# carry=[".device"], timeout_s=600), then PARTS=step in a second call (each fits in 10 min).
# Makes the full-size demo checkpoint (SIZE=tiny for a rehearsal, DEVICE=cpu on a CPU machine).
# Writes under $OUT: run.log, server.log, metrics.txt, serving_gpu.json/.png, engine_step_gpu.json/.png.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
ROOT="$(pwd)"
PARTS=" ${PARTS:-triton step} "
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"       # velocity is not installed there
DEVICE="${DEVICE:-cuda}"
get() { python3 -c "import sys,urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())" "$1" 2>/dev/null; }
PY="$(command -v python3)"
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
LIBDIR="$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))')"
PYV="$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
echo "python $PY ($PYV) site $SITE libdir $LIBDIR"; nvidia-smi -L 2>/dev/null

# the client wheels and velocity's runtime needs that the image lacks (scripts/device_bundle.sh)
if [[ -z "${NO_WHEELS:-}" ]]; then
    [[ -f /tmp/site/.velocity ]] || "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .device/*.whl || exit 1
    touch /tmp/site/.velocity                               # a later part of the same machine reuses it
    export PYTHONPATH="/tmp/site:$PYTHONPATH"
    # the python stubs do not see PYTHONPATH: a .pth adds /tmp/site to every path, theirs too,
    # after the image's own packages
    echo /tmp/site > "$SITE/velocity-device.pth" || exit 1
fi

if [[ "$PARTS" == *" tests "* ]]; then
    "$PY" -m pytest -q -ra -p no:cacheprovider tests/unit/model/test_gpu_kernels.py tests/unit/engine/test_cuda_graphs.py \
        tests/unit/engine/test_graph_sampler.py tests/unit/engine/test_engine_overlap.py 2>&1 | tail -30
fi

W=/tmp/demo-checkpoint
[[ "$PARTS" == *" triton "* || "$PARTS" == *" step "* || "$PARTS" == *" lever "* || "$PARTS" == *" inprocess "* \
    || "$PARTS" == *" reference "* || "$PARTS" == *" overhead "* || "$PARTS" == *" ab "* || "$PARTS" == *" other "* ]] || exit 0
"$PY" scripts/make_demo_checkpoint.py --size "${SIZE:-full}" --out "$W" --unless-current > "$OUT/checkpoint.log" 2>&1 \
    || { cat "$OUT/checkpoint.log"; exit 1; }
HW="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"; HW="${HW:-CPU}"

if [[ "$PARTS" == *" triton "* || "$PARTS" == *" overhead "* || "$PARTS" == *" ab "* || "$PARTS" == *" other "* ]]; then
    # serve.sh wants "$VENV/bin/python" and puts "$VENV/bin" first on PATH, where the stub's
    # embedded python finds its packages; a system python3 may have no `python` next to it
    VENV="$(dirname "$(dirname "$PY")")"
    [[ -x "$VENV/bin/python" ]] || ln -s "$PY" "$VENV/bin/python" || { echo "no $VENV/bin/python"; exit 1; }
    tar -xf "${TARBALL:-.device/triton$PYV.tar.xz}" -C "$SITE" || exit 1
    scripts/link_python_backend.sh "$PY" "$VENV" || exit 1
    be="$VENV/triton/backends/python"
    export LD_LIBRARY_PATH="$LIBDIR:/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    if LD_LIBRARY_PATH="$SITE/nvidia_pytriton.libs:$LD_LIBRARY_PATH" ldd "$be/triton_python_backend_stub" | grep "not found"; then
        echo "the stub misses a library; libpython$PYV here:"; find / -xdev -name "libpython$PYV*.so*" 2>/dev/null | head
        exit 1
    fi
    if [[ -f .device/numpy1.tar.xz ]]; then
        mkdir -p /tmp/numpy1 && tar -xJf .device/numpy1.tar.xz -C /tmp/numpy1 || exit 1
        echo 'import sys; sys.path.insert(0, "/tmp/numpy1")' > "$SITE/00-velocity-numpy1.pth" || exit 1
    fi
    "$PY" -c 'import numpy; print("numpy", numpy.__version__, "for the stub and the sweep")'
    # the in-process baseline runs beside the server on the same GPU: the server takes 40% of it
    spid=""; opid=""
    stop_group() {                               # a server's process group, TERM then KILL
        kill -TERM -- -"$1" 2>/dev/null
        for _ in $(seq 1 60); do kill -0 "$1" 2>/dev/null || break; sleep 1; done
        kill -KILL -- -"$1" 2>/dev/null
    }
    # wait_ready HTTP_PORT PID LOG: true once the server answers ready (seconds in $waited); false
    # once it has exited, or says it failed to load its models (it stays up, never ready), or 300 s
    wait_ready() {
        for waited in $(seq 1 300); do
            get "http://localhost:$1/v2/health/ready" >/dev/null && return 0
            kill -0 "$2" 2>/dev/null || break
            grep -q "failed to load all models" "$3" && break
            sleep 1
        done
        get "http://localhost:$1/v2/health/ready" >/dev/null
    }
    stop_server() {
        [[ -n "$opid" ]] && { stop_group "$opid"; opid=""; rm -f /tmp/velocity-other.pgid; }
        [[ -n "$spid" ]] || return 0
        stop_group "$spid"; spid=""; rm -f /tmp/velocity-server.pgid
        rm -f "$SITE/00-velocity-numpy1.pth"
    }
    trap 'stop_server; exit 143' TERM INT        # a time limit on this script stops its server too
    trap stop_server EXIT
    VENV="$VENV" GATEWAY_PORT=0 VELOCITY_MAX_DIRECT_REQUESTS="${VELOCITY_MAX_DIRECT_REQUESTS:-0}" \
        VELOCITY_GPU_MEMORY_UTILIZATION="${SERVER_GPU_MEMORY:-0.4}" setsid scripts/serve.sh --weights "$W" --bind 127.0.0.1 > "$OUT/server.log" 2>&1 &
    spid=$!; echo "$spid" > /tmp/velocity-server.pgid      # scripts/device_parts.sh's last resort
    if wait_ready 8000 "$spid" "$OUT/server.log"; then
        echo "server ready after ${waited}s"
        if [[ "$PARTS" == *" triton "* ]]; then
            PYTHONUNBUFFERED=1 TQDM_DISABLE=1 "$PY" -m benchmarks.sweep --concurrency "${LEVELS:-1,8,32}" --requests 16 \
                --weights "$W" --in-process-concurrency 1,32 --device "$DEVICE" --hardware "$HW" \
                --out "$OUT/serving_gpu" 2>&1 | tail -60
        fi
        if [[ "$PARTS" == *" overhead "* ]]; then     # Triton against in-process, paired rounds
            for c in ${AB_LEVELS:-1 32}; do
                PYTHONUNBUFFERED=1 TQDM_DISABLE=1 "$PY" benchmarks/bench_ab.py --arms triton,in-process \
                    --weights "$W" --device "$DEVICE" --concurrency "$c" --requests "$(( c > 4 ? c : 4 ))" \
                    --rounds "${ROUNDS:-2}" --note "$HW" --out "$OUT/overhead_gpu_c$c" 2>&1 | tee "$OUT/overhead_gpu_c$c.log" | tail -3
            done
        fi
        if [[ "$PARTS" == *" ab "* ]]; then           # this tree's server against the baseline's, paired rounds
            rev="$(cat .device/baseline_velocity.rev 2>/dev/null || echo baseline)"
            mkdir -p "/tmp/$rev" && tar -xf .device/baseline_velocity.tar -C "/tmp/$rev" || exit 1
            # the baseline's server starts beside this tree's: a baseline that counts all of the
            # GPU's memory in use (58c3671 does) needs a share past the first server's
            for c in ${AB_LEVELS:-1 32}; do
                VENV="$VENV" VELOCITY_GPU_MEMORY_UTILIZATION="${BASELINE_GPU_MEMORY:-0.85}" PYTHONUNBUFFERED=1 TQDM_DISABLE=1 \
                    "$PY" benchmarks/bench_ab.py --arms baseline,triton --baseline-dir "/tmp/$rev" --weights "$W" \
                    --concurrency "$c" --requests "$(( c > 4 ? c : 4 ))" --rounds "${ROUNDS:-2}" \
                    --note "$HW; baseline $rev" --out "$OUT/ab_gpu_c$c" 2>&1 | tee "$OUT/ab_gpu_c$c.log" | tail -3
            done
        fi
        if [[ "$PARTS" == *" other "* ]]; then        # this tree's server against itself with OTHER_ENV
            env ${OTHER_ENV:-} VENV="$VENV" GATEWAY_PORT=0 HTTP_PORT=9000 GRPC_PORT=9001 METRICS_PORT=9002 HEALTH_PORT=9003 \
                VELOCITY_GPU_MEMORY_UTILIZATION="${OTHER_GPU_MEMORY:-0.85}" \
                VELOCITY_MAX_DIRECT_REQUESTS="${VELOCITY_MAX_DIRECT_REQUESTS:-0}" \
                setsid scripts/serve.sh --weights "$W" --bind 127.0.0.1 > "$OUT/other_server.log" 2>&1 &
            opid=$!; echo "$opid" > /tmp/velocity-other.pgid
            if wait_ready 9000 "$opid" "$OUT/other_server.log"; then
                echo "other server (${OTHER_ENV:-}) ready after ${waited}s"
                for c in ${AB_LEVELS:-1 32}; do
                    PYTHONUNBUFFERED=1 TQDM_DISABLE=1 "$PY" benchmarks/bench_ab.py --arms triton,other \
                        --other-url localhost:9001 --other-metrics-url http://localhost:9002/metrics \
                        --concurrency "$c" --requests "$(( c > 4 ? c : 4 ))" --rounds "${ROUNDS:-2}" \
                        --note "$HW; other: ${OTHER_ENV:-}" --out "$OUT/other_gpu_c$c" 2>&1 | tee "$OUT/other_gpu_c$c.log" | tail -3
                done
            else
                echo "other server not ready"; tail -40 "$OUT/other_server.log"
            fi
        fi
        get http://localhost:8002/metrics > "$OUT/metrics.txt"     # Triton's per-model times and ours
    else
        echo "server not ready"; tail -80 "$OUT/server.log"
    fi
    stop_server
    tail -20 "$OUT/server.log"
fi

if [[ "$PARTS" == *" inprocess "* ]]; then
    PYTHONUNBUFFERED=1 TQDM_DISABLE=1 "$PY" -m benchmarks.sweep --in-process-only --weights "$W" \
        --in-process-concurrency "${LEVELS:-1,8,32,64}" --requests 16 --device "$DEVICE" --hardware "$HW" \
        --out "$OUT/serving_inprocess_gpu" 2>&1 | tail -20
fi

if [[ "$PARTS" == *" reference "* ]]; then
    # the same folder and texts as on CPU (bench_reference.py --equal-frames 120 --served-chunks);
    # the reference in this python, its wheels first on its path only
    "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/refsite .device/ref/*.whl || exit 1
    PYTHONUNBUFFERED=1 TQDM_DISABLE=1 "$PY" benchmarks/bench_reference.py --weights "$W" --device "$DEVICE" \
        --hardware "$HW" --ref-python "$PY" --ref-path /tmp/refsite --equal-frames 120 --served-chunks \
        --rounds "${ROUNDS:-1}" --out "$OUT/reference_gpu" 2>&1 | tail -30
fi

if [[ "$PARTS" == *" step "* ]]; then
    base=()
    if [[ -f .device/baseline_velocity.tar ]]; then
        rev="$(cat .device/baseline_velocity.rev 2>/dev/null || echo baseline)"
        mkdir -p "/tmp/$rev" && tar -xf .device/baseline_velocity.tar -C "/tmp/$rev"
        base=(--baseline-dir "/tmp/$rev" --rounds "${ROUNDS:-2}")
    fi
    PYTHONUNBUFFERED=1 TQDM_DISABLE=1 "$PY" benchmarks/bench_step.py --weights "$W" --device "$DEVICE" "${base[@]}" \
        --batches "${STEP_BATCHES:-1,8,32,64}" --steps 100 --profile "${PROFILE:-20}" --out "$OUT/engine_step_gpu" 2>&1 | tail -20
fi

if [[ "$PARTS" == *" lever "* ]]; then             # this tree against itself with one lever off (LEVER)
    lever=()
    for kv in ${LEVER:-graph_sampler=0}; do lever+=(--baseline-config "$kv"); done
    PYTHONUNBUFFERED=1 TQDM_DISABLE=1 "$PY" benchmarks/bench_step.py --weights "$W" --device "$DEVICE" "${lever[@]}" \
        --rounds "${ROUNDS:-2}" --batches "${STEP_BATCHES:-1,8,32,64}" --steps 100 --profile "${PROFILE:-20}" \
        --out "$OUT/engine_step_lever" 2>&1 | tail -20
fi

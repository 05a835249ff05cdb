#!/usr/bin/env bash
# Several parts of scripts/device_sweep.sh in one device call, in the order given, each under its
# own time limit (seconds): a part that runs over is stopped (its process group, then its server),
# and the next one starts. After each part, everything the parts wrote so far is packed into
# $OUT/results.tar.gz (a device run brings back at most 8 files), so a call that ends early
# still returns what was done.
#
#   OUT=/tmp/out scripts/device_parts.sh "triton overhead:270" step:130 reference:100 tests:80
#
# Environment (LEVELS, VELOCITY_MAX_NUM_SEQS, ROUNDS, ...) passes through to device_sweep.sh.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
RES="${RESULTS:-/tmp/device-parts}"; mkdir -p "$RES"
start=$(date +%s)
for spec in "$@"; do
    parts="${spec%:*}"; cap="${spec##*:}"; name="${parts// /+}"
    [[ "$spec" == *:* && "$cap" =~ ^[0-9]+$ ]] || { echo "device_parts.sh: '$spec' is not PARTS:SECONDS" >&2; exit 2; }
    mkdir -p "$RES/$name"
    echo "=== $parts (at most ${cap} s; $(( $(date +%s) - start )) s in)"
    OUT="$RES/$name" PARTS="$parts" setsid bash scripts/device_sweep.sh > "$RES/$name/console.log" 2>&1 &
    pid=$!
    # the watchdog in a session of its own, so that stopping it stops its sleep too (a sleep left
    # behind would hold this script's output open, and the device call with it)
    setsid bash -c 'sleep "$1"; echo "=== $2: $1 s are up, stopping it"; kill -TERM -- -"$3"; sleep 45
                    kill -KILL -- -"$3"' watchdog "$cap" "$parts" "$pid" 2>/dev/null &
    dog=$!
    wait "$pid"; rc=$?
    { kill -KILL -- -"$dog"; wait "$dog"; } 2>/dev/null
    for f in /tmp/velocity-server.pgid /tmp/velocity-other.pgid; do    # a server its part could not stop
        [[ -f "$f" ]] && { kill -KILL -- -"$(cat "$f")" 2>/dev/null; rm -f "$f"; }
    done
    echo "=== $parts: exit $rc, $(( $(date +%s) - start )) s in"
    tail -n "${TAIL:-30}" "$RES/$name/console.log"
    tar -czf "$OUT/results.tar.gz" -C "$RES" .
done

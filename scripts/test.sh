#!/usr/bin/env bash
# The test suite as `make test` runs it: two pytest processes at once, each given these arguments.
#
#   scripts/test.sh [pytest arguments]      e.g. scripts/test.sh -x -k stream
#
# - The tests that start a real Triton server (marked `server`) run in the foreground, as
#   before. They wait on their servers most of the time and leave much of the CPU idle.
# - The others run beside them in a second pytest: on one torch thread (OMP_NUM_THREADS=1),
#   in Linux's idle scheduling class (`chrt --idle`: it runs only on a core nothing else wants;
#   nice 19 where chrt is missing), so they take the idle CPU without starving the servers.
#   Their output is kept and printed after the foreground's. A Triton server started there is
#   an error that asks for the mark (TESTS_WITHOUT_SERVERS, benchmarks/server.py).
# - The servers wait passively between their torch threads' parallel regions
#   (OMP_WAIT_POLICY=PASSIVE, unless set): by default OpenMP's threads spin there, which on two
#   cores takes the CPU that the other stubs and the second pytest need. `make serve` keeps the
#   default (docs/development.md, "The test suite's time").
# Each keeps its own pytest cache, so `--lf` and `--ff` work through this script too.
# The exit status is the first failure's (pytest's 5, "no tests collected", counts only when
# neither pytest collected a test). Ctrl-C stops both.
# SERIAL=1: one pytest after the other, each at full speed (to time a test alone).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PY:-$ROOT/.venv/bin/python}"
cd "$ROOT"
others_args=(-m "not server" -o cache_dir=.pytest_cache/without-servers)
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"

if [[ "${SERIAL:-0}" == 1 ]]; then
    "$PY" -m pytest -m server "$@"; a=$?
    "$PY" -m pytest "${others_args[@]}" "$@"; b=$?
else
    log="$(mktemp "${TMPDIR:-/tmp}/velocity-tests.XXXXXX")"
    idle=(nice -n 19)
    chrt --idle 0 true 2>/dev/null && idle=(chrt --idle 0)
    # a session of its own: Ctrl-C (to the foreground's group) and the trap below stop it as a whole
    OMP_NUM_THREADS=1 TESTS_WITHOUT_SERVERS=1 setsid "${idle[@]}" "$PY" -m pytest "${others_args[@]}" "$@" \
        > "$log" 2>&1 &
    others=$!
    trap 'kill -- -"$others" 2>/dev/null; rm -f "$log"' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    "$PY" -m pytest -m server "$@"; a=$?
    wait "$others"; b=$?
    echo
    echo "==================== the tests without a server (run beside the ones above) ===================="
    cat "$log"
fi
for rc in "$a" "$b"; do
    [[ $rc == 0 || $rc == 5 ]] || exit "$rc"
done
[[ $a == 5 && $b == 5 ]] && exit 5
exit 0

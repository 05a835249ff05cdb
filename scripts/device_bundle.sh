#!/usr/bin/env bash
# Pack what scripts/device_sweep.sh needs on a GPU machine that has python3 + torch but no
# network and no Triton (e.g. the `device` tool's machines): writes .device/ (ignored by git).
#
#   scripts/device_bundle.sh [--python 3.12] [--baseline-rev REV]
#
# .device/triton<PYV>.tar.xz  the pytriton wheel's tritonserver, its libraries, the python
#                             backend and the stub for Python PYV (~27 MB; the wheel's own
#                             libpython 3.13 left out: the stub uses the machine's libpython)
# .device/*.whl               tritonclient[grpc] 2.51.0, grpcio, protobuf, python-rapidjson for PYV,
#                             and velocity's runtime needs that the device image lacks (RUNTIME
#                             below: the text front end's, the audio readers'; ~6 MB)
# .device/numpy1.tar.xz       numpy 1.26 for PYV, unpacked (~8 MB): the 2.51 stub misreads inputs
#                             under numpy 2, so the Triton part of device_sweep.sh puts it first
# .device/ref/*.whl          the reference (chattts==0.2.5) and the needs of it the image lacks
#                             (~0.5 MB), for PARTS=reference
# .device/baseline_velocity.tar  `git archive REV velocity model_repository scripts client` (with
#                             --baseline-rev), for the engine-step A/B and a baseline server
#                             (PARTS=ab; the device's copy of the tree may have no .git)
# Needs scripts/setup.sh's venv and PyPI (pip download). About 51 MB in all (the tree adds 8):
# under the 64 MiB a device run may carry.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYV=3.12
REV=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --python) PYV="$2"; shift 2 ;;
        --baseline-rev) REV="$2"; shift 2 ;;
        -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "device_bundle.sh: unknown flag '$1' (try --help)" >&2; exit 2 ;;
    esac
done
PY="$ROOT/.venv/bin/python"
[[ -x "$PY" ]] || { echo "device_bundle.sh: no $ROOT/.venv; run scripts/setup.sh first" >&2; exit 1; }
site="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
tri=pytriton/tritonserver
[[ -x "$site/$tri/python_backend_stubs/$PYV/triton_python_backend_stub" ]] || {
    echo "device_bundle.sh: the pytriton wheel has no stub for Python $PYV" >&2; exit 1; }
out="$ROOT/.device"
mkdir -p "$out"
echo "[bundle] server for Python $PYV -> $out/triton$PYV.tar.xz"
rm -f "$out"/triton*.tar.xz       # one Python's: two would pass the 64 MiB a run carries
(cd "$site" && tar -cJf "$out/triton$PYV.tar.xz" --exclude='__pycache__' --exclude='libpython3-*' \
    "$tri/bin" "$tri/backends/python" "$tri/caches" "$tri/python_backend_stubs/$PYV" nvidia_pytriton.libs)
echo "[bundle] client wheels for cp${PYV/./}"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
"$PY" -m pip download -q --only-binary :all: --python-version "$PYV" -d "$tmp" \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    "tritonclient[grpc]==2.51.0" python-rapidjson
rm -f "$out"/*.whl
# the client wheel without its perf_analyzer binaries (27 MB of the 64 MiB a run may carry)
zip -q -d "$tmp"/tritonclient-*.whl '*/bin/perf_client' '*/bin/perf_analyzer'
cp "$tmp"/tritonclient-*.whl "$tmp"/grpcio-*.whl "$tmp"/protobuf-*.whl "$tmp"/python_rapidjson-*.whl "$out"/
# not in the device image (its torch, numpy, transformers, safetensors, tqdm and prometheus-client
# are); the gateway's (av, fastapi, uvicorn) stay out: the sweep serves with GATEWAY_PORT=0
RUNTIME=(soundfile cffi pycparser soxr pypinyin pybase16384 opencc num2words cn2an proces)
echo "[bundle] runtime wheels: ${RUNTIME[*]}"
"$PY" -m pip download -q --no-deps --only-binary :all: --python-version "$PYV" -d "$out" \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 "${RUNTIME[@]}"
# numpy 1 for the 2.51 stub, apart from the wheels above: device_sweep.sh puts it first on the
# path for the Triton part only (the server's path needs no transformers, whose build in the
# image wants numpy 2). Unpacked without its tests and packed with xz: 8 MB, not the wheel's 18.
echo "[bundle] numpy<2 for the python stub -> $out/numpy1.tar.xz"
"$PY" -m pip download -q --no-deps --only-binary :all: --python-version "$PYV" -d "$tmp/np" \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 "numpy<2"
mkdir -p "$tmp/np/site" && (cd "$tmp/np/site" && unzip -q ../numpy-*.whl && find . -type d -name tests -prune -exec rm -rf {} + \
    && tar -cJf "$out/numpy1.tar.xz" .)
# the reference, chattts==0.2.5 (AGPL: an oracle that only runs there, never in the project), and
# those of its needs the image lacks (its numba, scipy, torchaudio, transformers serve): PARTS=reference
echo "[bundle] the reference's wheels -> $out/ref/"
rm -rf "$out/ref" && mkdir -p "$out/ref"
"$PY" -m pip wheel -q --no-deps -w "$out/ref" -r "$ROOT/scripts/conformance/reference-pins.txt" \
    einx==0.4.3 encodec==0.1.1
"$PY" -m pip download -q --no-deps --only-binary :all: --python-version "$PYV" -d "$out/ref" \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 "frozendict>=2.4"
if [[ -n "$REV" ]]; then
    echo "[bundle] velocity at $REV -> $out/baseline_velocity.tar"
    git -C "$ROOT" archive --format=tar -o "$out/baseline_velocity.tar" "$REV" velocity model_repository scripts client
    git -C "$ROOT" rev-parse --short "$REV" > "$out/baseline_velocity.rev"
fi
du -sh "$out"

#!/usr/bin/env bash
# Make .refvenv: the reference implementation, chattts==0.2.5, as a test oracle in a virtual
# environment of its own. It is AGPL: it is installed here, never copied into the project, and
# nothing in the project imports it (only scripts/conformance/make_fixtures.py runs in it).
#
#   scripts/conformance/setup_venv.sh        # idempotent; REF_VENV=DIR to put it elsewhere
#
# Pins: torch 2.13.0 (the CPU wheel on these machines, the project's torch); torchaudio 2.11.0
# without its compiled libraries (no CPU wheel matches torch 2.13; the reference needs only
# its pure-torch MelSpectrogram); chattts, vocos and vector-quantize-pytorch as
# reference-pins.txt says (the list device_bundle.sh packs for a GPU machine too).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
REF="${REF_VENV:-$ROOT/.refvenv}"
PY="${VELOCITY_PYTHON:-/usr/bin/python3.11}"
log() { printf '[conformance] %s\n' "$*"; }

[[ -x "$REF/bin/python" ]] || { log "creating $REF"; "$PY" -m venv "$REF"; }
pip() { "$REF/bin/python" -m pip install -q --disable-pip-version-check "$@"; }
log "installing torch, torchaudio (pure-torch parts), chattts==0.2.5 and its pins (a few minutes the first time)"
pip torch==2.13.0
pip --no-deps torchaudio==2.11.0
rm -f "$REF"/lib/python3.*/site-packages/torchaudio/lib/*.so
pip -r "$ROOT/scripts/conformance/reference-pins.txt" requests "numpy<2" \
    "safetensors>=0.4" "pybase16384>=0.3" "num2words>=0.5.13" "cn2an>=0.5.22" tqdm
"$REF/bin/python" -c "import ChatTTS, vector_quantize_pytorch" 2>/dev/null \
    || { echo "[conformance] the reference does not import; see above" >&2; exit 1; }
log "ready: $REF"

#!/usr/bin/env bash
# One command: the reference's venv (.refvenv), then the fixtures in tests/fixtures/chattts_0.2.5/.
#
#   scripts/conformance/regenerate.sh
#
# CI never runs this (it needs PyPI and minutes); it runs the tests on the committed fixtures.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
REF="${REF_VENV:-$ROOT/.refvenv}"
bash "$ROOT/scripts/conformance/setup_venv.sh"
"$REF/bin/python" "$ROOT/scripts/conformance/make_fixtures.py" "$@"

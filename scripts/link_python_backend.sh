#!/usr/bin/env bash
# Make VENV/triton/backends/python for the pytriton wheel's tritonserver: the python backend and
# the stub for PYTHON's version, from the wheel in PYTHON's site-packages (serve.sh passes
# VENV/triton/backends as --backend-directory). Used by setup.sh and device_sweep.sh.
#
#   scripts/link_python_backend.sh PYTHON VENV
set -euo pipefail
py="$1" venv="$2"
site="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
pyver="$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
tri="$site/pytriton/tritonserver"
be="$venv/triton/backends/python"
mkdir -p "$be"
ln -sfn "$tri/backends/python/libtriton_python.so" "$be/libtriton_python.so"
ln -sfn "$tri/backends/python/triton_python_backend_utils.py" "$be/triton_python_backend_utils.py"
ln -sfn "$tri/python_backend_stubs/$pyver/triton_python_backend_stub" "$be/triton_python_backend_stub"
[[ -e "$be/triton_python_backend_stub" ]] || { echo "no python backend stub for Python $pyver in $tri" >&2; exit 1; }

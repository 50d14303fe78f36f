#!/usr/bin/env bash
# Create .venv (once) and install autofuse with its pinned dependencies and test extras.
# Sourced by scripts/test.sh and scripts/demo.sh, so each of them works on a fresh machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
stamp=.venv/.autofuse-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e ".[test]"
    touch "$stamp"
fi
export PATH="$PWD/.venv/bin:$PATH"

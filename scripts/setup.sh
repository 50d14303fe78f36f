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
    echo "autofuse: installing into .venv (first run only; log in .venv/install.log)" >&2
    if ! { .venv/bin/python -m pip install --upgrade pip &&
           .venv/bin/python -m pip install -e ".[test]"; } > .venv/install.log 2>&1; then
        tail -n 30 .venv/install.log >&2
        exit 1
    fi
    touch "$stamp"
fi
export PATH="$PWD/.venv/bin:$PATH"

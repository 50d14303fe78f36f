#!/usr/bin/env bash
# The test command: set up (if needed) and run the whole suite. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh
exec python -m pytest -q "$@"

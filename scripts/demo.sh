#!/usr/bin/env bash
# The main job on the built-in default model: set up (if needed), then report and measure
# fusion plans. Extra args go to scripts/plan_report.py (e.g. a model path and --input).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh
exec python scripts/plan_report.py "$@"

#!/usr/bin/env bash
# The main job on the built-in default model: set up (if needed), tune its fusion plan, export a
# library with the tuned plan, and benchmark it side by side with TVM's default and onnxruntime.
# Any arguments are passed to `autofuse tune` (e.g. a model path, --input, --trials).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh
autofuse tune --trials 16 "$@"
model=${1:-}
case "$model" in -*) model="" ;; esac
autofuse apply $model -o tuning_logs/model.so
autofuse bench $model

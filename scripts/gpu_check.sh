#!/usr/bin/env bash
# On the GPU host: measure every prepared batch with the TVM runtime only, then (if listed in
# torch_models.txt) the PyTorch eager / torch.compile baselines. Prepared here by
# scripts/prepare_gpu_check.py; needs Python 3, numpy (and torch + transformers for the
# baselines), nothing installed by hand.
#
#   bash gpu_check.sh PREPARED_DIR RESULTS_DIR        # JSON per model in RESULTS_DIR
#
# Budget: each batch is capped at BATCH_TIMEOUT seconds (default 100), the baselines at 150 s,
# so three models finish well under 8 minutes. DEVICE=cpu runs CPU batches (how CI tests it).
set -uo pipefail
if [ $# -ne 2 ] || [ ! -d "$1/batches" ]; then
  echo "usage: gpu_check.sh PREPARED_DIR RESULTS_DIR (PREPARED_DIR/batches missing)" >&2
  exit 2
fi
PREP=$(cd "$1" && pwd)
mkdir -p "$2"
OUT=$(cd "$2" && pwd)
PY=${PYTHON:-python3}
if [ -d "$PREP/runtime" ]; then
  export PYTHONPATH="$PREP/runtime${PYTHONPATH:+:$PYTHONPATH}"
fi
export TVM_USE_RUNTIME_LIB=1
# TVM's CUDA runtime links libcudart.so.13: if the loader does not know one, use the CUDA
# toolkit's or the one PyTorch's Python carries
if [ "${DEVICE:-cuda}" = cuda ] && ! ldconfig -p 2>/dev/null | grep -q 'libcudart\.so\.13'; then
  for dir in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/lib* \
      $("$PY" -c 'import site; print(*site.getsitepackages())' 2>/dev/null | tr ' ' '\n' | sed 's|$|/nvidia/cu13/lib|'); do
    if [ -e "$dir/libcudart.so.13" ]; then
      export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      echo "libcudart.so.13 from $dir"
      break
    fi
  done
fi
status=0
for batch in "$PREP"/batches/*/; do
  name=$(basename "$batch")
  echo "== $name"
  if ! timeout "${BATCH_TIMEOUT:-100}" "$PY" "$batch/runner.py" "$batch" --out "$OUT/$name.json" \
      ${DEVICE:+--device "$DEVICE"}; then
    echo "runner failed or timed out on $name (partial results kept in $OUT/$name.json)" >&2
    status=1
  fi
done
if [ -s "$PREP/torch_models.txt" ]; then
  echo "== PyTorch baselines"
  timeout 150 "$PY" "$PREP/gpu_torch_baselines.py" "$OUT/torch.json" --models "$(cat "$PREP/torch_models.txt")" \
    || { echo "PyTorch baselines failed" >&2; status=1; }
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/device.txt" 2>/dev/null || true
exit $status

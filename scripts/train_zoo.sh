#!/usr/bin/env bash
# Trains zoo members one after another, one thread each (the recipe's determinism), into a staging
# directory, and copies each finished member's shipped files into the package. Resumable: rerun it
# and a member resumes from its last epoch.
# Usage: bash scripts/train_zoo.sh STAGE_DIR MEMBER...   (e.g. pairs-rope-axial-seed1)
set -euo pipefail
cd "$(dirname "$0")/.."
stage="$1"; shift
DEST=src/vitpos/models/builtin
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
for m in "$@"; do
  # `zoo train` resumes from the last epoch in the stage dir, or returns at once when it finished there
  echo "$m: start $(date -u +%FT%TZ)"
  .venv/bin/vitpos zoo train "$m" --out "$stage/$m" --no-progress
  mkdir -p "$DEST/$m"
  cp "$stage/$m"/{config.json,metrics.json,model.safetensors,train_config.json} "$DEST/$m/"
  echo "$m: done $(date -u +%FT%TZ)"
done

#!/usr/bin/env bash
# Trains every shipped checkpoint exactly as shipped (README: "Shipped models").
# Usage: bash scripts/train_builtin.sh [shapes|fashion|all]   (CPU: ~10 min shapes, ~90 min fashion)
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=src/vitpos/models/builtin
which="${1:-all}"
if [[ "$which" == shapes || "$which" == all ]]; then
  for pe in ape rope-axial rope-mixed none; do
    vitpos train --pe "$pe" --data shapes --epochs 3 --seed 0 --no-progress --out "$DEST/$pe"
    rm -rf "$DEST/$pe/checkpoint"   # resume state; not shipped
  done
fi
if [[ "$which" == fashion || "$which" == all ]]; then
  for pe in ape rope-axial rope-mixed none; do
    vitpos train --pe "$pe" --data fashion --epochs 10 --seed 0 --no-progress --out "$DEST/fashion-$pe"
    rm -rf "$DEST/fashion-$pe/checkpoint"
  done
fi

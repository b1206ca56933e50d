#!/usr/bin/env bash
# The main job (set-up included): check the registry against the traces, run the sweep on this
# machine (GPU kernels on a CUDA box, torch references on a CPU-only one), and render the report.
#   bash scripts/run.sh [dskbench run options...]     e.g. --kernel rmsnorm --sweep decode
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
python -m dskbench registry generate --check
stamp="$(date -u +%Y%m%dT%H%M%SZ)"
out="results/run-$stamp.jsonl"
status=0
python -m dskbench run --quick --out "$out" "$@" || status=$?
[ "$status" -le 1 ] || exit "$status"  # 1 = a case wrong or in error: its results still make a report
python -m dskbench report "$out" --out "out/report-$stamp"
echo "report: out/report-$stamp/index.html"
exit "$status"

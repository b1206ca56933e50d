#!/usr/bin/env bash
# The main job (set-up included): check the registry against the traces, run the sweep on this
# machine (GPU kernels on a CUDA box, torch references on a CPU-only one), and render the report.
# On a GPU box it first checks that torch can use the GPU, prints the expected time, and builds the
# JIT caches on all GPUs (dskbench warm) so that the sweep times kernels, not compilers.
#   bash scripts/run.sh [dskbench run options...]     e.g. --kernel rmsnorm --sweep decode
# DSKBENCH_DRY_RUN=1 prints each step instead of running it.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
step() {
    if [ "${DSKBENCH_DRY_RUN:-0}" = 1 ]; then echo "+ $*"; else "$@"; fi
}
step python3 -m dskbench registry generate --check
stamp="$(date -u +%Y%m%dT%H%M%SZ)"
out="results/run-$stamp.jsonl"
if [ "$DSKBENCH_GPU" = 1 ]; then
    step python3 -m dskbench.setup.stack cuda  # one line on a driver / CUDA / torch mismatch, exit 1
    if [ "${DSKBENCH_DRY_RUN:-0}" = 1 ]; then
        echo "+ python3 -m dskbench run --dry-run --quick $* | python3 -m dskbench.setup.mainjob eta"
        warm=("$@")
    else
        python3 -m dskbench run --dry-run --quick "$@" | python3 -m dskbench.setup.mainjob eta
        mapfile -d '' warm < <(python3 -m dskbench.setup.mainjob warm-args "$@")
    fi
    step python3 -m dskbench warm --gpus all "${warm[@]}"
fi
status=0
step python3 -m dskbench run --quick --out "$out" "$@" || status=$?
[ "$status" -le 1 ] || exit "$status"  # 1 = a case wrong or in error: its results still make a report
step python3 -m dskbench report "$out" --out "out/report-$stamp"
echo "report: out/report-$stamp/index.html"
exit "$status"

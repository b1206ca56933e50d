#!/usr/bin/env bash
# The batched cold timer against the per-case one, on one GPU, into OUT:
#
#   bash scripts/evidence/timers.sh OUT
#
#   probe       the GPU, CPU count, library versions
#   batched-1   `dskbench run --backend sgl_kernel --point tp=1 --seed 7` (every kernel's sgl_kernel backend at
#               the full profile's tp-1 points: no JIT compilation), cold cases sampled in batches (CUPTI)
#   per-case    the same with --no-batch (each cold case timed alone with CUDA events)
#   batched-2   the batched run again: its own run-to-run spread
#   summaries   dskbench stats of each file; dskbench compare and run-to-run of per-case vs batched-1 and
#               of batched-1 vs batched-2 (CPU), in OUT/summaries.log
#
# Steps are resumable (steps.sh). Time limit per run: TIMERS_SECONDS (default 1200). The subset is the
# one results/h100-2026-11-26 and results/h200-2026-11-27 measured.
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ $# -ne 1 ]; then
    echo "usage: bash scripts/evidence/timers.sh OUT" >&2
    exit 2
fi
# shellcheck source=steps.sh
source scripts/evidence/steps.sh "$1" || exit $?
if [ "${#gpus[@]}" -lt 1 ]; then
    echo "timers.sh: no GPU found (nvidia-smi -L lists none; EVIDENCE_GPUS=N to say how many)" >&2
    exit 2
fi
export CUDA_VISIBLE_DEVICES="$(gpu 0)"
subset=(--backend sgl_kernel --point tp=1 --seed 7)

step probe 120 bash -c 'nvidia-smi; nproc; python3 -m pip list 2>/dev/null | grep -iE "^(torch|triton|sglang|sglang-kernel|flashinfer-python|apache-tvm-ffi) "'
step batched-1 "${TIMERS_SECONDS:-1200}" python3 -m dskbench run "${subset[@]}" --resume --out "$out/batched-1.jsonl"
step per-case "${TIMERS_SECONDS:-1200}" python3 -m dskbench run "${subset[@]}" --no-batch --resume --out "$out/per-case.jsonl"
step batched-2 "${TIMERS_SECONDS:-1200}" python3 -m dskbench run "${subset[@]}" --resume --out "$out/batched-2.jsonl"
step summaries 600 bash -c 'o="$1"; for f in batched-1 per-case batched-2; do python3 -m dskbench stats "$o/$f.jsonl"; done; python3 -m dskbench compare "$o/per-case.jsonl" "$o/batched-1.jsonl"; python3 -m dskbench run-to-run "$o/per-case.jsonl" "$o/batched-1.jsonl"; python3 -m dskbench compare "$o/batched-1.jsonl" "$o/batched-2.jsonl"; python3 -m dskbench run-to-run "$o/batched-1.jsonl" "$o/batched-2.jsonl"' _ "$out"

#!/usr/bin/env bash
# The batched cold timer against the per-case one, on one GPU, interleaved, into OUT:
#
#   bash scripts/evidence/timers.sh OUT [dskbench run options...]
#
#   probe                  the GPU, CPU count, library versions
#   per-case-1 batched-1   `dskbench run --seed 7` with the options given (default: --backend sgl_kernel
#   per-case-2 batched-2   --point tp=1, every kernel's sgl_kernel backend at the full profile's tp-1 points:
#                          no JIT compilation), first with --no-batch (each cold case timed alone with CUDA
#                          events), then sampled in batches (CUPTI); then the pair again
#   summaries              dskbench stats of each file; dskbench compare per-case-1 per-case-2 -- batched-1
#                          batched-2 (two runs a side: each case judged against its own run-to-run spread);
#                          run-to-run of each side's two runs and of per-case-1 against batched-1 (CPU); for
#                          each slower/faster case, which timer CUPTI sides with (timer_arbiter.py), in
#                          OUT/summaries.log
#
# Interleaved so the box's drift over the job (clocks, temperature) falls on both timers alike. Steps are
# resumable (steps.sh). Time limit per run: TIMERS_SECONDS (default 1200).
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ $# -lt 1 ]; then
    echo "usage: bash scripts/evidence/timers.sh OUT [dskbench run options...]" >&2
    exit 2
fi
dest="$1"
shift
subset=("$@")
[ ${#subset[@]} -eq 0 ] && subset=(--backend sgl_kernel --point tp=1)
# shellcheck source=steps.sh
source scripts/evidence/steps.sh "$dest" || exit $?
if [ "${#gpus[@]}" -lt 1 ]; then
    echo "timers.sh: no GPU found (nvidia-smi -L lists none; EVIDENCE_GPUS=N to say how many)" >&2
    exit 2
fi
export CUDA_VISIBLE_DEVICES="$(gpu 0)"

step probe 120 bash -c 'nvidia-smi; nproc; python3 -m pip list 2>/dev/null | grep -iE "^(torch|triton|sglang|sglang-kernel|flashinfer-python|apache-tvm-ffi) "'
for n in 1 2; do
    step "per-case-$n" "${TIMERS_SECONDS:-1200}" python3 -m dskbench run "${subset[@]}" --seed 7 --no-batch --resume \
        --out "$out/per-case-$n.jsonl"
    step "batched-$n" "${TIMERS_SECONDS:-1200}" python3 -m dskbench run "${subset[@]}" --seed 7 --resume \
        --out "$out/batched-$n.jsonl"
done
step summaries 600 bash -c 'o="$1"; p1="$o/per-case-1.jsonl" p2="$o/per-case-2.jsonl" b1="$o/batched-1.jsonl" b2="$o/batched-2.jsonl"
for f in "$p1" "$b1" "$p2" "$b2"; do python3 -m dskbench stats "$f"; done
python3 -m dskbench compare "$p1" "$p2" -- "$b1" "$b2"
python3 -m dskbench run-to-run "$p1" "$p2"; python3 -m dskbench run-to-run "$b1" "$b2"; python3 -m dskbench run-to-run "$p1" "$b1"
python3 scripts/evidence/timer_arbiter.py "$p1" "$p2" -- "$b1" "$b2"' _ "$out"

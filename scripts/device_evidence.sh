#!/usr/bin/env bash
# One device call that gathers the evidence runs (used through scripts/device_run.sh on the lent GPU):
#   1. run-to-run: the same decode subset measured twice back to back (results/ r2r-*.jsonl)
#   2. asv: `asv run` of a decode subset in the existing environment, and the same cases through
#      `dskbench run`, each timed (wall clock) for the overhead comparison
#   3. the full quick sweep, resumed from SWEEP_FILE into $OUT/sweep-quick.jsonl, until SWEEP_SECONDS run out
# Usage: [COMMIT=<hash>] SWEEP_SECONDS=300 bash scripts/device_evidence.sh   (COMMIT defaults to HEAD)
set -uo pipefail
out="${OUT:-out}"
mkdir -p "$out"
subset=(--kernel rmsnorm --kernel fused_add_rmsnorm --kernel silu_and_mul --kernel moe_align_block_size
        --kernel apply_rope_with_cos_sin_cache_inplace --kernel moe_fused_gate --kernel bmm_fp8)
for i in 1 2; do
    python3 -m dskbench run --quick --sweep decode "${subset[@]}" --out "$out/r2r-$i.jsonl" 2>"$out/r2r-$i.log"
    tail -1 "$out/r2r-$i.log"
done
machine="$(python3 -m dskbench.asv_machine)"
# asv needs the commit in the checkout's own git; on 2026-11-21 the device's copy lacked the one passed in
# COMMIT, so fall back to whatever HEAD the device copy has (and say so).
if ! git cat-file -e "${COMMIT:-HEAD}^{commit}" 2>/dev/null; then
    echo "device_evidence: commit ${COMMIT:-?} not in this checkout; using $(git rev-parse HEAD)" | tee -a "$out/asv-run.log"
    COMMIT="$(git rev-parse HEAD)"
fi
export DSKBENCH_ASV_SWEEP=decode DSKBENCH_ASV_KERNELS=rmsnorm,silu_and_mul DSKBENCH_ASV_QUICK=1
t0=$(date +%s.%N)
ASV_PYTHONPATH="$PYTHONPATH" asv run --machine "$machine" -E existing:python3 --set-commit-hash "${COMMIT:-$(git rev-parse HEAD)}" \
    --show-stderr >"$out/asv-run.log" 2>&1
echo "asv rc=$? wall_s=$(python3 -c "print(round($(date +%s.%N) - $t0, 1))")" | tee -a "$out/asv-run.log"
t0=$(date +%s.%N)
python3 -m dskbench run --quick --sweep decode --kernel rmsnorm --kernel silu_and_mul --out "$out/same-as-asv.jsonl" 2>/dev/null
echo "dskbench run (same cases) wall_s=$(python3 -c "print(round($(date +%s.%N) - $t0, 1))")" | tee -a "$out/asv-run.log"
tar -czf "$out/asv-results.tar.gz" results/asv results/asv-jsonl 2>/dev/null
# The sweep writes straight into $OUT (what is under $OUT comes back even when the call is cut off);
# it resumes from the committed file, copied there first.
sweep="${SWEEP_FILE:-results/h200-2026-11-21/sweep-quick.jsonl}"
cp "$sweep" "$out/sweep-quick.jsonl" 2>/dev/null
timeout "${SWEEP_SECONDS:-300}" python3 -m dskbench run --quick --budget 0.25 --resume \
    --out "$out/sweep-quick.jsonl" 2>"$out/sweep.log"
echo "sweep rc=$?"; tail -1 "$out/sweep.log"

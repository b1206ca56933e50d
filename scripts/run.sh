#!/usr/bin/env bash
# The main job (set-up included): check the registry against the traces, run the sweep on this
# machine (GPU kernels on a CUDA box, torch references on a CPU-only one), and render the report.
# On a GPU box it first checks that torch can use the GPU and prints the expected time; the sweep then
# builds its JIT modules in processes beside the measuring one, longest builds first, and times each
# case once its build is done (dskbench run --build-ahead): kernels, not compilers, are timed, and a
# fresh box's first run takes about the longer of its builds and its measuring, not their sum. A build
# recorded as taking 15 minutes or more is not made (DSKBENCH_DEFER_BUILDS_S=S sets that limit, 0 makes
# every build): its cases are recorded skipped with the `dskbench warm` command that builds it, and once
# built, a later main job on this box measures them.
#   bash scripts/run.sh [dskbench run options...]     e.g. --kernel rmsnorm --sweep decode
# At the end (also after a failure) one line on stderr gives the wall seconds of each stage: set-up
# (scripts/setup.sh, the registry check, the GPU check, the expected time), measuring (JIT builds
# included), report; with the report, out/report-STAMP/main_job.json holds them, the exit status, and
# the box: whether its JIT caches were empty at the start ("fresh"), its GPUs and its CPU cores.
# The sweep's output ends with the cases that were not ok, one line each; the exit status is dskbench
# run's: 1 when a case is wrong or in error (on a CPU, a reference that ran past its time limit is not a
# failure), then the report is still written.
# DSKBENCH_DRY_RUN=1 prints each step instead of running it.
set -euo pipefail
cd "$(dirname "$0")/.."
step() {
    if [ "${DSKBENCH_DRY_RUN:-0}" = 1 ]; then echo "+ $*"; else "$@"; fi
}
SECONDS=0
declare -A took=([setup]=0 [measure]=0 [report]=0)
stage=setup
lap_start=0
next_stage() {  # close the current stage's lap, open $1's
    took[$stage]=$((took[$stage] + SECONDS - lap_start))
    lap_start=$SECONDS
    stage=$1
}
run_stamp="$(date -u +%Y%m%dT%H%M%SZ)"  # not `stamp`: setup.sh, sourced, has its own
times_json=""  # set once the report folder exists
box_json="$(mktemp)"  # the box's facts at the start: were the JIT caches empty, its GPUs and cores
finish() {
    local rc=$?
    trap - EXIT
    next_stage done
    local where=()
    [ -z "$times_json" ] || where=(--out "$times_json")
    step python3 -m dskbench.setup.mainjob times --status "$rc" --box "$box_json" ${where[@]+"${where[@]}"} \
        "setup=${took[setup]}" "measure=${took[measure]}" "report=${took[report]}" || true
    rm -f "$box_json"
    exit "$rc"
}
trap finish EXIT
source scripts/setup.sh
python3 -m dskbench.setup.mainjob box > "$box_json" 2>/dev/null || true
step python3 -m dskbench registry generate --check
out="results/run-$run_stamp.jsonl"
builds=()
if [ "$DSKBENCH_GPU" = 1 ]; then
    step python3 -m dskbench.setup.stack cuda  # one line on a driver / CUDA / torch mismatch, exit 1
    builds=(--build-ahead)
    # builds recorded as outlasting a first run (FlashInfer's CUTLASS fused MoE: 17 minutes on 64 cores)
    # are left to `dskbench warm`: their cases are recorded skipped with the command; 0 builds everything
    defer="${DSKBENCH_DEFER_BUILDS_S:-900}"
    [ "$defer" = 0 ] || builds+=(--defer-builds-over "$defer")
    if [ "${DSKBENCH_DRY_RUN:-0}" = 1 ]; then
        echo "+ python3 -m dskbench run --dry-run --quick $* | python3 -m dskbench.setup.mainjob eta ${builds[*]}"
    else
        python3 -m dskbench run --dry-run --quick "$@" | python3 -m dskbench.setup.mainjob eta "${builds[@]}"
    fi
fi
next_stage measure
status=0
step python3 -m dskbench run --quick ${builds[@]+"${builds[@]}"} --out "$out" "$@" || status=$?
[ "$status" -le 1 ] || exit "$status"  # 1 = a case wrong or in error: its results still make a report
next_stage report
if [ "${DSKBENCH_DRY_RUN:-0}" = 1 ]; then
    echo "+ python3 -m dskbench report $out --out out/report-$run_stamp"
else  # its file list is left out: the run's last lines (the cases not ok) stay the end of the output
    python3 -m dskbench report "$out" --out "out/report-$run_stamp" >/dev/null
fi
times_json="out/report-$run_stamp/main_job.json"
echo "report: out/report-$run_stamp/index.html"
exit "$status"

#!/usr/bin/env bash
# The suite's speed on one host, its lanes side by side, into OUT (one GPU: the fresh lane alone, on it):
#
#   bash scripts/evidence/speed.sh OUT
#
#   lane sweep (first GPU, its share of the cores), in OUT/sweep:
#     warm        `dskbench warm` for the full default sweep, with `--build-times` from an earlier
#                 warm's file when BUILD_TIMES=FILE is set, WARM_JOBS builds at once when set, and
#                 `--defer-builds-over DEFER_BUILDS_S` (default 900; 0 builds everything); with
#                 JIT_CACHE=FILE it first unpacks that `dskbench warm --export` archive (`--import`), so
#                 builds another box made (the longest, say, on a host with more cores) are cache hits
#     sweep       the full default sweep on this one GPU (`dskbench run --seed 7`), warm caches; with
#                 deferred builds, `--build-ahead --defer-builds-over` records their cases skipped
#                 instead of building them inside the measured run
#     stats       `dskbench stats` of it (wall, item time by stage)
#     sweep-all   with SPEED_LANES=sweep on a host of two or more GPUs (SWEEP_ALL=0 leaves it out): the
#                 same sweep sharded over every GPU of the job (`--gpus all`), on the caches the warm-up
#                 built, so one job gives the sweep on one GPU and on the whole host
#     stats-all   `dskbench stats` of that
#   lane fresh (second GPU, FRESH_CORES cores, default 16), in OUT/fresh:
#     main-job    `bash scripts/run.sh` with empty JIT caches: its own HOME under OUT/fresh/home, so
#                 FlashInfer's, tvm-ffi's, Triton's and torch's caches start empty; main_job.json is
#                 copied next to its log
#     main-job-again  the same again on the caches the first built (main_job-again.json): a warm box
#   lane timers (third GPU, when there is one), in OUT/timers: scripts/evidence/timers.sh
#
# Each lane is a plan of steps (steps.sh: its own limits, logs and resume); run the same command into the
# same OUT again to go on. A lane's cores are its own (`taskset`, where the host has it and has cores enough:
# FRESH_CORES, an eighth of the rest for the timers, the rest for the sweep), so the fresh box's compilers
# see FRESH_CORES cores. SPEED_LANES=sweep runs the sweep lane alone on the whole host: its warm-up
# spreads the builds over every GPU of the job and all cores, the sweep runs on the first GPU.
# Limits: WARM_SECONDS, SWEEP_SECONDS, MAIN_JOB_SECONDS.
# EVIDENCE_DRY_RUN=1 prints each lane's steps.
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ $# -ne 1 ]; then
    echo "usage: bash scripts/evidence/speed.sh OUT" >&2
    exit 2
fi
# shellcheck source=steps.sh
source scripts/evidence/steps.sh "$1" || exit $?
if [ "${#gpus[@]}" -lt 1 ]; then
    echo "speed.sh: needs a GPU (found none; EVIDENCE_GPUS=N to say how many)" >&2
    exit 2
fi
top="$out"
cores="${EVIDENCE_CORES:-$(nproc 2>/dev/null || echo 1)}"
fresh_cores="${FRESH_CORES:-16}"
lanes=2
[ "${#gpus[@]}" -ge 3 ] && lanes=3
[ "${#gpus[@]}" = 1 ] && lanes=1  # a box of one GPU (and its cores): the fresh lane is the box itself
fresh_gpu=1
[ "$lanes" = 1 ] && fresh_gpu=0
timer_cores=0
[ "$lanes" = 3 ] && timer_cores=$(((cores - fresh_cores) / 8))
[ "$lanes" = 3 ] && [ "$timer_cores" -lt 2 ] && timer_cores=2
split=1  # lanes on cores of their own only where each gets a few
[ $((cores - fresh_cores - timer_cores)) -ge 4 ] || split=0
[ "$lanes" = 1 ] && split=0
case "${SPEED_LANES:-}" in
"") ;;
sweep) lanes=sweep split=0 fresh_cores=0 timer_cores=0 ;;
*)
    echo "speed.sh: SPEED_LANES=${SPEED_LANES}: expected sweep (or unset: every lane the GPUs allow)" >&2
    exit 2
    ;;
esac
defer="${DEFER_BUILDS_S:-900}"

pin() {  # pin FIRST COUNT: the command prefix that keeps a lane on cores FIRST..FIRST+COUNT-1 (taskset)
    if [ "$split" = 1 ] && command -v taskset >/dev/null 2>&1; then
        echo "taskset -c $1-$(($1 + $2 - 1))"
    fi
}
lane() {  # lane NAME: steps.sh's OUT for this lane
    out="$top/$1"
    mkdir -p "$out"
}

sweep_lane() {
    lane sweep
    local first=$fresh_cores count=$((cores - fresh_cores - timer_cores))
    local warm_opts=() run_opts=() cpus
    read -ra cpus <<<"$(pin "$first" "$count")"
    [ -n "${BUILD_TIMES:-}" ] && warm_opts+=(--build-times "$BUILD_TIMES")
    [ -n "${WARM_JOBS:-}" ] && warm_opts+=(--jobs "$WARM_JOBS")
    [ -n "${JIT_CACHE:-}" ] && warm_opts+=(--import "$JIT_CACHE")
    if [ "$defer" != 0 ]; then
        warm_opts+=(--defer-builds-over "$defer")
        run_opts+=(--build-ahead --defer-builds-over "$defer")
    fi
    # alone on the host, the warm-up builds on every GPU of the job; beside other lanes, on its own
    [ "$lanes" = sweep ] || export CUDA_VISIBLE_DEVICES="$(gpu 0)"
    step warm "${WARM_SECONDS:-3600}" ${cpus[@]+"${cpus[@]}"} \
        python3 -m dskbench warm --gpus all ${warm_opts[@]+"${warm_opts[@]}"} --out "$out/warm.json"
    export CUDA_VISIBLE_DEVICES="$(gpu 0)"
    step sweep "${SWEEP_SECONDS:-7200}" ${cpus[@]+"${cpus[@]}"} \
        python3 -m dskbench run --seed 7 --resume ${run_opts[@]+"${run_opts[@]}"} --out "$out/sweep.jsonl"
    step stats 600 python3 -m dskbench stats "$out/sweep.jsonl" --json "$out/stats.json"
    if [ "$lanes" = sweep ] && [ "${#gpus[@]}" -ge 2 ] && [ "${SWEEP_ALL:-1}" != 0 ]; then
        export CUDA_VISIBLE_DEVICES
        CUDA_VISIBLE_DEVICES=$(IFS=,; echo "${gpus[*]}")
        step sweep-all "${SWEEP_SECONDS:-7200}" ${cpus[@]+"${cpus[@]}"} python3 -m dskbench run --gpus all \
            --seed 7 --resume ${run_opts[@]+"${run_opts[@]}"} --out "$out/sweep-all.jsonl"
        step stats-all 600 python3 -m dskbench stats "$out/sweep-all.jsonl" --json "$out/stats-all.json"
    fi
}

fresh_lane() {
    lane fresh
    export CUDA_VISIBLE_DEVICES="$(gpu "$fresh_gpu")"
    mkdir -p "$out/home"
    local cpus
    read -ra cpus <<<"$(pin 0 "$fresh_cores")"
    step main-job "${MAIN_JOB_SECONDS:-3600}" env HOME="$out/home" ${cpus[@]+"${cpus[@]}"} bash -c \
        'bash scripts/run.sh; rc=$?; cp "$(ls -td out/report-*/ | head -1)main_job.json" "$1/" 2>/dev/null; exit $rc' \
        _ "$out"
    # the same box again, its caches and build memory as the first run left them: the warm main job
    step main-job-again "${MAIN_JOB_SECONDS:-3600}" env HOME="$out/home" ${cpus[@]+"${cpus[@]}"} bash -c \
        'bash scripts/run.sh; rc=$?; cp "$(ls -td out/report-*/ | head -1)main_job.json" "$1/main_job-again.json" 2>/dev/null; exit $rc' \
        _ "$out"
}

timers_lane() {
    lane timers
    export CUDA_VISIBLE_DEVICES="$(gpu 2)"
    local cpus
    read -ra cpus <<<"$(pin $((cores - timer_cores)) "$timer_cores")"
    step timers 3600 ${cpus[@]+"${cpus[@]}"} bash scripts/evidence/timers.sh "$out"
}

if [ "$lanes" = sweep ]; then
    sweep_lane
    echo "speed.sh: the sweep lane done; see $top/sweep/steps.log"
    exit 0
fi
if [ "${EVIDENCE_DRY_RUN:-0}" = 1 ]; then
    [ "$lanes" -ge 2 ] && sweep_lane
    fresh_lane
    [ "$lanes" = 3 ] && timers_lane
    exit 0
fi
[ "$lanes" -ge 2 ] && sweep_lane &
fresh_lane &
[ "$lanes" = 3 ] && timers_lane &
wait
echo "speed.sh: lanes done; see $top/*/steps.log"

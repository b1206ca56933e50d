# A plan of evidence steps, each under its own time limit, resumable. Sourced by the plans in this
# folder from the checkout's root:
#
#   source scripts/evidence/steps.sh OUT      OUT: the output folder (created)
#   step NAME SECONDS COMMAND...              run COMMAND, killed after SECONDS (SIGTERM, then SIGKILL)
#
# Each step's output goes to OUT/NAME.log; its start, exit code and wall time to OUT/steps.log. A step
# that ended with exit code 0 is listed in OUT/steps.done and skipped when the plan runs again into the
# same OUT: on a job queue that ends a job at its time limit, submit the same plan again and it goes on
# (a step cut off runs again; the sweeps use `dskbench run --resume`, so they continue where they were).
# A failing step does not stop the plan.
#
# Also defined: $root (the checkout), $out, $gpus (the GPUs this job may use, as CUDA_VISIBLE_DEVICES
# tokens: its own CUDA_VISIBLE_DEVICES if set, else 0..N-1 from nvidia-smi; EVIDENCE_GPUS=N to say N),
# and gpu I (the token of the I-th of them).
# EVIDENCE_DRY_RUN=1 prints each step (name, limit, command) instead of running it.

if [ -z "${1:-}" ]; then
    echo "steps.sh: give the output folder: source scripts/evidence/steps.sh OUT" >&2
    return 2 2>/dev/null || exit 2
fi
root="$PWD"
mkdir -p "$1" || { return 1 2>/dev/null || exit 1; }
out="$(cd "$1" && pwd)"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

_evidence_gpus() {
    local n
    if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
        tr ',' ' ' <<<"$CUDA_VISIBLE_DEVICES"
        return
    fi
    n="${EVIDENCE_GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')}"
    [ "$n" -gt 0 ] 2>/dev/null && seq -s ' ' 0 $((n - 1))
}
read -ra gpus <<<"$(_evidence_gpus)"

gpu() {  # gpu I: the CUDA_VISIBLE_DEVICES token of this job's I-th GPU
    echo "${gpus[$1]}"
}

step() {
    local name="$1" limit="$2"
    shift 2
    if [ "${EVIDENCE_DRY_RUN:-0}" = 1 ]; then
        echo "step $name ${limit}s${CUDA_VISIBLE_DEVICES:+ [CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES]}: $(printf '%q ' "$@")"
        return 0
    fi
    if grep -qxF "$name" "$out/steps.done" 2>/dev/null; then
        echo "$(date -u +%FT%TZ) skip  $name (done in an earlier run of this plan)" >>"$out/steps.log"
        return 0
    fi
    local t0=$SECONDS rc
    echo "$(date -u +%FT%TZ) start $name (limit ${limit}s)" >>"$out/steps.log"
    timeout --kill-after=30 "$limit" "$@" >>"$out/$name.log" 2>&1
    rc=$?
    echo "$(date -u +%FT%TZ) end   $name exit code $rc, wall $((SECONDS - t0)) s" >>"$out/steps.log"
    [ "$rc" = 0 ] && echo "$name" >>"$out/steps.done"
    return "$rc"
}

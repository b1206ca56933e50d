# Sourced by the device chains (scripts/device_chain*.sh) from the tree's root: their environment and
# `step NAME SECONDS command...`, which runs one step under its own time limit, its output in
# .devrun/out/NAME.log, its start, exit code and wall time in .devrun/out/steps.log.
root="$PWD"
out="$root/.devrun/out"
mkdir -p "$out"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR="$HOME/.triton/cache"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export DSKBENCH_GIT_COMMIT="${DSKBENCH_GIT_COMMIT:-$(cat .devcarry/commit 2>/dev/null)}"

step() {
    local name="$1" limit="$2"
    shift 2
    local t0=$SECONDS
    echo "$(date -u +%H:%M:%S) start $name (limit ${limit}s)" >>"$out/steps.log"
    timeout --kill-after=20 "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    echo "$(date -u +%H:%M:%S) end   $name rc=$rc wall_s=$((SECONDS - t0))" >>"$out/steps.log"
    return $rc
}

#!/usr/bin/env bash
# A run beside another process on the same GPU, into OUT:
#
#   bash scripts/evidence/shared_gpu.sh OUT
#
#   busy        a second process keeps the GPU busy (back-to-back fp32 matrix products) for BUSY_SECONDS
#               (default 150), started first; its PID goes to OUT/busy.pid
#   exclusive   `dskbench run --kernel rmsnorm --quick --seed 7 --exclusive` beside it: expected to refuse
#               (exit 2, one line naming the other process) and to write no results
#   beside      the same run without --exclusive: a warning at the start, the environment record's
#               `shared_gpu` finding, and each result timed beside the other process flagged `shared_gpu`
#   waited      the same run with --wait-exclusive (BUSY_SECONDS + 120): it waits for the other process
#               to end, says which one it waits for, then runs with no result flagged
#   summary     per results file: the environment record's finding and how many results are flagged
#
# Each command's output is in OUT/NAME.log, its exit code in OUT/NAME.rc. One GPU: the first of
# CUDA_VISIBLE_DEVICES, else GPU 0. EVIDENCE_DRY_RUN=1 prints the three dskbench runs instead (nothing runs).
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ $# -ne 1 ]; then
    echo "usage: bash scripts/evidence/shared_gpu.sh OUT" >&2
    exit 2
fi
mkdir -p "$1" && out="$(cd "$1" && pwd)" || exit 1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"
CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES%%,*}"
busy_s="${BUSY_SECONDS:-150}"
subset=(--kernel rmsnorm --quick --seed 7)
if [ "${EVIDENCE_DRY_RUN:-0}" = 1 ]; then
    echo "run exclusive: python3 -m dskbench run ${subset[*]} --exclusive --out $out/exclusive.jsonl"
    echo "run beside: python3 -m dskbench run ${subset[*]} --out $out/beside.jsonl"
    echo "run waited: python3 -m dskbench run ${subset[*]} --wait-exclusive $((busy_s + 120)) --out $out/waited.jsonl"
    exit 0
fi

python3 - "$busy_s" >"$out/busy.log" 2>&1 <<'EOF' &
import sys, time
import torch
a = torch.randn(8192, 8192, device="cuda")
end = time.time() + float(sys.argv[1])
n = 0
while time.time() < end:
    a @ a
    torch.cuda.synchronize()
    n += 1
print(f"busy: {n} products of 8192 x 8192 fp32 in {sys.argv[1]} s")
EOF
busy=$!
echo "$busy" >"$out/busy.pid"
sleep 10  # its CUDA context exists, and NVML lists it

run() {  # run NAME ARGS...: one dskbench run, its log and exit code
    local name="$1"
    shift
    python3 -m dskbench run "${subset[@]}" "$@" >"$out/$name.log" 2>&1
    echo $? >"$out/$name.rc"
    echo "$name: exit $(cat "$out/$name.rc"), $(kill -0 "$busy" 2>/dev/null && echo "the other process still running" || echo "the other process ended")"
}
run exclusive --exclusive --out "$out/exclusive.jsonl"
run beside --out "$out/beside.jsonl"
run waited --wait-exclusive "$((busy_s + 120))" --out "$out/waited.jsonl"
wait "$busy"

python3 - "$out" <<'EOF' | tee "$out/summary.log"
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for name in ("exclusive", "beside", "waited"):
    rc = (out / f"{name}.rc").read_text().strip()
    f = out / f"{name}.jsonl"
    if not f.exists():
        first = next((ln for ln in (out / f"{name}.log").read_text().splitlines() if ln.strip()), "")
        print(f"{name}: exit {rc}, no results file; first line: {first}")
        continue
    env, n, flagged = None, 0, 0
    for line in f.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("record") == "environment":
            env = rec
            continue
        if rec.get("record") == "result":
            n += 1
            flagged += bool(rec.get("shared_gpu"))
    finding = [g.get("state") for g in (env or {}).get("shared_gpu") or []] if env else None
    print(f"{name}: exit {rc}, environment shared_gpu {finding}, {flagged} of {n} results flagged shared_gpu")
EOF

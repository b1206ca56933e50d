#!/usr/bin/env bash
# Fault injection on a GPU: faulty backends (tests/gpu_faults.py) beside rmsnorm's real ones, through
# `dskbench run` and `dskbench warm`. Usage: bash scripts/evidence/fault_injection.sh OUT_DIR [CASE_TIMEOUT_S]
# FAULT_GPUS=N shards the run and the warm-up over N GPUs (the --gpus path); FAULT_RUN_ARGS adds flags.
# A kernel's first case gets 120 s more (in-process JIT compilers such as CuTe DSL's and Triton's).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: fault_injection.sh OUT_DIR [CASE_TIMEOUT_S]}
limit=${2:-30}
mkdir -p "$out"
export DSKBENCH_EXTRA_ADAPTERS=tests.gpu_faults PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
backends=(--backend sgl_kernel --backend flashinfer --backend sglang_jit --backend sglang_triton
          --backend fault_oob --backend fault_spin --backend fault_alloc --backend fault_die)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
start=$(date +%s)
gpus=()
[ -n "${FAULT_GPUS:-}" ] && gpus=(--gpus "$FAULT_GPUS")
# shellcheck disable=SC2086
python3 -m dskbench run --kernel rmsnorm "${backends[@]}" --quick --sweep decode --seed 1 "${gpus[@]}" \
    ${FAULT_RUN_ARGS:-} --case-timeout "$limit" --first-use-allowance 120 --out "$out/fault-run.jsonl" \
    2> "$out/fault-run.log"
echo "run exit code $? in $(( $(date +%s) - start )) s" | tee -a "$out/summary.txt"
start=$(date +%s)
python3 -m dskbench warm --kernel rmsnorm "${backends[@]}" --sweep decode --jobs 4 "${gpus[@]}" \
    --case-timeout "$limit" --first-use-allowance 120 --out "$out/fault-warm.json" > "$out/fault-warm.txt" \
    2> "$out/fault-warm.log"
echo "warm exit code $? in $(( $(date +%s) - start )) s" | tee -a "$out/summary.txt"
python3 - "$out" <<'PY' | tee -a "$out/summary.txt"
import json, sys
from collections import Counter
from dskbench.results.io import read_runs
out = sys.argv[1]
(run,) = read_runs([f"{out}/fault-run.jsonl"])
env = run.environment
print("run:", env["settings"]["case_timeout"], "|", env["device"]["name"], "x", env["device"].get("count"))
if env.get("gpus"):
    print("  records per GPU:", dict(Counter(r.get("gpu_index") for r in run.results)))
counts = Counter((r["backend"]["name"], r["status"]) for r in run.results)
for (b, s), n in sorted(counts.items()):
    print(f"  {b:22} {s:8} {n}")
for r in run.results:
    if r["backend"]["name"].startswith("fault_") and r["status"] != "skipped":
        item_s = (r.get("stages") or {}).get("item_s")
        print(f"  {r['case_id']} {r['backend']['name']}: {r['status']}: {r['reason'][:150]}")
warm = json.load(open(f"{out}/fault-warm.json"))
print(f"warm: wall {warm['wall_s']} s, jobs {warm['jobs']}")
for r in warm["results"]:
    print(f"  {r['backend']:22} {r['status']:8} {(r['reason'] or '')[:150]}")
PY

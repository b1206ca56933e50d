#!/usr/bin/env bash
# The full-sweep evidence chain for a lent box of several GPUs (2 or 4), run detached by
# scripts/device_session.sh. Every step has its own time limit (steps.log: start, exit code, wall).
#
#   0. probe: GPUs, links, versions
#   1. in parallel: `dskbench warm` builds every JIT module on all GPUs but the last (CPU work, many at
#      once), while the last GPU runs asv at two commits + publish                       [issues 3, 4]
#   2. the full sm90 sweep on every GPU, twice, same seed: the pair is the run-to-run check, and the
#      first one's wall time is the sweep-speed figure with JIT caches warm              [issues 3, 5]
#   3. if time is left: run-to-run of small cold kernels with the L2 flush written vs read (one GPU
#      each), and the fidelity benchmark on a third GPU                                   [issue 3]
set -uo pipefail
cd "$(dirname "$0")/.."  # .devrun/ -> the tree's root
# shellcheck disable=SC1091
source scripts/device_lib.sh

ngpu=$(nvidia-smi -L | wc -l)
last=$((ngpu - 1))
first_gpus=$(seq -s, 0 $((last - 1)))

step probe 120 bash -c 'nvidia-smi; nvidia-smi topo -m; nproc; python3 -c "import torch, sgl_kernel, flashinfer, sglang; print(torch.__version__, torch.cuda.device_count(), sgl_kernel.__version__, flashinfer.__version__, sglang.__version__)"'

(
    export CUDA_VISIBLE_DEVICES=$first_gpus
    step warm "${WARM_SECONDS:-480}" python3 -m dskbench warm --gpus all --jobs "${WARM_JOBS:-16}" --out "$out/warm.json"
) &
(
    export CUDA_VISIBLE_DEVICES=$last
    if [ -d .devcarry/asv ]; then  # scripts/asv_thin_carry.sh: two commits without the history
        step asv "${ASV_SECONDS:-420}" bash scripts/device_asv_thin.sh .devcarry/asv "$out/asv"
    else  # a carried git bundle of main, cloned by device_session.sh
        step asv "${ASV_SECONDS:-420}" bash scripts/device_asv.sh "$root/.devrun/repo" "$out/asv"
    fi
) &
wait

# SWEEP_COSTS_FROM=results/...jsonl.gz: both sweeps cut the same way, by that file's measured times
costs=()
[ -n "${SWEEP_COSTS_FROM:-}" ] && costs=(--costs-from "$SWEEP_COSTS_FROM")
step sweep-a "${SWEEP_SECONDS:-600}" python3 -m dskbench run --gpus all --seed 7 "${costs[@]}" --out "$out/sweep-a.jsonl"
step sweep-b "${SWEEP_SECONDS:-600}" python3 -m dskbench run --gpus all --seed 7 "${costs[@]}" --out "$out/sweep-b.jsonl"

r2r=(--sweep decode --seed 7 --kernel fused_add_rmsnorm --kernel silu_and_mul --kernel moe_align_block_size
     --kernel apply_rope_with_cos_sin_cache_inplace --kernel dsv3_fused_a_gemm --kernel sgl_per_token_group_quant_fp8)
for flush in write read; do
    (
        export CUDA_VISIBLE_DEVICES=$([ "$flush" = write ] && echo 0 || echo 1)
        step "r2r-$flush-1" 200 python3 -m dskbench run --flush "$flush" "${r2r[@]}" --out "$out/r2r-$flush-1.jsonl"
        step "r2r-$flush-2" 200 python3 -m dskbench run --flush "$flush" "${r2r[@]}" --out "$out/r2r-$flush-2.jsonl"
    ) &
done
if [ "$ngpu" -ge 3 ]; then
    ( export CUDA_VISIBLE_DEVICES=2; step fidelity 300 python3 scripts/fidelity.py --out "$out/fidelity.json" ) &
fi
wait

date -u +%H:%M:%S >"$root/.devrun/chain.done"

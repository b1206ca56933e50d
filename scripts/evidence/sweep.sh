#!/usr/bin/env bash
# The full-sweep evidence on one GPU host (one or more GPUs of one model), into OUT:
#
#   bash scripts/evidence/sweep.sh OUT
#
#   probe     GPUs, links, CPU count, library versions
#   warm      `dskbench warm`: every JIT module built before anything is timed (all GPUs but the last
#             when there are two or more, while the last one runs asv at two commits: asv_two_commits.sh)
#   sweep-a   the full sweep (`dskbench run --gpus all --seed 7`), cold L2, default budget
#   sweep-b   the same again at once: run-to-run, with every cache warm
#   r2r-*     run-to-run of small cold decode kernels with the L2 flush written, then read (`--flush`)
#   fidelity  dskbench fidelity: our timer against CUPTI and Triton's do_bench / do_bench_cudagraph
#   insitu    dskbench insitu: one decoder layer of sweep-a's picks in one CUDA graph against
#             the sum of their isolated times
#   summaries dskbench stats and dskbench run-to-run over the files above (CPU)
#
# Steps are resumable (steps.sh): run the same command into the same OUT again to go on. Time limits per
# step: WARM_SECONDS, ASV_SECONDS, SWEEP_SECONDS, R2R_SECONDS, FIDELITY_SECONDS, INSITU_SECONDS. SWEEP_COSTS_FROM=FILE
# cuts both sweeps by an earlier sweep's measured times (`--costs-from`).
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ $# -ne 1 ]; then
    echo "usage: bash scripts/evidence/sweep.sh OUT" >&2
    exit 2
fi
# shellcheck source=steps.sh
source scripts/evidence/steps.sh "$1" || exit $?
n=${#gpus[@]}
if [ "$n" -lt 1 ]; then
    echo "sweep.sh: no GPU found (nvidia-smi -L lists none; EVIDENCE_GPUS=N to say how many)" >&2
    exit 2
fi
all=$(IFS=,; echo "${gpus[*]}")

step probe 120 bash -c 'nvidia-smi; nvidia-smi topo -m; nproc; python3 -m pip list 2>/dev/null | grep -iE "^(torch|triton|sglang|sglang-kernel|flashinfer-python|apache-tvm-ffi|asv) "'

if [ "$n" -ge 2 ]; then
    (
        export CUDA_VISIBLE_DEVICES="${all%,*}"
        step warm "${WARM_SECONDS:-1800}" python3 -m dskbench warm --gpus all --out "$out/warm.json"
    ) &
    (
        export CUDA_VISIBLE_DEVICES="$(gpu $((n - 1)))"
        step asv "${ASV_SECONDS:-1800}" bash scripts/evidence/asv_two_commits.sh "$out/asv"
    ) &
    wait
else
    step warm "${WARM_SECONDS:-3600}" python3 -m dskbench warm --gpus all --out "$out/warm.json"
    step asv "${ASV_SECONDS:-1800}" bash scripts/evidence/asv_two_commits.sh "$out/asv"
fi

costs=()
[ -n "${SWEEP_COSTS_FROM:-}" ] && costs=(--costs-from "$SWEEP_COSTS_FROM")
for run in a b; do
    step "sweep-$run" "${SWEEP_SECONDS:-7200}" python3 -m dskbench run --gpus all --seed 7 "${costs[@]}" \
        --resume --out "$out/sweep-$run.jsonl"
done

r2r=(--sweep decode --seed 7 --kernel fused_add_rmsnorm --kernel silu_and_mul --kernel moe_align_block_size
     --kernel apply_rope_with_cos_sin_cache_inplace --kernel dsv3_fused_a_gemm --kernel sgl_per_token_group_quant_fp8)
r2r_pair() {  # r2r_pair FLUSH: two runs of the same cases
    for i in 1 2; do
        step "r2r-$1-$i" "${R2R_SECONDS:-900}" python3 -m dskbench run --flush "$1" "${r2r[@]}" \
            --resume --out "$out/r2r-$1-$i.jsonl"
    done
}
if [ "$n" -ge 2 ]; then  # one GPU each, at the same time
    ( export CUDA_VISIBLE_DEVICES="$(gpu 0)"; r2r_pair write ) &
    ( export CUDA_VISIBLE_DEVICES="$(gpu 1)"; r2r_pair read ) &
    if [ "$n" -ge 3 ]; then
        ( export CUDA_VISIBLE_DEVICES="$(gpu 2)"; step fidelity "${FIDELITY_SECONDS:-900}" python3 -m dskbench fidelity --out "$out/fidelity.json" ) &
    fi
    wait
else
    r2r_pair write
    r2r_pair read
fi
(
    export CUDA_VISIBLE_DEVICES="$(gpu 0)"
    [ "$n" -lt 3 ] && step fidelity "${FIDELITY_SECONDS:-900}" python3 -m dskbench fidelity --out "$out/fidelity.json"
    step insitu "${INSITU_SECONDS:-900}" python3 -m dskbench insitu "$out/sweep-a.jsonl" --out "$out/insitu-layer.json"
)

for run in a b; do
    step "sweep-$run-stats" 300 python3 -m dskbench stats "$out/sweep-$run.jsonl" --json "$out/sweep-$run-stats.json"
done
step r2r-sweep 300 python3 -m dskbench run-to-run "$out/sweep-a.jsonl" "$out/sweep-b.jsonl" --json "$out/r2r-sweep.json"
for flush in write read; do
    step "r2r-flush-$flush" 300 python3 -m dskbench run-to-run "$out/r2r-$flush-1.jsonl" "$out/r2r-$flush-2.jsonl" \
        --json "$out/r2r-flush-$flush.json"
done
echo "sweep.sh: done; $out/steps.log lists each step's exit code and wall time"

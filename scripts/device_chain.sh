#!/usr/bin/env bash
# The evidence chain run detached by scripts/device_session.sh on a lent 2-GPU H200 box.
# Every step has its own time limit and writes under .devrun/out; a failing step does not stop the
# next. steps.log says when each step started, how it ended and how long it took.
#
#   0. probe: GPUs, links, versions
#   1. in parallel, one GPU each (and the comm JIT modules building on the CPU):
#        GPU0: run-to-run pair (decode subset, default budget, same seed)            [issue 3]
#        GPU1: fidelity vs CUPTI, then asv at two commits + publish                  [issues 3, 4]
#   2. comm: all-reduce backends vs NCCL at TP=2 (torchrun, one process per GPU)     [issue 7]
#   3. sweep: the full sm90 sweep, sharded over both GPUs, resumable                 [issues 3, 5, 7]
#   4. the in-situ layer check on the sweep's picks (GPU0)                          [issue 6]
#      and the JIT caches saved for the next machine (xz, CPU only, niced)
#   5. sharding speed-up: one decode subset on 1 GPU, then on 2                       [issue 7]
# The short steps come before the sweep: a sweep cut off by the device budget still leaves a
# resumable partial file, the others would leave nothing.
set -uo pipefail
cd "$(dirname "$0")/.."  # .devrun/ -> the tree's root
# shellcheck disable=SC1091
source scripts/device_lib.sh

r2r_kernels=(--kernel fused_add_rmsnorm --kernel silu_and_mul --kernel moe_align_block_size
             --kernel apply_rope_with_cos_sin_cache_inplace --kernel moe_fused_gate --kernel dsv3_fused_a_gemm
             --kernel sgl_per_token_group_quant_fp8)
shard_kernels=(--kernel rmsnorm --kernel silu_and_mul --kernel fused_add_rmsnorm --kernel moe_align_block_size)

step probe 120 bash -c 'nvidia-smi; nvidia-smi topo -m; python3 -c "import torch, sgl_kernel, flashinfer, sglang; print(torch.__version__, torch.cuda.device_count(), sgl_kernel.__version__, flashinfer.__version__, sglang.__version__)"'

# the communication backends' JIT modules (FlashInfer trtllm_comm, sglang all-reduce) build on the CPU
# while the single-GPU steps below run; comm_bench.py's ranks then find them built (file-locked builds)
(
    nice -n 10 python3 -c "from flashinfer.comm.trtllm_ar import get_trtllm_comm_module; get_trtllm_comm_module()" >"$out/precompile-flashinfer-comm.log" 2>&1
    echo "$(date -u +%H:%M:%S) precompiled flashinfer comm rc=$?" >>"$out/steps.log"
) &
(
    nice -n 10 python3 -c "import torch; from sglang.jit_kernel import all_reduce as ar; ar._init_communicator(); ar._init_ipc_manager(); ar.get_all_reduce_module(torch.bfloat16, 2)" >"$out/precompile-sglang-ar.log" 2>&1
    echo "$(date -u +%H:%M:%S) precompiled sglang all-reduce rc=$?" >>"$out/steps.log"
) &

(
    export CUDA_VISIBLE_DEVICES=0
    step r2r-1 200 python3 -m dskbench run --sweep decode --seed 7 "${r2r_kernels[@]}" --out "$out/r2r-1.jsonl"
    step r2r-2 200 python3 -m dskbench run --sweep decode --seed 7 "${r2r_kernels[@]}" --out "$out/r2r-2.jsonl"
) &
(
    export CUDA_VISIBLE_DEVICES=1
    step fidelity 240 python3 scripts/fidelity.py --out "$out/fidelity.json"
    step asv 300 bash scripts/device_asv.sh "$root/.devrun/repo" "$out/asv"
) &
wait

# one torchrun per backend (a hang loses only that backend), safest first
step comm 420 python3 scripts/comm_bench.py --nproc 2 --quick --case-timeout 120 --setup-timeout 240 --out "$out/comm-tp2.jsonl"

t_sweep=$SECONDS
# resume a sweep committed earlier: SWEEP_RESUME_FROM=results/<dir>/sweep-full.jsonl.gz
if [ -n "${SWEEP_RESUME_FROM:-}" ] && [ ! -s "$out/sweep-full.jsonl" ]; then
    gzip -dc "$SWEEP_RESUME_FROM" >"$out/sweep-full.jsonl"
fi
step sweep "${SWEEP_SECONDS:-720}" python3 -m dskbench run --gpus 2 --resume --out "$out/sweep-full.jsonl"
if [ "$(wc -l <"$out/sweep-full.jsonl" 2>/dev/null || echo 0)" -lt 50 ]; then
    # --gpus 2 failed early (first run of the sharding code on GPUs): shard by hand instead, half the
    # kernels per GPU, each a plain one-GPU sweep
    mapfile -t names < <(python3 -c "from dskbench.cli import _registry_and_shapes as r; print('\n'.join(sorted(r()[0])))")
    half=$(( ${#names[@]} / 2 ))
    left=$(( ${SWEEP_SECONDS:-720} - (SECONDS - t_sweep) ))
    [ "$left" -lt 60 ] && left=60
    ( export CUDA_VISIBLE_DEVICES=0; step sweep-gpu0 "$left" python3 -m dskbench run --resume \
        $(printf -- '--kernel %s ' "${names[@]:0:$half}") --out "$out/sweep-full-gpu0.jsonl" ) &
    ( export CUDA_VISIBLE_DEVICES=1; step sweep-gpu1 "$left" python3 -m dskbench run --resume \
        $(printf -- '--kernel %s ' "${names[@]:$half}") --out "$out/sweep-full-gpu1.jsonl" ) &
    wait
fi

(
    export CUDA_VISIBLE_DEVICES=0
    picks=("$out"/sweep-full*.jsonl)
    [ -s "${picks[0]}" ] || picks=(results/h200-2026-11-21/sweep-quick.jsonl.gz results/h200-2026-11-21/r2r-1.jsonl.gz)
    step insitu 180 python3 scripts/insitu_layer.py "${picks[@]}" --out "$out/insitu-layer.json"
) &
(
    cd "$HOME" && nice -n 19 tar -cf - --ignore-failed-read .cache/flashinfer .cache/tvm-ffi .triton/cache 2>/dev/null \
        | nice -n 19 xz -9 -T1 | split -b 15M - "$out/jitcache.tar.xz.part-"
    echo "$(date -u +%H:%M:%S) saved JIT caches" >>"$out/steps.log"
) &
wait

step shard-1gpu 240 python3 -m dskbench run --quick --sweep decode --gpus 1 --seed 7 "${shard_kernels[@]}" --out "$out/shard-1gpu.jsonl"
step shard-2gpu 240 python3 -m dskbench run --quick --sweep decode --gpus 2 --seed 7 "${shard_kernels[@]}" --out "$out/shard-2gpu.jsonl"

date -u +%H:%M:%S >"$root/.devrun/chain.done"

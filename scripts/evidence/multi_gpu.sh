#!/usr/bin/env bash
# Evidence that needs two or more GPUs of one host, into OUT:
#
#   bash scripts/evidence/multi_gpu.sh OUT
#
#   probe       GPUs, links (NVLink or PCIe), library versions
#   comm        dskbench comm: all-reduce backends against NCCL at TP = the number of GPUs, and
#               all-reduce + residual + RMSNorm fused against NCCL + fused_add_rmsnorm (one torchrun per
#               backend, each with its own limits)
#   shard-1gpu  one decode subset on one GPU, then the same sharded over all of them (`--gpus all`):
#   shard-ngpu  the sharding speed-up
#
# Steps are resumable (steps.sh): run the same command into the same OUT again to go on. Time limits per
# step: COMM_SECONDS, SHARD_SECONDS. COMM_ARGS replaces `dskbench comm`'s default arguments (`--quick`).
# NVLink multicast (NCCL's NVLS) is the host's default; DSKBENCH_NO_MULTICAST=1 turns it off for
# `dskbench comm`'s ranks (the results' environment record says which).
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ $# -ne 1 ]; then
    echo "usage: bash scripts/evidence/multi_gpu.sh OUT" >&2
    exit 2
fi
# shellcheck source=steps.sh
source scripts/evidence/steps.sh "$1" || exit $?
n=${#gpus[@]}
if [ "$n" -lt 2 ]; then
    echo "multi_gpu.sh: needs two or more GPUs, found $n (nvidia-smi -L; EVIDENCE_GPUS=N to say how many)" >&2
    exit 2
fi
export CUDA_VISIBLE_DEVICES
CUDA_VISIBLE_DEVICES=$(IFS=,; echo "${gpus[*]}")

step probe 120 bash -c 'nvidia-smi; nvidia-smi topo -m; python3 -m pip list 2>/dev/null | grep -iE "^(torch|triton|sglang|sglang-kernel|flashinfer-python|apache-tvm-ffi) "'

read -ra comm_args <<<"${COMM_ARGS:---quick}"
step comm "${COMM_SECONDS:-3600}" python3 -m dskbench comm --nproc "$n" "${comm_args[@]}" --resume \
    --out "$out/comm-tp$n.jsonl"

subset=(--quick --sweep decode --seed 7 --kernel rmsnorm --kernel silu_and_mul --kernel fused_add_rmsnorm
        --kernel moe_align_block_size)
step shard-1gpu "${SHARD_SECONDS:-1800}" python3 -m dskbench run --gpus 1 "${subset[@]}" --resume --out "$out/shard-1gpu.jsonl"
step shard-ngpu "${SHARD_SECONDS:-1800}" python3 -m dskbench run --gpus all "${subset[@]}" --resume --out "$out/shard-${n}gpu.jsonl"
for f in shard-1gpu "shard-${n}gpu"; do
    step "$f-stats" 300 python3 -m dskbench stats "$out/$f.jsonl" --json "$out/$f-stats.json"
done
echo "multi_gpu.sh: done; $out/steps.log lists each step's exit code and wall time"

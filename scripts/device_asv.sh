#!/usr/bin/env bash
# asv on the GPU box at two real commits, then `asv publish`, and the wall-clock cost of asv against
# `dskbench run` over the same cases.
#   bash scripts/device_asv.sh REPO DEST
# REPO: a git clone with history (device_session.sh clones the carried .devcarry/repo.bundle); its
# HEAD~1 and HEAD are measured, each checked out so that asv runs that commit's suite and dskbench.
# The stack comes from the existing interpreter (`-E existing`); asv drops PYTHONPATH, so the bundle's
# site folder is passed as ASV_PYTHONPATH. DEST receives results/asv, the published site and a log.
set -uo pipefail
repo="$(cd "${1:?repo}" && pwd)"
dest="${2:?dest}"
mkdir -p "$dest"
log="$dest/asv.log"
cd "$repo" || exit 1
git checkout -q main
export DSKBENCH_ASV_SWEEP=decode DSKBENCH_ASV_KERNELS="${DSKBENCH_ASV_KERNELS:-rmsnorm,silu_and_mul}" DSKBENCH_ASV_QUICK=1
IFS=, read -ra kernels <<<"$DSKBENCH_ASV_KERNELS"
kernel_args=()
for k in "${kernels[@]}"; do kernel_args+=(--kernel "$k"); done
machine="$(PYTHONPATH="$repo:${GPU_SITE:-}" python3 -m dskbench.asv_machine)"
echo "machine: $machine" >>"$log"
for commit in $(git rev-parse main~1 main); do
    git checkout -q "$commit"
    t0=$(date +%s.%N)
    PYTHONPATH="$repo:${GPU_SITE:-}" ASV_PYTHONPATH="$repo:${GPU_SITE:-}" DSKBENCH_GIT_COMMIT="$commit" \
        asv run --machine "$machine" -E existing:python3 --set-commit-hash "$commit" --show-stderr >>"$log" 2>&1
    echo "asv run $commit rc=$? wall_s=$(python3 -c "print(round($(date +%s.%N) - $t0, 1))")" | tee -a "$log"
    cp -r results/asv "$dest/" 2>>"$log"  # now: a time limit may end this script before the next commit
    cp -r results/asv-jsonl "$dest/" 2>/dev/null
    if [ "$commit" != "$(git rev-parse main)" ]; then  # once, between the two: the same cases without asv
        t0=$(date +%s.%N)
        PYTHONPATH="$repo:${GPU_SITE:-}" python3 -m dskbench run --quick --sweep decode \
            "${kernel_args[@]}" --out "$dest/same-as-asv.jsonl" >>"$log" 2>&1
        echo "dskbench run (same cases) rc=$? wall_s=$(python3 -c "print(round($(date +%s.%N) - $t0, 1))")" | tee -a "$log"
    fi
done
git checkout -q main
asv publish >>"$log" 2>&1
echo "asv publish rc=$?" | tee -a "$log"
PYTHONPATH="$repo:${GPU_SITE:-}" python3 -m dskbench.asv_offline results/asv-html >>"$log" 2>&1  # no CDN on the box
cp -r results/asv results/asv-html "$dest/" 2>>"$log"
cp -r results/asv-jsonl "$dest/" 2>/dev/null
exit 0

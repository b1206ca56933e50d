#!/usr/bin/env bash
# asv on the GPU box at HEAD~1 and HEAD without the repository's history (see scripts/asv_thin_carry.sh,
# which makes CARRY here), then `dskbench run` over the same cases for asv's overhead. Publish the
# results where the full repository is (`asv publish` walks the branch).
#   bash scripts/device_asv_thin.sh CARRY DEST      e.g. .devcarry/asv .devrun/out/asv
# Each commit's tree is this tree without results/ (HEAD), or that plus CARRY/prev.patch (HEAD~1), with
# CARRY/git as its .git; asv runs the commit's own suite and dskbench from it, the stack from the
# existing interpreter (`-E existing`; asv drops PYTHONPATH, so it is passed as ASV_PYTHONPATH).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
carry="$(cd "${1:?carry}" && pwd)"
dest="$(mkdir -p "${2:?dest}" && cd "$2" && pwd)"
log="$dest/asv.log"
python="${ASV_PYTHON:-python3}"
read -r old new < <(tr '\n' ' ' <"$carry/commits")
export DSKBENCH_ASV_SWEEP="${DSKBENCH_ASV_SWEEP:-decode}" DSKBENCH_ASV_KERNELS="${DSKBENCH_ASV_KERNELS:-rmsnorm,silu_and_mul}"
export DSKBENCH_ASV_QUICK="${DSKBENCH_ASV_QUICK:-1}"
work="${ASV_WORK:-/tmp/dskbench-asv}"
rm -rf "$work"
mkdir -p "$work"

tree() {  # tree COMMIT DIR: that commit's files (results/ empty) with the thin git dir
    mkdir -p "$2/results"
    tar -C "$root" --exclude=./results --exclude=./.git --exclude=./.gpu-bundle --exclude=./.devcarry \
        --exclude=./.devrun --exclude=./.venv --exclude=./.jitcache --exclude=./out -cf - . | tar -C "$2" -xf -
    cp -r "$carry/git" "$2/.git"
    git --git-dir "$2/.git" config core.bare false
    if [ "$1" = "$old" ]; then
        (cd "$2" && git apply --whitespace=nowarn "$carry/prev.patch") || return 1
    fi
}

kernel_args=()
IFS=, read -ra kernels <<<"$DSKBENCH_ASV_KERNELS"
for k in "${kernels[@]}"; do kernel_args+=(--kernel "$k"); done
machine="$(PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" "$python" -m dskbench.asv_machine)"
echo "machine: $machine" >>"$log"
for commit in "$old" "$new"; do
    dir="$work/$commit"
    if ! tree "$commit" "$dir" >>"$log" 2>&1; then
        echo "asv: could not make the tree of $commit" | tee -a "$log"
        continue
    fi
    t0=$(date +%s.%N)
    (cd "$dir" && PYTHONPATH="$dir${PYTHONPATH:+:$PYTHONPATH}" ASV_PYTHONPATH="$dir${PYTHONPATH:+:$PYTHONPATH}" \
        DSKBENCH_GIT_COMMIT="$commit" asv run --machine "$machine" -E "existing:$(command -v "$python")" \
        --set-commit-hash "$commit" --show-stderr >>"$log" 2>&1)
    echo "asv run $commit rc=$? wall_s=$(python3 -c "print(round($(date +%s.%N) - $t0, 1))")" | tee -a "$log"
    cp -r "$dir/results/asv" "$dir/results/asv-jsonl" "$dest/" 2>/dev/null  # after each commit: a limit may cut the next
done
t0=$(date +%s.%N)
(cd "$work/$new" && PYTHONPATH="$work/$new${PYTHONPATH:+:$PYTHONPATH}" "$python" -m dskbench run --quick \
    --sweep "$DSKBENCH_ASV_SWEEP" "${kernel_args[@]}" --out "$dest/same-as-asv.jsonl" >>"$log" 2>&1)
echo "dskbench run (same cases) rc=$? wall_s=$(python3 -c "print(round($(date +%s.%N) - $t0, 1))")" | tee -a "$log"
exit 0

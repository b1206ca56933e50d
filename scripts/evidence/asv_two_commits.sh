#!/usr/bin/env bash
# asv at two commits of this checkout (default HEAD~1 and HEAD), `dskbench run` over the same cases for
# asv's cost against ours, and the published site (offline: no CDN). Into DEST:
#
#   bash scripts/evidence/asv_two_commits.sh DEST [OLD NEW]
#
# Each commit runs from its own clone in a scratch folder (`git clone --shared`: the checkout itself is
# left as it is), with the stack of the Python that runs this (`asv run -E existing`; asv drops
# PYTHONPATH, so each clone is passed as ASV_PYTHONPATH). DEST receives asv/ (asv's results), asv-jsonl/
# (the measured JSON lines), asv-html/ (the site), same-as-asv.jsonl and asv.log. Which cases:
# DSKBENCH_ASV_SWEEP (default decode), DSKBENCH_ASV_KERNELS (default rmsnorm,silu_and_mul),
# DSKBENCH_ASV_QUICK (default 1). ASV_PYTHON: the interpreter (default python3); ASV_WORK: the scratch
# folder (default a new temporary one, removed at the end).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
if [ $# -ne 1 ] && [ $# -ne 3 ]; then
    echo "usage: bash scripts/evidence/asv_two_commits.sh DEST [OLD NEW]" >&2
    exit 2
fi
old_ref="${2:-HEAD~1}" new_ref="${3:-HEAD}"
if ! old=$(git -C "$root" rev-parse --verify -q "$old_ref^{commit}") || ! new=$(git -C "$root" rev-parse --verify -q "$new_ref^{commit}"); then
    echo "asv_two_commits.sh: $old_ref or $new_ref is not a commit of $root (a shallow clone lacks HEAD~1)" >&2
    exit 2
fi
dest="$(mkdir -p "$1" && cd "$1" && pwd)" || exit 1
log="$dest/asv.log"
python="$(command -v "${ASV_PYTHON:-python3}")" || { echo "asv_two_commits.sh: no ${ASV_PYTHON:-python3}" >&2; exit 2; }
export DSKBENCH_ASV_SWEEP="${DSKBENCH_ASV_SWEEP:-decode}" DSKBENCH_ASV_KERNELS="${DSKBENCH_ASV_KERNELS:-rmsnorm,silu_and_mul}"
export DSKBENCH_ASV_QUICK="${DSKBENCH_ASV_QUICK:-1}"
if [ -n "${ASV_WORK:-}" ]; then
    work="$ASV_WORK"
    mkdir -p "$work"
else
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
fi

clone() {  # clone COMMIT DIR: that commit's tree, with the history asv asks git about
    rm -rf "$2"
    git clone -q --shared --no-checkout "$root" "$2" && git -C "$2" checkout -q --detach "$1" \
        && git -C "$2" branch -q -f main "$1"  # asv.conf.json's branch: `asv publish` walks it
}

kernel_args=()
IFS=, read -ra kernels <<<"$DSKBENCH_ASV_KERNELS"
for k in "${kernels[@]}"; do kernel_args+=(--kernel "$k"); done
machine="$(PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" "$python" -m dskbench.frontends.asv.machine)" || exit 1
echo "machine: $machine" >>"$log"
for commit in "$old" "$new"; do
    dir="$work/$commit"
    if ! clone "$commit" "$dir" >>"$log" 2>&1; then
        echo "asv: could not clone $commit" | tee -a "$log"
        continue
    fi
    rm -rf "$dir/results/asv" "$dir/results/asv-jsonl"
    [ -d "$dest/asv" ] && mkdir -p "$dir/results" && cp -r "$dest/asv" "$dir/results/"  # the older commit's
    t0=$(date +%s.%N)
    (cd "$dir" && PYTHONPATH="$dir${PYTHONPATH:+:$PYTHONPATH}" ASV_PYTHONPATH="$dir${PYTHONPATH:+:$PYTHONPATH}" \
        "$python" -m asv run --machine "$machine" -E "existing:$python" \
        --set-commit-hash "$commit" --show-stderr >>"$log" 2>&1)
    echo "asv run $commit rc=$? wall_s=$("$python" -c "print(round($(date +%s.%N) - $t0, 1))")" | tee -a "$log"
    cp -r "$dir/results/asv" "$dir/results/asv-jsonl" "$dest/" 2>/dev/null  # after each commit: a limit may cut the next
done
t0=$(date +%s.%N)
(cd "$work/$new" && PYTHONPATH="$work/$new${PYTHONPATH:+:$PYTHONPATH}" "$python" -m dskbench run --quick \
    --sweep "$DSKBENCH_ASV_SWEEP" "${kernel_args[@]}" --out "$dest/same-as-asv.jsonl" >>"$log" 2>&1)
echo "dskbench run (same cases) rc=$? wall_s=$("$python" -c "print(round($(date +%s.%N) - $t0, 1))")" | tee -a "$log"
(cd "$work/$new" && "$python" -m asv publish >>"$log" 2>&1 \
    && PYTHONPATH="$root" "$python" -m dskbench.frontends.asv.offline results/asv-html >>"$log" 2>&1 \
    && rm -rf "$dest/asv-html" && cp -r results/asv-html "$dest/")
echo "asv publish rc=$?" | tee -a "$log"
exit 0

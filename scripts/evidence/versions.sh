#!/usr/bin/env bash
# One kernel library at two releases (or two builds) on one GPU, interleaved A, B, A, B, into OUT:
#
#   bash scripts/evidence/versions.sh OUT SPEC_A SPEC_B [dskbench run options...]
#   e.g. bash scripts/evidence/versions.sh out/fi flashinfer-python==0.6.14 ./wheels/flashinfer_python-0.7.0-py3-none-any.whl --kernel rmsnorm
#
#   probe      the GPU, CPU count, library versions
#   A-1 B-1 A-2 B-2   each: `pip install --no-deps --force-reinstall SPEC`, then `dskbench run --seed 7`
#              with the options given (default: the quick sweep) into OUT/<A|B>-<n>.jsonl; every run's
#              environment record names the versions it ran with
#   summaries  dskbench compare A-1 A-2 -- B-1 B-2 (two runs a side: each case's own run-to-run floor),
#              and dskbench run-to-run of A-1/A-2 and B-1/B-2 (CPU)
#
# Why interleaved: a box drifts (clocks, temperature, other tenants) over a job; A, B, A, B puts the same
# drift on both sides, so it is not taken for the library's change. A SPEC is whatever pip installs: a
# version from an index, a wheel file, a local build. `--no-deps` keeps torch and the rest as they are;
# the releases must run against the installed torch. Steps are resumable (steps.sh); time limit per run:
# VERSIONS_SECONDS (default 1800). The last step leaves SPEC_B installed.
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ $# -lt 3 ]; then
    echo "usage: bash scripts/evidence/versions.sh OUT SPEC_A SPEC_B [dskbench run options...]" >&2
    exit 2
fi
dest="$1" spec_a="$2" spec_b="$3"
shift 3
opts=("$@")
[ ${#opts[@]} -eq 0 ] && opts=(--quick)
# shellcheck source=steps.sh
source scripts/evidence/steps.sh "$dest" || exit $?
if [ "${#gpus[@]}" -lt 1 ]; then
    echo "versions.sh: no GPU found (nvidia-smi -L lists none; EVIDENCE_GPUS=N to say how many)" >&2
    exit 2
fi
export CUDA_VISIBLE_DEVICES="$(gpu 0)"

step probe 120 bash -c 'nvidia-smi; nproc; python3 -m pip list 2>/dev/null | grep -iE "^(torch|triton|sglang|sglang-kernel|flashinfer-python|apache-tvm-ffi) "'
for n in 1 2; do
    for side in A B; do
        spec="$spec_a"
        [ "$side" = B ] && spec="$spec_b"
        step "$side-$n" "${VERSIONS_SECONDS:-1800}" bash -c \
            'python3 -m pip install -q --no-deps --force-reinstall "$1" && shift && exec python3 -m dskbench run "$@"' \
            _ "$spec" "${opts[@]}" --seed 7 --resume --out "$out/$side-$n.jsonl"
    done
done
a="$out/A-1.jsonl" a2="$out/A-2.jsonl" b="$out/B-1.jsonl" b2="$out/B-2.jsonl"
step summaries 600 bash -c 'python3 -m dskbench compare "$1" "$2" -- "$3" "$4"; python3 -m dskbench run-to-run "$1" "$2"; python3 -m dskbench run-to-run "$3" "$4"' _ "$a" "$a2" "$b" "$b2"

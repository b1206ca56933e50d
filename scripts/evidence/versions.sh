#!/usr/bin/env bash
# One kernel library at two releases (or two builds) on one GPU, interleaved A, B, A, B, into OUT:
#
#   bash scripts/evidence/versions.sh OUT SPEC_A SPEC_B [dskbench run options...]
#   e.g. bash scripts/evidence/versions.sh out/fi flashinfer-python==0.6.14 ./wheels/flashinfer_python-0.7.0-py3-none-any.whl --kernel rmsnorm
#
#   probe      the GPU, CPU count, the versions python3 imports
#   A-1 B-1 A-2 B-2   each: install SPEC (scripts/evidence/install_spec.sh), then `dskbench run --seed 7`
#              with the options given (default: the quick sweep) into OUT/<A|B>-<n>.jsonl; every run's
#              environment record names the versions it ran with
#   summaries  dskbench compare A-1 A-2 -- B-1 B-2 (two runs a side: each case's own run-to-run floor),
#              and dskbench run-to-run of A-1/A-2 and B-1/B-2 (CPU)
#
# Why interleaved: a box drifts (clocks, temperature, other tenants) over a job; A, B, A, B puts the same
# drift on both sides, so it is not taken for the library's change.
#
# A SPEC is what pip installs: a version from an index (NAME==VERSION), a wheel file, a local build; or
# several of them separated by spaces (a release and a new dependency of it), or a folder: every *.whl in
# it. `--no-deps` keeps torch and the rest as they are; the releases must run against the installed torch.
# Where the stack is installed: by default `pip install --no-deps --force-reinstall` into python3's
# environment. When the stack lives in a folder on PYTHONPATH (`pip install --target`), an install into
# site-packages is shadowed by it: VERSIONS_PIP_TARGET=DIR installs into DIR (`--target DIR --upgrade
# --no-deps`, the old version's dist-info removed). VERSIONS_PIP_ARGS: more pip options (e.g. --no-index
# on a host without an index). After each install the step prints the version python3 finds and where its
# modules import from, and fails, without running dskbench, unless it is the version the SPEC names.
#
# FlashInfer's JIT cache: each side gets its own FLASHINFER_WORKSPACE_BASE, OUT/jit-A and OUT/jit-B
# (FlashInfer 0.6 and 0.7 keep compiled modules under $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer, by
# default in the home folder), so B never loads a module A compiled, even where two builds share a version
# string, and A-2 reuses what A-1 compiled. The cubins FlashInfer downloads land there too, unless
# FLASHINFER_CUBIN_DIR names a folder of them.
#
# Steps are resumable (steps.sh); time limit per run: VERSIONS_SECONDS (default 1800). The last step
# leaves SPEC_B installed.
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

step probe 120 bash -c 'nvidia-smi; nproc; python3 -c "
import importlib.metadata as md
for n in (\"torch\", \"triton\", \"sglang\", \"sglang-kernel\", \"flashinfer-python\", \"apache-tvm-ffi\"):
    try:
        d = md.distribution(n)
        print(n, d.version, d.locate_file(\"\"))
    except md.PackageNotFoundError:
        print(n, \"-\")
"'
for n in 1 2; do
    for side in A B; do
        spec="$spec_a"
        [ "$side" = B ] && spec="$spec_b"
        step "$side-$n" "${VERSIONS_SECONDS:-1800}" env FLASHINFER_WORKSPACE_BASE="$out/jit-$side" bash -c \
            'bash scripts/evidence/install_spec.sh "$1" && shift && exec python3 -m dskbench run "$@"' \
            _ "$spec" "${opts[@]}" --seed 7 --resume --out "$out/$side-$n.jsonl"
    done
done
a="$out/A-1.jsonl" a2="$out/A-2.jsonl" b="$out/B-1.jsonl" b2="$out/B-2.jsonl"
step summaries 600 bash -c 'python3 -m dskbench compare "$1" "$2" -- "$3" "$4"; python3 -m dskbench run-to-run "$1" "$2"; python3 -m dskbench run-to-run "$3" "$4"' _ "$a" "$a2" "$b" "$b2"

#!/usr/bin/env bash
# One kernel library at two releases (or two builds) on one GPU, interleaved A, B, A, B, into OUT:
#
#   bash scripts/evidence/versions.sh OUT SPEC_A SPEC_B [dskbench run options...]
#   e.g. bash scripts/evidence/versions.sh out/fi flashinfer-python==0.6.14 ./wheels/flashinfer_python-0.7.0-py3-none-any.whl --kernel rmsnorm
#
#   probe              the GPU, CPU count, the versions python3 imports
#   install-A warm-A   SPEC_A installed once into its own folder, OUT/site-A (scripts/evidence/install_spec.sh,
#                      `pip install --target --no-deps`), then `dskbench warm` with the selection options
#                      given: that release's JIT builds, in parallel, before anything is timed
#   install-B warm-B   the same for SPEC_B, in OUT/site-B
#   A-1 B-1 A-2 B-2    each: `dskbench run --seed 7` with the options given (default: the quick sweep) and its
#                      side's folder first on PYTHONPATH, into OUT/<A|B>-<n>.jsonl; every run's environment
#                      record names the versions it ran with
#   summaries          dskbench compare A-1 A-2 -- B-1 B-2 (two runs a side: each case's own run-to-run
#                      floor), and dskbench run-to-run of A-1/A-2 and B-1/B-2 (CPU)
#
# Why interleaved: a box drifts (clocks, temperature, other tenants) over a job; A, B, A, B puts the same
# drift on both sides, so it is not taken for the library's change.
#
# Why a folder per side, not an install before each run: a JIT library (FlashInfer, through ninja) rebuilds
# a module whose sources are newer than it, and a reinstall gives every source a new time. Installed once,
# each release compiles once (in its warm step) and its runs load what it built.
#
# A SPEC is what pip installs: a version from an index (NAME==VERSION), a wheel file, a local build; or
# several of them separated by spaces (a release and a new dependency of it), or a folder: every *.whl in
# it. `--no-deps` keeps torch and the rest where they are; the releases must run against them. The side's
# folder goes before everything else on PYTHONPATH, so it wins over the library installed in site-packages
# or in a folder on PYTHONPATH. VERSIONS_PIP_ARGS: more pip options (e.g. --no-index on a host without an
# index). Each run step first checks that python3 finds the version the SPEC names in the side's folder,
# and measures nothing otherwise.
#
# FlashInfer's JIT cache: each side gets its own FLASHINFER_WORKSPACE_BASE, OUT/jit-A and OUT/jit-B
# (FlashInfer 0.6 and 0.7 keep compiled modules under $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer, by
# default in the home folder), so B never loads a module A compiled, even where two builds share a version
# string. The cubins FlashInfer downloads land there too, unless FLASHINFER_CUBIN_DIR names a folder of
# them.
#
# Steps are resumable (steps.sh). The runs start only once both sides are installed: when an install fails
# (a wheel not there yet, an index down), the plan says so and stops, and running it again goes on from
# there. The warm steps take the selection options (--quick, --kernel, --backend, --point, --tp, ...); a
# run-only option among the options makes them fail, and the runs then compile in their first launches.
# Time limit per run and per warm step: VERSIONS_SECONDS (default 1800).
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

side_env() {  # side_env A|B: the environment of that side's steps, into the array senv
    senv=("PYTHONPATH=$out/site-$1${PYTHONPATH:+:$PYTHONPATH}" "VERSIONS_PIP_TARGET=$out/site-$1"
        "FLASHINFER_WORKSPACE_BASE=$out/jit-$1")
}
spec_of() {
    if [ "$1" = A ]; then echo "$spec_a"; else echo "$spec_b"; fi
}
installed=1
for side in A B; do
    side_env "$side"
    step "install-$side" 1200 env "${senv[@]}" bash scripts/evidence/install_spec.sh "$(spec_of "$side")"
    if [ "${EVIDENCE_DRY_RUN:-0}" != 1 ] && ! grep -qxF "install-$side" "$out/steps.done" 2>/dev/null; then
        installed=0
        continue
    fi
    step "warm-$side" "${VERSIONS_SECONDS:-1800}" env "${senv[@]}" python3 -m dskbench warm "${opts[@]}"
done
if [ "$installed" = 0 ]; then
    echo "versions.sh: a side is not installed (see $out/install-*.log); run the plan again to go on" >&2
    exit 1
fi
for n in 1 2; do
    for side in A B; do
        side_env "$side"
        step "$side-$n" "${VERSIONS_SECONDS:-1800}" env "${senv[@]}" bash -c \
            'bash scripts/evidence/install_spec.sh --check "$1" && shift && exec python3 -m dskbench run "$@"' \
            _ "$(spec_of "$side")" "${opts[@]}" --seed 7 --resume --out "$out/$side-$n.jsonl"
    done
done
a="$out/A-1.jsonl" a2="$out/A-2.jsonl" b="$out/B-1.jsonl" b2="$out/B-2.jsonl"
step summaries 600 bash -c 'python3 -m dskbench compare "$1" "$2" -- "$3" "$4"; python3 -m dskbench run-to-run "$1" "$2"; python3 -m dskbench run-to-run "$3" "$4"' _ "$a" "$a2" "$b" "$b2"

#!/usr/bin/env bash
# On the lent GPU box (no network): install the wheel bundle, restore JIT caches carried from an
# earlier call, run a command, and save the JIT caches back to $OUT so the next call skips compiling.
#   source-free use:  bash scripts/device_run.sh <command...>
# Carry `.gpu-bundle` (and `.jitcache` when present). JIT caches: flashinfer, tvm-ffi (sglang JIT), Triton.
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
source .gpu-bundle/install.sh || exit 1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# the commit of the copied tree, for the results' environment record (set DSKBENCH_GIT_COMMIT when calling)
export DSKBENCH_GIT_COMMIT="${DSKBENCH_GIT_COMMIT:-}"
export TRITON_CACHE_DIR="$HOME/.triton/cache"
# the archive travels in parts of at most 15 MiB (the device tool returns files of at most 16 MiB)
if ls .jitcache/jitcache.tar.gz.part-* >/dev/null 2>&1; then
    cat .jitcache/jitcache.tar.gz.part-* | tar -xzf - -C "$HOME" && echo "device_run: restored JIT caches" >&2
fi
"$@"
rc=$?
if [ -n "${OUT:-}" ]; then
    (cd "$HOME" && tar -czf - --ignore-failed-read .cache/flashinfer .cache/tvm-ffi .triton/cache 2>/dev/null) \
        | split -b 15M - "$OUT/jitcache.tar.gz.part-"
    ls -la "$OUT"/jitcache.tar.gz.part-* >&2
fi
exit $rc

#!/usr/bin/env bash
# Drive a chain of device runs that outlives the device tool's 10-minute call limit.
#
#   bash scripts/device_session.sh start CHAIN SECONDS   set up, start CHAIN detached, then poll
#   bash scripts/device_session.sh poll SECONDS          wait for the chain; return what it wrote so far
#
# Why: one lent machine stays held while calls follow each other within its idle window, and a
# process started in its own session (setsid) keeps running between calls. So the whole evidence run
# (a sweep of thousands of cases, then fidelity, run-to-run, asv...) is one detached chain, and each
# tool call only waits and copies `.devrun/out` to $OUT (JSON lines gzipped: the tool returns files
# of at most 16 MiB). A call cut off at its limit loses nothing: the chain goes on, the next poll
# returns it. `.devrun/` is git-ignored, so the device keeps it between calls.
#
# Set up on a fresh machine: the wheel bundle (.gpu-bundle, carried), mtimes of the installed
# packages pushed into the past (ninja then accepts JIT objects compiled on an earlier machine:
# pip gives every installed source file the install time, newer than any carried object),
# JIT caches restored from .devcarry/jitcache.tar.xz.part-* (carried), and a git clone of
# .devcarry/repo.bundle for asv (the device's copy of the tree has no usable history).
set -uo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
run="$root/.devrun"
mkdir -p "$run/out"

setup() {
    # shellcheck disable=SC1091
    source .gpu-bundle/install.sh || return 1
    if [ ! -e "$GPU_SITE/.mtimes-past" ]; then
        find "$GPU_SITE" -exec touch -h -d '2000-01-01 00:00:00' {} + && touch "$GPU_SITE/.mtimes-past"
    fi
    if [ ! -e "$HOME/.dskbench-jit-restored" ] && ls .devcarry/jitcache.tar.xz.part-* >/dev/null 2>&1; then
        cat .devcarry/jitcache.tar.xz.part-* | xz -d | tar -xf - -C "$HOME" \
            && touch "$HOME/.dskbench-jit-restored" && echo "device_session: JIT caches restored" >&2
    fi
    if [ -e .devcarry/repo.bundle ] && [ ! -d "$run/repo" ]; then
        git clone -q .devcarry/repo.bundle "$run/repo" -b main && echo "device_session: repo clone at $(git -C "$run/repo" rev-parse --short HEAD)" >&2
    fi
}

export_out() {  # the tool returns a few files only: one archive, plus the JIT cache parts
    [ -n "${OUT:-}" ] || return 0
    tar -czf "$OUT/out.tar.gz" -C "$run" --exclude 'jitcache.tar.xz.part-*' out chain.log 2>/dev/null
    cp "$run"/out/jitcache.tar.xz.part-* "$OUT/" 2>/dev/null
    return 0
}

poll() {
    local until=$((SECONDS + ${1:-540}))
    while [ "$SECONDS" -lt "$until" ]; do
        [ -e "$run/chain.done" ] && break
        sleep 5
    done
    export_out
    if [ -e "$run/chain.done" ]; then echo "chain finished: $(cat "$run/chain.done")"; else echo "chain still running"; fi
    tail -n 25 "$run/out/steps.log" 2>/dev/null
}

case "${1:-}" in
    start)
        chain="${2:?chain script}"
        setup || exit 1
        rm -f "$run/chain.done"
        cp "$chain" "$run/chain.sh"  # the tree is re-synced on every call: run a copy
        setsid nohup bash "$run/chain.sh" >"$run/chain.log" 2>&1 </dev/null &
        echo "device_session: chain started (pid $!)"
        poll "${3:-540}"
        ;;
    poll) poll "${2:-540}" ;;
    *)
        echo "usage: $0 start CHAIN [SECONDS] | poll [SECONDS]" >&2
        exit 2
        ;;
esac

#!/usr/bin/env bash
# Set up a working environment in .venv (idempotent): torch, dskbench and its test tools.
# Sourced by scripts/test.sh and scripts/run.sh. On a GPU box with the GPU stack already installed
# (DSKBENCH_USE_SYSTEM_PYTHON=1), it uses the current interpreter instead.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ "${DSKBENCH_USE_SYSTEM_PYTHON:-0}" = 1 ]; then
    python3 -m pip install -q --no-deps -e . >/dev/null
    return 0 2>/dev/null || exit 0
fi
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
# shellcheck disable=SC1091
source .venv/bin/activate
stamp=.venv/.dskbench-setup
want="$(sha256sum pyproject.toml | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    # torch first, pinned: this machine's pip finds the CPU build on disk; unpinned would pull CUDA wheels.
    python -m pip install -q "torch==${DSKBENCH_TORCH:-2.13.0}"
    python -m pip install -q -e ".[test]"
    echo "$want" > "$stamp"
fi
# The browser test needs Debian's chromium (headless); install it when we may.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
        || echo "setup: could not install chromium; the browser test will be skipped" >&2
fi

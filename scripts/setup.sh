#!/usr/bin/env bash
# Set up a working environment (idempotent). Sourced by scripts/test.sh and scripts/run.sh.
#  - No NVIDIA GPU (`nvidia-smi -L` lists none): a .venv with torch (pinned), dskbench and its test tools
#    (pytest, ruff, asv, ...), from the package index pip is configured with. On Linux x86_64 PyPI's torch
#    is the CUDA build (several GB of nvidia-* wheels); for the CPU build (a few hundred MB) add PyTorch's CPU
#    index first: export PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
#  - An NVIDIA GPU: when this python3 already has pyproject's pinned GPU stack (torch, sglang-kernel,
#    flashinfer-python, sglang at the `gpu` extra's versions), dskbench is installed into it; otherwise
#    a .venv gets the `gpu` extra (the pinned stack, a large download) and, unless PIP_NO_INDEX is set,
#    the test tools.
#  - DSKBENCH_USE_SYSTEM_PYTHON=1: use this python3 whatever it has.
# Offline, pip reads PIP_NO_INDEX=1 and PIP_FIND_LINKS=DIR (a wheelhouse, scripts/wheelhouse.py); the
# install into an existing Python needs no index (no build isolation: its own setuptools builds it).
# Exports DSKBENCH_GPU (1 or 0). DSKBENCH_DRY_RUN=1 prints the installing commands instead.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
_step() {
    if [ "${DSKBENCH_DRY_RUN:-0}" = 1 ]; then echo "+ $*"; else "$@"; fi
}
DSKBENCH_GPU=0
if python3 -m dskbench.setup.stack gpu; then DSKBENCH_GPU=1; fi
export DSKBENCH_GPU
use_system="${DSKBENCH_USE_SYSTEM_PYTHON:-0}"
if [ "$DSKBENCH_GPU" = 1 ] && [ "$use_system" != 1 ] && python3 -m dskbench.setup.stack check >/dev/null 2>&1; then
    echo "setup: $(command -v python3) has the pinned GPU stack: installing dskbench into it" >&2
    use_system=1
elif [ "$DSKBENCH_GPU" = 1 ] && [ "$use_system" = 1 ] && ! python3 -m dskbench.setup.stack check >&2; then
    echo "setup: DSKBENCH_USE_SYSTEM_PYTHON=1: using it although it differs from the pinned stack" >&2
fi
if [ "$use_system" = 1 ]; then
    python3 -m dskbench.setup.stack tools  # its own setuptools builds dskbench: one line if it cannot
    _step python3 -m pip install -q --no-deps --no-build-isolation -e .
    return 0 2>/dev/null || exit 0
fi
if [ ! -x .venv/bin/python ]; then
    _step python3 -m venv .venv
fi
if [ "${DSKBENCH_DRY_RUN:-0}" = 1 ]; then
    echo "+ source .venv/bin/activate"
else
    # shellcheck disable=SC1091
    source .venv/bin/activate
fi
stamp=.venv/.dskbench-setup
if [ "$DSKBENCH_GPU" = 1 ]; then
    want="$(sha256sum pyproject.toml | cut -c1-16)-gpu"
    if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
        echo "setup: NVIDIA GPU found: installing pyproject's gpu extra (the pinned stack) into .venv" >&2
        _step python3 -m pip install -q -e ".[gpu]"
        # the test tools too, from an index (a wheelhouse built for the gpu extra does not carry them)
        if [ -z "${PIP_NO_INDEX:-}" ]; then _step python3 -m pip install -q -e ".[test]"; fi
        [ "${DSKBENCH_DRY_RUN:-0}" = 1 ] || echo "$want" > "$stamp"
    fi
else
    want="$(sha256sum pyproject.toml | cut -c1-16)"
    if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
        # torch first, pinned (DSKBENCH_TORCH=VERSION for another), so that the test extra's torch is met by
        # it. pip takes the build its index offers: with PyTorch's CPU index added, the CPU build
        # (2.13.0+cpu ranks above PyPI's 2.13.0); with PyPI alone, the CUDA build.
        torch_pin="torch==${DSKBENCH_TORCH:-2.13.0}"
        echo "setup: no NVIDIA GPU: installing $torch_pin, dskbench and its test tools into .venv (for torch's" \
            "CPU build, PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu)" >&2
        _step python3 -m pip install -q "$torch_pin"
        _step python3 -m pip install -q -e ".[test]"
        [ "${DSKBENCH_DRY_RUN:-0}" = 1 ] || echo "$want" > "$stamp"
    fi
fi
# The browser test needs Debian's chromium (headless); install it when we may.
if [ "${DSKBENCH_DRY_RUN:-0}" != 1 ] && ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] \
    && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
        || echo "setup: could not install chromium; the browser test will be skipped" >&2
fi

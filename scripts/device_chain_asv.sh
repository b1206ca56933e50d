#!/usr/bin/env bash
# A short chain for a single-GPU machine (scripts/device_session.sh start scripts/device_chain_asv.sh):
# the flashinfer block-FP8 layout probe, then asv at two commits + publish (scripts/device_asv.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
source scripts/device_lib.sh

step probe-fi-blockscale 90 python3 scripts/probe_fi_blockscale.py --out "$out/probe-fi-blockscale.json"
step asv "${ASV_SECONDS:-330}" bash scripts/device_asv.sh "$root/.devrun/repo" "$out/asv"
date -u +%H:%M:%S >"$root/.devrun/chain.done"

"""Which GPUs CUDA may use: CUDA_VISIBLE_DEVICES read one way everywhere (NVML lookups, shards, asv's
machine entry, the collective benchmarks)."""

from __future__ import annotations

import os
from collections.abc import Mapping


def visible_devices(environ: Mapping[str, str] | None = None) -> list[str] | None:
    """The CUDA_VISIBLE_DEVICES entries (indices, GPU- UUIDs or MIG ids), stripped, as CUDA reads them:
    up to the first empty entry. None when the variable is unset (every GPU is visible); [] when it is
    set but names none."""
    env = os.environ if environ is None else environ
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    tokens: list[str] = []
    for token in (t.strip() for t in raw.split(",")):
        if not token:
            break
        tokens.append(token)
    return tokens

"""One part of a sweep for one host of a job array: `dskbench run --shard K/N`.

Why: past one host, a scheduler (Slurm's job arrays, or any queue) starts N copies of the same command
line; each must measure a disjoint part of the same plan, and together all of it. Every copy plans the
whole sweep, cuts it into N parts by expected cost exactly as `--gpus` cuts a host's sweep over its GPUs
(a kernel a unit, a heavy kernel a unit per case, longest unit first onto the lightest part), and keeps
part K. The cut depends only on the plan, the settings and the cost model (the GPU model, or
`--costs-from`), so hosts of one GPU model agree without talking to each other. The kernels skipped at
planning are recorded by part 1 only. `dskbench report`, `compare` and `pick` read the parts' folder.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from dskbench.execution.items import WorkItem
from dskbench.execution.shard import shard_items

_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


class ShardSpecError(ValueError):
    """A --shard value that is not K/N with 1 <= K <= N; the message is one line."""


def parse_shard(spec: str) -> tuple[int, int]:
    m = _SPEC.match(spec or "")
    if not m:
        raise ShardSpecError(f"--shard {spec!r}: expected K/N, e.g. 2/8 (part K of N, counted from 1)")
    k, n = int(m.group(1)), int(m.group(2))
    if n < 1 or not 1 <= k <= n:
        raise ShardSpecError(f"--shard {spec!r}: K must be between 1 and N (N >= 1)")
    return k, n


def take_part(
    items: Sequence[WorkItem],
    skips: Sequence[dict[str, Any]],
    k: int,
    n: int,
    cost: Callable[[WorkItem], float],
) -> tuple[list[WorkItem], list[dict[str, Any]]]:
    """Part k (1-based) of n of a plan: its items in plan order, and the planning skips if k is 1."""
    parts, _loads = shard_items(items, n, cost)
    return parts[k - 1], list(skips) if k == 1 else []

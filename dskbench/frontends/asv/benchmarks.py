"""What benchmarks/bench_kernels.py needs beyond the shared plan and measurements: the suite's version,
asv's time limit for a kernel's setup_cache, and where the measured JSON lines are kept."""

from __future__ import annotations

import keyword
import os
import re
import socket
from collections.abc import Container
from pathlib import Path

from dskbench.execution.config import RunConfig
from dskbench.frontends.suite.measure import slug

# Bump when what a sample means changes: asv then drops older results of the benchmark
# (their `version` differs) instead of drawing a false step in the graphs.
SUITE_VERSION = "1"


# Attribute names asv reads from a benchmark's class *and module*; a kernel's class must not shadow them.
ASV_ATTRS = frozenset(
    "setup teardown setup_cache params param_names timeout version unit number repeat rounds "
    "sample_time warmup_time min_run_count timer pretty_name benchmark_name skip_params".split()
)


def class_name(kernel: str, taken: set[str], reserved: Container[str] = ()) -> str:
    """The asv suite's class for a kernel: its name with non-word characters as '_', prefixed `k_` where
    it would start with a digit, be a keyword, an asv attribute or a name in `reserved` (the suite
    module's own), numbered where `taken` holds it already (then added to `taken`)."""
    name = re.sub(r"\W", "_", kernel).strip("_") or "kernel"
    if name[0].isdigit() or keyword.iskeyword(name) or name.lower() in ASV_ATTRS or name in reserved:
        name = f"k_{name}"
    base, n = name, 2
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    taken.add(name)
    return name


def setup_cache_timeout(n_items: int, config: RunConfig) -> float:
    """asv's limit on one kernel's setup_cache: generous, since first calls JIT-compile (20 s seen)."""
    per = 5.0 if config.device == "cpu" else (15.0 if config.profile == "quick" else 40.0)
    if config.options.budget_s is not None:
        per = max(per, 3 * config.options.budget_s + 5)
    return 180.0 + per * n_items


def asv_jsonl_dir(checkout: Path) -> Path:
    """Where the asv suite keeps each setup_cache's JSON lines: <root>/results/asv-jsonl/<host>/, next
    to asv's results/asv. <root> is ASV_CONF_DIR (the folder asv ran from; asv sets it for managed
    environments only), else `checkout`, the folder holding benchmarks/; DSKBENCH_ASV_JSONL_DIR wins."""
    if os.environ.get("DSKBENCH_ASV_JSONL_DIR"):
        return Path(os.environ["DSKBENCH_ASV_JSONL_DIR"])
    root = Path(os.environ.get("ASV_CONF_DIR") or checkout)
    return root / "results" / "asv-jsonl" / slug(socket.gethostname())

"""The builds this box has done for its GPU and stack, so that `run --build-ahead` starts builders only
for the others.

Why: with warm JIT caches every build is a cache hit, but a builder still makes its case's inputs and
launches it, in processes of their own beside the measuring worker; on a box that has built them all
that is a sweep's worth of input making and GPU work spent again for nothing, and it slowed the
measuring of a warm main job. A build is remembered once its builder ended it `ok`; one skipped (a
backend not installed may be installed later), failed or wrong is tried again next time.

The memory belongs to the JIT caches it describes. One file per GPU architecture and stack (the
versions in setup/jit_cache.STACK) under $DSKBENCH_BUILD_MEMORY, else $XDG_CACHE_HOME/dskbench/builds,
else ~/.cache/dskbench/builds, holding the build keys and each cache folder's file count when it was
written. It is not used while every cache is empty (a fresh box, or one whose caches were cleared),
nor once any cache folder holds fewer files than it did (cleared in part, or another HOME's). A build
it names whose cache entry is gone anyway compiles in the measured case's first launch, which is
never timed: the memory can cost time, never a wrong number.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from dskbench.setup import jit_cache

REMEMBERED = ("ok",)


def memory_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get("DSKBENCH_BUILD_MEMORY"):
        return Path(env["DSKBENCH_BUILD_MEMORY"])
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dskbench" / "builds"


def memory_path(gpu_arch: str | None, stack: Mapping[str, Any], folder: Path | None = None) -> Path:
    """The memory file of this GPU architecture and stack."""
    digest = hashlib.sha256(json.dumps(dict(stack), sort_keys=True).encode()).hexdigest()[:12]
    return (folder or memory_dir()) / f"sm{(gpu_arch or 'none').replace('.', '')}-{digest}.json"


def cache_files(dirs: Mapping[str, Path]) -> dict[str, int]:
    return {name: jit_cache.count_files(d) for name, d in dirs.items()}


class BuildMemory:
    """The remembered build keys of one memory file; `add` then `save` to remember more."""

    def __init__(self, path: Path, dirs: Mapping[str, Path] | None = None) -> None:
        self.path = path
        self.dirs = dict(dirs or jit_cache.cache_dirs())
        self.keys: set[str] = set()
        self.why_forgotten: str | None = None
        self._new: set[str] = set()
        self._load()

    @classmethod
    def here(cls) -> BuildMemory:
        """The memory of this box's first GPU and installed stack."""
        return cls(memory_path(jit_cache.gpu_arch(), jit_cache.stack_versions()))

    def _load(self) -> None:
        counts = cache_files(self.dirs)
        if not any(counts.values()):  # nothing built here yet, or all of it cleared
            return
        try:
            doc = json.loads(self.path.read_text())
            saved, keys = doc["caches"], doc["keys"]
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError):
            self.why_forgotten = f"{self.path}: unreadable, built again"
            return
        shrunk = [name for name, n in saved.items() if counts.get(name, 0) < int(n)]
        if shrunk:
            self.why_forgotten = (
                f"the {', '.join(sorted(shrunk))} cache holds fewer files than when remembered"
            )
            return
        self.keys = {str(k) for k in keys}

    def add(self, key: str, status: str) -> None:
        if key and status in REMEMBERED and key not in self.keys:
            self.keys.add(key)
            self._new.add(key)

    def save(self) -> None:
        """Write the keys with the caches' file counts now (atomically); nothing new, nothing written.
        A file that cannot be written leaves the run as it is: the memory only saves time."""
        if not self._new:
            return
        doc = {"caches": cache_files(self.dirs), "keys": sorted(self.keys)}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(self.path.name + f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(doc))
            tmp.replace(self.path)
        except OSError:
            return
        self._new.clear()

    def known(self, keys: Iterable[str]) -> set[str]:
        return {k for k in keys if k in self.keys}

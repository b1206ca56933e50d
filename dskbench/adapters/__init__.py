"""The adapter registry: kernel name -> Adapter. Modules are imported on first use (they import torch)."""

from __future__ import annotations

import functools
import importlib
import os
from pathlib import Path

from dskbench.adapters.base import Adapter

# Every module under dskbench/adapters/ (family folders included) registers its adapters with @register when
# imported; adding a kernel is adding a file. base, backends and common hold no adapters.
# DSKBENCH_EXTRA_ADAPTERS=mod1,mod2 imports more modules (tests use it for fake kernels).
NOT_ADAPTERS = ("base", "backends", "common")


@functools.cache
def adapter_modules() -> tuple[str, ...]:
    """The adapter modules of the package, found on disk once per process (sorted: a stable registration
    order; a sweep looks adapters up for every case, and walking the folder costs a millisecond)."""
    here = Path(__file__).resolve().parent
    found = []
    for f in sorted(here.rglob("*.py")):
        rel = f.relative_to(here).with_suffix("")
        if rel.parts[0] in NOT_ADAPTERS or rel.name == "__init__":
            continue
        found.append(".".join(("dskbench", "adapters", *rel.parts)))
    return tuple(found)


_REGISTRY: dict[str, type[Adapter]] = {}
_imported: set[str] = set()


def register(cls: type[Adapter]) -> type[Adapter]:
    """Class decorator: make `cls` the adapter of `cls.kernel`."""
    if cls.kernel in _REGISTRY and _REGISTRY[cls.kernel] is not cls:
        raise ValueError(
            f"two adapters for kernel {cls.kernel!r}: {_REGISTRY[cls.kernel].__name__}, {cls.__name__}"
        )
    _REGISTRY[cls.kernel] = cls
    return cls


def _load_all() -> None:
    """Import the adapter modules not imported yet (extra modules may be named after the first call)."""
    extra = tuple(m.strip() for m in os.environ.get("DSKBENCH_EXTRA_ADAPTERS", "").split(",") if m.strip())
    for mod in (*adapter_modules(), *extra):
        if mod in _imported:
            continue
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:  # a dependency is missing, not the module itself
                raise
        _imported.add(mod)


def adapters() -> dict[str, type[Adapter]]:
    _load_all()
    return dict(_REGISTRY)


def get_adapter(kernel: str) -> Adapter | None:
    cls = adapters().get(kernel)
    return cls() if cls else None

"""The vocabulary of the trace documents (traces/aliases.yaml): kernel name aliases, the canonical
category and source labels with their synonyms, and the traced kernels no pinned package has."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dskbench import paths
from dskbench.registry.trace_model import TraceError


def norm_label(raw: str) -> str:
    """`1. Attention Kernels` -> `attention`; `GEMM (Linear)` -> `gemm`; `MoE TopK` -> `moe-topk`."""
    s = re.sub(r"\*\*|`", "", raw).strip()
    s = re.sub(r"^\d+(?:\.\d+)*\.?\s+", "", s)
    s = re.sub(r"\s*\([^)]*\)\s*$", "", s)
    s = re.sub(r"\s+kernels?$", "", s, flags=re.I).lower().strip()
    s = re.sub(r"\.py$|/$", "", s)
    return re.sub(r"\s+", "-", s)


@dataclass(frozen=True)
class Vocab:
    canonical: frozenset[str] = frozenset()
    synonyms: dict[str, str] = field(default_factory=dict)
    ignore: frozenset[str] = frozenset()

    def normalise(self, raw: str, level: int = 1) -> str | None:
        """The canonical label, or None. A heading or module (level > 1) only counts when canonical."""
        s = norm_label(raw)
        s = self.synonyms.get(s, s)
        if not s or s in self.ignore or (level > 1 and s not in self.canonical):
            return None
        return s

    @classmethod
    def from_data(cls, d: dict[str, Any] | None) -> Vocab:
        d = d or {}
        return cls(
            frozenset(d.get("canonical") or ()),
            {str(k): str(v) for k, v in (d.get("synonyms") or {}).items()},
            frozenset(d.get("ignore") or ()),
        )


@dataclass(frozen=True)
class Aliases:
    kernels: dict[str, str] = field(default_factory=dict)
    categories: Vocab = field(default_factory=Vocab)
    sources: Vocab = field(default_factory=Vocab)
    absent: dict[str, str] = field(default_factory=dict)  # traced names no pinned package has -> why

    def canonical(self, name: str) -> str:
        return self.kernels.get(name, name)


def load_aliases(path: Path | None = None) -> Aliases:
    p = path or paths.TRACES_DIR / "aliases.yaml"
    if not p.exists():
        return Aliases()
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise TraceError(
            p, getattr(getattr(e, "problem_mark", None), "line", -1) + 1, f"bad YAML: {e}"
        ) from None
    if not isinstance(data, dict):
        raise TraceError(p, 1, "expected a mapping")
    return Aliases(
        {str(k): str(v) for k, v in (data.get("kernels") or {}).items()},
        Vocab.from_data(data.get("categories")),
        Vocab.from_data(data.get("sources")),
        {str(k): str(v) for k, v in (data.get("absent") or {}).items()},
    )

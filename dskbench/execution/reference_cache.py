"""The last case's torch reference, kept for the case's next backend.

A case's backends follow each other in a plan and get the same inputs (items.case_seed), so its
reference output is the same for all of them. The torch references are the largest share of a sweep's
time per case (those of large prefill GEMMs, MoE and attention cases take longer than the kernels'
sampling), and a case with several backends computed the same one again for each. The kept copy is a
clone taken before any backend runs: a reference may return
a view of its inputs, and a backend may write its inputs in place. References larger than LIMIT_BYTES
are not kept (a clone would double their memory on the GPU).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

LIMIT_BYTES = 1 << 30


def _tensors(obj: Any) -> list[Any]:
    """The torch tensors in a reference output (a tensor, or lists, tuples and dicts of them)."""
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, list | tuple):
        return [t for v in obj for t in _tensors(v)]
    return []


def _clone(obj: Any) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_clone(v) for v in obj)
    return obj


class ReferenceCache:
    """One entry: the reference of the case prepared last, under its key (kernel, case id, seed, device)."""

    def __init__(self, limit_bytes: int = LIMIT_BYTES) -> None:
        self.limit_bytes = limit_bytes
        self._key: Hashable | None = None
        self._ref: Any = None
        self.hits = 0

    def get(self, key: Hashable) -> Any:
        """The kept reference for this key, or None."""
        if self._key is None or key != self._key:
            return None
        self.hits += 1
        return self._ref

    def put(self, key: Hashable, ref: Any) -> None:
        """Keep a copy of `ref` for the key (dropping the one kept before); a reference over the limit,
        or one holding something other than tensors and plain values, is not kept."""
        self._key, self._ref = None, None
        size = sum(t.numel() * t.element_size() for t in _tensors(ref))
        if ref is None or size > self.limit_bytes:
            return
        self._key, self._ref = key, _clone(ref)

    def clear(self) -> None:
        self._key, self._ref = None, None


REFERENCES = ReferenceCache()

"""The building blocks of the record types (records.py): a nested part with its known fields and the keys it
does not know, and the field kinds (always written, written only when set, required)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import field, fields
from typing import Any


class RecordError(ValueError):
    """A record that breaks the schema's rules (the message says which)."""


def always(doc: str, default: Any = None) -> Any:
    """A field written on every record, null when unknown."""
    return field(default=default, metadata={"doc": doc})


def optional(doc: str) -> Any:
    """A field written only when set."""
    return field(default=None, metadata={"doc": doc, "omit_none": True})


def required(doc: str) -> Any:
    return field(metadata={"doc": doc})


def extra_field() -> Any:
    return field(default_factory=dict, metadata={"doc": "keys this version does not know, kept as read"})


def finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


class Part:
    """A nested object of a record: its known fields, plus `extra` for the keys it does not know."""

    extra: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            if f.name == "extra" or (v is None and f.metadata.get("omit_none")):
                continue
            out[f.name] = v
        return {**out, **self.extra}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Any:
        if not isinstance(d, Mapping):
            raise RecordError(f"{cls.__name__} must be a JSON object, not {type(d).__name__}")
        names = {f.name for f in fields(cls)} - {"extra"}  # type: ignore[arg-type]
        known = {k: v for k, v in d.items() if k in names}
        try:
            return cls(**known, extra={k: v for k, v in d.items() if k not in names})
        except TypeError as e:  # a required key missing
            raise RecordError(f"{cls.__name__}: {e}") from None

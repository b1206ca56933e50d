"""The published JSON Schema of results files, generated from the record types (records.py).

docs/results.schema.json is this module's output; a test keeps the two equal. Regenerate it with
`python -m dskbench.results.schema` (`--check` exits 1 when the file differs).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dskbench.results.records import (
    PARTS,
    RESULT_FIELDS,
    SCHEMA,
    STATUSES,
    BackendInfo,
    CrossCheck,
    Environment,
    Identity,
    ResultRecord,
)

SCHEMA_FILE = Path("docs") / "results.schema.json"
_SCALARS = {str: "string", bool: "boolean", int: "integer", float: "number", type(None): "null"}


def type_schema(tp: Any) -> dict[str, Any]:
    """The JSON Schema of a field's type hint."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return {}
    if tp in _SCALARS:
        return {"type": _SCALARS[tp]}
    if origin in (typing.Union, types.UnionType):
        subs = [type_schema(a) for a in args]
        if all(set(s) == {"type"} for s in subs):
            return {"type": [s["type"] for s in subs]}
        return {"anyOf": subs}
    if origin is list:
        return {"type": "array", "items": type_schema(args[0]) if args else {}}
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        return {"type": "object"}
    if dataclasses.is_dataclass(tp):
        return {"$ref": f"#/$defs/{tp.__name__}"}
    raise TypeError(f"no JSON Schema for {tp!r}")


def _doc(cls: type) -> str:
    return " ".join((cls.__doc__ or "").split())


def _properties(cls: type) -> tuple[dict[str, Any], list[str]]:
    """A dataclass's fields as schema properties, and the required ones (those without a default)."""
    hints = typing.get_type_hints(cls)
    props: dict[str, Any] = {}
    required = []
    for f in dataclasses.fields(cls):
        if f.name == "extra" or f.metadata.get("internal"):
            continue
        props[f.name] = {**type_schema(hints[f.name]), "description": f.metadata.get("doc", "")}
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.append(f.name)
    return props, required


def _object(cls: type, title: str | None = None) -> dict[str, Any]:
    props, required = _properties(cls)
    out: dict[str, Any] = {"title": title or cls.__name__, "description": _doc(cls), "type": "object"}
    out.update(properties=props, required=required, additionalProperties=True)
    return out


def _record_head(kind: str) -> dict[str, Any]:
    return {
        "record": {"const": kind, "description": "the record's type"},
        "schema": {"const": SCHEMA, "description": "bumped on any incompatible change"},
    }


def _result() -> dict[str, Any]:
    hints = typing.get_type_hints(ResultRecord)
    ident, _ = _properties(Identity)
    props: dict[str, Any] = {
        **_record_head("result"),
        "run_id": {"type": "string", "description": "the run (its environment record) this result belongs to"},
        "status": {
            "enum": list(STATUSES),
            "description": "ok: checked, then timed; wrong: failed the check; unstable: checked and timed, "
            "the timing impossible twice (kept, never used as a number)",
        },
        **ident,
        "backend": {"$ref": "#/$defs/BackendInfo"},
    }
    for name, cls in PARTS.items():
        props[name] = {"anyOf": [{"$ref": f"#/$defs/{cls.__name__}"}, {"type": "null"}]}
    for name, doc in RESULT_FIELDS.items():
        props[name] = {**type_schema(hints[name]), "description": doc}
    return {
        "title": "ResultRecord",
        "description": _doc(ResultRecord),
        "type": "object",
        "properties": props,
        "required": ["record", "schema", "run_id", "status", "kernel", "backend"],
        "additionalProperties": True,
        "allOf": [
            {
                "if": {"properties": {"status": {"enum": [s for s in STATUSES if s != "ok"]}}},
                "then": {"required": ["reason"], "properties": {"reason": {"type": "string", "minLength": 1}}},
            },
            {
                "if": {"properties": {"status": {"const": "ok"}}},
                "then": {
                    "required": ["timing"],
                    "properties": {
                        "timing": {"type": "object", "properties": {"median_us": {"type": "number"}}}
                    },
                },
            },
            {
                "if": {"properties": {"status": {"const": "unstable"}}},
                "then": {"required": ["timing"], "properties": {"timing": {"type": "object"}}},
            },
        ],
    }


def results_schema() -> dict[str, Any]:
    """The JSON Schema of one line of a results file: an environment or a result record."""
    env = _object(Environment, "EnvironmentRecord")
    env["properties"] = {**_record_head("environment"), **env["properties"]}
    env["required"] = ["record", "schema", *env["required"]]
    defs = {"EnvironmentRecord": env, "ResultRecord": _result(), "BackendInfo": _object(BackendInfo)}
    defs.update({cls.__name__: _object(cls) for cls in PARTS.values()})
    defs["CrossCheck"] = _object(CrossCheck)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"dskbench results record ({SCHEMA})",
        "description": "One line of a dskbench results file (JSON lines): docs/results-schema.md.",
        "oneOf": [{"$ref": "#/$defs/EnvironmentRecord"}, {"$ref": "#/$defs/ResultRecord"}],
        "$defs": defs,
    }


def schema_text() -> str:
    return json.dumps(results_schema(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dskbench.results.schema", description=__doc__)
    p.add_argument("--out", type=Path, default=SCHEMA_FILE, help=f"default {SCHEMA_FILE}")
    p.add_argument("--check", action="store_true", help="exit 1 if the file differs from the generated")
    args = p.parse_args(argv)
    text = schema_text()
    if args.check:
        same = args.out.exists() and args.out.read_text(encoding="utf-8") == text
        print(f"{args.out}: {'up to date' if same else 'differs from the record types; regenerate it'}")
        return 0 if same else 1
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Loading the kernel registry: one YAML file per traced kernel, each checked as it is read.

Every field the loader reads is checked, with the file and line in the message: a hand-edited or
damaged registry fails with one line that says where, never with a traceback in planning.

Generation lives in generate.py and its command in command.py; `cli_generate` and `drift_message` are
importable from here too, where the command line has always found them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dskbench import paths
from dskbench.registry.command import cli_generate
from dskbench.registry.generate import drift_message
from dskbench.registry.model import (
    ENTRY_KEYS,
    LIST_KEYS,
    OP_KEYS,
    STATUSES,
    KernelEntry,
    RegistryError,
    show_path,
)
from dskbench.registry.yaml_nodes import expect, fields, read_yaml
from dskbench.shapes.schema import MODELS

__all__ = ["KernelEntry", "RegistryError", "cli_generate", "drift_message", "load_registry"]


def load_registry(dir: Path | None = None) -> dict[str, KernelEntry]:  # noqa: A002 - the agreed API name
    """Every kernel file of the registry folder, checked; RegistryError names the first bad file."""
    d = Path(dir or paths.REGISTRY_DIR)
    if not d.is_dir():
        raise RegistryError(f"{show_path(d)}: no registry folder (`dskbench registry generate` writes it)")
    files = {p.stem: p for p in sorted(d.glob("*.yaml")) if not p.name.startswith(".")}
    out = {}
    for p in files.values():
        raw = _load_entry(p, files)
        out[raw["name"]] = KernelEntry.from_raw(raw)
    return out


def _load_entry(p: Path, files: dict[str, Path]) -> dict[str, Any]:
    """One kernel file, with the fields the loader reads checked (types, known keys, name = file name)."""
    node, raw = read_yaml(p)
    if node is None:
        raise RegistryError(f"{show_path(p)}:1: empty: expected a registry entry (name, status, ops, ...)")
    keys = fields(p, node, ENTRY_KEYS, "a registry entry")

    def line(key: str) -> int:
        return keys[key][0] if key in keys else node.start_mark.line + 1

    if "name" not in keys:
        raise RegistryError(f"{show_path(p)}:{line('name')}: no name: expected `name: {p.stem}`")
    name = raw["name"]
    expect(p, line("name"), "name", name, isinstance(name, str), "the kernel name (a string)")
    if name != p.stem:
        other = files.get(name)
        if other is not None:
            raise RegistryError(
                f"{show_path(p)}:{line('name')}: name {name!r} is the kernel of {show_path(other)}; "
                f"a registry file holds the kernel its file name says ({p.stem!r}): "
                "move this copy out of the registry folder"
            )
        raise RegistryError(
            f"{show_path(p)}:{line('name')}: name {name!r} does not match the file name: expected {p.stem!r}"
        )
    aliases = raw.get("aliases") or []
    ok = isinstance(aliases, list) and all(isinstance(a, str) for a in aliases)
    expect(p, line("aliases"), "aliases", aliases, ok, "a list of kernel names")
    for key in ("category", "source"):
        expect(p, line(key), key, raw.get(key), raw.get(key) is None or isinstance(raw[key], str), "a string")
    status = raw.get("status", "benchmark")
    expect(p, line("status"), "status", status, status in STATUSES, f"one of {', '.join(STATUSES)}")
    reason = raw.get("status_reason", "")
    expect(p, line("status_reason"), "status_reason", reason, isinstance(reason, str), "a string")
    for key in LIST_KEYS:
        expect(p, line(key), key, raw.get(key), isinstance(raw.get(key) or [], list), "a list")
    ops = raw.get("ops") or []
    expect(p, line("ops"), "ops", ops, isinstance(ops, list), "a list of ops")
    for op_node, op in zip(keys["ops"][1].value if "ops" in keys and ops else [], ops, strict=True):
        _check_op(p, op_node, op)
    sites = raw.get("call_sites") or []
    for site_node, site in zip(keys["call_sites"][1].value if sites else [], sites, strict=True):
        _check_call_site(p, site_node, site)
    return raw


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_opt_str(v: Any) -> bool:
    return v is None or isinstance(v, str)


def _check_op(p: Path, node: Any, op: dict[str, Any]) -> None:
    """One op of an entry: the fields OpEntry reads, with their types."""
    keys = fields(p, node, OP_KEYS, "an op")
    if "name" not in keys:
        raise RegistryError(f"{show_path(p)}:{node.start_mark.line + 1}: op with no name")
    checks = {
        "name": (_is_str, "an op name"),
        "executed": (lambda v: isinstance(v, bool), "true or false"),
        "models": (
            lambda v: isinstance(v, list) and all(m in MODELS for m in v),
            f"a list of {', '.join(MODELS)}",
        ),
        "reason": (_is_opt_str, "a string"),
        "phases": (lambda v: isinstance(v, list) and all(map(_is_str, v)), "a list of phases"),
        "layers": (_is_opt_str, "all, dense or moe"),
        "weight": (_is_opt_str, "a weight format"),
    }
    for key, (ok, expected) in checks.items():
        if key in keys:
            expect(p, keys[key][0], key, op[key], ok(op[key]), expected)


def _check_call_site(p: Path, node: Any, site: Any) -> None:
    """One call site: a mapping with site, kind and doc (strings) and an optional via."""
    keys = fields(p, node, ("site", "kind", "via", "doc"), "a call site")
    at = node.start_mark.line + 1
    for key in ("site", "kind", "doc"):
        if key not in keys:
            raise RegistryError(f"{show_path(p)}:{at}: call site with no {key}")
        expect(p, keys[key][0], key, site[key], _is_str(site[key]), "a string")
    if "via" in keys:
        expect(p, keys["via"][0], "via", site["via"], _is_opt_str(site["via"]), "a function name")

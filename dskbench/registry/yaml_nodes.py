"""Reading a registry YAML file with line numbers, so every complaint names the file and line."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml

from dskbench.registry.model import RegistryError, show_path

Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when built with it: 85 files load fast


def read_yaml(p: Path) -> tuple[yaml.Node | None, Any]:
    """The YAML document of `p` as a node (for line numbers) and as data; RegistryError when unreadable."""
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise RegistryError(f"{show_path(p)}: cannot read: {e.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise RegistryError(f"{show_path(p)}:{line}: not valid UTF-8 (byte {raw[e.start]:#04x})") from None
    loader = Loader(text)
    try:
        node = loader.get_single_node()
        return node, (loader.construct_document(node) if node is not None else None)
    except yaml.MarkedYAMLError as e:
        raise RegistryError(f"{show_path(p)}:{yaml_error(e)}") from None
    except yaml.YAMLError as e:
        raise RegistryError(f"{show_path(p)}: not valid YAML: {' '.join(str(e).split())}") from None
    finally:
        loader.dispose()


def yaml_error(e: yaml.MarkedYAMLError) -> str:
    """`8: not valid YAML: did not find expected ',' or ']' (while parsing a flow sequence at line 7)`."""
    mark = e.problem_mark or e.context_mark
    line = mark.line + 1 if mark else 1
    what = e.problem or "malformed"
    if e.context:
        at = e.context_mark.line + 1 if e.context_mark else line
        what += f" ({e.context}" + (f" at line {at})" if at != line else ")")
    return f"{line}: not valid YAML: {' '.join(what.split())}"


def fields(p: Path, node: yaml.Node, known: tuple[str, ...], what: str) -> dict[str, tuple[int, yaml.Node]]:
    """Key -> (line, value node) of a mapping node. RegistryError for a node that is not a mapping, a
    key given twice, or an unknown key (with the nearest known one: a typo must not drop a field)."""
    where = show_path(p)
    if not isinstance(node, yaml.MappingNode):
        kind = "a list" if isinstance(node, yaml.SequenceNode) else f"{node.value!r}"
        raise RegistryError(f"{where}:{node.start_mark.line + 1}: expected {what} (a mapping), got {kind}")
    out: dict[str, tuple[int, yaml.Node]] = {}
    for k, v in node.value:
        line, key = k.start_mark.line + 1, str(k.value)
        if key in out:
            raise RegistryError(f"{where}:{line}: key {key!r} given twice (first at line {out[key][0]})")
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"expected one of {', '.join(known)}"
            raise RegistryError(f"{where}:{line}: unknown key {key!r} in {what}; {hint}")
        out[key] = (line, v)
    return out


def expect(p: Path, line: int, key: str, value: Any, ok: bool, expected: str) -> None:
    if not ok:
        got = repr(value)
        got = got if len(got) <= 40 else got[:37] + "..."
        raise RegistryError(f"{show_path(p)}:{line}: {key}: expected {expected}, got {got}")

"""The registry folder's manifest: `dskbench registry generate` owns a folder through it.

It lists the files generate wrote and the trace documents they come from; generate rewrites and removes
only those, and refuses a folder holding anything else, so a mistyped --out never loses a file.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

from dskbench.registry.model import RegistryError, few, show_path
from dskbench.registry.yaml_nodes import expect, fields, read_yaml

MANIFEST = ".manifest"
MANIFEST_HEADER = (
    "# Written by `dskbench registry generate`: the files it wrote into this folder and the trace\n"
    "# documents they come from. It rewrites and removes only the files listed here, and refuses a\n"
    "# folder that holds any other file. Do not edit by hand.\n"
)


def entry_file(out_dir: Path, name: str) -> Path:
    """The file of kernel `name` in a registry folder."""
    return out_dir / f"{name}.yaml"


def same_text(p: Path, text: str) -> bool:
    """`p` exists and holds `text` (so generate rewrites only what changed)."""
    return p.is_file() and p.read_text() == text


@dataclass(frozen=True)
class Manifest:
    """What `generate` wrote into a folder (file names) and the trace documents it read (file names)."""

    files: frozenset[str] = frozenset()
    traces: frozenset[str] = frozenset()

    def render(self) -> str:
        data = {"traces": sorted(self.traces), "files": sorted(self.files)}
        return MANIFEST_HEADER + yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def read_manifest(folder: Path) -> Manifest | None:
    """The folder's manifest; None when it has none. Only plain `*.yaml` names in this folder count as
    files it may own, so a damaged manifest can never make generate touch anything else."""
    p = folder / MANIFEST
    if not p.exists():
        return None
    node, data = read_yaml(p)
    if node is None:
        return Manifest()
    keys = fields(p, node, ("traces", "files"), "the manifest")
    lists: dict[str, frozenset[str]] = {}
    for key, (line, _) in keys.items():
        names = data[key] or []
        ok = isinstance(names, list) and all(isinstance(n, str) and Path(n).name == n for n in names)
        expect(p, line, key, names, ok, "a list of file names")
        if key == "files":
            bad = [n for n in names if n.startswith(".") or not n.endswith(".yaml")]
            expect(p, line, key, bad[:1], not bad, "registry file names (NAME.yaml)")
        lists[key] = frozenset(names)
    return Manifest(lists.get("files", frozenset()), lists.get("traces", frozenset()))


def foreign_files(folder: Path, manifest: Manifest | None) -> list[str]:
    """What `folder` holds that `generate` did not write: anything its manifest does not list."""
    owned = manifest.files if manifest else frozenset()
    return sorted(
        p.name + ("/" if p.is_dir() else "")
        for p in folder.iterdir()
        if p.name != MANIFEST and p.name not in owned
    )


def claim_folder(folder: Path, trace_names: Iterable[str], partial: bool) -> Manifest:
    """The manifest of a folder `generate` may write into; RegistryError saying why it may not.

    A new or empty folder is claimed, and a folder generate wrote (its manifest lists every file
    there) is its own; any other file makes the folder someone else's. A partial generate (`--traces`)
    may not leave out documents the folder was generated from: the files of their kernels would be
    rewritten from fewer documents, or removed.
    """
    where = show_path(folder)
    if folder.exists() and not folder.is_dir():
        raise RegistryError(f"{where}: not a folder")
    if not folder.exists():
        return Manifest()
    manifest = read_manifest(folder)
    foreign = foreign_files(folder, manifest)
    if foreign:
        raise RegistryError(
            f"{where} holds {len(foreign)} file(s) `dskbench registry generate` did not write "
            f"({few(foreign)}); it writes only into a new or empty folder or one it generated: "
            "choose another --out, or move those files out"
        )
    if manifest is None:
        return Manifest()
    left_out = sorted(manifest.traces - set(trace_names))
    if partial and left_out and manifest.files:
        raise RegistryError(
            f"{where} was generated from {len(manifest.traces)} trace documents and --traces leaves out "
            f"{few(left_out)}: their kernels' files would be rewritten from fewer documents or removed; "
            "generate into a new folder (--out DIR), or name every document"
        )
    return manifest

"""The git tree id of the dskbench package as it is on disk: which code made a run, checkable against any
commit with `git rev-parse COMMIT:dskbench`, also where the copy that ran has no .git or a stale one (a
tree shipped to a job queue or an air-gapped box).

Computed as git computes a tree (blobs of the files' bytes, entries sorted by name, a folder's name as if
it ended in "/"), over what git would track: Python's byte-code caches are left out. A file that git does
not track makes an id no commit has, which says as much."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

SKIPPED_FOLDERS = ("__pycache__",)
SKIPPED_SUFFIXES = (".pyc", ".pyo")


def _object(kind: bytes, body: bytes) -> bytes:
    return hashlib.sha1(kind + b" %d\0" % len(body) + body).digest()


def _tree(folder: str) -> bytes | None:
    """The tree object id of a folder (None for a folder with nothing git would track: git keeps none)."""
    entries: list[tuple[bytes, bytes, bytes]] = []  # (sort key, mode and name, object id)
    for entry in os.scandir(folder):
        name = os.fsencode(entry.name)
        if entry.is_symlink():
            mode, oid, key = b"120000", _object(b"blob", os.fsencode(os.readlink(entry.path))), name
        elif entry.is_dir():
            sub = None if entry.name in SKIPPED_FOLDERS else _tree(entry.path)
            if sub is None:
                continue
            mode, oid, key = b"40000", sub, name + b"/"
        elif entry.name.endswith(SKIPPED_SUFFIXES):
            continue
        else:
            executable = entry.stat().st_mode & stat.S_IXUSR
            mode = b"100755" if executable else b"100644"
            oid, key = _object(b"blob", Path(entry.path).read_bytes()), name
        entries.append((key, mode + b" " + name, oid))
    if not entries:
        return None
    entries.sort(key=lambda e: e[0])
    return _object(b"tree", b"".join(head + b"\0" + oid for _, head, oid in entries))


def tree_id(folder: Path) -> str | None:
    """The git tree id (hex) of `folder` as it is on disk; None when it cannot be read."""
    try:
        oid = _tree(str(folder))
    except OSError:
        return None
    return oid.hex() if oid else None

"""The product speaks for itself: its text cites no file it does not ship, and its committed results
carry no path of the machine that gathered them. Read from the tracked files, so it runs anywhere a
checkout is."""

from __future__ import annotations

import gzip
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEXT_ROOTS = (
    "dskbench/",
    "scripts/",
    "tests/",
    "docs/",
    "bench/",
    "benchmarks/",
    "traces/",
    "shapes/",
    "kernels_registry/",
    "README.md",
)
# Built from parts, so that this file does not match itself.
UNSHIPPED = ("catalog" + "ue §", "METHOD" + ".md", "/root" + "/out")
GATHERING_PATHS = ("/root" + "/out", "/work" + "/")


def tracked(prefixes: tuple[str, ...]) -> list[Path]:
    """The tracked files under `prefixes` (git's index, so build outputs and caches are left out)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout: the check reads the tracked files")
    out = subprocess.run(
        ["git", "ls-files", "-z", "--", *prefixes], cwd=ROOT, capture_output=True, check=True
    )
    paths = [ROOT / name for name in out.stdout.decode().split("\0") if name]
    return [p for p in paths if not p.is_symlink()]  # a link is checked where it points


def text_of(path: Path) -> str | None:
    """The file as text, or None for a binary file."""
    raw = path.read_bytes()
    if b"\0" in raw:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def content_of(path: Path) -> bytes:
    """A results file's bytes, gzip (.gz, .tgz) read through."""
    raw = path.read_bytes()
    return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw


def offending_text(paths: list[Path], needles: tuple[str, ...], root: Path = ROOT) -> list[str]:
    """'file: needle' for each text file that holds a needle."""
    found = []
    for p in paths:
        text = text_of(p)
        for n in needles:
            if text is not None and n in text:
                found.append(f"{p.relative_to(root)}: {n}")
    return found


def offending_results(paths: list[Path], needles: tuple[str, ...], root: Path = ROOT) -> list[str]:
    """'file: needle' for each results file (gzip read through) that holds a needle."""
    found = []
    for p in paths:
        data = content_of(p)
        for n in needles:
            if n.encode() in data:
                found.append(f"{p.relative_to(root)}: {n}")
    return found


def test_the_checks_find_what_they_look_for(tmp_path):
    doc = tmp_path / "doc.py"
    doc.write_text('"""Bytes as in ' + UNSHIPPED[0] + '0.6."""\n')
    clean = tmp_path / "clean.py"
    clean.write_text('"""Bytes: each operand read once."""\n')
    assert offending_text([doc, clean], UNSHIPPED, tmp_path) == [f"doc.py: {UNSHIPPED[0]}"]
    run = tmp_path / "run.jsonl.gz"
    run.write_bytes(
        gzip.compress(b'{"command":["run","--out","' + GATHERING_PATHS[0].encode() + b'/x.jsonl"]}\n')
    )
    log = tmp_path / "run.log"
    log.write_text("done -> x.jsonl\n")
    assert offending_results([run, log], GATHERING_PATHS, tmp_path) == [f"run.jsonl.gz: {GATHERING_PATHS[0]}"]


def test_product_text_cites_nothing_it_does_not_ship():
    found = offending_text(tracked(TEXT_ROOTS), UNSHIPPED)
    assert not found, "text citing files the product does not ship:\n" + "\n".join(found)


def test_committed_results_hold_no_path_of_the_gathering_machine():
    found = offending_results(tracked(("results/",)), GATHERING_PATHS)
    assert not found, "results files with a path of the machine that gathered them:\n" + "\n".join(found)


def test_a_run_records_its_command_as_a_user_would_type_it():
    """`python -m dskbench` and the console script are recorded as `dskbench`: the results file holds no
    path of the machine that ran it; any other program is left as it is."""
    from dskbench.results.environment import command_line

    assert command_line(["/opt/x/dskbench/__main__.py", "run", "--quick"]) == ["dskbench", "run", "--quick"]
    assert command_line(["/usr/local/bin/dskbench", "report", "a.jsonl"]) == ["dskbench", "report", "a.jsonl"]
    assert command_line(["/opt/x/asv", "run"]) == ["/opt/x/asv", "run"]

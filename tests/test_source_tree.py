"""A run records the git tree id of the code it ran, computed from the files on disk: the id git gives the
same folder at its commit, also without a .git to ask."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from dskbench import paths
from dskbench.results.environment import git_state
from dskbench.results.source_tree import tree_id

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git to compare with")


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    out = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_the_id_is_the_one_git_gives_the_folder(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub" / "deeper").mkdir(parents=True)
    (pkg / "foo").mkdir()  # a folder sorts as "foo/": after "foo.py"
    (pkg / "foo" / "x.py").write_text("x = 1\n")
    (pkg / "foo.py").write_text("print('foo')\n")
    (pkg / "sub" / "deeper" / "data.json").write_bytes(b'{"a": 1}')
    (pkg / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (pkg / "run.sh").chmod(0o755)
    os.symlink("sub/deeper", pkg / "link")
    (pkg / "empty").mkdir()  # git keeps no empty folder
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "pkg")
    _git(tmp_path, "commit", "-q", "-m", "c")
    (pkg / "__pycache__").mkdir()  # byte-code caches git does not track
    (pkg / "__pycache__" / "foo.cpython-312.pyc").write_bytes(b"\0\1")
    (pkg / "foo" / "x.pyc").write_bytes(b"\0")
    assert tree_id(pkg) == _git(tmp_path, "rev-parse", "HEAD:pkg")
    (pkg / "foo.py").write_text("print('changed')\n")
    assert tree_id(pkg) != _git(tmp_path, "rev-parse", "HEAD:pkg")


def test_a_run_records_the_id_of_its_package_even_when_git_is_told_another_commit(monkeypatch):
    expected = tree_id(paths.REPO_ROOT / "dskbench")
    assert expected and len(expected) == 40
    assert git_state()["source_tree"] == expected
    monkeypatch.setenv("DSKBENCH_GIT_COMMIT", "0" * 40)
    state = git_state()
    assert state["commit"] == "0" * 40 and state["source_tree"] == expected

"""Helpers of the front-end tests (test_suite, test_bench_pytest, test_asv): a fake DSKBENCH_ROOT whose
registry names the fake kernels of tests/fake_adapters.py, and a pytest runner in a subprocess."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHAPES = REPO / "dskbench" / "data" / "shapes" / "deepseek_r1_nvfp4.yaml"


def write_registry(root: Path, entries: dict[str, str]) -> None:
    """A registry/ folder as dskbench.registry.load reads it (only the fields it reads)."""
    reg = root / "registry"
    reg.mkdir(parents=True, exist_ok=True)
    for name, status in entries.items():
        reason = "host function, no GPU kernel" if status != "benchmark" else "fake"
        (reg / f"{name}.yaml").write_text(
            f"name: {name}\naliases: []\nstatus: {status}\nstatus_reason: {reason}\n"
            "ops:\n- name: input_layernorm\n"
        )


def make_fake_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """DSKBENCH_ROOT with a fake registry; the fake adapters loaded in every subprocess."""
    root = tmp_path / "root"
    write_registry(root, {"fake_ok": "benchmark", "fake_wrong": "benchmark", "fake_host": "host-only"})
    (root / "shapes").mkdir()
    shutil.copyfile(SHAPES, root / "shapes" / SHAPES.name)
    monkeypatch.setenv("DSKBENCH_ROOT", str(root))
    monkeypatch.setenv("DSKBENCH_EXTRA_ADAPTERS", "tests.fake_adapters")
    monkeypatch.setenv("DSKBENCH_CACHE_DIR", str(tmp_path / "cache"))
    from dskbench import paths

    monkeypatch.setattr(paths, "REGISTRY_DIR", root / "registry")
    monkeypatch.setattr(paths, "SHAPES_FILE", root / "shapes" / SHAPES.name)
    return root


def run_pytest(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )

"""scripts/wheelhouse.py: the wheels an offline GPU box needs, downloaded on a connected machine, installed
there from them alone. pip itself is replaced by a fake here (no network): what is checked is the
command the script gives pip, the manifest, and every refusal (one line, exit code 2)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "wheelhouse.py"


@pytest.fixture
def wh():
    spec = importlib.util.spec_from_file_location("wheelhouse", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _one_line_error(capsys, *parts: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("wheelhouse: "), err
    assert all(p in err[0] for p in parts), err[0]
    return err[0]


def test_requirements_are_the_extras_pins_and_the_build_requirements(wh):
    reqs = wh.requirements(ROOT / "pyproject.toml", "gpu")
    for pin in ("torch==2.11.0", "sglang-kernel==0.4.5", "flashinfer-python==0.6.14", "sglang==0.5.16"):
        assert pin in reqs
    assert "pyyaml>=6" in reqs and "setuptools>=68" in reqs  # dskbench's own, and to build it on the box
    assert "pytest>=8" not in reqs  # the test extra's
    assert "torch==2.11.0" not in wh.requirements(ROOT / "pyproject.toml", "none")
    with pytest.raises(wh.UsageError, match="no such extra \\(known: gpu, test, none\\)"):
        wh.requirements(ROOT / "pyproject.toml", "cuda")


def test_platform_tags_cover_every_older_manylinux(wh):
    tags = wh.platform_tags("2.28", "x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and tags[10] == "manylinux_2_18_x86_64"
    assert tags[-4:] == [
        "manylinux_2_17_x86_64",
        "manylinux2014_x86_64",
        "manylinux2010_x86_64",
        "manylinux1_x86_64",
    ]
    assert "manylinux_2_29_x86_64" not in tags  # newer than the box's C library
    assert wh.platform_tags("2.17", "aarch64") == ["manylinux_2_17_aarch64", "manylinux2014_aarch64"]


def test_build_dry_run_prints_the_download_for_the_box(wh, tmp_path, capsys):
    folder = tmp_path / "wheels"
    args = [
        "build",
        str(folder),
        "--python-version",
        "3.12",
        "--glibc",
        "2.28",
        "--arch",
        "aarch64",
        "--dry-run",
    ]
    assert wh.main([*args, "--", "--extra-index-url", "https://example.invalid/whl"]) == 0
    cmd = capsys.readouterr().out.split()
    assert cmd[1:4] == ["-m", "pip", "download"] and cmd[cmd.index("--dest") + 1] == str(folder)
    assert "--only-binary=:all:" in cmd and cmd[cmd.index("--python-version") + 1] == "3.12"
    assert cmd[cmd.index("--platform") + 1] == "manylinux_2_28_aarch64"
    assert cmd[cmd.index("--extra-index-url") + 1] == "https://example.invalid/whl"  # after `--`: pip's
    assert "sglang==0.5.16" in cmd and "setuptools>=68" in cmd
    assert not folder.exists()  # a dry run makes nothing


@pytest.mark.parametrize(
    "argv, parts",
    [
        (["build"], ["required: DIR"]),
        (["build", "d", "--python-version", "312"], ["--python-version", "MAJOR.MINOR", "'312'"]),
        (["build", "d", "--glibc", "2.5"], ["--glibc", "2.17 or later", "'2.5'"]),
        (["build", "d", "--arch", "ppc64le"], ["--arch", "invalid choice"]),
        (["build", "d", "--extra", "cuda"], ["--extra cuda", "no such extra"]),
        (["install", "d", "--", "--pre"], ["after `--`", "only `build`"]),
        (["fetch", "d"], ["invalid choice: 'fetch'"]),
        ([], ["required: command"]),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(wh, capsys, argv, parts):
    assert wh.main(argv) == 2
    _one_line_error(capsys, *parts)


def _fake_pip(monkeypatch, wh, rc: int = 0, wheels: tuple[str, ...] = ()):
    calls: list[list[str]] = []

    def run(cmd):
        calls.append(cmd)
        if rc == 0 and "download" in cmd:
            dest = Path(cmd[cmd.index("--dest") + 1])
            for w in wheels:
                (dest / w).write_bytes(b"PK")
        return rc

    monkeypatch.setattr(wh, "run_pip", run)
    return calls


def _build(wh, folder: Path, *extra: str) -> int:
    return wh.main(
        ["build", str(folder), "--python-version", "3.12", "--glibc", "2.28", "--arch", "x86_64", *extra]
    )


def test_build_writes_a_manifest_only_when_pip_succeeded(wh, tmp_path, monkeypatch, capsys):
    folder = tmp_path / "wheels"
    _fake_pip(monkeypatch, wh, rc=1)
    assert _build(wh, folder) == 1
    assert "pip download failed (exit code 1)" in capsys.readouterr().err
    assert not (folder / "wheelhouse.json").exists()  # so install refuses the half-made folder
    _fake_pip(monkeypatch, wh, wheels=("torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl",))
    assert _build(wh, folder) == 0  # the same folder again: pip keeps what it has, fetches the rest
    doc = json.loads((folder / "wheelhouse.json").read_text())
    assert (doc["extra"], doc["python"], doc["glibc"], doc["arch"]) == ("gpu", "3.12", "2.28", "x86_64")
    assert doc["wheels"] == ["torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl"]
    assert "torch==2.11.0" in doc["requirements"]
    assert "1 wheels" in capsys.readouterr().out


def test_build_refuses_folders_it_does_not_own_or_made_for_another_box(wh, tmp_path, monkeypatch, capsys):
    calls = _fake_pip(monkeypatch, wh)
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("mine")
    assert _build(wh, other) == 2
    _one_line_error(capsys, "a folder with other files in it")
    assert [p.name for p in other.iterdir()] == ["todo.txt"]
    made = tmp_path / "wheels"
    assert _build(wh, made) == 0
    capsys.readouterr()
    assert (
        wh.main(["build", str(made), "--python-version", "3.11", "--glibc", "2.28", "--arch", "x86_64"]) == 2
    )
    _one_line_error(capsys, "Python 3.12", "not extra 'gpu', Python 3.11")
    assert len(calls) == 1  # pip was asked only once
    afile = tmp_path / "a.whl"
    afile.write_text("x")
    assert _build(wh, afile) == 2
    _one_line_error(capsys, "is not a folder")


def _wheelhouse(folder: Path, **target: str) -> Path:
    folder.mkdir()
    doc = {"format": 1, "extra": "gpu", "python": "3.12", "glibc": "2.28", "arch": "x86_64", **target}
    (folder / "wheelhouse.json").write_text(json.dumps(doc))
    return folder


def test_install_checks_the_wheelhouse_against_this_machine(wh, tmp_path, monkeypatch, capsys):
    calls = _fake_pip(monkeypatch, wh)
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    monkeypatch.setattr(wh, "this_glibc", lambda: "2.31")
    monkeypatch.setattr(wh.platform, "machine", lambda: "x86_64")
    assert wh.main(["install", str(tmp_path / "none")]) == 2
    _one_line_error(capsys, "no such folder", "wheelhouse.py build")
    assert wh.main(["install", str(tmp_path)]) == 2
    _one_line_error(capsys, "no wheelhouse.json in it")
    other = "3.9" if here != "3.9" else "3.10"
    assert wh.main(["install", str(_wheelhouse(tmp_path / "py", python=other))]) == 2
    _one_line_error(capsys, f"wheels for Python {other}", f"is Python {here}", f"--python-version {here}")
    assert wh.main(["install", str(_wheelhouse(tmp_path / "arm", python=here, arch="aarch64"))]) == 2
    _one_line_error(capsys, "wheels for aarch64", "this machine is x86_64")
    assert wh.main(["install", str(_wheelhouse(tmp_path / "new", python=here, glibc="2.35"))]) == 2
    _one_line_error(capsys, "glibc 2.35", "glibc 2.31", "--glibc 2.31")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "wheelhouse.json").write_text("{not json")
    assert wh.main(["install", str(bad)]) == 2
    _one_line_error(capsys, "not readable as JSON")
    assert calls == []  # pip never ran
    ok = _wheelhouse(tmp_path / "ok", python=here, glibc="2.17")
    assert wh.main(["install", str(ok), "--dry-run"]) == 0
    assert capsys.readouterr().out.split()[1:] == [
        "-m", "pip", "install", "--no-index", "--find-links", str(ok), "-e", f"{ROOT}[gpu]"
    ]  # fmt: skip
    assert calls == []
    assert wh.main(["install", str(ok)]) == 0
    assert calls[0][0] == sys.executable and "--no-index" in calls[0]  # into the Python that ran it
    _fake_pip(monkeypatch, wh, rc=1)
    assert wh.main(["install", str(ok)]) == 1
    assert "pip install failed (exit code 1)" in capsys.readouterr().err


def test_the_script_runs_as_a_command():
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "build", "--python-version", "3.12"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and p.stderr.strip() == (
        "wheelhouse: the following arguments are required: DIR (see --help)"
    )
    p = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "build" in p.stdout and "install" in p.stdout

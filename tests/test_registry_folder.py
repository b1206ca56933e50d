"""The registry folder: generate writes only into a folder it owns; loading names the file and line of each
mistake; run compares the registry with the traces."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dskbench import paths
from dskbench.registry.command import cli_generate
from dskbench.registry.generate import (
    drift_message,
    write_registry,
)
from dskbench.registry.load import load_registry
from dskbench.registry.manifest import MANIFEST
from dskbench.registry.model import RegistryError
from tests import test_registry
from tests.test_registry import DOCS

shapes, entries = test_registry.shapes, test_registry.entries  # its fixtures, used here too

# -- the registry folder: generate writes only into a folder it owns --------------------------------


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture
def reg_copy(tmp_path: Path) -> Path:
    """A copy of the committed registry (with its manifest), for tests that change it."""
    reg = tmp_path / "reg"
    shutil.copytree(paths.REGISTRY_DIR, reg)
    return reg


def test_committed_registry_has_a_manifest_owning_every_file():
    owned = (paths.REGISTRY_DIR / MANIFEST).read_text()
    assert all(f"- {p.name}\n" in owned for p in paths.REGISTRY_DIR.glob("*.yaml"))
    assert all(f"- {name}\n" in owned for name in DOCS)


def test_generate_refuses_a_folder_holding_other_files_and_leaves_it_intact(tmp_path, capsys):
    from dskbench.frontends import cli

    out = tmp_path / "shapes"
    out.mkdir()
    (out / "deployment.yaml").write_text("tp: 8\n")
    (out / "notes.txt").write_text("mine\n")
    before = _snapshot(out)
    assert cli.main(["registry", "generate", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("dskbench: ")
    assert "deployment.yaml, notes.txt" in err and "did not write" in err
    assert captured.out == ""  # refused before doing anything
    assert _snapshot(out) == before  # nothing removed, nothing added (not even a manifest)


def test_generate_into_a_new_folder_reports_what_it_wrote_then_unchanged(entries, tmp_path, capsys):
    out = tmp_path / "new" / "reg"
    assert cli_generate(None, out, check=False) == 0
    assert f"wrote {out}: {len(entries)} added, 0 changed, 0 removed; 0 unchanged" in capsys.readouterr().out
    assert sorted(p.stem for p in out.glob("*.yaml")) == sorted(entries)
    assert (out / MANIFEST).read_text() == (paths.REGISTRY_DIR / MANIFEST).read_text()
    assert cli_generate(None, out, check=False) == 0
    assert f"0 added, 0 changed, 0 removed; {len(entries)} unchanged" in capsys.readouterr().out
    assert cli_generate(None, out, check=True) == 0
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli_generate(None, empty, check=False) == 0  # an empty folder is claimed too


def test_generate_reports_changes_and_removes_only_files_it_wrote(entries, tmp_path):
    out = tmp_path / "reg"
    fewer = {k: v for k, v in entries.items() if k != "silu_and_mul"}
    write_registry(fewer, out, DOCS)
    (out / "rmsnorm.yaml").write_text("edited by hand\n")
    w = write_registry(entries, out, DOCS)
    assert (w.added, w.changed, w.removed) == (["silu_and_mul"], ["rmsnorm"], [])
    assert "1 added (silu_and_mul), 1 changed (rmsnorm), 0 removed" in w.line(out)
    w = write_registry(fewer, out, DOCS)
    assert (w.added, w.changed, w.removed) == ([], [], ["silu_and_mul"])
    assert not (out / "silu_and_mul.yaml").exists()
    assert "silu_and_mul.yaml" not in (out / MANIFEST).read_text()


def test_partial_traces_generate_deletes_nothing(reg_copy, tmp_path, capsys):
    one = paths.TRACES_DIR / "deepseek_op_traces.md"
    before = _snapshot(reg_copy)
    assert cli_generate([one], reg_copy, check=False) == 2
    err = capsys.readouterr().err
    assert "--traces leaves out" in err and "deepseek_kernel_traces.md" in err and "--out DIR" in err
    assert _snapshot(reg_copy) == before  # no file removed or rewritten from one document
    fresh = tmp_path / "one"
    assert cli_generate([one], fresh, check=False) == 0  # a new folder takes a partial registry
    partial = _snapshot(fresh)
    assert 0 < len(partial) - 1 < len(before) - 1
    assert cli_generate([one], fresh, check=False) == 0  # ...and the same documents again
    assert "0 added, 0 changed, 0 removed" in capsys.readouterr().out
    assert cli_generate(None, fresh, check=False) == 0  # every document: the folder grows
    assert len(_snapshot(fresh)) == len(before)
    assert cli_generate([one], fresh, check=False) == 2  # and is no longer a partial one's


def test_a_damaged_manifest_never_reaches_outside_its_folder(tmp_path, entries):
    reg = tmp_path / "reg"
    reg.mkdir()
    outside = tmp_path / "precious.yaml"
    outside.write_text("keep\n")
    (reg / MANIFEST).write_text("traces: []\nfiles: [../precious.yaml]\n")
    with pytest.raises(RegistryError, match=r"\.manifest:2: files: expected a list of file names"):
        write_registry(entries, reg, DOCS)
    assert outside.read_text() == "keep\n"


def test_check_reports_a_folder_without_a_manifest(entries, reg_copy, capsys):
    (reg_copy / MANIFEST).unlink()
    assert cli_generate(None, reg_copy, check=True) == 1
    assert f"has no manifest ({MANIFEST})" in capsys.readouterr().out


# -- loading the registry: one line naming the file and line for each mistake -----------------------


def _list_error(reg: Path, monkeypatch, capsys) -> str:
    """`dskbench list` on the registry folder `reg`: exit 2 and its one stderr line."""
    from dskbench.frontends import cli

    monkeypatch.setattr(paths, "REGISTRY_DIR", reg)
    assert cli.main(["list"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("dskbench: ") and "Traceback" not in err
    return err


def test_a_stray_copy_holding_another_kernels_name_is_an_error_naming_both(reg_copy, monkeypatch, capsys):
    shutil.copyfile(reg_copy / "rmsnorm.yaml", reg_copy / "rmsnorm_backup.yaml")
    err = _list_error(reg_copy, monkeypatch, capsys)
    assert "rmsnorm_backup.yaml:3: name 'rmsnorm'" in err and f"{reg_copy / 'rmsnorm.yaml'}" in err
    (reg_copy / "rmsnorm_backup.yaml").unlink()
    (reg_copy / "renamed.yaml").write_text((reg_copy / "rmsnorm.yaml").read_text())
    (reg_copy / "rmsnorm.yaml").unlink()
    with pytest.raises(RegistryError, match="renamed.yaml:3: name 'rmsnorm' does not match the file name"):
        load_registry(reg_copy)


def test_yaml_syntax_error_names_file_and_line(reg_copy, monkeypatch, capsys):
    p = reg_copy / "rmsnorm.yaml"
    p.write_text(p.read_text().replace("status: benchmark", "status: [benchmark"))
    err = _list_error(reg_copy, monkeypatch, capsys)
    assert f"{p}:8: not valid YAML" in err


@pytest.mark.parametrize(
    ("old", "new", "want"),
    [
        (
            "status: benchmark",
            "staus: benchmark",
            ":7: unknown key 'staus' in a registry entry; did you mean 'status'?",
        ),
        (
            "  executed: true",
            "  execute: true",
            ":41: unknown key 'execute' in an op; did you mean 'executed'?",
        ),
        ("status: benchmark", "status: benchmrk", ":7: status: expected one of benchmark, host-only"),
        ("  executed: true", "  executed: 'no'", ":41: executed: expected true or false, got 'no'"),
        ("aliases: []", "aliases: rmsnorm2", ":4: aliases: expected a list of kernel names"),
        (
            "  executed: true",
            "  executed: true\n  models: [deepseek-v4]",
            ":42: models: expected a list of deepseek-r1, deepseek-v3.2, got ['deepseek-v4']",
        ),
        ("aliases: []", "aliases: []\nname: rmsnorm", ":5: key 'name' given twice (first at line 3)"),
        ("  phases: [decode, prefill]", "  phases: decode", ":42: phases: expected a list of phases"),
        ("  layers: all", "  layers: [all]", ":43: layers: expected all, dense or moe"),
        (
            "- {site: 'layernorm.py:102', kind: kernel, ",
            "- {site: 'layernorm.py:102', kinds: kernel, ",
            ":13: unknown key 'kinds' in a call site; did you mean 'kind'?",
        ),
        (
            "- {site: 'layernorm.py:102', kind: kernel, ",
            "- {site: 'layernorm.py:102', ",
            ":13: call site with no kind",
        ),
        (
            "- {site: 'layernorm.py:102', kind: kernel, ",
            "- {site: 102, kind: kernel, ",
            ":13: site: expected a string",
        ),
    ],
)
def test_bad_fields_name_the_key_and_line(reg_copy, old, new, want):
    p = reg_copy / "rmsnorm.yaml"
    text = p.read_text()
    assert old in text
    p.write_text(text.replace(old, new, 1))
    with pytest.raises(RegistryError) as e:
        load_registry(reg_copy)
    assert str(e.value).startswith(f"{p}{want}")


def test_a_minimal_entry_loads_and_a_missing_folder_is_named(tmp_path):
    reg = tmp_path / "reg"
    reg.mkdir()
    (reg / "k.yaml").write_text("name: k\nstatus: host-only\nops:\n- name: a\n- {name: b, executed: false}\n")
    e = load_registry(reg)["k"]
    assert (e.status, e.op_names, e.aliases, e.category) == ("host-only", ("a",), (), None)
    with pytest.raises(RegistryError, match="no_reg: no registry folder"):
        load_registry(tmp_path / "no_reg")


# -- run compares the registry with the traces ------------------------------------------------------


def test_run_refuses_a_drifted_registry_unless_allowed(reg_copy, monkeypatch, capsys):
    from dskbench.frontends import cli

    monkeypatch.setattr(paths, "REGISTRY_DIR", reg_copy)
    args = ["run", "--device", "cpu", "--kernel", "rmsnorm", "--dry-run"]
    assert cli.main(args) == 0  # an up-to-date copy runs
    capsys.readouterr()
    p = reg_copy / "rmsnorm.yaml"
    p.write_text(p.read_text().replace("category: normalization", "category: gemm"))
    (reg_copy / "silu_and_mul.yaml").unlink()
    assert cli.main(args) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert (
        err[-1].startswith("dskbench: ") and "rmsnorm, silu_and_mul" in err[-1] and "--allow-drift" in err[-1]
    )
    assert "cases to run" not in captured.out
    assert cli.main([*args, "--allow-drift"]) == 0
    assert "cases to run" in capsys.readouterr().out


def test_no_trace_documents_no_drift_check(reg_copy, tmp_path, monkeypatch):
    (reg_copy / "rmsnorm.yaml").write_text("name: rmsnorm\n")
    monkeypatch.setattr(paths, "REGISTRY_DIR", reg_copy)
    assert drift_message() is not None and "rmsnorm" in drift_message()
    monkeypatch.setattr(paths, "TRACES_DIR", tmp_path / "no_traces")  # a registry installed alone
    assert drift_message() is None

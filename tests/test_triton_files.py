"""Trace rows that name a file of Triton kernels but not the kernels: the walker's file rows, the `ast`
extraction (decorators, aliases, stacked autotune, helpers, imports, shims, a file turned package, a
wheel), the data file traces/triton_kernels.yaml (its checks, one-line errors naming the file and key),
`dskbench registry triton-files`, and the entries `registry generate` makes of them."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import pytest
import yaml

from dskbench.registry.command import cli_generate, cli_triton_files
from dskbench.registry.generate import default_trace_files, generate
from dskbench.registry.model import RegistryError
from dskbench.registry.traces import parse_trace
from dskbench.registry.triton_data import default_data_file, load_triton_kernels
from dskbench.registry.triton_source import SglangSource, SourceError, kernels_in_text, kernels_of_file
from dskbench.shapes.cases import load_shapes

SAMPLE = Path(__file__).parent / "fixtures" / "triton" / "kernels_sample.py"

SAMPLE_OPS = """\
import triton
import triton.language as tl


@triton.jit
def moved_kernel(x):
    pass


@triton.jit
def other_kernel(x):
    pass


@triton.jit
def unused_kernel(x):
    pass


def launch_moved(x):
    other_kernel[(1,)](x)


class Pool:  # another module's class: not followed from an import
    def write(self, x):
        unused_kernel[(1,)](x)
"""

TRACE = """\
# Kernel traces

### Triton JIT (sglang/python/)

| File | Kernels |
|------|---------|
| x/sample.py | sample kernels |
| old/shim.py | shim kernels |
| pkg.py | package kernels |
| x/named.py | named_kernel, other_named |
"""


def _tree(root: Path) -> Path:
    """A small sglang package: a file of kernels, the module it imports from, a shim, a package."""
    files = {
        "sglang/__init__.py": "",
        "sglang/srt/__init__.py": "",
        "sglang/srt/x/sample.py": SAMPLE.read_text(),
        "sglang/kernels/ops/sample_ops.py": SAMPLE_OPS,
        "sglang/srt/old/shim.py": "from sglang.kernels.ops.sample_ops import *  # noqa\n",
        "sglang/srt/pkg/__init__.py": "from sglang.srt.pkg.part import Alloc\n",
        "sglang/srt/pkg/part.py": (
            "from sglang.kernels.ops.sample_ops import other_kernel\n\n\n"
            "class Alloc:\n    def run(self, x):\n        other_kernel[(1,)](x)\n"
        ),
    }
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    (root / "sglang-9.9.9.dist-info").mkdir()
    return root


def _names(kernels):
    return [k.name for k in kernels]


# -- the walker ------------------------------------------------------------------------------------


def test_walker_keeps_rows_that_name_a_file_but_not_its_kernels(tmp_path):
    doc = tmp_path / "t.md"
    doc.write_text(TRACE)
    d = parse_trace(doc)
    rows = [(r.file, r.text, r.line) for r in d.file_rows]
    assert rows == [
        ("x/sample.py", "sample kernels", 7),
        ("old/shim.py", "shim kernels", 8),
        ("pkg.py", "package kernels", 9),
    ]
    assert {"named_kernel", "other_named"} <= set(d.kernels)  # a row that names its kernels is as before


def test_the_traces_file_rows_are_the_triton_jit_tables():
    rows = [r for p in default_trace_files() for r in parse_trace(p).file_rows]
    assert {r.file for r in rows} >= {
        "mem_cache/memory_pool.py",
        "mem_cache/allocator.py",
        "layers/logits_processor.py",
    }
    assert all(r.section.startswith("Triton JIT") for r in rows)


# -- extraction ------------------------------------------------------------------------------------


def test_extraction_of_one_file_finds_every_decorator_form():
    ks = kernels_in_text(SAMPLE.read_text(), "sample.py")
    assert _names(ks) == [
        "plain_kernel",
        "with_args_kernel",
        "autotuned_kernel",
        "aliased_module_kernel",
        "imported_jit_kernel",
        "renamed_jit_kernel",
        "helper_fn",
    ]
    lines = SAMPLE.read_text().splitlines()
    for k in ks:
        assert lines[k.line - 1].startswith(f"def {k.name}("), k  # the def's line, below its decorators


def test_closure_follows_imports_and_drops_device_helpers(tmp_path):
    src = SglangSource(_tree(tmp_path))
    ks = kernels_of_file(src, ["sglang/srt/x/sample.py"])
    got = {k.name: (k.file, k.via) for k in ks}
    assert "helper_fn" not in got  # only called inside another kernel: inlined, never launched
    assert got["plain_kernel"] == ("sglang/srt/x/sample.py", "")
    assert got["moved_kernel"] == (
        "sglang/kernels/ops/sample_ops.py",
        "imported from sglang.kernels.ops.sample_ops",
    )
    assert got["other_kernel"] == ("sglang/kernels/ops/sample_ops.py", "launcher")  # through launch_moved
    assert "unused_kernel" not in got  # another module's class is not followed
    assert ks == sorted(ks, key=lambda k: (k.file, k.line, k.name))


def test_a_shim_and_a_file_turned_package_resolve(tmp_path):
    src = SglangSource(_tree(tmp_path))
    assert src.trace_file("old/shim.py") == ["sglang/srt/old/shim.py"]
    shim = kernels_of_file(src, src.trace_file("old/shim.py"))
    assert set(_names(shim)) == {"moved_kernel", "other_kernel", "unused_kernel"}  # everything re-exported
    pkg = src.trace_file("pkg.py")
    assert pkg == ["sglang/srt/pkg/__init__.py", "sglang/srt/pkg/part.py"]
    assert _names(kernels_of_file(src, pkg)) == ["other_kernel"]
    assert src.trace_file("nowhere.py") == []


def test_a_wheel_reads_the_same_and_gives_its_version(tmp_path):
    root = _tree(tmp_path / "tree")
    whl = tmp_path / "sglang-9.9.9-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for p in sorted(root.rglob("*")):
            if p.is_file():
                z.write(p, str(p.relative_to(root)))
        z.writestr("sglang-9.9.9.dist-info/METADATA", "Version: 9.9.9\n")
    a, b = SglangSource(root), SglangSource(whl)
    assert (a.version(), b.version()) == ("9.9.9", "9.9.9")
    assert kernels_of_file(a, ["sglang/srt/x/sample.py"]) == kernels_of_file(b, ["sglang/srt/x/sample.py"])
    assert SglangSource(root / "sglang").names == a.names  # the package folder itself


def test_a_source_that_is_not_sglang_is_one_line(tmp_path):
    for bad in (tmp_path, tmp_path / "missing.whl"):
        with pytest.raises(SourceError) as e:
            SglangSource(bad)
        assert "\n" not in str(e.value)


# -- triton-files and the data file ----------------------------------------------------------------


def test_triton_files_writes_the_data_and_keeps_hand_fields(tmp_path, capsys):
    root = _tree(tmp_path / "tree")
    doc = tmp_path / "t.md"
    doc.write_text(TRACE)
    out = tmp_path / "triton_kernels.yaml"
    assert cli_triton_files(root, [doc], out) == 1  # new kernels: no status yet
    assert "write a status and why for 9 new kernel(s)" in capsys.readouterr().out
    data = yaml.safe_load(out.read_text())
    assert data["sglang"] == "9.9.9"
    assert data["files"]["pkg.py"] == {
        "source": ["sglang/srt/pkg/__init__.py", "sglang/srt/pkg/part.py"],
        "kernels": ["other_kernel"],
    }
    k = data["kernels"]["plain_kernel"]
    assert (k["file"], k["line"], k["status"]) == ("sglang/srt/x/sample.py", 12, None)
    with pytest.raises(RegistryError, match=r"kernels\.[a-z_]+\.status: missing"):
        load_triton_kernels(out)
    for k in data["kernels"].values():
        k.update(status="not-in-model", why="a test kernel")
    out.write_text(yaml.safe_dump(data))
    assert cli_triton_files(root, [doc], out) == 0
    again = yaml.safe_load(out.read_text())
    assert again["kernels"]["plain_kernel"]["why"] == "a test kernel"  # kept on re-extraction
    assert load_triton_kernels(out).files["old/shim.py"] == ("moved_kernel", "other_kernel", "unused_kernel")


def test_a_traced_file_gone_from_the_release_asks_for_moved(tmp_path, capsys):
    root = _tree(tmp_path / "tree")
    doc = tmp_path / "t.md"
    doc.write_text(TRACE + "| gone/file.py | gone kernels |\n")
    out = tmp_path / "triton_kernels.yaml"
    assert cli_triton_files(root, [doc], out) == 2
    err = capsys.readouterr().err
    assert "gone/file.py: no such file" in err and "`moved`" in err and err.count("\n") == 1
    out.write_text("moved:\n  gone/file.py: {to: [sglang/srt/pkg/part.py], why: moved}\n")
    assert cli_triton_files(root, [doc], out) == 1
    assert yaml.safe_load(out.read_text())["files"]["gone/file.py"]["kernels"] == ["other_kernel"]


GOOD_KERNEL = "{file: a.py, line: 3, status: benchmark, why: runs}"


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("kernels: [a]", "kernels: expected a mapping"),
        ("kernels:\n  k: {file: a.py, line: 0, status: benchmark, why: x}", "kernels.k.line"),
        ("kernels:\n  k: {file: a.py, line: 3, status: maybe, why: x}", "kernels.k.status: 'maybe'"),
        ("kernels:\n  k: {file: a.py, line: 3, status: benchmark}", "kernels.k.why: missing"),
        ("kernels:\n  k: {line: 3, status: benchmark, why: x}", "kernels.k.file: missing"),
        (
            "kernels:\n  k: {file: a.py, line: 3, status: benchmark, why: x, stauts: y}",
            "kernels.k.stauts: unknown key",
        ),
        (
            f"kernels:\n  k: {GOOD_KERNEL}\nfiles:\n  f.py: {{kernels: [j]}}",
            "files.f.py.kernels: 'j' is not under `kernels`",
        ),
        (
            f"kernels:\n  k: {GOOD_KERNEL}\nfiles:\n  f.py: {{kernels: k}}",
            "files.f.py.kernels: expected a list",
        ),
        ("colours: 3", "(top level).colours: unknown key"),
        ("kernels: [", ":2: bad YAML"),
    ],
)
def test_a_bad_data_file_is_one_line_naming_the_file_and_key(tmp_path, text, key):
    p = tmp_path / "triton_kernels.yaml"
    p.write_text(text + "\n")
    with pytest.raises(RegistryError) as e:
        load_triton_kernels(p)
    msg = str(e.value)
    assert "\n" not in msg and "triton_kernels.yaml" in msg and key in msg, msg


def test_generate_refuses_a_file_row_the_data_does_not_cover(tmp_path, capsys, monkeypatch):
    doc = tmp_path / "t.md"
    doc.write_text(TRACE)
    data = tmp_path / "triton_kernels.yaml"
    data.write_text(f"kernels:\n  k: {GOOD_KERNEL}\nfiles:\n  x/sample.py: {{kernels: [k]}}\n")
    with pytest.raises(
        RegistryError, match=r"triton_kernels.yaml: files: no entry for 'old/shim.py' \(t.md:8\)"
    ):
        generate([doc], load_shapes(), triton=load_triton_kernels(data))
    monkeypatch.setattr("dskbench.registry.triton_data.default_data_file", lambda: data)
    assert cli_generate([doc], tmp_path / "out", check=False) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "files: no entry for 'old/shim.py'" in err


# -- the generated entries -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def entries():
    return generate(default_trace_files(), load_shapes())


def test_every_kernel_of_the_data_file_is_an_entry_with_its_file_line_and_status(entries):
    data = load_triton_kernels()
    assert data.sglang == "0.5.16" and len(data.kernels) == 38
    for name, k in data.kernels.items():
        e = entries[name]
        assert e["source"] == "triton", name
        assert {"site": f"{k.file}:{k.line}", "doc": e["traces"][0]["doc"]} in e["definition"], name
        assert e["status"] == k.status and e["status_reason"].startswith(k.why), name
        assert all(t["section"].startswith("Triton JIT") for t in e["traces"]), name
    by_status = {}
    for k in data.kernels.values():
        by_status[k.status] = by_status.get(k.status, 0) + 1
    assert by_status == {"benchmark": 12, "not-in-model": 24, "needs-multi-gpu": 2}


def test_the_kernels_a_deepseek_step_runs(entries):
    e = entries["set_mla_kv_buffer_kernel"]
    assert e["status"] == "benchmark" and e["category"] == "memory"
    assert e["definition"][0]["site"] == "sglang/kernels/ops/kvcache/mla_buffer.py:12"
    assert [o["name"] for o in e["ops"]] == ["set_mla_kv_buffer"]
    assert e["ops"][0]["shapes"]["kv_write"] == [{"T": "T", "Lkv": 512, "Dr": 64, "pool": 131072}]
    for name, line, op in (
        ("alloc_decode_kernel", 103, "alloc_decode"),
        ("alloc_extend_kernel", 16, "alloc_extend"),
    ):
        e = entries[name]
        assert e["status"] == "benchmark" and [o["name"] for o in e["ops"]] == [op]
        assert e["definition"][0]["site"] == f"sglang/kernels/ops/memory/allocator.py:{line}"
    v32 = entries["_set_k_and_s_triton_kernel"]
    assert v32["status"] == "benchmark" and v32["ops"][0]["models"] == ["deepseek-v3.2"]
    assert entries["_get_k_triton_kernel"]["status"] == "not-in-model"
    assert entries["matmul_kernel_persistent"]["status"] == "not-in-model"  # batch-invariant mode only
    assert entries["_all_gather_kernel_inner"]["status"] == "needs-multi-gpu"


def test_the_committed_data_matches_the_sglang_wheel_when_it_is_here():
    whl = Path.home() / ".cache" / "gpu-bundle-wheels" / "sglang-0.5.16-cp312-cp312-manylinux_2_34_x86_64.whl"
    if not whl.exists():
        pytest.skip("no sglang 0.5.16 wheel on this machine")
    tmp = default_data_file().read_text()
    out = Path(shutil.os.environ.get("TMPDIR", "/tmp")) / "dskbench_triton_kernels_check.yaml"
    out.write_text(tmp)
    try:
        assert cli_triton_files(whl, None, out) == 0
        assert out.read_text() == tmp
    finally:
        out.unlink()

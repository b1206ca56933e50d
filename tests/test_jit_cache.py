"""The JIT caches: where they are, whether a box is fresh, and moving them between boxes (no GPU needed)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from dskbench.setup import jit_cache
from dskbench.setup.jit_cache import CacheError, cache_dirs, export_caches, import_caches, is_fresh, mismatch

REPO = Path(__file__).resolve().parent.parent


def _dirs(root: Path) -> dict[str, Path]:
    return cache_dirs(env={}, home=root)


def test_cache_folders_follow_each_librarys_variable(tmp_path):
    env = {"TRITON_CACHE_DIR": "/t", "TVM_FFI_CACHE_DIR": "/v", "FLASHINFER_WORKSPACE_BASE": "/f"}
    d = cache_dirs(env=env, home=tmp_path)
    assert d["triton"] == Path("/t") and d["tvm-ffi"] == Path("/v")
    assert d["deep_gemm"] == tmp_path / ".tensorrt_llm"
    assert cache_dirs(env={"TRTLLM_DG_CACHE_DIR": "/d"}, home=tmp_path)["deep_gemm"] == Path("/d")
    assert d["flashinfer"] == Path("/f/.cache/flashinfer")
    assert d["torch_extensions"] == tmp_path / ".cache" / "torch_extensions"
    assert cache_dirs(env={}, home=tmp_path)["triton"] == tmp_path / ".triton" / "cache"


def test_a_box_is_fresh_until_a_cache_holds_a_file(tmp_path):
    d = _dirs(tmp_path)
    d["triton"].mkdir(parents=True)  # an empty folder is still fresh
    assert is_fresh(d)
    (d["triton"] / "abc").mkdir()
    (d["triton"] / "abc" / "k.cubin").write_bytes(b"x")
    assert not is_fresh(d)


def test_export_then_import_carries_every_cache_to_another_box(tmp_path, monkeypatch):
    monkeypatch.setattr(jit_cache, "gpu_arch", lambda: "9.0")
    src = _dirs(tmp_path / "a")
    for name, rel in (("triton", "h1/k.cubin"), ("flashinfer", "0.6/90/norm.so"), ("tvm-ffi", "m/lib.so")):
        (src[name] / rel).parent.mkdir(parents=True, exist_ok=True)
        (src[name] / rel).write_bytes(name.encode())
    info = export_caches(tmp_path / "caches.tar.gz", src)
    assert info["files"] == {
        "flashinfer": 1,
        "tvm-ffi": 1,
        "triton": 1,
        "torch_extensions": 0,
        "deep_gemm": 0,
    }
    dst = _dirs(tmp_path / "b")
    import_caches(tmp_path / "caches.tar.gz", dst)
    assert (dst["triton"] / "h1/k.cubin").read_bytes() == b"triton"
    assert (dst["flashinfer"] / "0.6/90/norm.so").read_bytes() == b"flashinfer"
    assert not is_fresh(dst)


def test_an_archive_for_another_gpu_or_stack_is_refused_unless_forced(tmp_path, monkeypatch):
    monkeypatch.setattr(jit_cache, "gpu_arch", lambda: "9.0")
    src = _dirs(tmp_path / "a")
    (src["triton"] / "k").mkdir(parents=True)
    (src["triton"] / "k" / "x").write_bytes(b"1")
    archive = tmp_path / "c.tar.gz"
    export_caches(archive, src)
    monkeypatch.setattr(jit_cache, "gpu_arch", lambda: "10.0")
    with pytest.raises(
        CacheError, match=r"c.tar.gz: built for GPU compute capability 9.0, this box has 10.0"
    ):
        import_caches(archive, _dirs(tmp_path / "b"))
    import_caches(archive, _dirs(tmp_path / "b"), force=True)
    assert (tmp_path / "b" / ".triton" / "cache" / "k" / "x").exists()
    assert mismatch(
        {"gpu_arch": "9.0", "stack": {"torch": "2.11.0"}}, {"gpu_arch": "9.0", "stack": {"torch": "2.12.0"}}
    ) == ("built with torch 2.11.0, this box has 2.12.0")


def test_an_archive_cannot_write_outside_the_cache_folders(tmp_path, monkeypatch):
    monkeypatch.setattr(jit_cache, "gpu_arch", lambda: None)
    archive = tmp_path / "evil.tar.gz"
    manifest = json.dumps({"gpu_arch": None, "stack": jit_cache.stack_versions()}).encode()
    with tarfile.open(archive, "w:gz") as tar:
        for name, data in ((jit_cache.MANIFEST, manifest), ("triton/../../escaped", b"x")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(tarfile.TarError):
        import_caches(archive, _dirs(tmp_path / "b"))
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "b" / "escaped").exists()


def test_warm_with_a_bad_archive_is_a_one_line_error(tmp_path):
    bad = tmp_path / "not-an-archive.tar.gz"
    bad.write_text("hello")
    p = subprocess.run(
        [sys.executable, "-m", "dskbench", "warm", "--import", str(bad), "--device", "cpu"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        f"dskbench: {bad}: not a dskbench JIT cache archive (expected dskbench-jit-cache.json inside)"
    ]

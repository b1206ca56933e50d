"""The JIT caches a sweep fills, and moving them between boxes: `dskbench warm --export FILE` / `--import FILE`.

Why: on a fresh GPU box most of a first run is compilation (FlashInfer's and sglang's nvcc builds,
Triton's kernels). The builds depend only on the GPU architecture and the pinned stack, so a fleet
builds once per (architecture, stack) and every other box starts warm from the archive.

Where each library keeps its cache (its environment variable first, then its default):
  FlashInfer     $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer, else ~/.cache/flashinfer
  tvm-ffi        $TVM_FFI_CACHE_DIR, else ~/.cache/tvm-ffi (sglang's jit_kernel modules)
  Triton         $TRITON_CACHE_DIR, else ~/.triton/cache
  torch          $TORCH_EXTENSIONS_DIR, else ~/.cache/torch_extensions
  DeepGEMM       $TRTLLM_DG_CACHE_DIR, else ~/.tensorrt_llm (FlashInfer's copy compiles per GEMM shape)
An archive is a gzipped tar of these folders with a manifest (the stack's versions and the GPU's
compute capability); importing into a box whose stack or GPU differs is refused, naming the difference.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dskbench.setup.stack import installed

MANIFEST = "dskbench-jit-cache.json"
STACK = ("torch", "triton", "flashinfer-python", "sglang-kernel", "sglang", "apache-tvm-ffi")


class CacheError(ValueError):
    """An archive that cannot be written or read here; the message is one line for the user."""


def cache_dirs(env: Mapping[str, str] | None = None, home: Path | None = None) -> dict[str, Path]:
    """The JIT cache folders of this environment, by library."""
    env = os.environ if env is None else env
    home = home or Path.home()
    fi_base = env.get("FLASHINFER_WORKSPACE_BASE")
    return {
        "flashinfer": Path(fi_base) / ".cache" / "flashinfer" if fi_base else home / ".cache" / "flashinfer",
        "tvm-ffi": Path(env.get("TVM_FFI_CACHE_DIR") or home / ".cache" / "tvm-ffi"),
        "triton": Path(env.get("TRITON_CACHE_DIR") or home / ".triton" / "cache"),
        "torch_extensions": Path(env.get("TORCH_EXTENSIONS_DIR") or home / ".cache" / "torch_extensions"),
        "deep_gemm": Path(env.get("TRTLLM_DG_CACHE_DIR") or home / ".tensorrt_llm"),
    }


def count_files(folder: Path) -> int:
    """Files under `folder` (0 when it does not exist)."""
    return sum(len(files) for _, _, files in os.walk(folder)) if folder.is_dir() else 0


def is_fresh(dirs: Mapping[str, Path] | None = None) -> bool:
    """True when no JIT cache holds a file: a first run here compiles everything it meets."""
    return all(count_files(d) == 0 for d in (dirs or cache_dirs()).values())


def stack_versions() -> dict[str, str | None]:
    """The versions of the stack the builds depend on (None: not installed)."""
    return installed(STACK)


def gpu_arch() -> str | None:
    """The first visible GPU's compute capability ("9.0"), or None without one."""
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(0)
            return f"{major}.{minor}"
    except Exception:  # noqa: BLE001 - no torch or no driver: no GPU to build for
        pass
    return None


def manifest(dirs: Mapping[str, Path]) -> dict[str, Any]:
    return {
        "gpu_arch": gpu_arch(),
        "stack": stack_versions(),
        "files": {name: count_files(d) for name, d in dirs.items()},
    }


def export_caches(path: Path, dirs: Mapping[str, Path] | None = None) -> dict[str, Any]:
    """Write every cache folder that exists into `path` (tar.gz) with the manifest; returns it."""
    dirs = dict(dirs or cache_dirs())
    if path.exists() and path.is_dir():
        raise CacheError(f"{path}: is a folder; expected a file to write the archive to")
    info = manifest(dirs)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".part")
        with tarfile.open(tmp, "w:gz") as tar:
            data = json.dumps(info, indent=2).encode()
            member = tarfile.TarInfo(MANIFEST)
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
            for name, folder in dirs.items():
                if folder.is_dir():
                    tar.add(folder, arcname=name)
        tmp.replace(path)
    except OSError as e:
        raise CacheError(f"{path}: cannot write the archive: {e.strerror or e}") from e
    return info


def read_manifest(path: Path) -> dict[str, Any]:
    try:
        with tarfile.open(path, "r:gz") as tar:
            f = tar.extractfile(MANIFEST)
            if f is None:
                raise KeyError(MANIFEST)
            return json.loads(f.read())
    except FileNotFoundError as e:
        raise CacheError(f"{path}: no such file") from e
    except (tarfile.TarError, KeyError, json.JSONDecodeError, OSError) as e:
        raise CacheError(f"{path}: not a dskbench JIT cache archive (expected {MANIFEST} inside)") from e


def mismatch(theirs: Mapping[str, Any], ours: Mapping[str, Any]) -> str | None:
    """Why an archive's builds do not fit this box (GPU architecture or a stack version), or None."""
    if theirs.get("gpu_arch") != ours.get("gpu_arch"):
        return (
            f"built for GPU compute capability {theirs.get('gpu_arch')}, this box has {ours.get('gpu_arch')}"
        )
    for name in STACK:
        a, b = (theirs.get("stack") or {}).get(name), (ours.get("stack") or {}).get(name)
        if a != b:
            return f"built with {name} {a}, this box has {b}"
    return None


def import_caches(path: Path, dirs: Mapping[str, Path] | None = None, force: bool = False) -> dict[str, Any]:
    """Unpack an archive's folders into this box's cache folders (files already there are kept where
    the archive has none). Refused when its GPU architecture or stack differs, unless `force`."""
    dirs = dict(dirs or cache_dirs())
    theirs = read_manifest(path)
    why = mismatch(theirs, manifest(dirs))
    if why and not force:
        raise CacheError(f"{path}: {why} (--force imports it anyway)")
    with tarfile.open(path, "r:gz") as tar:
        for member in tar.getmembers():
            top, _, rest = member.name.partition("/")
            if member.name == MANIFEST or top not in dirs or not rest:
                continue
            member.name = rest
            dirs[top].mkdir(parents=True, exist_ok=True)
            tar.extract(member, dirs[top], filter="data")  # no absolute paths, no escaping links
    return theirs

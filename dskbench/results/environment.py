"""The environment block stored with every run: machine, GPU, driver, library versions, git commit."""

from __future__ import annotations

import datetime as dt
import os
import platform
import socket
import subprocess
import sys
import uuid
from collections.abc import Mapping
from typing import Any

from dskbench import __version__, paths
from dskbench.adapters.backends import package_version
from dskbench.device.info import DeviceInfo
from dskbench.results.source_tree import tree_id

# Distributions whose versions decide what a kernel measurement means.
TRACKED_PACKAGES = (
    "torch",
    "triton",
    "sglang-kernel",
    "flashinfer-python",
    "sglang",
    "apache-tvm-ffi",
    "nvidia-ml-py",
    "asv",
    "asv_runner",
    "pytest-benchmark",
)


# NVLink multicast (NVLS in NCCL, multicast objects in torch's symmetric memory and NVSHMEM) is on where
# the host supports it. These variables switch it off, for hosts whose GPUs are shared with other tenants
# (a multicast object can put a GPU out of service there). NCCL's all-reduce then takes another
# algorithm, so every run records whether they were set. dskbench sets them only when asked:
# `dskbench run --no-multicast` (or DSKBENCH_NO_MULTICAST=1), and `dskbench comm` under
# DSKBENCH_NO_MULTICAST=1.
NO_MULTICAST_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
NO_MULTICAST_SWITCH = "DSKBENCH_NO_MULTICAST"


def no_multicast_asked(environ: Mapping[str, str] | None = None) -> bool:
    """DSKBENCH_NO_MULTICAST set to anything but empty or 0."""
    environ = os.environ if environ is None else environ
    return environ.get(NO_MULTICAST_SWITCH, "").strip() not in ("", "0")


def multicast_env(no_multicast: bool, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of the processes a run starts: `base` (default os.environ), with NVLink multicast
    switched off if asked, else as it is."""
    env = dict(os.environ if base is None else base)
    if no_multicast:
        env.update(NO_MULTICAST_ENV)
    return env


def worker_env(
    token: str, base: Mapping[str, str] | None = None, no_multicast: bool = False
) -> dict[str, str]:
    """Environment of one GPU's processes: that GPU alone; NVLink multicast switched off only if asked
    (--no-multicast), else as the host has it."""
    env = multicast_env(no_multicast, base)
    env["CUDA_VISIBLE_DEVICES"] = token
    return env


def multicast_block(no_multicast: bool = False, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """For the environment record: the multicast variables as the run's processes saw them (null: unset,
    the host's default; `no_multicast`: dskbench sets them in those processes), and whether that
    switches multicast off (`dskbench run` also records its --no-multicast in `settings`)."""
    env = multicast_env(no_multicast, environ)
    seen = {k: env.get(k) for k in NO_MULTICAST_ENV}
    return {"off": seen == NO_MULTICAST_ENV, "env": seen}


def new_run_id() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]


def git_state() -> dict[str, Any]:
    def git(*args: str) -> str | None:
        try:
            # safe.directory: a checkout copied to another machine belongs to another user, and git then
            # refuses it ("dubious ownership"); the commit of what runs is still what we want to record.
            cmd = ["git", "-c", f"safe.directory={paths.REPO_ROOT}", *args]
            out = subprocess.run(
                cmd, cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=10, check=True
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip()

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    state = {"commit": commit, "dirty": bool(status) if status is not None else None}
    given = os.environ.get("DSKBENCH_GIT_COMMIT")
    if given and given != commit:
        # A launcher that copied the tree (a job system that ships a snapshot of it) knows its commit
        # better than the copy's git, whose .git may be stale: every later tree would read as an old
        # commit, "dirty". Keep what git said, next to it.
        state = {"commit": given, "dirty": None, "source": "DSKBENCH_GIT_COMMIT", "git_said": state}
    # the code itself, whatever git says: `git rev-parse COMMIT:dskbench` gives the same id for its commit
    state["source_tree"] = tree_id(paths.REPO_ROOT / "dskbench")
    return state


def versions() -> dict[str, str | None]:
    v = {name: package_version(name) for name in TRACKED_PACKAGES}
    v["dskbench"] = __version__
    v["python"] = platform.python_version()
    try:
        import torch

        v["torch"] = torch.__version__
        v["cuda_runtime"] = torch.version.cuda
    except ImportError:
        pass
    return v


def device_block(device: DeviceInfo) -> dict[str, Any]:
    block: dict[str, Any] = {"kind": device.kind, "name": device.name, "sm": device.sm, "count": device.count}
    if device.kind != "cuda":
        block["name"] = f"CPU {socket.gethostname()}"  # CPU timings of two hosts never share a series
        block["cpu"] = platform.processor() or platform.machine()
        from dskbench.device.info import usable_cores

        block["cores"] = usable_cores()
        return block
    import torch

    props = torch.cuda.get_device_properties(0)
    block.update(
        memory_gib=round(props.total_memory / 2**30, 1),
        multiprocessors=props.multi_processor_count,
        l2_bytes=getattr(props, "L2_cache_size", None),
    )
    try:
        from dskbench.measure import gpu_identity

        block.update(gpu_identity() or {})
    except Exception as e:  # NVML is optional; say why it is missing
        block["nvml_error"] = f"{type(e).__name__}: {e}"
    return block


def run_peaks(device: DeviceInfo) -> dict[str, Any]:
    """{"peaks": the datasheet peaks of a GPU run's device} (every % of peak is taken against them);
    {} on a CPU or a GPU with no datasheet entry."""
    from dskbench.measure.peaks import datasheet_peaks

    peaks = datasheet_peaks(device.name) if device.kind == "cuda" else None
    return {"peaks": peaks} if peaks else {}


def environment(device: DeviceInfo, no_multicast: bool = False) -> dict[str, Any]:
    """The block of one run; `no_multicast`: dskbench switches NVLink multicast off in its processes."""
    return {
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "device": device_block(device),
        "versions": versions(),
        "git": git_state(),
        "multicast": multicast_block(no_multicast),
    }


def command_line(argv: list[str] | None = None) -> list[str]:
    """The command as a user would type it again: the program named `dskbench` (python -m dskbench, the
    console script), so that a results file holds no path of the machine that wrote it."""
    argv = list(sys.argv if argv is None else argv)
    if argv and os.path.basename(argv[0]) in ("dskbench", "__main__.py"):
        argv[0] = "dskbench"
    return argv

"""Other processes on a GPU, through NVML: a kernel timed while another process runs work on the same GPU
measures the contention as much as the kernel, and nothing in its numbers says so.

`gpu_sharing(index, ignore)` lists the compute and graphics processes NVML reports on CUDA device
`index` (MPS clients included), less the PIDs to ignore (this run's own: `run_pids()`), with the GPU's
MIG mode and whether an MPS server runs. Without NVML (no nvidia-ml-py, no driver) the state is
"unknown", never an error.

PID namespaces: in a container, NVML may report the host's PIDs, which match none of this run's. When
NVML's list holds none of our PIDs, some of its PIDs do not exist here, and some of our processes hold
the device open (/dev/nvidiaN), those PIDs cannot be told apart: as many of them as ours holding the
device are taken to be ours, and the finding's note says so. (A process of ours that opened the device
without creating a context yet is then counted as one of NVML's: an error towards "exclusive".)
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dskbench.device.procs import processes
from dskbench.measure import nvml

MPS_SERVER = "nvidia-cuda-mps-server"
RUN_PID_ENV = "DSKBENCH_RUN_PID"  # set by the process that starts a run; its workers inherit it
CHECK_EVERY_S = 5.0


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    name: str | None
    used_mib: float | None

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "name": self.name, "used_mib": self.used_mib}

    def label(self) -> str:
        parts = [self.name or "name not readable"]
        if self.used_mib is not None:
            parts.append(f"{self.used_mib:,.0f} MiB")
        return f"pid {self.pid} ({', '.join(parts)})"


@dataclass(frozen=True)
class Sharing:
    """What NVML says about the other users of one GPU."""

    state: str  # "exclusive", "shared" or "unknown"
    gpu: int = 0
    others: tuple[GpuProcess, ...] = ()
    count: int = 0  # other processes (fewer than `others` when PIDs could not be matched)
    mig: bool | None = None
    mps: bool | None = None
    note: str | None = None

    @property
    def shared(self) -> bool:
        return self.state == "shared"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"gpu": self.gpu, "state": self.state, "count": self.count}
        out.update(others=[p.to_json() for p in self.others], mig=self.mig, mps=self.mps)
        return {**out, "note": self.note} if self.note else out

    def record_field(self) -> dict[str, Any] | None:
        """The `shared_gpu` field of a result measured now: None unless others use the GPU."""
        if not self.shared:
            return None
        out: dict[str, Any] = {"pids": [p.pid for p in self.others], "names": [p.name for p in self.others]}
        return {**out, "count": self.count} if self.count != len(self.others) else out

    def describe(self) -> str:
        """One line: who else uses the GPU (or why that is unknown)."""
        if self.state == "unknown":
            return f"GPU {self.gpu}: cannot tell whether other processes use it ({self.note})"
        if not self.shared:
            return f"GPU {self.gpu}: no other process uses it"
        who = ", ".join(p.label() for p in self.others)
        n = f"{self.count} other process{'es' if self.count != 1 else ''}"
        return f"GPU {self.gpu} is in use by {n}: {who}" + (f" ({self.note})" if self.note else "")


def _try(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:
        return None


def _listed(lib: Any, h: Any) -> dict[int, Any]:
    """pid -> NVML process info, over compute, graphics and MPS client processes."""
    out: dict[int, Any] = {}
    for call in (
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetGraphicsRunningProcesses",
        "nvmlDeviceGetMPSComputeRunningProcesses",
    ):
        fn = getattr(lib, call, None)
        for p in (_try(fn, h) if fn else None) or ():
            out.setdefault(int(p.pid), p)
    return out


def _mps_clients(lib: Any, h: Any) -> bool:
    fn = getattr(lib, "nvmlDeviceGetMPSComputeRunningProcesses", None)
    return bool(_try(fn, h)) if fn else False


def _name(lib: Any, pid: int, proc_dir: str) -> str | None:
    try:
        with open(f"{proc_dir}/{pid}/comm") as fh:
            return fh.read().strip() or None
    except OSError:
        pass
    got = _try(getattr(lib, "nvmlSystemGetProcessName", lambda _p: None), pid)
    if got is None:
        return None
    text = got.decode(errors="replace") if isinstance(got, bytes) else str(got)
    return os.path.basename(text.strip()) or None


def _mig(lib: Any, h: Any) -> bool | None:
    try:
        current = lib.nvmlDeviceGetMigMode(h)
    except Exception as e:  # a GPU without MIG answers "not supported"
        return False if "NotSupported" in type(e).__name__ or "Not Supported" in str(e) else None
    if isinstance(current, list | tuple):
        current = current[0]
    return bool(current)


def _mps_server_running(proc_dir: str) -> bool:
    return any(name == MPS_SERVER for _pid, _ppid, name in _processes(proc_dir))


def _processes(proc_dir: str) -> list[tuple[int, int, str]]:
    """(pid, ppid, command name) of every process in this PID namespace; none without /proc."""
    return [(p.pid, p.ppid, p.name) for p in processes(proc_dir)]


def run_pids(proc_dir: str = "/proc", environ: Mapping[str, str] | None = None) -> set[int]:
    """This run's processes: the one that started it (DSKBENCH_RUN_PID, else this one), this one, and
    all their descendants (workers, probes, compilers)."""
    env = os.environ if environ is None else environ
    roots = {os.getpid()}
    if (env.get(RUN_PID_ENV) or "").isdigit():
        roots.add(int(env[RUN_PID_ENV]))
    children: dict[int, list[int]] = {}
    for pid, ppid, _name in _processes(proc_dir):
        children.setdefault(ppid, []).append(pid)
    out, stack = set(roots), list(roots)
    while stack:
        for c in children.get(stack.pop(), ()):
            if c not in out:
                out.add(c)
                stack.append(c)
    return out


def _holding(pids: Iterable[int], minor: int | None, proc_dir: str) -> int:
    """How many of `pids` hold the GPU's device file (/dev/nvidia<minor>; any GPU's when unknown) open."""
    want = re.compile(rf"/dev/nvidia{minor}$" if minor is not None else r"/dev/nvidia\d+$")
    n = 0
    for pid in pids:
        try:
            fds = os.listdir(f"{proc_dir}/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if want.match(os.readlink(f"{proc_dir}/{pid}/fd/{fd}")):
                    n += 1
                    break
            except OSError:
                continue
    return n


def gpu_sharing(
    index: int = 0, ignore: Iterable[int] = (), *, lib: Any = None, proc_dir: str = "/proc"
) -> Sharing:
    """The other processes on CUDA device `index`, less the PIDs in `ignore`; "unknown" without NVML."""
    lib = lib if lib is not None else nvml.library()
    if lib is None:
        return Sharing("unknown", index, note="NVML not available (nvidia-ml-py not installed, or no driver)")
    try:
        h = nvml.device_handle(lib, index)
        if not hasattr(lib, "nvmlDeviceGetComputeRunningProcesses"):
            raise RuntimeError("this nvidia-ml-py cannot list processes")
        lib.nvmlDeviceGetComputeRunningProcesses(h)  # fails here, not silently below, when NVML cannot
    except Exception as e:
        return Sharing("unknown", index, note=f"NVML: {type(e).__name__}: {e}")
    ours = set(ignore)
    listed = _listed(lib, h)
    procs = []
    mps = _mps_clients(lib, h) or _mps_server_running(proc_dir)
    for pid, info in listed.items():
        name = _name(lib, pid, proc_dir)
        if name == MPS_SERVER:  # the server runs for its clients, which MPS lists on their own
            mps = True
            continue
        used = getattr(info, "usedGpuMemory", None)
        procs.append(GpuProcess(pid, name, round(used / 2**20, 1) if isinstance(used, int) else None))
    mig = _mig(lib, h)
    others = [p for p in procs if p.pid not in ours]
    count, note = len(others), None
    unseen = [p for p in others if not os.path.exists(f"{proc_dir}/{p.pid}")]
    if unseen and len(others) == len(procs) and ours:
        # NVML lists PIDs this namespace does not have, and none of ours: in a container, NVML may
        # report the host's PIDs, ours among them. Ours holding the device stand for as many of those.
        held = _holding(ours, _try(lib.nvmlDeviceGetMinorNumber, h), proc_dir)
        if held:
            count = len(others) - min(held, len(unseen))
            note = (
                f"NVML reports {len(unseen)} PID(s) of another PID namespace (a container?); "
                f"{min(held, len(unseen))} of them are taken to be this run's own"
            )
    state = "shared" if count else "exclusive"
    return Sharing(state, index, tuple(others) if count else (), count, mig, mps, note)


class SharingWatch:
    """gpu_sharing at most once per `period_s`: a sweep asks after every case, NVML's process queries
    take milliseconds, and a process that shares the GPU rarely comes and goes within seconds."""

    def __init__(
        self,
        index: int = 0,
        period_s: float = CHECK_EVERY_S,
        probe: Callable[[], Sharing] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.probe = probe or (lambda: gpu_sharing(index, run_pids()))
        self.period_s, self.clock = period_s, clock
        self._last: Sharing | None = None
        self._at = 0.0

    def current(self) -> Sharing:
        if self._last is None or self.clock() - self._at >= self.period_s:
            return self.refresh()
        return self._last

    def refresh(self) -> Sharing:
        """Ask NVML now."""
        self._last, self._at = self.probe(), self.clock()
        return self._last

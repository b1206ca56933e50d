"""Backends: one implementation of a kernel, declared lazily as a target string with its requirements.

A target is ``"package.module:attr.sub"`` or ``"torch.ops.<ns>.<op>.<overload>"`` (the latter imports the
modules in ``preload`` first, so the library registers its ops). Nothing is imported until a backend is
resolved, so listing and gating work on any machine. Packages move kernels between releases; a backend
may list ``fallbacks`` that are tried in order, modules a later release moved are tried at their new
place (adapters/moved.py), and the target that really resolved is recorded.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dskbench.device.info import DeviceInfo

# kind of build, recorded with results
KINDS = ("aot", "jit", "triton", "cutedsl", "cubin", "torch", "host")


class Unavailable(RuntimeError):
    """The backend's code is not in this install (module or attribute missing, import failed)."""


UNAVAILABLE = "not available in this install"  # how a skipped record's reason says so: true of every case


Window = tuple[int, int | None]  # compute capabilities lo..hi inclusive; hi None: lo and newer


def _window_label(w: Window) -> str:
    lo, hi = w
    if hi is None:
        return f"sm{lo}+"
    return f"sm{lo}" if lo == hi else f"sm{lo}-{hi}"


@dataclass(frozen=True)
class Requirement:
    """What a backend needs from the machine: a CUDA GPU whose compute capability (major*10+minor: 90,
    100) lies in any one of `windows` (none: any), and `gpus` of them. `sm=(100, 103)` (exactly these)
    and `min_sm=90` (this and newer) are shorthands that become windows."""

    cuda: bool = True
    min_sm: int | None = None
    sm: tuple[int, ...] | None = None  # exact list, e.g. (100, 103) for tcgen05-only kernels
    gpus: int = 1
    windows: tuple[Window, ...] = ()  # e.g. ((90, 90), (100, 103)): sm90, or sm100 to sm103

    def __post_init__(self) -> None:
        if self.windows or (self.sm is None and self.min_sm is None):
            return
        if self.sm is not None:
            floor = self.min_sm or 0
            wins: tuple[Window, ...] = tuple((s, s) for s in self.sm if s >= floor)
            if not wins:
                raise ValueError(f"no capability in sm={self.sm} is sm{floor} or newer")
        else:
            wins = ((self.min_sm or 0, None),)
        object.__setattr__(self, "windows", wins)

    def allows(self, sm: int) -> bool:
        """Whether a GPU of compute capability `sm` lies in one of the windows."""
        return not self.windows or any(lo <= sm and (hi is None or sm <= hi) for lo, hi in self.windows)

    def reason_unmet(self, device: DeviceInfo) -> str | None:
        """A `skipped: ...` reason, or None when the machine qualifies."""
        if not self.cuda:
            return None
        if device.kind != "cuda":
            need = _window_label(self.windows[0]) if self.windows else "a CUDA GPU"
            return f"needs {need} (found no CUDA GPU)"
        if not self.allows(device.sm):
            want = "/".join(_window_label(w) for w in self.windows)
            return f"needs {want} (found sm{device.sm})"
        if self.gpus > device.count:
            return f"needs {self.gpus} GPUs (found {device.count})"
        return None


SM100 = Requirement(sm=(100, 103))
SM90_ONLY = Requirement(sm=(90,))
ANY_CUDA = Requirement()
CPU_OK = Requirement(cuda=False)


# bind(fn, inputs, case) -> zero-argument launcher that runs the kernel once and returns its output.
# Anything that is set-up (plan(), workspace allocation, weight shuffles) happens in bind, not the launcher.
Binder = Callable[[Any, dict[str, Any], Any], Callable[[], Any]]


@dataclass(frozen=True)
class Backend:
    name: str  # unique within a kernel: sgl_kernel, sglang_jit, flashinfer, triton, torch, ...
    target: str | None  # None: the adapter's own torch reference
    package: str | None  # distribution recorded; None: inferred from the target (sgl_kernel -> sglang-kernel)
    kind: str
    bind: Binder
    requires: Requirement = ANY_CUDA
    preload: tuple[str, ...] = ()
    fallbacks: tuple[str, ...] = ()
    capturable: bool = True  # False: timed eagerly (and reported so)
    dispatches_to: str | None = None  # a wrapper that forwards elsewhere says where
    label: str | None = None  # e.g. "Hopper path for cutlass_scaled_fp4_mm"
    skip: Callable[[Any], str | None] | None = None  # per-case reason this backend does not apply
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # The library compiles again for each new shape at its first launch (a JIT that specialises its
    # kernel on the sizes, as DeepGEMM's does), so `dskbench warm` builds each shape, not one per op.
    # Triton and CuTe DSL backends do so by their kind (execution/warm.py: PER_SHAPE_KINDS).
    builds_per_shape: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"backend {self.name}: unknown kind {self.kind!r}")


@dataclass(frozen=True)
class Resolved:
    fn: Any
    target: str
    package: str | None
    version: str | None


# top-level module -> distribution name on PyPI
DISTRIBUTIONS = {
    "sgl_kernel": "sglang-kernel",
    "sglang": "sglang",
    "flashinfer": "flashinfer-python",
    "torch": "torch",
    "triton": "triton",
    "dskbench": "dskbench",
}


def distribution_of(target: str) -> str | None:
    top = target.split(":", 1)[0].split(".")[0]
    if target.startswith("torch.ops."):
        top = target.split(".")[2]
    return DISTRIBUTIONS.get(top)


@functools.cache
def package_version(dist: str | None) -> str | None:
    """The installed distribution's version, once per process: importlib.metadata scans every folder on
    sys.path for it, tens of milliseconds where a large stack is installed, and every case resolves its
    backend."""
    if not dist:
        return None
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def import_target(target: str, preload: tuple[str, ...] = ()) -> Any:
    """Import what a target string names. Raises Unavailable with the reason."""
    try:
        for mod in preload:
            importlib.import_module(mod)
        if target.startswith("torch.ops."):
            import torch

            obj: Any = torch.ops
            for part in target.split(".")[2:]:
                obj = getattr(obj, part)
            return obj
        if ":" not in target:
            raise Unavailable(f"bad target {target!r}: expected 'module:attr'")
        mod_name, attr = target.split(":", 1)
        obj = importlib.import_module(mod_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
        return obj
    except Unavailable:
        raise
    except (ImportError, AttributeError, RuntimeError, OSError) as e:
        raise Unavailable(f"{target}: {type(e).__name__}: {e}") from None


def candidates(backend: Backend) -> list[str]:
    """The targets resolve tries, in order: the target, its fallbacks, then each of them at the place a
    later release moved its module to (adapters/moved.py)."""
    from dskbench.adapters.moved import moved

    named = [t for t in (backend.target, *backend.fallbacks) if t]
    later = [m for t in named if (m := moved(t)) is not None and m not in named]
    return named + list(dict.fromkeys(later))


def resolve(backend: Backend) -> Resolved:
    """Find the backend's callable: its target, else each fallback; say what was tried if none exists."""
    if backend.target is None:
        return Resolved(None, "reference", backend.package, package_version(backend.package))
    tried: list[str] = []
    for target in candidates(backend):
        try:
            fn = import_target(target, backend.preload)
        except Unavailable as e:
            tried.append(str(e))
            continue
        dist = distribution_of(target) if target != backend.target or not backend.package else backend.package
        return Resolved(fn, target, dist, package_version(dist))
    raise Unavailable(f"{UNAVAILABLE}: " + "; ".join(tried))


def absent_package(backend: Backend) -> str | None:
    """A top-level package that every target of the backend needs and this install lacks, found without
    importing anything; None when resolving it may succeed. A run then starts no process only to learn
    that a backend is not installed (resolve still says why when the case runs)."""
    if backend.target is None:
        return None
    missing = []
    for target in candidates(backend):
        needed = [*backend.preload, "torch" if target.startswith("torch.ops.") else target.split(":", 1)[0]]
        lacking = [m.split(".")[0] for m in needed if not _findable(m.split(".")[0])]
        if not lacking:
            return None
        missing.append(lacking[0])
    return missing[0] if missing else None


def _findable(top: str) -> bool:
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False

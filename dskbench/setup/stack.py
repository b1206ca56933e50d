"""Which software stack this box needs, and whether the Python at hand has it: scripts/setup.sh asks
before it installs anything (so the standard library only, and torch imported only when asked).

    python3 -m dskbench.setup.stack gpu      exit 0 when `nvidia-smi -L` lists a GPU, else 1
    python3 -m dskbench.setup.stack check    exit 0 when this Python has the `gpu` extra's pinned versions;
                                       else 1, one line per package that differs
    python3 -m dskbench.setup.stack tools    exit 0 when this Python can build dskbench without an index (its own
                                       setuptools, and wheel for a setuptools before 70.1); else 1, one line
    python3 -m dskbench.setup.stack cuda     exit 0 when torch can use the GPU nvidia-smi sees; else 1 and one
                                       line saying what does not match (driver, CUDA build of torch)
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[2]
# The packages whose versions must match: the rest of the extra (triton, asv, ...) follows from them.
CHECKED = ("torch", "sglang-kernel", "flashinfer-python", "sglang")


def _load_toml(path: Path) -> dict[str, Any]:
    try:
        import tomllib  # Python 3.11+
    except ImportError:  # Python 3.10: the copy pip carries
        from pip._vendor import tomli as tomllib
    with path.open("rb") as f:
        return tomllib.load(f)


def pinned(pyproject: Path = ROOT / "pyproject.toml", extra: str = "gpu") -> dict[str, str]:
    """The `==` pins of the checked packages in pyproject's extra: {name: version}."""
    reqs = _load_toml(pyproject).get("project", {}).get("optional-dependencies", {}).get(extra, [])
    pins = {}
    for req in reqs:
        m = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*==\s*([^\s;,]+)\s*", req)
        if m and _norm(m.group(1)) in CHECKED:
            pins[_norm(m.group(1))] = m.group(2)
    return pins


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed(names: tuple[str, ...] = CHECKED) -> dict[str, str | None]:
    """Each package's installed version in this Python (None when it is not installed)."""
    found: dict[str, str | None] = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def _base(version: str) -> str:
    """torch's local label (2.11.0+cu130) names a CUDA build of the same release: it still matches."""
    return version.split("+", 1)[0]


def stack_problems(pins: Mapping[str, str], have: Mapping[str, str | None]) -> list[str]:
    """One line per pinned package this Python lacks or has at another version; [] when all match."""
    problems = []
    for name, want in pins.items():
        got = have.get(name)
        if got is None:
            problems.append(f"{name}: not installed (the gpu extra pins {want})")
        elif _base(got) != want:
            problems.append(f"{name}: {got} installed, the gpu extra pins {want}")
    return problems


Runner = Callable[[list[str]], Optional[str]]  # noqa: UP045 - evaluated at run time (3.9)


def _run(cmd: list[str]) -> str | None:
    """A command's stdout, or None when it is missing or fails."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def gpu_names(run: Runner = _run) -> list[str]:
    """The NVIDIA GPUs the driver lists (`nvidia-smi -L`); [] without a driver or GPU."""
    out = run(["nvidia-smi", "-L"]) or ""
    return [line.strip() for line in out.splitlines() if line.startswith("GPU ")]


def driver_cuda(run: Runner = _run) -> str | None:
    """The newest CUDA version the driver supports, from nvidia-smi's header ("CUDA Version: 12.8")."""
    m = re.search(r"CUDA Version:\s*(\d+\.\d+)", run(["nvidia-smi"]) or "")
    return m.group(1) if m else None


def cuda_problem(
    gpus: list[str], driver: str | None, torch_version: str | None, torch_cuda: str | None, usable: bool
) -> str | None:
    """One line naming what keeps torch off the GPU nvidia-smi lists, or None when nothing does.
    torch_cuda is the CUDA torch was built for (torch.version.cuda; None for a CPU build)."""
    if not gpus or usable:
        return None
    if torch_version is None:
        return "torch is not installed in this Python: install the gpu extra (pip install -e '.[gpu]')"
    if torch_cuda is None:
        return (
            f"nvidia-smi lists {len(gpus)} GPU(s) but torch {torch_version} is a CPU-only build: "
            "install the gpu extra's CUDA build (pip install -e '.[gpu]')"
        )
    if driver and int(torch_cuda.split(".")[0]) > int(driver.split(".")[0]):
        return (
            f"torch {torch_version} is built for CUDA {torch_cuda} but the NVIDIA driver supports CUDA "
            f"{driver} at most: update the driver, or install a torch built for CUDA {driver.split('.')[0]}"
        )
    return (
        f"nvidia-smi lists {len(gpus)} GPU(s) (driver's CUDA {driver or 'unknown'}) but torch "
        f"{torch_version} (CUDA {torch_cuda}) cannot use them: check CUDA_VISIBLE_DEVICES and the driver "
        "(python -c 'import torch; torch.cuda.init()' shows torch's error)"
    )


def build_tools_problem(setuptools_version: str | None, has_wheel: bool) -> str | None:
    """What keeps this Python from building dskbench itself (no build isolation, so no index)."""
    if setuptools_version is None:
        return "no setuptools in this Python, needed to install dskbench into it (pip install setuptools)"
    parts = tuple(int(x) for x in re.findall(r"\d+", setuptools_version)[:2])
    if parts < (68, 0):
        return f"setuptools {setuptools_version} in this Python; dskbench needs setuptools>=68"
    if parts < (70, 1) and not has_wheel:
        return f"setuptools {setuptools_version} in this Python needs the wheel package to install dskbench"
    return None


def _torch_facts() -> tuple[str | None, str | None, bool]:
    try:
        import torch
    except ImportError:
        return None, None, False
    return torch.__version__, torch.version.cuda, bool(torch.cuda.is_available())


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    what = args[0] if len(args) == 1 else ""
    if what == "gpu":
        return 0 if gpu_names() else 1
    if what == "check":
        problems = stack_problems(pinned(), installed())
        for p in problems:
            print(f"{sys.executable}: {p}")
        return 1 if problems else 0
    if what == "tools":
        have = installed(("setuptools", "wheel"))
        if problem := build_tools_problem(have["setuptools"], have["wheel"] is not None):
            print(f"{sys.executable}: {problem}", file=sys.stderr)
        return 1 if problem else 0
    if what == "cuda":
        gpus = gpu_names()
        problem = cuda_problem(gpus, driver_cuda() if gpus else None, *_torch_facts()) if gpus else None
        if problem:
            print(f"dskbench: {problem}", file=sys.stderr)
        return 1 if problem else 0
    print("dskbench.setup.stack: expected one of: gpu, check, tools, cuda", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())

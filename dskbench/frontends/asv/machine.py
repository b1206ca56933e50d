"""Write this box's entry in ~/.asv-machine.json from NVML, so asv files results per GPU model and host.

asv keeps results per machine name (results/asv/<machine>/). Its default name is the host name and
`asv machine --yes --machine NAME` stores only the name, so results from two GPUs on one host, or a
GPU swapped in a box, would land in one series. Here the name is ``<gpu>_<host>`` (e.g.
``nvidia-h100-80gb-hbm3_node7``) and the entry carries the GPU, driver and CUDA versions, which
asv shows as filterable parameters.

    asv run --machine "$(python -m dskbench.frontends.asv.machine)" -E existing:python3 --set-commit-hash "$(git rev-parse HEAD)"

The command prints only the machine name on stdout (what it wrote goes to stderr). Other entries in
the file are kept.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import socket
import sys
from pathlib import Path
from typing import Any

ASV_MACHINE_FILE_VERSION = 1  # asv's MachineCollection.api_version


def _str(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _nvml() -> Any:
    import pynvml

    pynvml.nvmlInit()
    return pynvml


def _visible(lib: Any) -> list[Any]:
    """NVML handles of the GPUs CUDA would use, in CUDA's order (CUDA_VISIBLE_DEVICES honoured)."""
    from dskbench.device.visible import visible_devices

    count = int(lib.nvmlDeviceGetCount())
    tokens = visible_devices()
    if tokens is None:
        return [lib.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    handles = []
    for tok in tokens:
        if tok.isdigit():
            if int(tok) >= count:
                break  # CUDA stops at the first invalid entry
            handles.append(lib.nvmlDeviceGetHandleByIndex(int(tok)))
        else:
            handles.append(lib.nvmlDeviceGetHandleByUUID(tok))
    return handles


def read_gpus(lib: Any = None) -> list[dict[str, Any]]:
    """Name, memory, UUID of each visible GPU plus driver and CUDA driver versions. [] without GPUs.

    Raises when NVML itself is unusable (no library, no driver); `lib` injects a fake for tests.
    """
    lib = lib if lib is not None else _nvml()
    driver = _str(lib.nvmlSystemGetDriverVersion())
    cuda = int(lib.nvmlSystemGetCudaDriverVersion())
    out = []
    for h in _visible(lib):
        mem = lib.nvmlDeviceGetMemoryInfo(h)
        out.append(
            {
                "name": _str(lib.nvmlDeviceGetName(h)),
                "uuid": _str(lib.nvmlDeviceGetUUID(h)),
                "memory_gb": round(mem.total / 1e9, 1),
                "driver": driver,
                "cuda": f"{cuda // 1000}.{cuda % 1000 // 10}",
            }
        )
    return out


def slug(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-") or "unknown"


def machine_name(gpu_name: str | None, host: str) -> str:
    """``<gpu>_<host>``; ``cpu_<host>`` without a GPU. No '/', spaces or dots: it names a folder."""
    return f"{slug(gpu_name) if gpu_name else 'cpu'}_{slug(host.split('.')[0])}"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ram_bytes() -> str:
    try:
        return str(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return ""


def machine_info(gpus: list[dict[str, Any]], host: str | None = None) -> dict[str, Any]:
    """asv's machine fields (machine, os, arch, cpu, num_cpu, ram) plus gpu, gpu_count, driver, cuda."""
    host = host or socket.gethostname()
    first = gpus[0] if gpus else None
    mixed = sorted({g["name"] for g in gpus}) if len({g["name"] for g in gpus}) > 1 else None
    info: dict[str, Any] = {
        "machine": machine_name(first["name"] if first else None, host),
        "os": f"{platform.system()} {platform.release()}",
        "arch": platform.machine(),
        "cpu": _cpu_model(),
        "num_cpu": str(os.cpu_count() or ""),
        "ram": _ram_bytes(),
        "gpu": first["name"] if first else "none",
        "gpu_count": str(len(gpus)),
        "gpu_memory_gb": str(first["memory_gb"]) if first else "",
        "driver": first["driver"] if first else "",
        "cuda": first["cuda"] if first else "",
    }
    if mixed:
        info["gpu_models"] = ", ".join(mixed)  # benchmarks use the first visible GPU
    return info


def default_path() -> Path:
    return Path(os.path.expanduser("~/.asv-machine.json"))


def write_machine_file(info: dict[str, Any], path: Path | None = None) -> Path:
    """Add or replace `info`'s entry in asv's machine file, keeping the others."""
    path = path or default_path()
    data: dict[str, Any] = {}
    if path.is_file():
        try:
            data = json.loads(path.read_text())
        except ValueError:
            raise SystemExit(f"{path} is not JSON; fix or remove it") from None
    data[info["machine"]] = info
    data["version"] = ASV_MACHINE_FILE_VERSION
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=4, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def main(argv: list[str] | None = None, lib: Any = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m dskbench.frontends.asv.machine", description=__doc__.split("\n")[0]
    )
    p.add_argument("--path", type=Path, help="machine file (default ~/.asv-machine.json)")
    p.add_argument("--host", help="host part of the name (default: this host)")
    p.add_argument("--print-name", action="store_true", help="print the name, write nothing")
    args = p.parse_args(argv)
    try:
        gpus = read_gpus(lib)
    except Exception as e:  # no NVML: a CPU-only box (reference timings)
        print(f"NVML unavailable ({type(e).__name__}: {e}); describing a CPU-only machine", file=sys.stderr)
        gpus = []
    info = machine_info(gpus, args.host)
    if not args.print_name:
        path = write_machine_file(info, args.path)
        print(f"wrote machine {info['machine']!r} to {path}: {json.dumps(info)}", file=sys.stderr)
    print(info["machine"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What every command shares: exit codes, the error a command raises for bad input, and the registry,
shapes and device a run or warm-up plans with."""

from __future__ import annotations

from typing import Any

from dskbench import paths

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
EXIT_PIPE = 141  # stdout's reader went away (`dskbench list | head`): what a shell reports for SIGPIPE
SWEEPS = ("decode", "prefill", "decode_graph")
DESCRIPTION = (
    "Command line: `dskbench registry generate | list | run | warm | compare | pick | report` and the tools "
    "beside them: `stats | plan-stats | run-to-run | noise-prior | pack | comm | insitu | fidelity | selftest`."
)


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C is: workers stopped, the results file left whole, a message."""


def on_sigterm(signum: int, frame: Any) -> None:
    """The first SIGTERM stops the command cleanly; a second one (a job runner signalling the whole
    process group again, during clean-up or at exit) ends the process as SIGTERM does, without a traceback."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise Terminated()


class UsageError(Exception):
    """Bad input found below a command: main() prints it as one `dskbench: ...` line and exits 2."""


def registry_and_shapes() -> tuple[dict[str, Any], Any]:
    """The kernel registry and the shapes file; a broken one is a usage error."""
    from dskbench.registry.load import RegistryError, load_registry
    from dskbench.shapes.cases import ShapeError, default_shapes

    try:
        shapes = default_shapes()
        return load_registry(paths.REGISTRY_DIR), shapes
    except (RegistryError, ShapeError) as e:
        raise UsageError(str(e)) from None


def device_choice(requested: str | None) -> tuple[str, str | None]:
    """The device to run on, and a message to print (or an error)."""
    from dskbench.device.info import DeviceInfo

    found = DeviceInfo.detect("cuda")
    if requested == "cuda" and found.kind != "cuda":
        raise SystemExit(
            "dskbench: --device cuda, but no CUDA GPU is visible to torch (torch.cuda.is_available() is False).\n"
            "Run `dskbench run --device cpu` to time the torch references on the CPU instead."
        )
    if requested is None and found.kind != "cuda":
        return (
            "cpu",
            "no CUDA GPU found: timing the torch reference implementations on the CPU (capped sweep)",
        )
    return requested or "cuda", None


def sweeps(asked: list[str] | None) -> list[str]:
    """--sweep as given (repeatable; 'all' = every sweep); decode and prefill by default."""
    if not asked:
        return ["decode", "prefill"]
    return list(SWEEPS) if "all" in asked else asked


def visible_gpu_count(device: str) -> int:
    """GPUs torch sees when running on CUDA; none on the CPU (what --gpus is checked against)."""
    from dskbench.device.info import DeviceInfo

    return DeviceInfo.detect("cuda").count if device == "cuda" else 0


def stamp() -> str:
    import datetime as dt

    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def version() -> str:
    """The installed package's version; the source tree's when dskbench runs uninstalled."""
    from importlib import metadata

    try:
        return metadata.version("dskbench")
    except metadata.PackageNotFoundError:
        from dskbench import __version__

        return __version__


def read_results(files: Any) -> list[Any]:
    """The runs of results files; an unreadable or malformed one is a usage error naming it."""
    from dskbench.results.io import ResultsError, read_runs

    try:
        return read_runs(files)
    except ResultsError as e:
        raise UsageError(str(e)) from None


def write_json(path: Any, doc: Any, flag: str = "--json") -> None:
    """`doc` as indented JSON at `path` (its folder made); a path that cannot be written is a usage error."""
    import json

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot write it: {e.strerror or e}") from None


def need_gpu(command: str) -> None:
    """A command that times on a GPU, run where torch sees none: a usage error that says so."""
    from dskbench.device.info import DeviceInfo

    if DeviceInfo.detect("cuda").kind != "cuda":
        raise UsageError(
            f"{command} needs a CUDA GPU, and torch sees none (torch.cuda.is_available() is False)"
        )

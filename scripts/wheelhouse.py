#!/usr/bin/env python3
"""Install dskbench with its pinned GPU stack on a box without network, from a folder of wheels.

    python3 scripts/wheelhouse.py build DIR [--extra gpu] [--python-version 3.12] [--glibc 2.28]
                                            [--arch x86_64] [--dry-run] [-- PIP_DOWNLOAD_ARGS...]
    python3 scripts/wheelhouse.py install DIR [--dry-run]

`build` runs on a connected machine: `pip download` of dskbench's dependencies, the chosen extra of
pyproject.toml (by default `gpu`: torch, sglang-kernel, flashinfer-python, sglang, ... as pinned there)
and its build requirements, with everything they need, as wheels for the box's Python, C library and
CPU (by default this machine's), into DIR; then DIR/wheelhouse.json says what DIR is for. Arguments
after `--` go to pip (e.g. `--extra-index-url URL` for another CUDA build of torch).

`install` runs on the box, from the checkout: `pip install --no-index --find-links DIR -e '.[EXTRA]'`
(the extra DIR was built with) into the Python that runs this script (a virtual environment's, if one is active), after checking that
DIR was built for this Python and machine.

Why a script and not a `dskbench` subcommand: it must run before dskbench and its dependencies are
installed, so it uses the standard library only.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = "wheelhouse.json"
FORMAT = 1
EXIT_FAIL, EXIT_USAGE = 1, 2
OLDEST_GLIBC = 17  # manylinux2014 = glibc 2.17: the oldest manylinux tag a current wheel carries


class UsageError(Exception):
    """Bad input: printed as one `wheelhouse: ...` line, exit code 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not argparse's usage block
        raise UsageError(f"{message} (see --help)")


# -- what to download ------------------------------------------------------------------------------------


def _load_toml(path: Path) -> dict[str, Any]:
    try:
        import tomllib  # Python 3.11+
    except ImportError:  # Python 3.10: the copy pip carries
        from pip._vendor import tomli as tomllib
    with path.open("rb") as f:
        return tomllib.load(f)


def requirements(pyproject: Path, extra: str) -> list[str]:
    """dskbench's dependencies, the extra's (none for "none") and its build requirements, as written."""
    doc = _load_toml(pyproject)
    project = doc.get("project", {})
    extras = project.get("optional-dependencies", {})
    if extra != "none" and extra not in extras:
        known = ", ".join([*sorted(extras), "none"])
        raise UsageError(f"--extra {extra}: {pyproject.name} has no such extra (known: {known})")
    reqs = [*project.get("dependencies", []), *(extras.get(extra, []) if extra != "none" else [])]
    reqs += doc.get("build-system", {}).get("requires", [])
    return list(dict.fromkeys(reqs))


def python_version(s: str) -> str:
    if not re.fullmatch(r"3\.\d{1,2}", s):
        raise argparse.ArgumentTypeError(f"expected MAJOR.MINOR such as 3.12, got {s!r}")
    return s


def glibc_version(s: str) -> str:
    m = re.fullmatch(r"2\.(\d{1,2})", s)
    if not m or int(m.group(1)) < OLDEST_GLIBC:
        raise argparse.ArgumentTypeError(
            f"expected a glibc version 2.{OLDEST_GLIBC} or later such as 2.28, got {s!r}"
        )
    return s


def this_glibc() -> str | None:
    name, version = platform.libc_ver()
    m = re.match(r"2\.(\d+)", version) if name == "glibc" else None
    return f"2.{m.group(1)}" if m else None


def platform_tags(glibc: str, arch: str) -> list[str]:
    """Every manylinux tag a box with this glibc and CPU can install, newest first. pip takes --platform
    literally (a manylinux_2_28 box also runs manylinux_2_17 wheels, but pip does not infer that)."""
    minor = int(glibc.split(".")[1])
    tags = [f"manylinux_2_{n}_{arch}" for n in range(minor, OLDEST_GLIBC - 1, -1)]
    tags.append(f"manylinux2014_{arch}")
    if arch in ("x86_64", "i686"):
        tags += [f"manylinux2010_{arch}", f"manylinux1_{arch}"]
    return tags


def download_command(
    dest: Path, reqs: list[str], python: str, glibc: str, arch: str, pip_args: list[str]
) -> list[str]:
    cmd = [sys.executable, "-m", "pip", "download", "--dest", str(dest), "--only-binary=:all:"]
    cmd += ["--python-version", python, "--implementation", "cp"]
    for tag in platform_tags(glibc, arch):
        cmd += ["--platform", tag]
    return [*cmd, *pip_args, *reqs]


def install_command(folder: Path, extra: str) -> list[str]:
    target = str(ROOT) if extra == "none" else f"{ROOT}[{extra}]"
    return [sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(folder), "-e", target]


def run_pip(cmd: list[str]) -> int:
    """pip, its output on this terminal; its exit code."""
    return subprocess.run(cmd).returncode


# -- build -----------------------------------------------------------------------------------------------


def read_manifest(folder: Path) -> dict[str, Any] | None:
    path = folder / MANIFEST
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: not readable as JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise UsageError(f"{path}: not a wheelhouse manifest of format {FORMAT}")
    return doc


def target_of(doc: dict[str, Any]) -> tuple[str, str, str, str]:
    return (doc.get("extra"), doc.get("python"), doc.get("glibc"), doc.get("arch"))


def cmd_build(args: argparse.Namespace) -> int:
    folder: Path = args.dir
    glibc = args.glibc or this_glibc()
    if glibc is None:
        raise UsageError("this machine has no glibc to default to: say the box's with --glibc 2.N")
    python = args.python_version or f"{sys.version_info.major}.{sys.version_info.minor}"
    arch = args.arch or platform.machine()
    reqs = requirements(ROOT / "pyproject.toml", args.extra)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{folder}: exists and is not a folder")
    old = read_manifest(folder) if folder.is_dir() else None
    if old is None and folder.is_dir() and any(folder.iterdir()):
        raise UsageError(f"{folder}: a folder with other files in it; give a new or empty folder")
    want = {"extra": args.extra, "python": python, "glibc": glibc, "arch": arch}
    if old is not None and target_of(old) != target_of(want):
        raise UsageError(
            f"{folder} holds a wheelhouse for {_describe(old)}, not {_describe(want)}; give another folder"
        )
    cmd = download_command(folder, reqs, python, glibc, arch, args.pip_args)
    print(f"wheelhouse: {_describe(want)} into {folder}", file=sys.stderr)
    if args.dry_run:
        print(" ".join(cmd))
        return 0
    folder.mkdir(parents=True, exist_ok=True)
    rc = run_pip(cmd)
    if rc != 0:
        print(
            f"wheelhouse: pip download failed (exit code {rc}): see pip's message above; "
            f"{folder} is left without its {MANIFEST}, so `install` refuses it",
            file=sys.stderr,
        )
        return EXIT_FAIL
    wheels = sorted(p.name for p in folder.glob("*.whl"))
    doc = {
        "format": FORMAT,
        **want,
        "requirements": reqs,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "built_on": f"Python {platform.python_version()}, {platform.platform()}",
        "wheels": wheels,
    }
    (folder / MANIFEST).write_text(json.dumps(doc, indent=1) + "\n")
    size = sum(p.stat().st_size for p in folder.glob("*.whl")) / 2**20
    print(f"wheelhouse: {len(wheels)} wheels, {size:.0f} MiB in {folder}")
    return 0


def _describe(doc: dict[str, Any]) -> str:
    extra = "no extra" if doc.get("extra") == "none" else f"extra {doc.get('extra')!r}"
    return f"{extra}, Python {doc.get('python')}, glibc {doc.get('glibc')}, {doc.get('arch')}"


# -- install ---------------------------------------------------------------------------------------------


def check_target(doc: dict[str, Any], folder: Path, python: str, glibc: str | None, arch: str) -> None:
    """Refuse a wheelhouse made for another Python or machine before pip says so less plainly."""
    if doc.get("python") != python:
        raise UsageError(
            f"{folder} holds wheels for Python {doc.get('python')}, and {sys.executable} is Python {python}: "
            f"run this with a Python {doc.get('python')}, or build with --python-version {python}"
        )
    if doc.get("arch") != arch:
        raise UsageError(f"{folder} holds wheels for {doc.get('arch')}, and this machine is {arch}")
    if glibc is not None and _minor(glibc) < _minor(doc.get("glibc", "2.0")):
        raise UsageError(
            f"{folder} was built for glibc {doc.get('glibc')} and this machine has glibc {glibc}: "
            f"build it with --glibc {glibc}"
        )


def _minor(glibc: str) -> int:
    return int(str(glibc).split(".")[1])


def cmd_install(args: argparse.Namespace) -> int:
    folder: Path = args.dir
    if not folder.is_dir():
        raise UsageError(
            f"{folder}: no such folder (make it with `wheelhouse.py build` on a connected machine)"
        )
    doc = read_manifest(folder)
    if doc is None:
        raise UsageError(f"{folder}: no {MANIFEST} in it: not a finished `wheelhouse.py build`")
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    check_target(doc, folder, python, this_glibc(), platform.machine())
    cmd = install_command(folder, doc["extra"])
    print(f"wheelhouse: installing dskbench ({_describe(doc)}) from {folder}", file=sys.stderr)
    if args.dry_run:
        print(" ".join(cmd))
        return 0
    rc = run_pip(cmd)
    if rc != 0:
        print(
            f"wheelhouse: pip install failed (exit code {rc}): see pip's message above",
            file=sys.stderr,
        )
        return EXIT_FAIL
    print(f"wheelhouse: installed into {sys.executable}; try `dskbench list`")
    return 0


# -- command line ----------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="wheelhouse.py",
        description="Install dskbench and its pinned GPU stack on a box without network, from a folder of wheels.",
    )
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    b = sub.add_parser("build", help="on a connected machine: download the wheels the box needs into DIR")
    b.add_argument("dir", type=Path, metavar="DIR", help="a new or empty folder (or one this command built)")
    b.add_argument("--extra", default="gpu", help="pyproject.toml extra to include, or 'none' (default gpu)")
    b.add_argument(
        "--python-version", type=python_version, help="the box's Python, e.g. 3.12 (default: this one)"
    )
    b.add_argument(
        "--glibc",
        type=glibc_version,
        help="the box's glibc, e.g. 2.35 (`ldd --version`; default: this machine's)",
    )
    b.add_argument("--arch", choices=("x86_64", "aarch64"), help="the box's CPU (default: this machine's)")
    b.add_argument("--dry-run", action="store_true", help="print the pip command and download nothing")
    i = sub.add_parser("install", help="on the box, from the checkout: install dskbench from DIR alone")
    i.add_argument("dir", type=Path, metavar="DIR", help="a folder `build` wrote")
    i.add_argument("--dry-run", action="store_true", help="check DIR, print the pip command, install nothing")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    pip_args: list[str] = []
    if "--" in argv:  # everything after `--` goes to pip download
        cut = argv.index("--")
        argv, pip_args = argv[:cut], argv[cut + 1 :]
    try:
        args = build_parser().parse_args(argv)
        if pip_args and args.command != "build":
            raise UsageError("arguments after `--` go to `pip download`: only `build` takes them")
        args.pip_args = pip_args
        return cmd_build(args) if args.command == "build" else cmd_install(args)
    except UsageError as e:
        print(f"wheelhouse: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())

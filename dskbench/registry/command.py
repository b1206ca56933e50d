"""`dskbench registry generate [--traces FILE...] [--out DIR] [--check]`: what it prints and its exit code."""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

from dskbench import paths
from dskbench.registry.aliases import load_aliases
from dskbench.registry.generate import check_folder, default_trace_files, write_registry
from dskbench.registry.manifest import claim_folder
from dskbench.registry.merge import build
from dskbench.registry.model import STATUSES, RegistryError, show_path
from dskbench.registry.trace_model import TraceError
from dskbench.registry.traces import parse_trace
from dskbench.registry.triton_data import load_triton_kernels
from dskbench.shapes.cases import ShapeError, load_shapes


def cli_generate(traces: list[Path] | None, out: Path | None, check: bool) -> int:
    """`dskbench registry generate [--traces FILE...] [--out DIR] [--check]`: 0 ok, 1 check failed,
    2 bad input. `--traces` is a partial generate: see claim_folder."""
    files = [Path(p) for p in traces] if traces else default_trace_files()
    out_dir = Path(out) if out else paths.REGISTRY_DIR
    partial = bool(traces)
    if not files:  # an installed package has no traces/: generating from none would empty the registry
        where = show_path(paths.TRACES_DIR)
        print(
            f"dskbench: no trace documents in {where}: run from a checkout, or name them (--traces)",
            file=sys.stderr,
        )
        return 2
    try:
        if not check:  # refuse a folder before any work, so nothing is printed that is not done
            claim_folder(out_dir, [p.name for p in files], partial)
        docs = [parse_trace(p) for p in files]
        shapes = load_shapes()
        entries = build(docs, shapes, load_aliases(), load_triton_kernels())
    except (TraceError, ShapeError, RegistryError) as e:
        print(f"dskbench: {e}", file=sys.stderr)
        return 2
    for doc in docs:
        n = sum(1 for e in entries.values() if any(t["doc"].startswith(doc.name + ":") for t in e["traces"]))
        print(f"{doc.name}: {doc.format}, {n} kernels")
        for w in doc.warnings:
            print(f"  note: {w}")
    by_status: dict[str, list[str]] = defaultdict(list)
    for e in entries.values():
        by_status[e["status"]].append(e["name"])
    print(f"union: {len(entries)} kernels")
    for st in STATUSES:
        if by_status.get(st):
            names = ", ".join(by_status[st]) if st != "benchmark" else ""
            print(f"  {st}: {len(by_status[st])}" + (f" ({names})" if names else ""))
    names = [d.name for d in docs]
    try:
        if check:
            problems = check_folder(entries, out_dir, names)
            for line in problems:
                print(line)
            if problems:
                print("run `dskbench registry generate` and commit the result")
                return 1
            print(f"registry {show_path(out_dir)} is up to date")
            return 0
        written = write_registry(entries, out_dir, names, partial)
    except RegistryError as e:
        print(f"dskbench: {e}", file=sys.stderr)
        return 2
    print(written.line(out_dir))
    return 0


def cli_triton_files(source: Path | None, traces: list[Path] | None, out: Path | None) -> int:
    """`dskbench registry triton-files --from SRC [--traces FILE...] [--out FILE]`: read the Triton kernels
    of every trace row that names a file but not its kernels from an sglang folder or wheel, and write
    them into traces/triton_kernels.yaml (keeping its hand-written fields). 0 ok, 2 bad input; 1 when
    some kernel still needs a hand-written status."""
    from dskbench.registry.triton_data import (
        default_data_file,
        extract,
        load_triton_kernels,
        read_raw,
        render,
    )
    from dskbench.registry.triton_source import SglangSource, SourceError

    files = [Path(p) for p in traces] if traces else default_trace_files()
    data_file = Path(out) if out else default_data_file()
    try:
        src = SglangSource(source) if source else _installed_sglang()
        rows = [r for p in files for r in parse_trace(p).file_rows]
        old = read_raw(data_file) if data_file.exists() else {}
        data = extract(rows, src, old)
    except (TraceError, RegistryError, SourceError, SyntaxError) as e:
        print(f"dskbench: {e}", file=sys.stderr)
        return 2
    data_file.write_text(render(data), encoding="utf-8")
    kernels = data["kernels"]
    print(
        f"wrote {show_path(data_file)}: {len(data['files'])} traced files, {len(kernels)} Triton kernels "
        f"(sglang {data['sglang'] or 'of unknown version'})"
    )
    todo = sorted(n for n, k in kernels.items() if not k.get("status") or not k.get("why"))
    if todo:
        print(f"write a status and why for {len(todo)} new kernel(s): {', '.join(todo)}")
        return 1
    try:
        load_triton_kernels(data_file)
    except RegistryError as e:
        print(f"dskbench: {e}", file=sys.stderr)
        return 2
    return 0


def _installed_sglang():
    """The sglang package this Python would import, found without importing it."""
    import importlib.util

    from dskbench.registry.triton_source import SglangSource, SourceError

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise SourceError("no sglang installed here: name a folder holding it or its wheel (--from)")
    return SglangSource(Path(next(iter(spec.submodule_search_locations))))

"""The deployment model `dskbench pick` reads: rows of ops in execution order, their candidate paths, the
server flags that select them, and the layer mix of a step. The data is
shapes/deployment.yaml; this module only parses and checks it (every flag value must be one
sglang 0.5.16 accepts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import yaml

from dskbench import paths
from dskbench.shapes.cases import ModelShapes
from dskbench.shapes.exprs import ExprError, evaluate

DEPLOYMENT_FILE = paths.DEPLOYMENT_FILE
SCOPES = ("layer", "step", "nextn", "spec")
LAUNCH = ("python", "-m", "sglang.launch_server", "--model-path", "nvidia/DeepSeek-R1-NVFP4-v2")


class DeploymentError(ValueError):
    """A deployment file that does not parse or names a flag value sglang does not accept."""


# The keys each level of the file may hold: a misspelt one (`fuse:`) is an error, not a silent default.
ROW_KEYS = frozenset(
    {"name", "op", "ops", "variant", "calls", "scope", "min_tp", "kernels", "what_if", "paths", "replaces"}
)
PATH_KEYS = frozenset({"name", "flags", "parts", "what_if", "note", "fuses"})
PART_KEYS = frozenset({"op", "kernel", "variant", "backends"})


def _check_keys(d: Any, known: frozenset[str], where: str) -> None:
    if not isinstance(d, dict):
        raise DeploymentError(f"{where}: expected a mapping, got {type(d).__name__}")
    bad = sorted(str(k) for k in d if k not in known)
    if bad:
        raise DeploymentError(f"{where}: unknown key {bad[0]!r} (known: {', '.join(sorted(known))})")


@dataclass(frozen=True)
class Part:
    """One kernel call of a path: the fastest correct of `kernels` x `backends` (None: any backend)."""

    op: str
    kernels: tuple[str, ...]
    variant: str | None = None
    backends: tuple[str, ...] | None = None

    def matches(self, kernel: str, backend: str) -> bool:
        return kernel in self.kernels and (self.backends is None or backend in self.backends)

    @property
    def label(self) -> str:
        k = "|".join(self.kernels)
        v = f":{self.variant}" if self.variant else ""
        b = f"/{'|'.join(self.backends)}" if self.backends else ""
        return f"{k}@{self.op}{v}{b}"


@dataclass(frozen=True)
class PathSpec:
    """A candidate for a row: its parts' medians are summed. `what_if` candidates are shown, never picked."""

    name: str
    parts: tuple[Part, ...]
    flags: dict[str, str] = field(default_factory=dict)
    what_if: str | None = None
    note: str = ""
    # rows of the phase this path does the work of (SGLang's shared-expert fusion: the routed MoE runs the
    # shared expert as one more expert): priced inside this path, 0 in the step when it is picked
    fuses: tuple[str, ...] = ()


@dataclass(frozen=True)
class RowSpec:
    name: str
    op: str
    ops: tuple[str, ...]
    variant: str | None = None
    calls: int = 1
    scope: str = "layer"
    min_tp: int = 1
    layers: str | None = None  # dense | moe | None (every layer), from the shapes file
    kernels: tuple[str, ...] = ()  # "kernel" or "kernel/backend" fnmatch patterns
    what_if: tuple[tuple[str, str], ...] = ()  # (pattern, reason)
    paths: tuple[PathSpec, ...] = ()
    replaces: str | None = None  # scope nextn: the layer row the NextN draft layer runs this row instead of

    def classify(self, kernel: str, backend: str) -> tuple[str, str] | None:
        """("candidate", "") or ("what_if", reason) for a measured kernel/backend at this row, else None."""
        for pat in self.kernels:
            if _match(pat, kernel, backend):
                return "candidate", ""
        for pat, reason in self.what_if:
            if _match(pat, kernel, backend):
                return "what_if", reason
        return None

    @property
    def expected(self) -> list[tuple[str, str | None]]:
        """(kernel, backend or None) this row names outright: 'no measurement' when the results lack them."""
        out = []
        for p in self.kernels:
            if not any(c in p for c in "*?["):
                kernel, _, backend = p.partition("/")
                out.append((kernel, backend or None))
        return out


def _match(pattern: str, kernel: str, backend: str) -> bool:
    if "/" in pattern:
        return fnmatchcase(f"{kernel}/{backend}", pattern)
    return fnmatchcase(kernel, pattern)


@dataclass(frozen=True)
class Deployment:
    rows: dict[str, list[RowSpec]]  # phase -> rows in execution order
    server_flags: dict[str, dict[str, Any]]
    backend_flags: tuple[tuple[str, dict[str, str]], ...]
    layer_counts: dict[str, int]  # dense / moe
    kv_len: int
    speculative: dict[str, int]  # target_tokens, draft_forwards (evaluated)
    draft_layer: str = "moe"
    source: str = ""
    launch: tuple[str, ...] = LAUNCH  # the server command before `--tp N` and the picked flags
    speculative_flags: dict[str, str] = field(default_factory=dict)  # added when NextN/EAGLE rows are picked

    def flags_of(self, kernel: str, backend: str) -> dict[str, str]:
        for pat, flags in self.backend_flags:
            if _match(pat, kernel, backend):
                return dict(flags)
        return {}


def load_deployment(shapes: ModelShapes, path: str | Path | None = None) -> Deployment:
    p = Path(path) if path else DEPLOYMENT_FILE
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as e:
        raise DeploymentError(f"cannot read {p}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise DeploymentError(f"{p}: not valid YAML: {e}") from None
    try:
        return _parse(data, shapes, str(p))
    except (KeyError, TypeError, ValueError, ExprError) as e:
        if isinstance(e, DeploymentError):
            raise
        raise DeploymentError(f"{p}: malformed deployment file: {type(e).__name__}: {e}") from None


def _tuple(x: Any) -> tuple[str, ...]:
    if x is None:
        return ()
    return (str(x),) if isinstance(x, str) else tuple(str(v) for v in x)


def _path(d: dict[str, Any], op: str, variant: str | None, where: str) -> PathSpec:
    _check_keys(d, PATH_KEYS, where)
    parts = []
    for i, pd in enumerate(d["parts"]):
        _check_keys(pd, PART_KEYS, f"{where} parts[{i}]")
        backends = pd.get("backends")
        parts.append(
            Part(
                op=str(pd.get("op", op)),
                kernels=_tuple(pd["kernel"]),
                variant=pd.get("variant", variant),
                backends=_tuple(backends) if backends is not None else None,
            )
        )
    return PathSpec(
        name=str(d["name"]),
        parts=tuple(parts),
        flags={str(k): str(v) for k, v in (d.get("flags") or {}).items()},
        what_if=d.get("what_if"),
        note=str(d.get("note") or ""),
        fuses=_tuple(d.get("fuses")),
    )


def _parse(data: dict[str, Any], shapes: ModelShapes, source: str) -> Deployment:
    server_flags = {str(k): dict(v) for k, v in (data.get("server_flags") or {}).items()}
    path_sets = data.get("path_sets") or {}
    backend_flags = tuple(
        (str(k), {str(f): str(v) for f, v in fl.items()})
        for k, fl in (data.get("backend_flags") or {}).items()
    )
    rows: dict[str, list[RowSpec]] = {}
    for phase, specs in (data.get("phases") or {}).items():
        out: list[RowSpec] = []
        for i, s in enumerate(specs):
            _check_keys(s, ROW_KEYS, f"{source}: phases.{phase}[{i}]")
            op = str(s["op"])
            variant = s.get("variant")
            ops = _tuple(s.get("ops")) or (op,)
            spec_op = shapes.ops.get(op)
            scope = str(s.get("scope", "layer"))
            if scope not in SCOPES:
                raise DeploymentError(
                    f"{source}: row {op}: scope {scope!r} is not one of {', '.join(SCOPES)}"
                )
            set_name = s.get("paths")
            if set_name is not None and set_name not in path_sets:
                raise DeploymentError(f"{source}: row {op}: unknown path set {set_name!r}")
            row_paths = tuple(
                _path(pd, op, variant, f"{source}: path_sets.{set_name}[{j}]")
                for j, pd in enumerate(path_sets.get(set_name) or [])
            )
            out.append(
                RowSpec(
                    name=str(s.get("name") or (f"{op}:{variant}" if variant else op)),
                    op=op,
                    ops=ops,
                    variant=variant,
                    calls=int(s.get("calls", 1)),
                    scope=scope,
                    min_tp=int(s.get("min_tp", 1)),
                    layers=spec_op.layers if spec_op else None,
                    kernels=_tuple(s.get("kernels")),
                    what_if=tuple((str(k), str(v)) for k, v in (s.get("what_if") or {}).items()),
                    paths=row_paths,
                    replaces=str(s["replaces"]) if s.get("replaces") is not None else None,
                )
            )
        names = [r.name for r in out]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise DeploymentError(f"{source}: phase {phase}: duplicate row names {', '.join(dup)}")
        bad = replacement_problems(out) + fusion_problems(out)
        if bad:
            raise DeploymentError(f"{source}: phase {phase}: " + "; ".join(bad))
        rows[str(phase)] = out
    est = data.get("estimate") or {}
    env: dict[str, int | float] = {**shapes.config, **shapes.speculative}
    layer_counts = {str(k): int(evaluate(v, env)) for k, v in (est.get("layers") or {}).items()}
    spec = est.get("speculative") or {}
    speculative = {k: int(evaluate(spec[k], env)) for k in ("target_tokens", "draft_forwards") if k in spec}
    spec_flags = {
        str(f): str(int(evaluate(v, env))) if server_flags.get(str(f), {}).get("type") == "int" else str(v)
        for f, v in (spec.get("flags") or {}).items()
    }
    dep = Deployment(
        rows=rows,
        server_flags=server_flags,
        backend_flags=backend_flags,
        layer_counts=layer_counts,
        kv_len=int(est.get("kv_len", 4096)),
        speculative=speculative,
        draft_layer=str(spec.get("draft_layer", "moe")),
        source=source,
        launch=_tuple(data.get("launch")) or LAUNCH,
        speculative_flags=spec_flags,
    )
    bad = flag_problems(dep)
    if bad:
        raise DeploymentError(f"{source}: " + "; ".join(bad))
    return dep


def replacement_problems(rows: list[RowSpec]) -> list[str]:
    """`replaces` only on NextN rows, naming a layer row of the same phase (the draft layer's rows)."""
    layer_rows = {r.name for r in rows if r.scope == "layer"}
    out = []
    for r in rows:
        if r.replaces is None:
            continue
        if r.scope != "nextn":
            out.append(f"row {r.name}: replaces is for scope nextn rows, not {r.scope}")
        elif r.replaces not in layer_rows:
            out.append(f"row {r.name}: replaces {r.replaces!r}, which is no layer row of this phase")
    return out


def fusion_problems(rows: list[RowSpec]) -> list[str]:
    """`fuses` names other rows of the same phase, of the fusing row's scope (a NextN row's path may also
    fuse the layer rows the draft layer runs)."""
    by_name = {r.name: r for r in rows}
    out = []
    for r in rows:
        for p in r.paths:
            for name in p.fuses:
                f = by_name.get(name)
                if f is None or f is r:
                    out.append(
                        f"row {r.name} path {p.name}: fuses {name!r}, which is no other row of this phase"
                    )
                elif f.scope not in (r.scope, "layer" if r.scope == "nextn" else r.scope):
                    out.append(f"row {r.name} path {p.name}: fuses {name!r}, a {f.scope} row")
    return out


def all_flag_uses(dep: Deployment) -> list[tuple[str, str, str]]:
    """(where, flag, value) for every flag value the file cites."""
    uses = [(f"backend_flags {pat}", f, v) for pat, fl in dep.backend_flags for f, v in fl.items()]
    uses += [("estimate.speculative.flags", f, v) for f, v in dep.speculative_flags.items()]
    for phase, rows in dep.rows.items():
        for r in rows:
            for p in r.paths:
                uses += [(f"{phase} {r.name} path {p.name}", f, v) for f, v in p.flags.items()]
    return uses


def flag_problems(dep: Deployment) -> list[str]:
    """Flags or values not in the server_flags table (which copies sglang 0.5.16's choices)."""
    out = []
    for where, flag, value in all_flag_uses(dep):
        known = dep.server_flags.get(flag)
        if known is None:
            out.append(f"{where}: flag {flag} is not in server_flags")
        elif known.get("type") == "int":
            if not value.isdigit() or int(value) < 1:
                out.append(f"{where}: {flag} {value!r} is not a positive whole number")
        elif value not in (known.get("choices") or []):
            out.append(f"{where}: {flag} {value!r} is not an accepted value")
    return out

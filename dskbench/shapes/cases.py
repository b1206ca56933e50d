"""Model config, sweeps and op shapes: turns (kernel, op, sweep point) into concrete dimensions.

The data is shapes/deepseek_r1_nvfp4.yaml; this module only evaluates it. An adapter
declares the role it reads (``gemm``, ``norm``, ``moe``...) and gets one Case per op variant and sweep point.
"""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from dskbench import paths
from dskbench.shapes.exprs import ExprError, evaluate, names_in
from dskbench.shapes.schema import META_KEYS, SchemaError, check_dims, check_structure

PROFILES = ("full", "quick", "cpu")


class ShapeError(ValueError):
    """Bad shape data or a request the shape data cannot answer."""


@dataclass(frozen=True)
class OpSpec:
    name: str
    aliases: tuple[str, ...] = ()
    phases: tuple[str, ...] = ()
    roles: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    vars: dict[str, dict[str, str]] = field(default_factory=dict)
    tensor_in: tuple[str, ...] | None = None
    tensor_out: tuple[str, ...] | None = None
    executed: bool = True
    reason: str | None = None
    layers: str | None = None  # "dense" (layers 0..2), "moe" (3..60) or None (every layer)
    models: tuple[str, ...] = ()  # the models that run the op; () = DeepSeek-R1, the file's model
    at_most: dict[str, str] = field(default_factory=dict)  # expression -> bound: points beyond are left out


@dataclass(frozen=True)
class Case:
    """One concrete benchmark point: a kernel at one op variant, phase and sweep point."""

    kernel: str
    op: str
    phase: str
    point: dict[str, int]
    dims: dict[str, Any]
    variant: str | None = None
    # The model's symbols (H, Lq, rms_norm_eps, ...) from the shapes file the case was planned from, and its
    # op's `weight_format`: an adapter reads every model constant here, so a case alone decides its inputs.
    # Not part of its identity.
    model: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def id(self) -> str:
        op = f"{self.op}:{self.variant}" if self.variant else self.op
        pt = ",".join(f"{k}={v}" for k, v in self.point.items())
        return f"{self.kernel}/{op}/{self.phase}/{pt}"

    def to_json(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "op": self.op,
            "variant": self.variant,
            "phase": self.phase,
            "point": dict(self.point),
            "dims": dict(self.dims),
            **({"model": dict(self.model)} if self.model else {}),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Case:
        return cls(
            d["kernel"],
            d["op"],
            d["phase"],
            dict(d["point"]),
            dict(d["dims"]),
            d.get("variant"),
            dict(d.get("model") or {}),
        )


def canonical_op_name(raw: str) -> str:
    """`self.q_b_proj()` -> `q_b_proj`; `experts (cutlass MoE path)` -> `experts`."""
    s = raw.strip().strip("`").strip()
    m = re.match(r"^(.*?)\s+\((.+)\)$", s)  # a trailing remark in parentheses
    if m:
        s = m.group(1).strip().strip("`")
    if s.endswith("()"):
        s = s[:-2]
    if s.startswith("self."):
        s = s[len("self.") :]
    return s.strip()


class ModelShapes:
    """The parsed shapes file, checked against the schema (dskbench/shapes/schema.py) as it is built."""

    def __init__(self, data: dict[str, Any], source: str = "<data>"):
        self.source = source
        try:
            check_structure(data)
        except SchemaError as e:
            raise ShapeError(f"{source}: {e}") from None
        try:
            model = data["model"]
            self.model_name: str = model.get("name", "")
            self.config: dict[str, int | float] = dict(model["config"])
            for k, expr in (model.get("derived") or {}).items():
                self.config[k] = evaluate(expr, self.config)
            self.weights: dict[str, list[str]] = {k: list(v) for k, v in (model.get("weights") or {}).items()}
            self.speculative: dict[str, int] = dict(model.get("speculative") or {})
            self.sweeps: dict[str, list[int]] = {k: list(v) for k, v in data["sweeps"].items()}
            self.phases: dict[str, dict[str, str]] = {k: dict(v) for k, v in data["phases"].items()}
            self.profiles: dict[str, dict[str, list[int]]] = {
                "quick": dict(data.get("quick") or {}),
                "cpu": dict(data.get("cpu") or {}),
            }
            self.op_groups: dict[str, list[str]] = {
                k: list(v) for k, v in (data.get("op_groups") or {}).items()
            }
            self.limits: dict[str, int | float] = dict(data.get("limits") or {})
            self.ops: dict[str, OpSpec] = {}
            for name, spec in data["ops"].items():
                self.ops[name] = _op_spec(name, spec or {})
        except (KeyError, TypeError, ExprError) as e:
            raise ShapeError(f"{source}: malformed shapes file: {e}") from None
        try:
            check_dims(self)
        except SchemaError as e:
            raise ShapeError(f"{source}: {e}") from None
        self._alias: dict[str, str] = {}
        for op in self.ops.values():
            for a in (op.name, *op.aliases):
                self._alias[a] = op.name
                self._alias[canonical_op_name(a)] = op.name

    # -- ops ---------------------------------------------------------------------------------------
    def resolve_op(self, raw: str) -> str | None:
        """Canonical op name for a name as a trace writes it, or None when no op matches."""
        for cand in (raw.strip(), canonical_op_name(raw)):
            if cand in self._alias:
                return self._alias[cand]
        return None

    def resolve_group(self, raw: str) -> list[str] | None:
        """Ops named by a trace's free-text label (e.g. 'Linear layers (FP8 path)' -> every linear)."""
        low = raw.lower()
        if low.startswith("linear"):
            return list(self.op_groups.get("linear", []))
        if low.startswith("input quantization"):
            return list(self.op_groups.get("input_quantization", []))
        return None

    def weight_format(self, op: str) -> str | None:
        for fmt, ops in self.weights.items():
            if op in ops:
                return fmt
        return None

    def env(self, point: dict[str, int] | None = None) -> dict[str, int | float]:
        env = dict(self.config)
        env.update(point or {})
        if "T" in env and "B" not in env:
            env["B"] = env["T"]
        if "B" in env and "T" not in env:
            env["T"] = env["B"]
        env.setdefault("tp", 1)
        return env

    def eval_role(self, variant: dict[str, Any], point: dict[str, int]) -> dict[str, Any]:
        env = self.env(point)
        out: dict[str, Any] = {}
        for k, v in variant.items():
            out[k] = v if k in META_KEYS else evaluate(v, env)
        return out

    def eval_tensor(self, shape: tuple[str, ...] | None, point: dict[str, int]) -> list[int] | None:
        if shape is None:
            return None
        env = self.env(point)
        return [int(evaluate(x, env)) for x in shape]

    # -- sweeps ------------------------------------------------------------------------------------
    def values(self, list_name: str, profile: str = "full") -> list[int]:
        if profile not in PROFILES:
            raise ShapeError(f"unknown profile {profile!r} (choose from {', '.join(PROFILES)})")
        if list_name not in self.sweeps:
            raise ShapeError(f"unknown sweep list {list_name!r}")
        if profile != "full" and list_name in self.profiles[profile]:
            return list(self.profiles[profile][list_name])
        return list(self.sweeps[list_name])

    def phase_family(self, phase: str) -> str:
        if phase not in self.phases:
            raise ShapeError(f"unknown sweep {phase!r} (choose from {', '.join(self.phases)})")
        return "decode" if phase.startswith("decode") else phase

    def points(
        self, op: OpSpec, role_variants: list[dict[str, Any]], phase: str, profile: str
    ) -> list[dict[str, int]]:
        """Sweep points of one op in one phase: the product of its variables' value lists."""
        family = self.phase_family(phase)
        var_lists = dict(self.phases[phase])
        override = op.vars.get(family) or op.vars.get(phase) or {}
        if override:
            var_lists = dict(override)
        uses_tp = any(
            "tp" in names_in(v) for var in role_variants for k, v in var.items() if k not in META_KEYS
        )
        if uses_tp:
            var_lists["tp"] = "tp"
        names = list(var_lists)
        grids = [self.values(var_lists[n], profile) for n in names]
        points = [dict(zip(names, combo, strict=True)) for combo in itertools.product(*grids)]
        return [p for p in points if self.within(op, p)] if op.at_most else points

    def within(self, op: OpSpec, point: dict[str, int]) -> bool:
        """Whether a sweep point keeps to the op's `at_most` bounds (e.g. the KV tokens a batch holds)."""
        env = {**self.env(point), **self.limits}
        for expr, bound in op.at_most.items():
            try:
                if evaluate(expr, env) > evaluate(bound, env):
                    return False
            except ExprError as e:  # the file's own mistake: one line naming the key (check_dims meets it)
                at = ", ".join(f"{n}={v}" for n, v in point.items())
                raise SchemaError(("ops", op.name, "at_most", expr), f"{e} at {at}") from None
        return True

    def cases(
        self,
        kernel: str,
        ops: list[str],
        role: str,
        phase: str,
        profile: str = "full",
        tp: list[int] | None = None,
    ) -> list[Case]:
        """Every case of `kernel` for the given registry ops, read through `role`, in `phase`."""
        out: list[Case] = []
        family = self.phase_family(phase)
        for op_name in ops:
            op = self.ops.get(op_name)
            if op is None or not op.executed or family not in op.phases:
                continue
            variants = op.roles.get(role) or []
            if not variants:
                continue
            # the model's symbols, and the format this op's weights are stored in (nvfp4, fp8, bf16)
            model = {**self.config, "weight_format": self.weight_format(op_name)}
            for point in self.points(op, variants, phase, profile):
                if tp is not None and "tp" in point and point["tp"] not in tp:
                    continue
                for var in variants:
                    dims = self.eval_role(var, point)
                    variant = dims.pop("variant", None)
                    out.append(Case(kernel, op_name, phase, point, dims, variant, model))
        return out


def _op_spec(name: str, spec: dict[str, Any]) -> OpSpec:
    roles = {k: [dict(v) for v in (vs or [])] for k, vs in (spec.get("roles") or {}).items()}
    return OpSpec(
        name=name,
        aliases=tuple(spec.get("aliases") or ()),
        phases=tuple(spec.get("phases") or ()),
        roles=roles,
        vars={k: dict(v) for k, v in (spec.get("vars") or {}).items()},
        tensor_in=tuple(str(x) for x in spec["in"]) if spec.get("in") else None,
        tensor_out=tuple(str(x) for x in spec["out"]) if spec.get("out") else None,
        executed=bool(spec.get("executed", True)),
        reason=spec.get("reason"),
        layers=spec.get("layers"),
        models=tuple(spec.get("models") or ()),
        at_most={str(k): v for k, v in (spec.get("at_most") or {}).items()},
    )


def load_shapes(path: str | Path | None = None) -> ModelShapes:
    """Read and check a shapes file; a ShapeError names the file, the key and what was expected."""
    p = Path(path) if path else paths.SHAPES_FILE
    shown = _shown(p)
    try:
        text = p.read_text()
    except OSError as e:
        raise ShapeError(f"cannot read shapes file {shown}: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise ShapeError(f"{shown}{line}: not valid YAML: {getattr(e, 'problem', None) or e}") from None
    if not isinstance(data, dict):
        raise ShapeError(f"{shown}: expected a mapping at the top level")
    return ModelShapes(data, source=shown)


def _shown(p: Path) -> str:
    """The path as the user would type it: relative to the working directory when inside it."""
    try:
        rel = os.path.relpath(p)
    except ValueError:
        return str(p)
    return str(p) if rel.startswith("..") else rel


@lru_cache(maxsize=4)
def default_shapes() -> ModelShapes:
    return load_shapes(paths.SHAPES_FILE)

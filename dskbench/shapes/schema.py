"""The schema of the shapes file, checked when it is loaded.

An edited shapes file fails at load with one line naming the key and what was expected, instead of
silently dropping an op (a typo'd key), losing the CPU cap, or measuring a shape that does not exist
(``T=1.5``, ``Nh / 3``). Structure and types are pydantic models (unknown keys are errors); names that
refer to other parts of the file (sweep lists, phases, roles, ops, model symbols) and the evaluated
dimensions are checked by hand, because they depend on the file's own content.
"""

from __future__ import annotations

import difflib
import itertools
import math
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from dskbench.shapes.exprs import ExprError, evaluate, names_in

if TYPE_CHECKING:
    from dskbench.shapes.cases import ModelShapes

# Role keys that are labels, not numbers.
META_KEYS = frozenset({"variant", "weight", "out"})
# Sweep variables an expression may use besides the model symbols.
SWEEP_VARS = ("T", "B", "kv_len", "tp")
# The sweeps `dskbench run --sweep` offers; an op's `phases` name their families (decode_graph -> decode).
PHASES = ("decode", "decode_graph", "prefill")
# The views of an op that adapters read (`role` of dskbench/adapters/*; tests check the two agree).
ROLES = frozenset(
    {
        "act",
        "act_quant",
        "allreduce",
        "bmm",
        "concat_k",
        "concat_q",
        "dsa_topk",
        "fp8_cast",
        "gemm",
        "hadamard",
        "kv_alloc",
        "kv_indices",
        "kv_quant",
        "kv_read",
        "kv_write",
        "merge_state",
        "mha_prefill",
        "mla_decode",
        "mla_prefill",
        "moe",
        "moe_gemm",
        "moe_layer",
        "norm",
        "quant",
        "rope",
        "sampling",
        "spec",
        "topk",
    }
)
# Model symbols dskbench's adapters read by name (a missing one would fail mid-sweep).
REQUIRED_SYMBOLS = (
    "Lq",
    "Lkv",
    "Dn",
    "Dr",
    "Dv",
    "Dq",
    "Dkv",
    "n_group",
    "topk_group",
    "routed_scaling_factor",
    "max_position",
    "rms_norm_eps",
)
# Models an op's `models` list may name -> how messages write them. An op without `models` is one
# DeepSeek-R1 (the shapes file's model) runs; `models: [deepseek-v3.2]` marks an op only DeepSeek-V3.2 has.
MODELS = {"deepseek-r1": "DeepSeek-R1", "deepseek-v3.2": "DeepSeek-V3.2"}
# Groups that resolve the labels trace documents use instead of op names (ModelShapes.resolve_group).
OP_GROUPS = ("linear", "input_quantization")

KeyPath = tuple[str | int, ...]


class SchemaError(ValueError):
    """A shapes file that breaks the schema: where (a key path) and what was expected."""

    def __init__(self, path: KeyPath, message: str):
        super().__init__(f"{dotted(path)}: {message}" if path else message)
        self.path, self.message = path, message


def dotted(path: KeyPath) -> str:
    """`ops.q_b_proj.roles.gemm[0].N`; keys holding a dot are quoted (`ops."sampler.forward"`)."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            key = f'"{part}"' if ("." in part or " " in part or not part) else part
            out += f".{key}" if out else key
    return out


def did_you_mean(word: str, choices: Iterable[str], listing: bool = True) -> str:
    """`; did you mean 'phases'?` for a near miss, else (when `listing`) the list of what is allowed."""
    choices = sorted(choices)
    close = difflib.get_close_matches(str(word), choices, n=1)
    if close:
        return f"; did you mean {close[0]!r}?"
    return f" (expected one of: {', '.join(choices)})" if choices and listing else ""


# -- values ----------------------------------------------------------------------------------------


def _got(v: Any) -> str:
    if v is None:
        return "nothing"
    if isinstance(v, Mapping):
        return "a mapping"
    if isinstance(v, list | tuple):
        return "a list"
    return repr(v)


def _positive_int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueError(f"expected a positive integer, got {_got(v)}")
    return v


def _positive_number(v: Any) -> int | float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not (math.isfinite(v) and v > 0):
        raise ValueError(f"expected a positive number, got {_got(v)}")
    return v


def _expression(v: Any) -> int | str:
    """A dimension: a number or an expression of model symbols and sweep variables (checked later)."""
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        raise ValueError(f"expected a number or an expression, got {_got(v)}")
    return v


def _no_repeats(values: list[Any]) -> list[Any]:
    seen: set[Any] = set()
    for v in values:
        if v in seen:
            raise ValueError(f"{v!r} appears twice")
        seen.add(v)
    return values


PositiveInt = Annotated[Any, AfterValidator(_positive_int)]
PositiveNumber = Annotated[Any, AfterValidator(_positive_number)]
Expr = Annotated[Any, AfterValidator(_expression)]
ValueList = Annotated[list[PositiveInt], Field(min_length=1), AfterValidator(_no_repeats)]
Names = Annotated[list[str], AfterValidator(_no_repeats)]


# -- structure -------------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Speculative(_Strict):
    num_steps: PositiveInt
    eagle_topk: PositiveInt
    num_draft_tokens: PositiveInt


class Model(_Strict):
    name: str = ""
    config: dict[str, PositiveNumber]
    derived: dict[str, Expr] = {}
    weights: dict[str, Names] = {}
    speculative: Speculative | None = None


class Op(_Strict):
    aliases: list[str] = []
    phases: Names = []
    in_: list[Expr] | None = Field(None, alias="in")
    out: list[Expr] | None = None
    roles: dict[str, list[dict[str, Expr]]] = {}
    vars: dict[str, dict[str, str]] = {}
    executed: bool = True
    reason: str | None = None
    layers: Literal["dense", "moe"] | None = None
    models: Names = []
    # sweep points kept only where each expression is at most its bound (`B * kv_len: max_kv_tokens`)
    at_most: dict[str, Expr] = {}


class ShapesFile(_Strict):
    model: Model
    sweeps: dict[str, ValueList]
    phases: dict[str, dict[str, str]]
    quick: dict[str, ValueList] = {}
    cpu: dict[str, ValueList] = {}
    op_groups: dict[str, Names] = {}
    limits: dict[str, PositiveNumber] = {}  # named bounds an op's `at_most` may use
    ops: dict[str, Op]


_KINDS = {
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "list_type": "a list",
    "string_type": "a string",
    "bool_type": "true or false",
}


def _from_pydantic(err: ValidationError) -> SchemaError:
    # an unknown key first: a typo'd required key also reads as that key missing
    e = min(err.errors(), key=lambda x: x["type"] != "extra_forbidden")
    loc: KeyPath = tuple(e["loc"])
    kind, value = e["type"], e.get("input")
    if loc and loc[-1] == "[key]":
        return SchemaError(loc[:-2], f"key {loc[-2]!r}: expected a string")
    if kind == "extra_forbidden":
        return SchemaError(loc, "unknown key" + did_you_mean(str(loc[-1]), _keys_at(ShapesFile, loc[:-1])))
    if kind == "missing":
        return SchemaError(loc[:-1], f"missing key {loc[-1]!r}")
    if kind == "too_short":
        return SchemaError(loc, "expected a non-empty list")
    if kind == "literal_error":
        return SchemaError(loc, f"expected {e['ctx']['expected']}, got {_got(value)}")
    if kind in _KINDS:
        return SchemaError(loc, f"expected {_KINDS[kind]}, got {_got(value)}")
    msg = str(e["msg"]).removeprefix("Value error, ")
    return SchemaError(loc, msg)


def _keys_at(model: type[BaseModel], loc: KeyPath) -> list[str]:
    """The keys the model at `loc` allows (for the did-you-mean of an unknown key)."""
    tp: Any = model
    for part in loc:
        tp = _unwrap(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            fields = {f.alias or n: f for n, f in tp.model_fields.items()}
            tp = fields[str(part)].annotation
        else:  # dict[str, X] or list[X]: step into X
            tp = get_args(tp)[-1]
    tp = _unwrap(tp)
    return [f.alias or n for n, f in tp.model_fields.items()]


def _unwrap(tp: Any) -> Any:
    while True:
        origin = get_origin(tp)
        if origin is Annotated:
            tp = get_args(tp)[0]
        elif origin is Union or isinstance(tp, types.UnionType):
            tp = next(a for a in get_args(tp) if a is not type(None))
        else:
            return tp


# -- references ------------------------------------------------------------------------------------


def check_structure(data: Mapping[str, Any]) -> None:
    """Keys, types and cross-references of the parsed YAML (before anything is evaluated)."""
    try:
        ShapesFile.model_validate(data)
    except ValidationError as e:
        raise _from_pydantic(e) from None
    check_references(data)


def _known(path: KeyPath, name: str, choices: Iterable[str], what: str) -> None:
    choices = list(choices)
    if name not in choices:
        raise SchemaError(path, f"unknown {what} {name!r}" + did_you_mean(name, choices))


def _known_keys(path: KeyPath, mapping: Mapping[str, Any], choices: Iterable[str], what: str) -> None:
    choices = list(choices)
    for key in mapping:
        if key not in choices:
            raise SchemaError((*path, key), f"unknown {what}" + did_you_mean(key, choices))


def _sweep_vars(path: KeyPath, mapping: Mapping[str, str], sweeps: Mapping[str, Any]) -> None:
    """`{T: decode_tokens}`: a sweep variable -> the name of a list under `sweeps`."""
    _known_keys(path, mapping, SWEEP_VARS, "sweep variable")
    for var, list_name in mapping.items():
        _known((*path, var), list_name, sweeps, "sweep list")


def check_references(data: Mapping[str, Any]) -> None:
    """Every name the file uses refers to something the file (or dskbench) defines."""
    model = data["model"]
    symbols = dict(model["config"])
    for key in model["config"]:
        if key in SWEEP_VARS:
            raise SchemaError(("model", "config", key), f"{key!r} is a sweep variable, not a model symbol")
    for key, expr in (model.get("derived") or {}).items():
        path: KeyPath = ("model", "derived", key)
        if key in symbols or key in SWEEP_VARS:
            raise SchemaError(path, f"{key!r} is already defined")
        symbols[key] = _evaluate(path, expr, symbols)
    for name in REQUIRED_SYMBOLS:
        if name not in symbols:
            raise SchemaError(("model", "config"), f"missing {name!r} (a model symbol dskbench reads)")

    sweeps = data["sweeps"]
    if "tp" not in sweeps:
        raise SchemaError(("sweeps",), "missing key 'tp' (the tensor-parallel degrees)")
    _known_keys(("phases",), data["phases"], PHASES, "phase")
    for phase in PHASES:
        if phase not in data["phases"]:
            raise SchemaError(("phases",), f"missing key {phase!r}")
    for phase, mapping in data["phases"].items():
        _sweep_vars(("phases", phase), mapping, sweeps)
    for profile in ("quick", "cpu"):
        _known_keys((profile,), data.get(profile) or {}, sweeps, "sweep list")
    for name in sweeps:
        if name not in (data.get("cpu") or {}):
            raise SchemaError(("cpu",), f"missing {name!r} (the CPU cap names every sweep list)")

    ops = data["ops"]
    _known_keys(("op_groups",), data.get("op_groups") or {}, OP_GROUPS, "op group")
    for group, members in (data.get("op_groups") or {}).items():
        for i, op in enumerate(members):
            _known(("op_groups", group, i), op, ops, "op")
    families = {_family(p) for p in PHASES}
    for name, op in ops.items():
        here: KeyPath = ("ops", name)
        for i, phase in enumerate(op.get("phases") or ()):
            _known((*here, "phases", i), phase, families, "phase")
        for phase, mapping in (op.get("vars") or {}).items():
            _known((*here, "vars", phase), phase, [*families, *PHASES], "phase")
            _sweep_vars((*here, "vars", phase), mapping, sweeps)
        for i, model in enumerate(op.get("models") or ()):
            _known((*here, "models", i), model, MODELS, "model")
        bound_names = {*symbols, *(data.get("limits") or {}), *SWEEP_VARS}
        for expr, bound in (op.get("at_most") or {}).items():
            for part in (expr, bound):
                unknown = sorted(names_in(part) - bound_names)
                if unknown:
                    raise SchemaError(
                        (*here, "at_most", expr),
                        f"unknown name {unknown[0]!r} in {part!r} (not a model symbol, limit or sweep variable)"
                        + did_you_mean(unknown[0], bound_names, False),
                    )
        _known_keys((*here, "roles"), op.get("roles") or {}, ROLES, "role")
        for role, variants in (op.get("roles") or {}).items():
            _variants((*here, "roles", role), variants)


def _family(phase: str) -> str:
    return "decode" if phase.startswith("decode") else phase


def _variants(path: KeyPath, variants: Sequence[Mapping[str, Any]]) -> None:
    """Labels are strings; several variants of one role each need their own `variant` label."""
    labels = set()
    for i, var in enumerate(variants):
        for key in META_KEYS & set(var):
            if not isinstance(var[key], str):
                raise SchemaError((*path, i, key), f"expected a label (a string), got {_got(var[key])}")
        if len(variants) > 1:
            label = var.get("variant")
            if label is None:
                raise SchemaError(
                    (*path, i), "missing key 'variant' (a role with several variants names each)"
                )
            if label in labels:
                raise SchemaError((*path, i, "variant"), f"{label!r} appears twice")
            labels.add(label)


# -- dimensions ------------------------------------------------------------------------------------


def _evaluate(
    path: KeyPath, expr: Any, env: Mapping[str, int | float], where: Callable[[], str] | None = None
):
    """`expr` in `env`; an unknown name gets a did-you-mean, a failure says at which sweep point."""
    try:
        unknown = sorted(names_in(expr) - set(env))
    except ExprError as e:
        raise SchemaError(path, str(e)) from None
    if unknown:
        name = unknown[0]
        if name in SWEEP_VARS:
            swept = ", ".join(n for n in SWEEP_VARS if n in env)
            raise SchemaError(
                path, f"{expr!r} uses {name!r}, which this op's sweep does not have (it has {swept})"
            )
        what = "not a model symbol" if where is None else "not a model symbol or sweep variable"
        raise SchemaError(
            path, f"unknown name {name!r} in {expr!r} ({what})" + did_you_mean(name, env, False)
        )
    try:
        return evaluate(expr, env)
    except ExprError as e:
        raise SchemaError(path, f"{e}" + (f" at {where()}" if where else "")) from None


def _size(path: KeyPath, expr: Any, env: Mapping[str, int | float], where: Callable[[], str]) -> None:
    value = _evaluate(path, expr, env, where)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SchemaError(path, f"{expr!r} is {value!r} at {where()}; expected a positive integer")


def check_dims(shapes: ModelShapes) -> None:
    """Every dimension of every executed op evaluates to a positive integer at every sweep point of
    every profile, and its tensors (`in`, `out`) do at T = B = 1, tp = 1."""
    names: dict[Any, tuple[str, ...]] = {}
    done: set[tuple[Any, ...]] = set()
    base = shapes.env({"T": 1, "tp": 1})
    for name, op in shapes.ops.items():
        if not op.executed:
            continue
        here: KeyPath = ("ops", name)
        for key, shape in (("in", op.tensor_in), ("out", op.tensor_out)):
            for i, expr in enumerate(shape or ()):
                _size((*here, key, i), expr, base, lambda: "T = B = 1, tp = 1")
        phases = [p for p in shapes.phases if shapes.phase_family(p) in op.phases]
        for role, variants in op.roles.items():
            for phase, profile in itertools.product(phases, ("full", "quick", "cpu")):
                for point in shapes.points(op, variants, phase, profile) if variants else ():
                    env = shapes.env(point)
                    for i, var in enumerate(variants):
                        for key, expr in var.items():
                            if key in META_KEYS:
                                continue
                            if expr not in names:
                                names[expr] = tuple(sorted(n for n in names_in(expr) if n in SWEEP_VARS))
                            # a dimension depends only on the sweep variables it names: check each value once
                            memo = (expr, tuple(env.get(n) for n in names[expr]))
                            if memo in done:
                                continue
                            done.add(memo)
                            _size(
                                (*here, "roles", role, i, key),
                                expr,
                                env,
                                lambda pt=point, ph=phase, pr=profile: _where(ph, pr, pt),
                            )


def _where(phase: str, profile: str, point: Mapping[str, int]) -> str:
    pt = ", ".join(f"{n}={v}" for n, v in point.items())
    return f"{pt} ({phase} sweep, {profile} profile)"

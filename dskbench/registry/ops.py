"""The ops of a registry entry: which model ops a trace label or call chain names (through the shapes
file), each op written with its shapes symbolic and the model constants folded in, and where a trace's
shape table disagrees with the model config."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from dskbench.registry.trace_model import Frame
from dskbench.shapes.cases import META_KEYS, ModelShapes, canonical_op_name
from dskbench.shapes.exprs import ExprError, evaluate, names_in, simplify

# Name token -> the weight format a GEMM kernel consumes (checked against model.weights).
FORMAT_TOKENS = {
    "fp4": "nvfp4",
    "nvfp4": "nvfp4",
    "mxfp4": "mxfp4",
    "fp8": "fp8",
    "int8": "int8",
    "w8a8": "int8",
    "w4a8": "w4a8",
    "bf16": "bf16",
}
SYMBOLS = {
    "T": {"decode": "B", "prefill": "B*S"},
    "B": "requests in the batch",
    "kv_len": "KV context length per request",
    "tp": "tensor-parallel degree",
}


def resolve_label(label: str, shapes: ModelShapes, kernel_names: set[str]) -> list[str] | None:
    """Ops a trace's op label names, through the shapes file's aliases and op groups.

    A trailing remark may name the op when the label does not (``bmm_fp8() (q_nope * w_kc)``).
    A label that is the kernel's own name (a kernel called directly, or a MoE backend table whose
    Op column is the kernel) names no op: []. None when nothing matches.
    """
    op = shapes.resolve_op(label)
    if op:
        return [op]
    group = shapes.resolve_group(label)
    if group:
        return group
    m = re.match(r"^(.*?)\s+\((.+)\)$", label.strip())
    if m:
        op = shapes.resolve_op(m.group(2))
        if op:
            return [op]
    if canonical_op_name(label) in kernel_names:
        return []
    return None


def chain_ops(chain: list[Frame], shapes: ModelShapes) -> Iterable[tuple[Frame, str]]:
    """The nearest model op above the kernel on every path of a call chain.

    Only `self.<module>()` frames can be ops, and only the first one met walking up from the
    kernel: `cutlass_mla_decode <- ... <- self.attn_mqa() <- self.forward_absorb_core()` serves
    attn_mqa, not forward_absorb_core.
    """
    resolved = [shapes.resolve_op(fr.fn) if i > 0 and fr.self_call else None for i, fr in enumerate(chain)]
    for i, fr in enumerate(chain):
        if not resolved[i]:
            continue
        p = fr.parent
        while p > 0 and not resolved[p]:
            p = chain[p].parent
        if p <= 0:
            yield fr, resolved[i]  # type: ignore[misc]


def kernel_weight_format(name: str) -> str | None:
    """The weight format a GEMM kernel's name says it consumes (`..._fp8_...` -> fp8), or None."""
    for tok in name.lower().split("_"):
        if tok in FORMAT_TOKENS:
            return FORMAT_TOKENS[tok]
    return None


def runs_in_r1(op: dict[str, Any]) -> bool:
    """An op entry without `models` is one of DeepSeek-R1, the shapes file's model."""
    return not op.get("models") or "deepseek-r1" in op["models"]


def _fold(expr: Any, shapes: ModelShapes) -> Any:
    return simplify(expr, shapes.config)


def op_entry(op: str, trace_names: set[str], shapes: ModelShapes) -> dict[str, Any]:
    spec = shapes.ops[op]
    d: dict[str, Any] = {"name": op, "trace_names": sorted(trace_names), "executed": spec.executed}
    if spec.models:
        d["models"] = list(spec.models)
    if not spec.executed:
        d["reason"] = spec.reason
        return d
    d["phases"] = list(spec.phases)
    d["layers"] = spec.layers or "all"
    d["weight"] = shapes.weight_format(op)
    roles = {
        role: [{k: (v if k in META_KEYS else _fold(v, shapes)) for k, v in var.items()} for var in variants]
        for role, variants in spec.roles.items()
        if variants
    }
    d["shapes"] = roles
    if spec.tensor_in:
        d["in"] = [_fold(x, shapes) for x in spec.tensor_in]
    if spec.tensor_out:
        d["out"] = [_fold(x, shapes) for x in spec.tensor_out]
    if spec.vars:
        d["sweeps"] = {ph: dict(v) for ph, v in spec.vars.items()}
    free: set[str] = set()
    for variants in roles.values():
        for var in variants:
            free |= {n for k, v in var.items() if k not in META_KEYS for n in names_in(v)}
    for key in ("in", "out"):
        free |= {n for x in d.get(key, []) for n in names_in(x)}
    d["symbols"] = _symbols(free, spec.phases)
    return d


def _symbols(free: set[str], phases: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for sym in sorted(free):
        meaning = SYMBOLS.get(sym)
        if isinstance(meaning, dict):
            parts = [f"{meaning[p]} in {p}" for p in phases if p in meaning]
            out[sym] = "tokens in the step: " + ", ".join(parts)
        elif meaning:
            out[sym] = meaning
    return out


_TENSOR = re.compile(r"\[[^\]]*\](?:\s*=\s*\[[^\]]*\])*")


def doc_tensor(text: str, env: dict[str, int | float]) -> list[int] | None:
    """The first tensor a trace's shape text gives, evaluated leniently (None when unreadable).

    ``[B*S, Lq + Lkv + Dr] = [B*S, 2112]`` reads the last ``= [...]`` form (the doc's final numbers);
    ``q: [B, Nh, Dq], k: ...`` reads q.
    """
    m = _TENSOR.search(text)
    if not m:
        return None
    for group in reversed(re.findall(r"\[([^\]]*)\]", m.group())):
        try:
            return [int(evaluate(dim.strip(), env)) for dim in group.split(",")]
        except (ExprError, SyntaxError, ValueError):
            continue
    return None


def shape_disagreement(op: str, tin: str, tout: str, shapes: ModelShapes) -> dict[str, Any] | None:
    spec = shapes.ops[op]
    if not spec.tensor_in or not spec.tensor_out:
        return None
    point = {"T": 1, "tp": 1}
    env = dict(shapes.env(point))
    env.setdefault("S", 1)
    cfg_in, cfg_out = shapes.eval_tensor(spec.tensor_in, point), shapes.eval_tensor(spec.tensor_out, point)
    doc_in = doc_tensor(tin, env)
    doc_out = doc_in if tout.strip().lower() == "same" else doc_tensor(tout, env)
    if doc_in is None or doc_out is None:
        return None
    if (doc_in, doc_out) == (cfg_in, cfg_out):
        return None
    return {
        "op": op,
        "kind": "shape",
        "trace": f"{tin} -> {tout}",
        "config": f"[{', '.join(spec.tensor_in)}] -> [{', '.join(spec.tensor_out)}]",
        "at": "T = B*S = 1, tp = 1",
        "values": {"trace": f"{doc_in} -> {doc_out}", "config": f"{cfg_in} -> {cfg_out}"},
    }

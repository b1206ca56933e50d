"""Safe evaluation of the integer shape expressions used in shapes/*.yaml and the registry."""

from __future__ import annotations

import ast
from collections.abc import Mapping


class ExprError(ValueError):
    """An expression that cannot be evaluated: unknown name, bad syntax, inexact division."""


_BINOPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv)


def names_in(expr: str | int | float) -> set[str]:
    """The free names an expression refers to (used to tell whether a shape depends on tp)."""
    if not isinstance(expr, str):
        return set()
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as e:
        raise ExprError(f"bad expression {expr!r}: {e.msg}") from None
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def evaluate(expr: str | int | float, env: Mapping[str, int | float]) -> int | float:
    """Evaluate `expr` (e.g. "Nh * (Dn + Dv) / tp") with names from `env`.

    `/` must divide exactly when both sides are integers, so a shape never silently rounds.
    """
    if isinstance(expr, bool):
        raise ExprError(f"not a shape expression: {expr!r}")
    if isinstance(expr, int | float):
        return expr
    try:
        tree = ast.parse(str(expr), mode="eval")
    except SyntaxError as e:
        raise ExprError(f"bad expression {expr!r}: {e.msg}") from None
    return _eval(tree.body, env, str(expr))


def _eval(node: ast.AST, env: Mapping[str, int | float], src: str) -> int | float:
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise ExprError(f"unknown name {node.id!r} in {src!r}")
        return env[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand, env, src)
    if isinstance(node, ast.BinOp) and isinstance(node.op, _BINOPS):
        a, b = _eval(node.left, env, src), _eval(node.right, env, src)
        if isinstance(node.op, ast.Add):
            return a + b
        if isinstance(node.op, ast.Sub):
            return a - b
        if isinstance(node.op, ast.Mult):
            return a * b
        if b == 0:
            raise ExprError(f"division by zero in {src!r}")
        if isinstance(node.op, ast.FloorDiv):
            return a // b
        if isinstance(a, int) and isinstance(b, int):
            if a % b:
                raise ExprError(f"{src!r}: {a} / {b} is not exact")
            return a // b
        return a / b
    raise ExprError(f"unsupported syntax in {src!r}")

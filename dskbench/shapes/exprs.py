"""Safe evaluation of the integer shape expressions used in the shapes files and the registry."""

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


# -- partial evaluation (the registry writes op shapes with the model constants folded in) ----------

_PREC = {ast.Add: 1, ast.Sub: 1, ast.Mult: 2, ast.Div: 2, ast.FloorDiv: 2}
_SYM = {ast.Add: " + ", ast.Sub: " - ", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//"}


def simplify(expr: str | int | float, env: Mapping[str, int | float]) -> int | float | str:
    """Substitute the names `env` knows and fold constant sub-expressions, keep the other names.

    Returns a number when nothing free remains, else the folded expression as text:
    ``simplify("Nh * Dq / tp", {"Nh": 128, "Dq": 192}) == "24576/tp"``. Folding never reorders
    operands, so exact division is checked exactly where `evaluate` would check it.
    """
    if isinstance(expr, bool):
        raise ExprError(f"not a shape expression: {expr!r}")
    if isinstance(expr, int | float):
        return expr
    try:
        tree = ast.parse(str(expr), mode="eval")
    except SyntaxError as e:
        raise ExprError(f"bad expression {expr!r}: {e.msg}") from None
    folded = _fold(tree.body, env, str(expr))
    return folded if isinstance(folded, int | float) else _render(folded)


def _fold(node: ast.AST, env: Mapping[str, int | float], src: str) -> int | float | ast.AST:
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        return node.value
    if isinstance(node, ast.Name):
        return env[node.id] if node.id in env else node
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _fold(node.operand, env, src)
        return -inner if isinstance(inner, int | float) else ast.UnaryOp(ast.USub(), _as_node(inner))
    if isinstance(node, ast.BinOp) and isinstance(node.op, _BINOPS):
        a, b = _fold(node.left, env, src), _fold(node.right, env, src)
        if isinstance(a, int | float) and isinstance(b, int | float):
            return _eval(ast.BinOp(ast.Constant(a), node.op, ast.Constant(b)), {}, src)
        return ast.BinOp(_as_node(a), node.op, _as_node(b))
    raise ExprError(f"unsupported syntax in {src!r}")


def _as_node(x: int | float | ast.AST) -> ast.AST:
    return ast.Constant(x) if isinstance(x, int | float) else x


def _prec(node: ast.AST) -> int:
    if isinstance(node, ast.BinOp):
        return _PREC[type(node.op)]
    if isinstance(node, ast.UnaryOp):
        return 3
    return 4


def _render(node: ast.AST) -> str:
    if isinstance(node, ast.Constant):
        return repr(node.value)
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.UnaryOp):
        inner = _render(node.operand)
        return f"-({inner})" if _prec(node.operand) < 3 else f"-{inner}"
    assert isinstance(node, ast.BinOp)
    p = _PREC[type(node.op)]
    left, right = _render(node.left), _render(node.right)
    if _prec(node.left) < p:
        left = f"({left})"
    # a right operand of equal precedence needs parentheses unless the operation is associative
    same_assoc = type(node.op) in (ast.Add, ast.Mult) and type(getattr(node.right, "op", None)) is type(
        node.op
    )
    if _prec(node.right) < p or (_prec(node.right) == p and not same_assoc):
        right = f"({right})"
    return f"{left}{_SYM[type(node.op)]}{right}"

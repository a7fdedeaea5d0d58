"""The built-in ``calculator`` tool: arithmetic on numbers, evaluated by walking a parsed `ast` tree.

Nothing is executed: only number literals, ``+ - * / // % **``, unary ``+ -`` and parentheses are
allowed. Sizes are bounded so a call cannot stall the rollout: at most `MAX_EXPRESSION_CHARS`
characters, exponents of at most `MAX_EXPONENT` in magnitude, and whole-number results (also
intermediate ones) of at most `MAX_DIGITS` digits.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any, ClassVar

from tandem.tools.base import Tool
from tandem.tools.names import CALCULATOR

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 100
MAX_DIGITS = 100
SIGNIFICANT_DIGITS = 12  # of a printed non-whole result: "1/3" -> "0.333333333333"
ALLOWED = "numbers, + - * / // % ** and parentheses"

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_REFUSED = {
    ast.Name: "names",
    ast.Call: "function calls",
    ast.Attribute: "attribute access",
    ast.Subscript: "indexing",
    ast.Compare: "comparisons",
    ast.BoolOp: "and/or",
    ast.Lambda: "lambdas",
}


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression; ValueError saying what is wrong for anything else."""
    if not isinstance(expression, str):
        raise ValueError(f"the expression must be a string, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(
            f"the expression is {len(expression)} characters long; at most {MAX_EXPRESSION_CHARS}"
        )
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as error:
        raise ValueError(f"not a valid expression ({error.msg}); use {ALLOWED}") from None
    try:
        return _value(tree.body)
    except RecursionError:
        raise ValueError("the expression is nested too deeply") from None


def format_number(value: int | float) -> str:
    """ "355810" for ints and whole floats, else up to `SIGNIFICANT_DIGITS` significant digits."""
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.{SIGNIFICANT_DIGITS}g}"


def _value(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant):
        if type(node.value) not in (int, float):  # bool, complex, str, bytes, None, ...
            raise ValueError(f"{node.value!r} is not a number; use {ALLOWED}")
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_value(node.operand)))
    if isinstance(node, ast.BinOp):
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow):
            return _checked(_power(left, right))
        op = _BINARY.get(type(node.op))
        if op is not None:
            if right == 0 and isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod):
                raise ValueError("division by zero")
            try:
                return _checked(op(left, right))
            except OverflowError:  # an int too large for a float in a / b
                raise ValueError("the result is too large") from None
    what = next((text for kind, text in _REFUSED.items() if isinstance(node, kind)), type(node).__name__)
    raise ValueError(f"{what} not allowed; use {ALLOWED}")


def _power(base: int | float, exponent: int | float) -> int | float:
    if abs(exponent) > MAX_EXPONENT:
        raise ValueError(f"the exponent {format_number(exponent)} is too large; at most {MAX_EXPONENT}")
    if base == 0 and exponent < 0:
        raise ValueError("division by zero")
    whole = isinstance(base, int) and isinstance(exponent, int)
    if whole and exponent > 0 and abs(base) > 1 and exponent * math.log10(abs(base)) > MAX_DIGITS:
        raise ValueError(f"the result would have more than {MAX_DIGITS} digits")
    try:
        result = base**exponent
    except OverflowError:
        raise ValueError("the result is too large") from None
    if isinstance(result, complex):
        raise ValueError("the result is not a real number (a negative base to a fractional power)")
    return result


def _checked(value: Any) -> int | float:
    if isinstance(value, int) and abs(value) >= 10**MAX_DIGITS:
        raise ValueError(f"the result has more than {MAX_DIGITS} digits")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("the result is too large")
    return value


class Calculator(Tool):
    """Evaluates an arithmetic expression such as ``910*391`` or ``(2+3)**2/7``."""

    name = CALCULATOR
    description = (
        "Evaluate an arithmetic expression and return its value. "
        "Supports numbers, + - * / // % ** and parentheses, e.g. (12+3)*4/5."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "The expression, e.g. 910*391"}},
        "required": ["expression"],
    }

    async def call(self, expression: str) -> str:  # type: ignore[override]
        return format_number(evaluate(expression))

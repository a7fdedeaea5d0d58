"""Scorers for the synthetic arithmetic tasks: "addition", "countdown" and "tool_multiply".

A wrong or malformed answer scores 0.0; only a broken ground truth raises (counted as an error).
"""

from __future__ import annotations

import ast
import contextlib
import json
import math
import numbers
import operator
import re
from collections import Counter
from fractions import Fraction
from typing import Any

from tandem.rewards.registry import register_scorer

_NUMBER = re.compile(r"(?<![\d.])-?\d+(?:\.\d+)?")
_THOUSANDS_COMMA = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def last_number(text: str) -> str | None:
    """The last number in `text` as written ("1,234" reads as "1234", "42.5" stays "42.5"), or None."""
    found = _NUMBER.findall(_THOUSANDS_COMMA.sub("", text))
    return found[-1] if found else None


def last_integer(text: str) -> int | None:
    """The last number in `text` if it is a whole number ("42", "42.0"), else None ("42.5", none)."""
    number = last_number(text)
    if number is None or (("." in number) and float(number) != int(float(number))):
        return None
    return int(float(number)) if "." in number else int(number)


def whole_number(value: Any, what: str) -> int:
    """`value` as an int when it is a whole number (7, 7.0, "7", " 7.0 ", "1,042"); else ValueError."""
    number = None
    if isinstance(value, str):
        with contextlib.suppress(ValueError, ZeroDivisionError):
            number = Fraction(_THOUSANDS_COMMA.sub("", value.strip()))
    elif isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value):
        number = (
            Fraction(value) if isinstance(value, numbers.Rational) else Fraction(float(value))
        )  # numpy too
    if number is None or number.denominator != 1:
        raise ValueError(f"{what} must be a whole number such as 42 or '42', got {value!r}")
    return int(number)


def check_addition_truth(data_source: str, ground_truth: Any) -> str | None:
    """None when `ground_truth` is a whole number the addition scorer can read, else what it expects."""
    try:
        whole_number(ground_truth, "addition ground_truth")
    except ValueError:
        return "expected a whole number such as 42 or '42'"
    return None


# count_squares (the visual task: how many squares of a colour) is answered by a whole number too
@register_scorer("addition", "count_squares", check_ground_truth=check_addition_truth)
def addition_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> dict:
    """1.0 if the last integer in the response equals the ground truth (e.g. "42", 42 or 42.0), else 0.0."""
    target = whole_number(ground_truth, "addition ground_truth")
    pred = last_integer(solution_str)
    correct = pred is not None and pred == target
    return {"score": float(correct), "acc": correct, "pred": last_number(solution_str)}


# --- tool_multiply ------------------------------------------------------------------------------

# A tool call block (closed, or cut off at the end of the text): a request, never an answer.
_TOOL_CALL_BLOCK = re.compile(r"<tool_call>.*?(?:</tool_call>|$)", re.DOTALL)


@register_scorer("tool_multiply", check_ground_truth=check_addition_truth)
def tool_multiply_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> dict:
    """1.0 if the last integer of the final answer, outside any ``<tool_call>`` block, equals the product.

    ``solution_str`` is the final assistant turn (the reward manager's multi-turn input); the
    numbers inside a tool call are the question, so a turn that only calls the tool scores 0.0.
    """
    target = whole_number(ground_truth, "tool_multiply ground_truth")
    answer = _TOOL_CALL_BLOCK.sub(" ", solution_str)
    pred = last_integer(answer)
    correct = pred is not None and pred == target
    return {"score": float(correct), "acc": correct, "pred": last_number(answer)}


# --- countdown ---------------------------------------------------------------------------------

MAX_EXPRESSION_CHARS = 200  # longer "expressions" are junk; also bounds parser recursion depth
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_ANSWER_PREFIX = re.compile(r"answer\s*:", re.IGNORECASE)
_EXPRESSION_RUN = re.compile(r"[\d\s+\-*/().]+")
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


# Symbols models write for * / and minus, and LaTeX math delimiters (dropped), as plain ASCII.
_SYMBOLS = {
    "\\times": "*", "\\cdot": "*", "\u00d7": "*", "\u00b7": "*", "\u22c5": "*", "\u2217": "*",
    "\\div": "/", "\u00f7": "/", "\u2215": "/", "\u2212": "-",
    "\\left": "", "\\right": "", "\\(": "", "\\)": "", "\\[": "", "\\]": "",
}  # fmt: skip
_SYMBOL = re.compile("|".join(re.escape(k) for k in sorted(_SYMBOLS, key=len, reverse=True)))
_SENTENCE_END = re.compile(r"\.(?=\s|$)")  # "3. 1+2": a full stop, never part of an expression


def _runs(text: str) -> list[str]:
    """Maximal runs of expression characters in `text` that hold a digit, split at full stops."""
    runs = [run.strip() for piece in _SENTENCE_END.split(text) for run in _EXPRESSION_RUN.findall(piece)]
    return [run for run in runs if any(c.isdigit() for c in run)]


def extract_countdown_expression(text: str) -> str | None:
    """The answer expression of a countdown response, or None.

    Where it is looked for: the last `<answer>...</answer>` block if any, else the text after
    the last "Answer:", else the whole response. "×", "\\times", "÷", "−" and the like are read
    as * / -. In that region, lines are read from the last one up; a line is cut at each "=" and
    the first piece holding an operator is used ("(5-3)*4*3 = 24" and "24 = (5-3)*4*3" both
    give "(5-3)*4*3"); in that piece, the last run of characters from `0-9 + - * / ( ) .` and
    spaces that holds an operator is taken. If no line has one, the last run holding a digit is
    returned (a bare number).
    """
    text = _SYMBOL.sub(lambda m: _SYMBOLS[m.group()], text)
    tags = _ANSWER_TAG.findall(text)
    if tags:
        region = tags[-1]
    else:
        prefixes = list(_ANSWER_PREFIX.finditer(text))
        region = text[prefixes[-1].end() :] if prefixes else text
    bare_number = None
    for line in reversed(region.splitlines()):
        for piece in line.split("="):
            runs = _runs(piece)
            with_operator = [r for r in runs if any(c in "+-*/" for c in r)]
            if with_operator:
                return with_operator[-1]
            if runs and bare_number is None:
                bare_number = runs[-1]
    return bare_number


def _evaluate(node: ast.AST, literals: list[int]) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        literals.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp):
        left, right = _evaluate(node.left, literals), _evaluate(node.right, literals)
        if isinstance(node.op, ast.Div):
            if right == 0:
                raise ValueError("division by zero")
            return left / right
        op = _OPERATORS.get(type(node.op))
        if op is not None:
            return op(left, right)
    # Unary minus, powers, names, calls, attributes, floats, ...: not part of the game.
    raise ValueError(f"not allowed in a countdown expression: {ast.dump(node)[:80]}")


def evaluate_arithmetic(expression: str) -> tuple[Fraction, list[int]] | None:
    """Exact value and integer literals of `expression`, or None if it is not a valid one.

    Only integer literals, binary + - * / and parentheses are allowed; nothing is executed
    (the expression is walked as an `ast` tree), division is exact (Fraction).
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        return None
    try:
        tree = ast.parse(expression.strip(), mode="eval")
        literals: list[int] = []
        return _evaluate(tree.body, literals), literals
    except (SyntaxError, ValueError, RecursionError, MemoryError, ZeroDivisionError):
        return None


def _countdown_problem(ground_truth: Any) -> tuple[int, list[int]]:
    if isinstance(ground_truth, str | bytes):
        ground_truth = json.loads(ground_truth)
    if not isinstance(ground_truth, dict) or "target" not in ground_truth or "numbers" not in ground_truth:
        raise ValueError(
            f'countdown ground_truth must be {{"target": int, "numbers": [int, ...]}}, got {ground_truth!r}'
        )
    given = ground_truth["numbers"]
    if isinstance(given, str | bytes | dict) or not hasattr(given, "__iter__"):
        raise ValueError(f"countdown ground_truth 'numbers' must be a list of whole numbers, got {given!r}")
    target = whole_number(ground_truth["target"], "countdown ground_truth 'target'")
    return target, [whole_number(n, "countdown ground_truth 'numbers'") for n in given]


def check_countdown_truth(data_source: str, ground_truth: Any) -> str | None:
    """None when `ground_truth` is a countdown problem the scorer can read, else what it expects."""
    try:
        _countdown_problem(ground_truth)
    except ValueError:  # json.JSONDecodeError too
        return (
            'expected {"target": 24, "numbers": [4, 6, 1, 1]}: a dict (or its JSON text) whose '
            "target is a whole number and numbers a list of whole numbers"
        )
    return None


@register_scorer("countdown", check_ground_truth=check_countdown_truth)
def countdown_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> dict:
    """1.0 if the answer expression equals the target and uses each given number exactly once."""
    target, numbers = _countdown_problem(ground_truth)
    expression = extract_countdown_expression(solution_str)
    result = evaluate_arithmetic(expression) if expression is not None else None
    correct = False
    if result is not None:
        value, literals = result
        correct = value == target and Counter(literals) == Counter(numbers)
    return {"score": float(correct), "acc": correct, "pred": expression}

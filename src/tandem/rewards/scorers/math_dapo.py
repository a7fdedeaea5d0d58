"""DAPO math scorer: verl's rule for DAPO-Math and AIME rows (verl/utils/reward_score/math_dapo.py).

The response's last `TAIL_CHARS` characters are read; the answer is the rest of the line after the last
"Answer:" there (any case, spaces around the colon allowed), else the placeholder "[INVALID]". Answer and
ground truth both go through `normalize_dapo_answer` (the Minerva normaliser: the part after the last "=",
units and LaTeX wrappers dropped, "\\frac12" widened to "\\frac{1}{2}", "1,000" to "1000") and are equal as
text: score 1.0 when equal, -1.0 otherwise (no answer included). The result also holds `acc` (bool) and
`pred` (the normalised answer), which land in the reward metrics as verl's do.

data_source "math" is scored here too, as verl's default_compute_score routes it (rewards/registry.py,
DATA_SOURCE_ROUTES); the scorer *named* "math" (extra_info.style, scorer_overrides) is the \boxed{} one.
"""

from __future__ import annotations

import numbers
import re
from typing import Any

from tandem.rewards.registry import register_scorer

TAIL_CHARS = 300  # verl reads only this many characters at the end of the response
NO_ANSWER = "[INVALID]"  # the answer verl compares when the response has no "Answer:" line

_ANSWER_LINE = re.compile(r"answer\s*:\s*([^\n]+)", re.IGNORECASE)

# Replaced in this order, before the removals below; the order matters ("an " before "a ", "\\$" before " ").
_REPLACE = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
# Deleted wherever they occur, in this order (units and words first, then LaTeX leftovers).
_UNIT_WORDS = [
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
]
_LATEX_LEFTOVERS = (
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    "\\mathrm{th}",
    "^\\circ",
    "^{\\circ}",
    "\\;",
    ",\\!",
    "{,}",
    '"',
    "\\dots",
)
# (pattern, replacement), applied in order after the deletions.
_REWRITES = (
    (re.compile(r"(.*?)\$(.*?)\$(.*)"), r"$\2$"),  # keep only the first $...$ span
    (re.compile(r"\\text\{(.*?)\}"), r"\1"),
    (re.compile(r"\\textbf\{(.*?)\}"), r"\1"),
    (re.compile(r"\\overline\{(.*?)\}"), r"\1"),
    (re.compile(r"\\boxed\{(.*)\}"), r"\1"),
    (re.compile(r"frac([^{])(.)"), r"frac{\1}{\2}"),  # \frac12 -> \frac{1}{2}
    (re.compile(r"sqrt([^{])"), r"sqrt{\1}"),  # \sqrt2 -> \sqrt{2}
)


def normalize_dapo_answer(answer: str) -> str:
    """`answer` as verl's DAPO scorer compares it (the Minerva normaliser; see the module docstring)."""
    text = answer.split("=")[-1]
    for old, new in _REPLACE:
        text = text.replace(old, new)
    for token in (*_UNIT_WORDS, *_LATEX_LEFTOVERS):
        text = text.replace(token, "")
    for pattern, replacement in _REWRITES:
        text = pattern.sub(replacement, text)
    text = text.replace("$", "")
    if text.replace(",", "").isdigit():
        text = text.replace(",", "")
    return text.strip()


def extract_dapo_answer(solution_str: str) -> str:
    """The text after the last "Answer:" in the response's last `TAIL_CHARS` characters, else NO_ANSWER."""
    found = _ANSWER_LINE.findall(solution_str[-TAIL_CHARS:])
    return found[-1] if found else NO_ANSWER


def check_dapo_truth(data_source: str, ground_truth: Any) -> str | None:
    """None when `ground_truth` is an answer the DAPO scorer can compare with, else what it expects."""
    text = isinstance(ground_truth, str) and ground_truth.strip()
    number = isinstance(ground_truth, numbers.Real) and not isinstance(ground_truth, bool)
    if not (text or number):
        return "expected the final answer as non-empty text (such as '42' or '\\frac{1}{2}') or a number"
    return None


@register_scorer("math_dapo", "math_dapo_reasoning", prefixes=("aime",), check_ground_truth=check_dapo_truth)
def math_dapo_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> dict:
    """1.0 if the response's last "Answer: ..." equals the ground truth after normalising both, else -1.0."""
    problem = check_dapo_truth(data_source, ground_truth)
    if problem is not None:
        raise ValueError(f"math_dapo ground_truth: {problem}, got {ground_truth!r:.80}")
    pred = normalize_dapo_answer(extract_dapo_answer(solution_str))
    correct = pred == normalize_dapo_answer(str(ground_truth))
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}

"""GSM8K scorer: verl's strict rule by default (only a "#### N" answer counts), its flexible rule, or
Tandem's lenient one.

| method   | the answer read                                            | compared with the truth |
|----------|------------------------------------------------------------|-------------------------|
| strict   | the last "#### N" in the last 300 characters, commas gone  | as text                 |
| flexible | the last run of digits / "." / "," / leading "-" in them   | as text                 |
| lenient  | the number after the last "####", else the last number     | as a number             |

strict and flexible give verl's numbers (verl/utils/reward_score/gsm8k.py): "The answer is 72." scores 0
under strict (no "####"), and 0 under flexible too (it reads "72.", text unequal to "72"); "#### 72.0" is
not "72" under either. lenient (Tandem's rule before verl's became the default) reads numbers as a person
would: "$1,234.", "72.0", "−5" and "-$5" are the numbers 1234, 72, -5, -5.

Which method: the `method` keyword of a call (a tool's reward passes it), else the row's
`extra_info["gsm8k_method"]`, else strict. The row carries it because verl's rows already carry an
extra_info dict that a data-preparation script fills in once, and it needs no new config key.
A found answer that is wrong scores `format_score` (verl's name; 0 by default), no answer scores 0.
"""

from __future__ import annotations

import numbers
import re
from fractions import Fraction
from typing import Any, Literal

from tandem.rewards.registry import register_scorer

Method = Literal["strict", "flexible", "lenient"]
METHODS = ("strict", "flexible", "lenient")
METHOD_KEY = "gsm8k_method"  # extra_info key naming a row's method
TAIL_CHARS = 300  # strict and flexible read only this many characters at the end of the response (as verl)

_STRICT = re.compile(r"#### (-?[0-9.,]+)")  # exactly one space after ####, then digits, "." and ","
_FLEXIBLE = re.compile(r"-?[0-9.,]+")

# "1,234.5", "-3", "72", ".5": thousands commas only in whole groups of three ("3,4" reads as 3 and 4,
# "1,0000" as 1 and 0000, never as 1,000); a minus only where it cannot be a subtraction or a range
# ("12-5" is 12 and 5, "=-7" and " -7" are -7); no digits or "." right before ("1.5" is not "5").
_NUMBER = re.compile(r"(?:(?<![\w.)\]])-)?(?<![\d.])(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)")
# Written around numbers, dropped before reading them: "$", "-$5" and "$-5" are -5, "−5" (U+2212) too.
_NOISE = str.maketrans({"$": None, "\u2212": "-"})


def extract_gsm8k_answer(text: str) -> str | None:
    """lenient: the first number after the last "####", else the last number in `text`; commas removed."""
    text = text.translate(_NOISE)
    if "####" in text:
        found = _NUMBER.findall(text.rsplit("####", 1)[1])
        answer = found[0] if found else None
    else:
        found = _NUMBER.findall(text)
        answer = found[-1] if found else None
    return None if answer is None else answer.replace(",", "")


def extract_verl_answer(text: str, method: Literal["strict", "flexible"] = "strict") -> str | None:
    """verl's reading of a response: strict = the last "#### N" (commas and "$" dropped); flexible = the
    last run of number characters that is not a lone "." (kept as written, commas included; a text whose
    every run is "." gives "." as verl's does). Both look at the last `TAIL_CHARS` characters only."""
    tail = text[-TAIL_CHARS:]
    if method == "strict":
        found = _STRICT.findall(tail)
        return found[-1].replace(",", "").replace("$", "") if found else None
    found = _FLEXIBLE.findall(tail)
    if not found:
        return None
    return next((run for run in reversed(found) if run != "."), found[0])


def check_gsm8k_truth(data_source: str, ground_truth: Any) -> str | None:
    """None when `ground_truth` holds the number the gsm8k scorer compares with, else what it expects."""
    readable = isinstance(ground_truth, str | numbers.Real) and not isinstance(ground_truth, bool)
    if not readable or extract_gsm8k_answer(str(ground_truth)) is None:
        return 'expected the final answer as a number such as 72 or "72", or a solution ending in "#### 72"'
    return None


def _truth_text(ground_truth: Any) -> str:
    """The ground truth's answer as strict / flexible compare it: a solution's number after "####", a
    number (72 or 72.0) as "72", other text as written (surrounding spaces dropped; "1,234" stays, as in
    verl, where only "1,234" under flexible equals it)."""
    if isinstance(ground_truth, numbers.Real):
        value = (
            Fraction(int(ground_truth))
            if isinstance(ground_truth, numbers.Integral)
            else Fraction(str(ground_truth))
        )
        return str(value.numerator) if value.denominator == 1 else str(ground_truth)
    text = str(ground_truth)
    return str(extract_gsm8k_answer(text)) if "####" in text else text.strip()


def _method_of(method: str | None, extra_info: dict | None) -> str:
    if method is None and isinstance(extra_info, dict) and extra_info.get(METHOD_KEY) is not None:
        method, where = extra_info[METHOD_KEY], f"the row's extra_info['{METHOD_KEY}']"
    else:
        where = "the method keyword"
    method = "strict" if method is None else method
    if method not in METHODS:
        raise ValueError(f"gsm8k scorer: {where} is {method!r}; use one of {', '.join(METHODS)}")
    return method


@register_scorer("gsm8k", "openai/gsm8k", check_ground_truth=check_gsm8k_truth)
def gsm8k_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    *,
    method: Method | None = None,
    format_score: float = 0.0,
    score: float = 1.0,
) -> dict:
    """`score` when the response's answer equals the ground truth's (a number, or a full "... #### 72"),
    `format_score` when an answer was found but differs, 0 when none was; `method` as the module says."""
    method = _method_of(method, extra_info)
    gold = extract_gsm8k_answer(str(ground_truth))
    if gold is None:
        raise ValueError(f"gsm8k ground_truth holds no number: {ground_truth!r}")
    if method == "lenient":
        pred = extract_gsm8k_answer(solution_str)
        correct = pred is not None and Fraction(pred) == Fraction(gold)
    else:
        pred = extract_verl_answer(solution_str, method)
        correct = pred == _truth_text(ground_truth)
    value = score if correct else (0.0 if pred is None else format_score)
    return {"score": float(value), "acc": correct, "pred": pred}

"""GSM8K-style scorer: the final number after "####", else the last number, compared exactly."""

from __future__ import annotations

import numbers
import re
from fractions import Fraction
from typing import Any

from tandem.rewards.registry import register_scorer

# "1,234.5", "-3", "72", ".5": thousands commas only in whole groups of three ("3,4" reads as 3 and 4,
# "1,0000" as 1 and 0000, never as 1,000); a minus only where it cannot be a subtraction or a range
# ("12-5" is 12 and 5, "=-7" and " -7" are -7); no digits or "." right before ("1.5" is not "5").
_NUMBER = re.compile(r"(?:(?<![\w.)\]])-)?(?<![\d.])(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)")
# Written around numbers, dropped before reading them: "$", "-$5" and "$-5" are -5, "−5" (U+2212) too.
_NOISE = str.maketrans({"$": None, "\u2212": "-"})


def extract_gsm8k_answer(text: str) -> str | None:
    """The first number after the last "####", else the last number in `text`; commas removed."""
    text = text.translate(_NOISE)
    if "####" in text:
        found = _NUMBER.findall(text.rsplit("####", 1)[1])
        answer = found[0] if found else None
    else:
        found = _NUMBER.findall(text)
        answer = found[-1] if found else None
    return None if answer is None else answer.replace(",", "")


def check_gsm8k_truth(data_source: str, ground_truth: Any) -> str | None:
    """None when `ground_truth` holds the number the gsm8k scorer compares with, else what it expects."""
    readable = isinstance(ground_truth, str | numbers.Real) and not isinstance(ground_truth, bool)
    if not readable or extract_gsm8k_answer(str(ground_truth)) is None:
        return 'expected the final answer as a number such as 72 or "72", or a solution ending in "#### 72"'
    return None


@register_scorer("gsm8k", "openai/gsm8k", check_ground_truth=check_gsm8k_truth)
def gsm8k_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> dict:
    """1.0 if the response's final number equals the ground truth's (a number, or a full "... #### 72")."""
    gold = extract_gsm8k_answer(str(ground_truth))
    if gold is None:
        raise ValueError(f"gsm8k ground_truth holds no number: {ground_truth!r}")
    pred = extract_gsm8k_answer(solution_str)
    correct = pred is not None and Fraction(pred) == Fraction(gold)
    return {"score": float(correct), "acc": correct, "pred": pred}

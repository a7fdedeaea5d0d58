"""geo3k's scorer (`data_source: hiyouga/geometry3k`, verl's examples/data_preprocess/geo3k.py rows), as verl
scores it: 0.9 x the last \\boxed{} answer equal to the ground truth + 0.1 x the reasoning format
(`<think>...</think>` then a \\boxed{} answer). verl grades with mathruler's grade_answer (normalized strings,
then sympy); here math_verify does the symbolic part, normalized strings where it cannot parse (math_answer.py).
"""

from __future__ import annotations

import re
from typing import Any

from tandem.rewards.registry import register_scorer
from tandem.rewards.scorers.math_answer import _verify, check_math_truth, last_boxed, normalize_answer

FORMAT_SCORE = 0.1  # verl's format_score: the weight of the format term
_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def geo3k_format(solution_str: str) -> float:
    """1.0 when the response is `<think>...</think>` and then holds a \\boxed{} answer, else 0.0."""
    return 1.0 if _FORMAT.fullmatch(solution_str) else 0.0


def geo3k_correct(pred: str | None, ground_truth: Any) -> bool:
    """Whether `pred` (a \\boxed{} content) is the ground truth's answer."""
    if pred is None:
        return False
    gold = str(ground_truth).strip()
    if normalize_answer(pred) == normalize_answer(gold):
        return True
    return bool(_verify(gold, pred))


@register_scorer("geo3k", "hiyouga/geometry3k", check_ground_truth=check_math_truth)
def geo3k_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> dict:
    """(1 - 0.1) x accuracy + 0.1 x format, verl's geo3k compute_score."""
    pred = last_boxed(solution_str)
    correct = geo3k_correct(pred, ground_truth)
    form = geo3k_format(solution_str)
    score = (1.0 - FORMAT_SCORE) * float(correct) + FORMAT_SCORE * form
    return {"score": score, "acc": correct, "format": form, "pred": pred}

"""Math scorer: the last \\boxed{} answer checked against the ground truth with math_verify.

When math_verify cannot parse either side, the two answers are compared as normalized strings.
"""

from __future__ import annotations

import numbers
import re
import threading
from typing import Any

from tandem.rewards.registry import register_scorer

MATH_VERIFY_TIMEOUT_S = 5  # math_verify's own signal-based limit; only usable on the main thread


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`, or `\\boxed 5`) in `text`, or None."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    rest = text[start + (6 if text.startswith("\\boxed", start) else 5) :]
    if rest.startswith(" "):  # "\boxed 5": up to the next space or "$"
        return re.split(r"[\s$]", rest.lstrip(), maxsplit=1)[0] or None
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, char in enumerate(rest):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return rest[1:i]
    return None  # unbalanced braces: the response was cut off


_DROP = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\ ", "$", "^\\circ", "^{\\circ}", "\\%", "%")


def normalize_answer(answer: str) -> str:
    """A plain-string form of a LaTeX answer, for when math_verify cannot parse it."""
    text = re.sub(r"\\text\{(.*?)\}", r"\1", answer)
    for token in _DROP:
        text = text.replace(token, "")
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = re.sub(r"\s+", "", text).rstrip(".")
    return text.lower()


def _verify(gold: str, pred: str) -> bool | None:
    """math_verify's verdict, or None when it cannot parse one of the answers."""
    from math_verify import parse, verify  # imports sympy: slow, so only when first needed

    # math_verify's time limit uses SIGALRM, which works on the main thread only; elsewhere the
    # caller's limit (the reward worker pool kills a hung process) is the only one.
    limit = MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    gold_parsed = parse(f"\\boxed{{{gold}}}", parsing_timeout=limit)
    pred_parsed = parse(f"\\boxed{{{pred}}}", parsing_timeout=limit)
    if not gold_parsed or not pred_parsed:
        return None
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=limit))


def check_math_truth(data_source: str, ground_truth: Any) -> str | None:
    """None when `ground_truth` is an answer the math scorer can compare with, else what it expects."""
    text = isinstance(ground_truth, str) and ground_truth.strip()
    number = isinstance(ground_truth, numbers.Real) and not isinstance(ground_truth, bool)
    if not (text or number):
        return (
            "expected the answer as non-empty text (LaTeX such as '\\frac{1}{2}' or '\\boxed{3}') or a number"
        )
    return None


@register_scorer(
    "math",
    "lighteval/MATH",
    "DigitalLearningGmbH/MATH-lighteval",
    "HuggingFaceH4/MATH-500",
    check_ground_truth=check_math_truth,
)
def math_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> dict:
    """1.0 if the last \\boxed{} answer equals the ground truth (math_verify, else normalized strings)."""
    problem = check_math_truth(data_source, ground_truth)
    if problem is not None:  # str(None) would be compared as the answer "None": 0 on every sample
        raise ValueError(f"math ground_truth: {problem}, got {ground_truth!r:.80}")
    gold = str(ground_truth)
    gold = last_boxed(gold) or gold
    pred = last_boxed(solution_str)
    if pred is None:
        return {"score": 0.0, "acc": False, "pred": None}
    correct = _verify(gold, pred)
    if correct is None:
        correct = normalize_answer(pred) == normalize_answer(gold)
    return {"score": float(correct), "acc": correct, "pred": pred}

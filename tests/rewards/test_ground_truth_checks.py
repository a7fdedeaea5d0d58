"""Each built-in scorer declares what its ground truth must look like; user scorers may too. The checks
accept exactly what the scorers can score, and the manager finds the right check for each row."""

import numpy as np
import pytest

from tandem.rewards import (
    DATA_SOURCES,
    GROUND_TRUTH_CHECKS,
    SCORERS,
    RewardManager,
    addition_score,
    countdown_score,
    gsm8k_score,
    math_score,
    register_scorer,
)
from tandem.rewards.scorers import tool_multiply_score

GOOD = {
    "addition": ["42", 42, 42.0, " 7 ", "1,042", np.int64(3)],
    "countdown": [{"target": 24, "numbers": [4, 6, 1, 1]}, '{"target": 3, "numbers": [1, 2]}'],
    "gsm8k": ["72", 72, "He has 3 + 4 = 7 <<3+4=7>>\n#### 7", 0.5],
    "math": ["\\frac{1}{2}", "\\boxed{3}", 3, "x"],
    "tool_multiply": ["56088", 56088, "56,088"],
}
BAD = {
    "addition": [None, "two", 4.5, True, [42], {"answer": 42}],
    "countdown": [None, {"target": 3}, {"target": 3, "numbers": "1 2"}, "{not json", 24],
    "gsm8k": [None, "none", [72], True, {"answer": 72}],
    "math": [None, "", "   ", True, ["1"], {"answer": "1"}],
    "tool_multiply": [None, "123*456", 56088.5, [56088]],
}
SCORE = {
    "addition": addition_score,
    "countdown": countdown_score,
    "gsm8k": gsm8k_score,
    "math": math_score,
    "tool_multiply": tool_multiply_score,
}


@pytest.mark.parametrize("name", sorted(GOOD))
def test_builtin_checks_accept_what_the_scorer_reads(name):
    check = GROUND_TRUTH_CHECKS[name]
    for truth in GOOD[name]:
        assert check(name, truth) is None, truth
        SCORE[name](name, "no answer", truth, None)  # the scorer reads it too (no exception)


@pytest.mark.parametrize("name", sorted(BAD))
def test_builtin_checks_say_what_they_expected(name):
    check = GROUND_TRUTH_CHECKS[name]
    for truth in BAD[name]:
        problem = check(name, truth)
        assert problem is not None and problem.startswith("expected "), truth


def test_math_scorer_no_longer_scores_a_missing_ground_truth_as_the_answer_none():
    with pytest.raises(ValueError, match="math ground_truth: expected the answer as non-empty text"):
        math_score("math", "\\boxed{None}", None, None)


@pytest.fixture
def clean_registry():
    saved = dict(SCORERS), dict(DATA_SOURCES), dict(GROUND_TRUTH_CHECKS)
    yield
    for registry, old in zip((SCORERS, DATA_SOURCES, GROUND_TRUTH_CHECKS), saved):
        registry.clear()
        registry.update(old)


def _even_check(data_source, ground_truth):
    return None if isinstance(ground_truth, int) and ground_truth % 2 == 0 else "expected an even number"


def test_register_scorer_with_a_check_and_the_manager_finds_it(clean_registry):
    @register_scorer("even_task", "evens", check_ground_truth=_even_check)
    def even_score(data_source, solution_str, ground_truth, extra_info=None):
        return 0.0

    manager = RewardManager(None, num_workers=0, scorer_overrides={"renamed": "even_task"})
    rows = [("evens", None, 2), ("evens", None, 3), ("renamed", None, "x"), ("addition", None, "x")]
    rows += [("anything", "even_task", 4), ("anything", "even_task", 5)]  # found by extra_info style
    problems = list(manager.ground_truth_problems(rows))
    assert problems == [
        (1, "scorer 'even_task'", "expected an even number"),
        (2, "scorer 'even_task'", "expected an even number"),
        (3, "scorer 'addition'", "expected a whole number such as 42 or '42'"),
        (5, "scorer 'even_task'", "expected an even number"),
    ]


def test_a_scorer_without_a_check_accepts_anything(clean_registry):
    @register_scorer("lenient")
    def lenient(data_source, solution_str, ground_truth, extra_info=None):
        return 0.0

    manager = RewardManager(None, num_workers=0)
    assert list(manager.ground_truth_problems([("lenient", None, None), ("lenient", None, object())])) == []


def test_custom_file_check_is_optional_and_its_failures_are_reported(tmp_path):
    plain = tmp_path / "plain.py"
    plain.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n"
    )
    assert (
        list(
            RewardManager(None, num_workers=0, custom_reward_file=plain).ground_truth_problems(
                [("x", None, None)]
            )
        )
        == []
    )

    checked = tmp_path / "checked.py"
    checked.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n\n"
        "def check_ground_truth(data_source, ground_truth):\n"
        "    if ground_truth == 'boom':\n        raise KeyError('answer')\n"
        "    if ground_truth == 'bool':\n        return False\n"
        "    return None if isinstance(ground_truth, str) else 'expected text'\n"
    )
    manager = RewardManager(None, num_workers=0, custom_reward_file=checked)
    problems = list(
        manager.ground_truth_problems(
            [("x", None, "ok"), ("x", None, 3), ("x", None, "boom"), ("x", None, "bool")]
        )
    )
    who = f"compute_score in {checked}"
    assert problems == [
        (1, who, "expected text"),
        (2, who, f"check_ground_truth of {who} raised KeyError: 'answer'"),
        (
            3,
            who,
            f"check_ground_truth of {who} returned False; it must return None (the ground truth is fine) or a "
            "string saying what it expected",
        ),
    ]

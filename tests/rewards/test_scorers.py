from fractions import Fraction

import numpy as np
import pytest

from tandem.rewards import (
    addition_score,
    countdown_score,
    default_scorer_for,
    evaluate_arithmetic,
    math_score,
)
from tandem.rewards.scorers import tool_multiply_score
from tandem.rewards.scorers.arithmetic import extract_countdown_expression
from tandem.rewards.scorers.math_answer import last_boxed, normalize_answer


def score(fn, solution, ground_truth, source="x"):
    return fn(source, solution, ground_truth, None)["score"]


# --- addition ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("42", 1.0),
        ("12+30=42", 1.0),
        ("The answer is 42.", 1.0),
        ("42 or maybe 41", 0.0),  # the LAST integer counts
        ("41", 0.0),
        ("forty-two", 0.0),
        ("", 0.0),
        ("420", 0.0),
        ("42.5", 0.0),  # not read as "5": the last number is 42.5, not a whole number
        ("42.0", 1.0),
        ("1,042", 0.0),
        ("-42", 0.0),
    ],
)
def test_addition(response, expected):
    assert score(addition_score, response, "42") == expected


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("The answer is 7.", 1.0),
        ("7 apples", 1.0),
        ("**7**", 1.0),
        ("I think 7. No wait, 8.", 0.0),
        ("7,000", 0.0),
        ("1.7", 0.0),  # not "7" read out of a decimal
        ("-7", 0.0),
    ],
)
@pytest.mark.parametrize("ground_truth", ["7", " 7 ", "7.0", 7, 7.0, "+7"])
def test_addition_ground_truth_as_written_by_users(response, expected, ground_truth):
    assert score(addition_score, response, ground_truth) == expected


@pytest.mark.parametrize("ground_truth", [None, 7.5, "7.5", "seven", "", True, float("nan"), [7]])
def test_addition_broken_ground_truth_is_an_error_naming_it(ground_truth):
    with pytest.raises(
        ValueError, match=r"addition ground_truth must be a whole number such as 42 or '42', got"
    ):
        addition_score("addition", "7", ground_truth, None)


def test_addition_thousands_ground_truth():
    assert score(addition_score, "so 1,042", "1,042") == score(addition_score, "1042", 1042) == 1.0


def test_addition_reports_prediction_and_rejects_broken_ground_truth():
    assert addition_score("addition", "12+30=42", "42", None) == {"score": 1.0, "acc": True, "pred": "42"}
    assert addition_score("addition", "none", "42", None)["pred"] is None
    assert addition_score("addition", "42.5", "42", None) == {"score": 0.0, "acc": False, "pred": "42.5"}
    with pytest.raises(ValueError):
        addition_score("addition", "42", "forty-two", None)


# --- tool_multiply ----------------------------------------------------------------------------

CALL = '<tool_call>{"name":"calculator","arguments":{"expression":"123*456"}}</tool_call>'


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("56088", 1.0),
        ("The answer is 56,088.", 1.0),
        ("123*456=56088", 1.0),
        (f"{CALL}56088", 1.0),  # an answer written after a call still counts
        ("56087", 0.0),
        ("56088 (123*456)", 0.0),  # the LAST integer counts
        ("5608 8", 0.0),
        ("560880", 0.0),
        ("56088.5", 0.0),
        ("", 0.0),
        ("fifty-six thousand", 0.0),
        ("<|im_end|>", 0.0),
        (CALL, 0.0),  # the tool call turn alone is a question, not an answer
        ('<tool_call>{"name":"calculator","arguments":{"expression":"56088"}}</tool_call>', 0.0),
        ('<tool_call>{"name":"calculator","arguments":{"expression":"56088', 0.0),  # cut off
    ],
)
def test_tool_multiply(response, expected):
    assert score(tool_multiply_score, response, "56088", "tool_multiply") == expected


def test_tool_multiply_registered_reports_prediction_and_checks_ground_truth():
    assert default_scorer_for("tool_multiply") is tool_multiply_score
    assert tool_multiply_score("tool_multiply", "so 56088", 56088, None) == {
        "score": 1.0,
        "acc": True,
        "pred": "56088",
    }
    assert tool_multiply_score("tool_multiply", CALL, "56088", None) == {
        "score": 0.0,
        "acc": False,
        "pred": None,
    }
    with pytest.raises(ValueError, match="tool_multiply ground_truth must be a whole number"):
        tool_multiply_score("tool_multiply", "1", "56088.5", None)


def test_tool_multiply_scores_the_task_rows():
    from tandem.data.synthetic import make_rows

    for row in make_rows("tool_multiply", 20, seed=0):
        truth = row["reward_model"]["ground_truth"]
        call, _, answer = (m["content"] for m in row["messages"][1:])
        assert (
            score(tool_multiply_score, answer, truth)
            == score(tool_multiply_score, row["response"], truth)
            == 1.0
        )
        assert score(tool_multiply_score, call, truth) == 0.0


# --- countdown --------------------------------------------------------------------------------

PROBLEM = {"target": 24, "numbers": [3, 4, 5]}


@pytest.mark.parametrize(
    "response",
    [
        "(5 + 3) * 4 - 8",  # = 24, but 8 is not a given number
        "Answer: (5 - 3 + 4) * 4",  # = 24, but uses 4 twice
        "<answer>4 * (3 + 5)</answer>",  # right numbers, = 32
        "<answer>4*5+3</answer>",  # = 23
        "<answer>(5 + 3) * 3</answer>",  # = 24 with a 3 that is not there, and 4 unused
    ],
)
def test_countdown_wrong_answers(response):
    assert score(countdown_score, response, PROBLEM) == 0.0


def test_countdown_needs_every_number():
    assert (
        score(countdown_score, "<answer>(5 + 3) * 3</answer>", {"target": 24, "numbers": [5, 3, 3, 4]}) == 0.0
    )


@pytest.mark.parametrize(
    ("response", "problem"),
    [
        ("<answer>(5 + 3) * 3</answer>", {"target": 24, "numbers": [5, 3, 3]}),
        ("Answer: (5 - 3) * 4 * 3", {"target": 24, "numbers": [3, 3, 4, 5]}),
        ("Let me think.\n(5 - 3) * 4 * 3 = 24", {"target": 24, "numbers": [3, 4, 3, 5]}),
        ("<answer>8 / (3 - 8 / 3)</answer>", {"target": 24, "numbers": [8, 3, 8, 3]}),  # exact division
        (
            "<answer>((((4 * 5))) + ((1)))</answer>",
            {"target": 21, "numbers": [4, 5, 1]},
        ),  # nested parentheses
        ("<answer>12 / 4 + 5</answer>", '{"target": 8, "numbers": [12, 4, 5]}'),  # ground truth as JSON
    ],
)
def test_countdown_right_answers(response, problem):
    assert score(countdown_score, response, problem) == 1.0


@pytest.mark.parametrize(
    "response",
    [
        "<answer>3 * 4 * 5 / (5 - 5)</answer>",  # division by zero
        "<answer>-3 + 4 * 5 + 7</answer>",  # unary minus is not allowed
        "<answer>3 ** 4</answer>",
        "<answer>2 ** 2 ** 2 ** 2 ** 2 ** 2</answer>",  # a huge power is rejected, not computed
        "<answer>__import__('os').system('echo pwned')</answer>",
        "Answer: __import__('os')",
        "<answer>(3).__class__</answer>",
        "<answer>3 // 4</answer>",
        "<answer>3.0 * 8</answer>",
        "I have no idea",
        "",
        "<answer>" + "(" * 150 + "3" + ")" * 150 + "</answer>",
    ],
)
def test_countdown_malformed_answers_score_zero(response):
    assert score(countdown_score, response, {"target": 24, "numbers": [3, 8]}) == 0.0


FOUR = {"target": 24, "numbers": [3, 4, 5, 7]}


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (
            "<answer>-3 + 4 * 5 + 7</answer>",
            0.0,
        ),  # = 24 with the right numbers, but unary minus is not allowed
        ("<answer>4 * 5 + 7 - 3</answer>", 1.0),  # the same with binary minus
        ("<answer>4 * 5 + 7 - (-3)</answer>", 0.0),
        ("<answer>4*5+7-3</answer>", 1.0),  # no spaces
        ("<answer>  4 *   5 +\t7 - 3  </answer>", 1.0),  # odd spacing
        ("<answer>4 × 5 + 7 − 3</answer>", 1.0),  # typographic times and minus
        ("<answer>\\(4 \\times 5 + 7 - 3\\)</answer>", 1.0),  # LaTeX
        ("<answer>$4 \\cdot 5 + 7 - 3$</answer>", 1.0),
        ("<answer>4 * 5 + 7 - 3 + 3 - 3</answer>", 0.0),  # 3 used three times
        ("<answer>4 * 5 + 4</answer>", 0.0),  # 4 reused, 3 and 7 unused
        ("<answer>(7 - 5) * 4 * 3</answer>", 1.0),
        ("24 = (7 - 5) * 4 * 3", 1.0),  # expression on the right of "="
        ("(7 - 5) * 4 * 3 = 2 * 4 * 3 = 24", 1.0),  # the first expression of a chain
        ("Given 3, 4, 5, 7. 4 * 5 + 7 - 3 = 24", 1.0),  # "7." ends a sentence, not an expression
        (
            "<answer>4 * 5 + 7 - 3</answer> no wait <answer>3 * 7 + 5 - 4</answer>",
            0.0,
        ),  # the last one counts: 22
    ],
)
def test_countdown_unary_minus_spaces_symbols_and_reuse(response, expected):
    assert score(countdown_score, response, FOUR) == expected


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("<answer>6 / 3 * 1</answer>", 1.0),  # exact: 2
        ("<answer>(6 + 1) / 3</answer>", 0.0),  # 7/3, not rounded down to 2
        ("<answer>1 / 3 * 6</answer>", 1.0),  # a non-integer on the way is fine when the end is exact
        ("<answer>6 / (3 - 3)</answer>", 0.0),
        ("<answer>6 // 3 * 1</answer>", 0.0),  # floor division is not in the game
    ],
)
def test_countdown_division_is_exact(response, expected):
    assert score(countdown_score, response, {"target": 2, "numbers": [1, 3, 6]}) == expected


@pytest.mark.parametrize(
    "ground_truth",
    [
        {"target": 7.5, "numbers": [1, 2, 3]},  # was read as 7: "1 + 2 * 3" got full marks
        {"target": 7, "numbers": [1, 2.5, 3]},
        {"target": 7, "numbers": "1 2 3"},
        {"target": None, "numbers": [1, 2, 3]},
    ],
)
def test_countdown_non_integer_ground_truth_is_an_error(ground_truth):
    with pytest.raises(ValueError, match="countdown ground_truth"):
        countdown_score("countdown", "<answer>1 + 2 * 3</answer>", ground_truth, None)


def test_countdown_ground_truth_numbers_written_loosely():
    for truth in (
        {"target": 7.0, "numbers": (1, "2", 3.0)},
        {"target": np.int64(7), "numbers": np.array([1, 2, 3])},
    ):
        assert score(countdown_score, "<answer>1 + 2 * 3</answer>", truth) == 1.0


def test_countdown_extraction_rules():
    assert (
        extract_countdown_expression("blah <answer>1+2</answer> then <answer> (3+4)*5 </answer>") == "(3+4)*5"
    )
    assert extract_countdown_expression("Answer: 3*8.") == "3*8"
    assert extract_countdown_expression("(5-3)*4*3 = 24\nSo the answer is 24.") == "(5-3)*4*3"
    assert extract_countdown_expression("Using 3, 4 and 5: 3*4+5 works") == "3*4+5"
    assert extract_countdown_expression("just 24") == "24"
    assert extract_countdown_expression("nothing here") is None


def test_evaluate_arithmetic_is_exact_and_safe():
    assert evaluate_arithmetic("8 / (3 - 8 / 3)") == (Fraction(24), [8, 3, 8, 3])
    assert evaluate_arithmetic("1 / 3 + 1 / 6") == (Fraction(1, 2), [1, 3, 1, 6])
    for bad in (
        "__import__('os')",
        "x + 1",
        "2 ** 100",
        "-1",
        "1 / 0",
        "[1, 2]",
        "abs(3)",
        "1 if 1 else 2",
        "9" * 300,
    ):
        assert evaluate_arithmetic(bad) is None, bad


def test_countdown_broken_ground_truth_raises():
    with pytest.raises(ValueError, match="target"):
        countdown_score("countdown", "1+2", {"numbers": [1, 2]}, None)


# --- math -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "ground_truth", "expected"),
    [
        ("So the answer is \\boxed{\\frac{1}{2}}.", "0.5", 1.0),
        ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("\\boxed{\\dfrac{2}{4}}", "\\boxed{\\frac12}", 1.0),
        ("first \\boxed{3} then \\boxed{3\\sqrt{2}}", "3\\sqrt{2}", 1.0),  # the last box counts
        ("\\boxed{3}", "3\\sqrt{2}", 0.0),
        ("The answer is 1/2", "0.5", 0.0),  # no box, no score
        ("\\boxed{\\frac{1}{2}", "0.5", 0.0),  # cut off: unbalanced braces
        ("\\boxed{x^2 + 2x + 1}", "(x+1)^2", 1.0),
        ("\\boxed{\\text{Monday}}", "\\text{monday}", 1.0),  # string fallback
    ],
)
def test_math(response, ground_truth, expected):
    assert score(math_score, response, ground_truth, "math") == expected


@pytest.mark.parametrize(
    ("response", "ground_truth", "expected"),
    [
        ("\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}", 1.0),
        ("\\boxed{\\dfrac{1}{2}}", "0.5", 1.0),
        ("\\boxed{\\dfrac{1}{2}}", "\\frac{1}{3}", 0.0),
        ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}", 1.0),  # nested braces
        ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{2}}{2}", 0.0),
        ("\\boxed{{1}}", "1", 1.0),
        ("\\boxed{1} or \\boxed{2}", "2", 1.0),  # several boxes: the last counts
        ("\\boxed{1} or \\boxed{2}", "1", 0.0),
        ("\\boxed{1}, finally $\\boxed{-1}$.", "-1", 1.0),
        ("\\boxed{1} then cut off \\boxed{\\frac{1}{", "1", 0.0),  # the last box is unfinished
        ("\\boxed{3}", 3, 1.0),  # a number as ground truth
        ("\\boxed{0.5}", 0.5, 1.0),
        ("\\boxed{(2,1)}", "(1,2)", 0.0),
        ("\\boxed{}", "0", 0.0),
    ],
)
def test_math_fractions_nesting_and_last_box(response, ground_truth, expected):
    assert score(math_score, response, ground_truth, "math") == expected


def test_math_helpers():
    assert last_boxed("a \\boxed{\\frac{1}{\\sqrt{2}}} b") == "\\frac{1}{\\sqrt{2}}"
    assert last_boxed("\\boxed 5$") == "5"
    assert last_boxed("\\fbox{7}") == "7"
    assert last_boxed("none") is None
    assert normalize_answer("\\left( 3, 4 \\right).") == "(3,4)"
    assert math_score("math", "no box", "1", None) == {"score": 0.0, "acc": False, "pred": None}

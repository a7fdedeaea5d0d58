"""The GSM8K scorer: verl's strict (default) and flexible rules give verl's numbers, and Tandem's lenient rule
reads numbers as a person would.

The verl columns were worked out by hand from verl/utils/reward_score/gsm8k.py (`compute_score(solution_str,
ground_truth, method, format_score, score)`) and checked once against it; verl is not installed here."""

import functools

import pytest

from tandem.rewards import gsm8k_score
from tandem.rewards.scorers.gsm8k import extract_gsm8k_answer, extract_verl_answer

# (response, ground truth, verl strict, verl flexible) with format_score=0.1, score=1.0:
# 1.0 = the answer equals the truth, 0.1 = an answer was found but differs, 0.0 = none was found.
VERL_TABLE = [
    ("She has 3 apples.\n#### 72", "72", 1.0, 1.0),
    ("The answer is 72.", "72", 0.0, 0.1),  # no ####; flexible reads "72." (the full stop is a number char)
    ("The answer is 72", "72", 0.0, 1.0),
    ("#### 1,234", "1234", 1.0, 0.1),  # strict drops commas, flexible keeps them
    ("The total is 1,234", "1,234", 0.0, 1.0),
    ("#### 72.0", "72", 0.1, 0.1),  # compared as text
    ("#### 72.", "72", 0.1, 0.1),
    ("####72", "72", 0.0, 1.0),  # strict wants one space after ####
    ("#### $72", "72", 0.0, 1.0),
    ("##### 72", "72", 1.0, 1.0),
    ("#### -5", "-5", 1.0, 1.0),
    ("#### 7 then #### 8", "8", 1.0, 1.0),  # the last #### counts
    ("#### 7 then #### 8", "7", 0.1, 0.1),
    ("#### 71", "72", 0.1, 0.1),
    ("x" * 400 + "#### 72", "72", 1.0, 1.0),
    ("#### 72" + "x" * 300, "72", 0.0, 0.0),  # only the last 300 characters are read
    ("72, then hello, world", "72", 0.0, 0.1),  # flexible's last run is the lone ","
    ("...", "72", 0.0, 0.1),  # every run is ".": flexible gives "." as verl does
    ("no number", "72", 0.0, 0.0),
]


@pytest.mark.parametrize(("response", "truth", "strict", "flexible"), VERL_TABLE)
def test_strict_and_flexible_give_verls_numbers(response, truth, strict, flexible):
    for method, expected in (("strict", strict), ("flexible", flexible)):
        got = gsm8k_score("openai/gsm8k", response, truth, None, method=method, format_score=0.1)
        assert got["score"] == expected, (method, response)
        assert got["acc"] is (expected == 1.0)


def test_strict_is_the_default_and_score_scales_the_reward():
    assert gsm8k_score("gsm8k", "The answer is 72.", "72")["score"] == 0.0
    assert gsm8k_score("gsm8k", "#### 72", "72", score=2.0) == {"score": 2.0, "acc": True, "pred": "72"}
    assert gsm8k_score("gsm8k", "#### 71", "72") == {"score": 0.0, "acc": False, "pred": "71"}
    assert extract_verl_answer("a #### 1,234,567 b") == "1234567"
    assert extract_verl_answer("a 1,234,567 b", "flexible") == "1,234,567"


def test_ground_truth_as_a_number_or_a_full_solution():
    assert gsm8k_score("gsm8k", "#### 1000", 1000)["score"] == 1.0
    assert gsm8k_score("gsm8k", "#### 1000", 1000.0)["score"] == 1.0
    assert gsm8k_score("gsm8k", "#### 0.5", 0.5)["score"] == 1.0
    assert gsm8k_score("gsm8k", "so #### -7", "He loses 7 <<3-10=-7>>\n#### -7")["score"] == 1.0
    assert gsm8k_score("gsm8k", "#### 72", " 72\n")["score"] == 1.0  # surrounding spaces dropped
    with pytest.raises(ValueError, match="holds no number"):
        gsm8k_score("gsm8k", "1", "none", None)


def test_the_method_comes_from_the_keyword_then_the_row():
    lenient_row = {"gsm8k_method": "lenient"}
    assert gsm8k_score("gsm8k", "The answer is 72.", "72", lenient_row)["score"] == 1.0
    assert gsm8k_score("gsm8k", "The answer is 72.", "72", {"gsm8k_method": "flexible"})["score"] == 0.0
    assert gsm8k_score("gsm8k", "The answer is 72.", "72", lenient_row, method="strict")["score"] == 0.0
    assert gsm8k_score("gsm8k", "The answer is 72.", "72", {"index": 3})["score"] == 0.0  # strict
    with pytest.raises(ValueError, match=r"extra_info\['gsm8k_method'\] is 'loose'; use one of strict"):
        gsm8k_score("gsm8k", "#### 72", "72", {"gsm8k_method": "loose"})
    with pytest.raises(ValueError, match="the method keyword is 'exact'"):
        gsm8k_score("gsm8k", "#### 72", "72", None, method="exact")


# --- lenient: the number after ####, else the last number, compared by value ----------------------------

lenient = functools.partial(gsm8k_score, method="lenient")


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("She has 3 apples, then 5 more.\n#### 1,234", 1.0),
        ("#### 1234.0", 1.0),
        ("The total is $1,234.", 1.0),  # no ####: last number
        ("#### 1234 and then 5 more", 1.0),  # the number right after ####
        ("1234 first, but #### 5", 0.0),
        ("The total is 1,233.", 0.0),
        ("no number", 0.0),
    ],
)
def test_lenient(response, expected):
    assert lenient("openai/gsm8k", response, "1234", None)["score"] == expected


@pytest.mark.parametrize(
    ("response", "ground_truth", "expected"),
    [
        ("#### $1,000.00", "1000", 1.0),
        ("The total is $1,000.00.", "1,000", 1.0),
        ("#### 1000", 1000, 1.0),  # a number as ground truth
        ("#### 1000", 1000.0, 1.0),
        ("#### -5", "-5", 1.0),
        ("#### 5", "-5", 0.0),
        ("#### -$5", "-5", 1.0),
        ("#### $-5", "-5", 1.0),
        ("#### \u22125", "-5", 1.0),  # U+2212 minus sign
        ("12 - 17 = -5", "-5", 1.0),
        ("She pays 20-25, so 25", "-25", 0.0),  # a range, not a negative number
        ("The answer is 2-3", "-3", 0.0),
        ("#### .5", "5", 0.0),  # was read as 5
        ("#### .5", "0.5", 1.0),
        ("#### 1,0000", "1000", 0.0),  # was read as 1,000
        ("The answer is 1,234, I think", "1234", 1.0),
        ("#### 7.50", "7.5", 1.0),
        ("#### 1.5", "5", 0.0),
    ],
)
def test_lenient_money_negatives_and_malformed_numbers(response, ground_truth, expected):
    assert lenient("gsm8k", response, ground_truth, None)["score"] == expected


def test_lenient_ground_truth_with_rationale_and_negative():
    assert lenient("gsm8k", "so #### -7", "He loses 7 <<3-10=-7>>\n#### -7", None)["score"] == 1.0
    assert lenient("gsm8k", "#### 0.5", "0.50", None)["score"] == 1.0
    assert extract_gsm8k_answer("3,4 and 1,000,000") == "1000000"

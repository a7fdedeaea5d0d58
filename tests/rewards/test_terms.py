import pytest

from tandem.rewards import FormatTerm, LengthTerm, TermInput, soft_overlong_penalty
from tandem.rewards.terms import check_terms


def sample(text="", length=0):
    return TermInput(solution_str=text, response_length=length, data_source="x")


@pytest.mark.parametrize(
    ("length", "expected"),
    [
        (0, 0.0),
        (12, 0.0),  # L - B
        (13, -0.25 * 0.5),  # L - B + 1: 1/4 of the way
        (15, -0.75 * 0.5),
        (16, -0.5),  # L
        (17, -0.5),  # L + 1
        (1000, -0.5),
    ],
)
def test_soft_overlong_penalty_exact_values(length, expected):
    assert soft_overlong_penalty(length, max_length=16, buffer=4, penalty_factor=0.5) == pytest.approx(
        expected
    )
    assert LengthTerm(overlong_buffer=4, penalty_factor=0.5, max_response_length=16)(
        sample(length=length)
    ) == (pytest.approx(expected))


def test_length_term_takes_managers_max_length_and_validates():
    (bound,) = check_terms([LengthTerm(overlong_buffer=2)], max_response_length=10)
    assert bound.max_response_length == 10
    assert bound(sample(length=9)) == -0.5
    with pytest.raises(ValueError, match="max_response_length"):
        check_terms([LengthTerm(overlong_buffer=2)], max_response_length=None)
    with pytest.raises(ValueError, match="overlong_buffer"):
        LengthTerm(overlong_buffer=0)
    with pytest.raises(ValueError, match="overlong_buffer"):
        LengthTerm(overlong_buffer=20, max_response_length=10)


def test_format_term_search_and_fullmatch():
    search = FormatTerm(r"<answer>.*</answer>", match_reward=0.1, mismatch_reward=-1.0)
    assert search(sample("think...\n<answer>\n42</answer> bye")) == 0.1
    assert search(sample("42")) == -1.0
    full = FormatTerm(r"<think>.*</think>\s*<answer>.*</answer>", fullmatch=True, mismatch_reward=-0.5)
    assert full(sample("  <think>a\nb</think>\n<answer>1</answer>\n")) == 0.0
    assert full(sample("<think>a</think><answer>1</answer> trailing")) == -0.5


def test_format_term_bad_regex_and_duplicate_names():
    with pytest.raises(ValueError, match="not a valid regex"):
        FormatTerm("(unclosed")
    with pytest.raises(ValueError, match="distinct names"):
        check_terms([FormatTerm("a"), FormatTerm("b")], None)
    assert [t.name for t in check_terms([FormatTerm("a"), FormatTerm("b", name="format2")], None)] == [
        "format",
        "format2",
    ]
    with pytest.raises(TypeError, match="name"):
        check_terms([lambda s: 1.0], None)

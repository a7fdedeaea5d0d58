"""geo3k's scorer as verl scores it: 0.9 x accuracy of the last \\boxed{} + 0.1 x the <think> format."""

import pytest

import tandem.rewards.scorers  # noqa: F401  (registers the built-in scorers)
from tandem.rewards.registry import SCORERS, default_scorer_for
from tandem.rewards.scorers.geo3k import geo3k_score


@pytest.mark.parametrize(
    ("response", "truth", "score"),
    [
        ("<think>the angle sums to 180</think> so \\boxed{60}", "60", 1.0),
        ("the answer is \\boxed{60}", "60", 0.9),  # right, without the format
        ("<think>guess</think> \\boxed{45}", "60", 0.1),  # the format alone
        ("<think>x</think> 60", "60", 0.0),  # no boxed answer: neither
        ("<think>r</think>\\boxed{\\frac{1}{2}}", "0.5", 1.0),  # equal as numbers
        ("<think>r</think>\\boxed{2\\sqrt{3}}", "2 \\sqrt{3}", 1.0),
    ],
)
def test_geo3k_scores_as_verl(response, truth, score):
    assert geo3k_score("hiyouga/geometry3k", response, truth)["score"] == pytest.approx(score)


def test_geo3k_rows_find_the_scorer():
    assert "geo3k" in SCORERS
    assert default_scorer_for("hiyouga/geometry3k") is geo3k_score

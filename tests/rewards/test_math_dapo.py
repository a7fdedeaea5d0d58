"""The DAPO math scorer as verl scores data_source math_dapo / math_dapo_reasoning / aime*: the last
"Answer: ..." line in the response's last 300 characters, Minerva-normalised, 1.0 if equal to the truth
else -1.0. Expected values are worked out by hand from verl's rules (verl/utils/reward_score/math_dapo.py)."""

import numpy as np
import pytest
import torch

from tandem.batch import Batch
from tandem.rewards import RewardManager, math_dapo_score, math_score
from tandem.rewards.registry import default_scorer_for, known_data_sources
from tandem.rewards.scorers.math_dapo import normalize_dapo_answer


@pytest.mark.parametrize(
    ("response", "truth", "score", "pred"),
    [
        ("2 + 40 = 42.\nAnswer: 42", "42", 1.0, "42"),
        ("so it is 41\nAnswer: 41", "42", -1.0, "41"),
        ("The answer is \\boxed{42}", "42", -1.0, "[INVALID]"),  # no "Answer:": the placeholder, wrong
        ("ANSWER :  42\nthat's it", "42", 1.0, "42"),  # any case, spaces around ":", the rest of the line
        ("Answer: 1\nchecking again...\nAnswer: 2", "2", 1.0, "2"),  # the last one counts
        ("Answer: x = 5 \\text{ meters}", "5", 1.0, "5"),  # after "=", spaces and the unit gone
        ("Answer: $\\frac12$", "\\frac{1}{2}", 1.0, "\\frac{1}{2}"),  # $ dropped, \frac12 widened
        ("Answer: 1,000 dollars", "1000", 1.0, "1000"),  # unit gone, then a comma number's commas
        ("Answer: 90^\\circ", "90", 1.0, "90"),
        ("Answer: \\boxed{7}", "\\boxed{7}", 1.0, "7"),  # \boxed unwrapped on both sides
        ("Answer: a + b", "a+b", -1.0, "+b"),  # verl's "a " deletion eats the variable: kept as verl
        ("Answer: 0.5", "\\frac{1}{2}", -1.0, "0.5"),  # text equality only, no math equivalence
    ],
)
def test_scores_as_verl(response, truth, score, pred):
    result = math_dapo_score("math_dapo", response, truth)
    assert result == {"score": score, "acc": score == 1.0, "pred": pred}


def test_only_the_last_300_characters_are_read():
    answer = "Answer: 42"  # 10 characters
    inside = "reasoning\n" + answer + "\n" + "x" * 289  # the answer line ends 290 characters from the end
    assert math_dapo_score("math_dapo", inside, "42")["score"] == 1.0
    cut = answer + "\n" + "x" * 290  # "A" is character 301 from the end: the tail starts at "nswer: 42"
    assert math_dapo_score("math_dapo", cut, "42") == {"score": -1.0, "acc": False, "pred": "[INVALID]"}


def test_normaliser_leaves_plain_answers_alone():
    assert normalize_dapo_answer(" 17 ") == "17"
    assert normalize_dapo_answer("\\sqrt2") == "\\sqrt{2}"
    assert normalize_dapo_answer("\\text{(B)}") == "(B)"


@pytest.mark.parametrize(
    "source", ["math", "math_dapo", "math_dapo_reasoning", "aime24", "aime-2025", "aime_2024"]
)
def test_verls_dapo_data_sources_route_to_it(source):
    assert default_scorer_for(source) is math_dapo_score


def test_other_math_sources_keep_the_boxed_scorer():
    for source in ("lighteval/MATH", "my_olympiad_aime"):  # a prefix match only at the start
        assert default_scorer_for(source, style="math") is math_score
    assert "aime*" in known_data_sources() and "math_dapo" in known_data_sources()


def test_acc_and_pred_reach_the_reward_result():
    texts = ["Answer: 42", "Answer: 7"]  # one character per token; 0 = pad
    responses = torch.zeros((2, 12), dtype=torch.long)
    mask = torch.zeros((2, 12), dtype=torch.long)
    for i, text in enumerate(texts):
        responses[i, : len(text)] = torch.tensor([ord(c) for c in text])
        mask[i, : len(text)] = 1
    batch = Batch.from_dict(
        {"responses": responses, "response_mask": mask},
        {"data_source": ["math_dapo", "aime24"], "ground_truth": ["42", "8"], "extra_info": [None, None]},
    )

    class CharTokenizer:
        def batch_decode(self, seqs, skip_special_tokens=False):
            return ["".join(chr(i) for i in ids if i) for ids in seqs]

    result = RewardManager(CharTokenizer(), num_workers=0)(batch)
    assert result.scores.tolist() == [1.0, -1.0]
    np.testing.assert_array_equal(result.extra["acc"], [1, 0])
    assert list(result.extra["pred"]) == ["42", "7"]
    assert result.metrics["reward/score_mean/math_dapo"] == 1.0
    assert result.metrics["reward/score_mean/aime24"] == -1.0


def test_ground_truth_must_be_an_answer():
    with pytest.raises(ValueError, match="math_dapo ground_truth"):
        math_dapo_score("math_dapo", "Answer: 1", None)

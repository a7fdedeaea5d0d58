"""verl's batch reward manager (RewardManager(batch=True), reward.manager=batch): the user's function is called
once per batch with verl's plural keyword arguments, and its list of scores lands as verl's batch manager puts
it, on each sample's last response token."""

import textwrap

import numpy as np
import pytest
import torch
from test_manager import CharTokenizer, make_batch

from tandem.rewards import RewardManager

BATCH_FN = textwrap.dedent(
    '''
    import time

    import numpy as np


    def compute_score(data_sources, solution_strs, ground_truths, extra_infos, bonus=0.0, scale=1.0):
        """1 for the right answer, + bonus, + len/10 for data_source "long"; as a dict on odd rows."""
        assert isinstance(data_sources, np.ndarray) and isinstance(extra_infos, np.ndarray)  # verl's columns
        assert isinstance(solution_strs, list) and isinstance(ground_truths, list)
        out = []
        for i, (source, text, truth, info) in enumerate(zip(data_sources, solution_strs, ground_truths, extra_infos)):
            assert info["rollout_reward_scores"] == {}  # set on each extra_info, as verl's batch manager does
            score = scale * (float(text == truth) + bonus + (len(text) / 10 if source == "long" else 0.0))
            seen = {"batch_size": len(solution_strs), "row": info.get("row", -1)}
            out.append({"score": score, "acc": float(text == truth), **seen} if i % 2 else score)
        return out


    def per_sample(data_source, solution_str, ground_truth, extra_info=None):
        return float(solution_str == ground_truth)


    def raises(data_sources, solution_strs, ground_truths, extra_infos):
        raise ValueError("no judge today")


    def one_short(data_sources, solution_strs, ground_truths, extra_infos):
        return [1.0] * (len(solution_strs) - 1)


    def bad_item(data_sources, solution_strs, ground_truths, extra_infos):
        return [1.0, "high", {"acc": 1.0}][: len(solution_strs)]


    def sleeps(data_sources, solution_strs, ground_truths, extra_infos):
        time.sleep(30)
    '''
)

ROWS = dict(
    texts=["42", "41", "abcd", "7"],
    sources=["addition", "addition", "long", "long"],
    ground_truths=["42", "42", "abcd", "8"],
    extra_infos=[{"row": 0}, None, {"row": 2}, {"row": 3}],
)


@pytest.fixture
def batch_file(tmp_path):
    path = tmp_path / "batch_reward.py"
    path.write_text(BATCH_FN)
    return path


def _batch(**kwargs):
    return make_batch(
        ROWS["texts"], ROWS["sources"], ROWS["ground_truths"], ROWS["extra_infos"], width=8, **kwargs
    )


@pytest.mark.parametrize("num_workers", [0, 1])
def test_one_call_per_batch_with_verls_arguments_and_hand_computed_scores(batch_file, num_workers):
    manager = RewardManager(
        CharTokenizer(),
        custom_reward_file=batch_file,
        custom_reward_kwargs={"scale": 2.0},
        batch=True,
        manager_kwargs={"bonus": 0.5, "scale": 99.0},  # custom_reward_kwargs win, as verl binds them
        num_workers=num_workers,
    )
    with manager:
        result = manager(_batch())
    # 2 * (right + 0.5 + len/10 on "long"): "42" 3.0, "41" 1.0, "abcd" 2 * (1.5 + 0.4) = 3.8, "7" 2 * (0.5 + 0.1)
    expected = torch.tensor([3.0, 1.0, 3.8, 1.2])
    assert torch.allclose(result.scores, expected)
    token_level = torch.zeros(4, 8)
    for i, text in enumerate(ROWS["texts"]):
        token_level[i, len(text)] = expected[i]  # the last valid token: the EOS after the text
    assert torch.allclose(result.token_level_scores, token_level)
    assert result.metrics["reward/error_count"] == 0 and result.metrics["reward/timeout_count"] == 0
    assert result.metrics["reward/score_mean"] == pytest.approx(float(expected.mean()))
    # a dict's fields are kept per sample (NaN on the rows that returned a number), as for a per-sample function
    np.testing.assert_array_equal(result.extra["batch_size"], [np.nan, 4, np.nan, 4])  # one call saw all 4
    np.testing.assert_array_equal(result.extra["row"], [np.nan, -1, np.nan, 3])
    np.testing.assert_array_equal(result.extra["acc"], [np.nan, 0.0, np.nan, 0.0])


def test_the_per_sample_path_is_unchanged(batch_file):
    manager = RewardManager(
        CharTokenizer(), custom_reward_file=batch_file, custom_reward_function="per_sample", num_workers=0
    )
    result = manager(_batch())
    assert result.scores.tolist() == [1.0, 0.0, 1.0, 0.0] and result.metrics["reward/error_count"] == 0
    # a batch-style function called per sample (verl's naive manager, reward.manager=naive) fails each sample
    batch_style = RewardManager(CharTokenizer(), custom_reward_file=batch_file, num_workers=0)(_batch())
    assert batch_style.metrics["reward/error_count"] == 4 and batch_style.scores.tolist() == [0.0] * 4


@pytest.mark.parametrize(
    ("function", "message"),
    [
        ("raises", "the batch call over 4 samples failed (each scores 0): ValueError: no judge today"),
        ("one_short", "the batch reward function returned 3 scores for 4 samples"),
    ],
)
def test_a_failed_call_fails_every_sample_of_it(batch_file, function, message):
    manager = RewardManager(
        CharTokenizer(),
        custom_reward_file=batch_file,
        custom_reward_function=function,
        batch=True,
        num_workers=0,
    )
    result = manager(_batch())
    assert result.scores.tolist() == [0.0] * 4 and not result.token_level_scores.any()
    assert result.metrics["reward/error_count"] == 4
    assert message in result.first_error and result.first_error.startswith(
        "sample 0 (data_source 'addition')"
    )
    assert list(result.extra["error"]) == [result.extra["error"][0]] * 4


def test_an_item_that_is_no_score_fails_its_own_sample(batch_file):
    batch = make_batch(["42", "41", "7"], ["addition"] * 3, ["42"] * 3)
    manager = RewardManager(
        CharTokenizer(),
        custom_reward_file=batch_file,
        custom_reward_function="bad_item",
        batch=True,
        num_workers=0,
    )
    result = manager(batch)
    assert result.scores.tolist() == [1.0, 0.0, 0.0] and result.metrics["reward/error_count"] == 2
    assert "got 'high'" in result.extra["error"][1] and "must hold 'score'" in result.extra["error"][2]


def test_a_hung_call_times_out_at_timeout_s_per_sample_and_counts_each_sample(batch_file):
    manager = RewardManager(
        CharTokenizer(),
        custom_reward_file=batch_file,
        custom_reward_function="sleeps",
        batch=True,
        num_workers=1,
        timeout_s=0.25,
    )
    with manager:
        result = manager(_batch())
    assert result.metrics["reward/timeout_count"] == 4 and result.metrics["reward/error_count"] == 0
    assert "timed out after 1 s (worker process killed)" in result.first_error  # 4 samples x 0.25 s


def test_what_batch_needs_is_refused_by_name(batch_file):
    with pytest.raises(ValueError, match="give custom_reward_file"):
        RewardManager(CharTokenizer(), batch=True)
    with pytest.raises(ValueError, match=r"\['solution_strs'\] clash with the batch call's own arguments"):
        RewardManager(
            CharTokenizer(), custom_reward_file=batch_file, batch=True, manager_kwargs={"solution_strs": 1}
        )
    with pytest.raises(ValueError, match="scorer_overrides cannot apply"):
        RewardManager(
            CharTokenizer(), custom_reward_file=batch_file, batch=True, scorer_overrides={"addition": "gsm8k"}
        )
    with pytest.raises(
        ValueError, match=r"manager_kwargs \['bonus'\] are passed to a batch function's calls"
    ):
        RewardManager(CharTokenizer(), custom_reward_file=batch_file, manager_kwargs={"bonus": 1.0})

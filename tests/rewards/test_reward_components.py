"""gdpo's reward terms: the fields a scorer's dict returns (or a term's column), checked per sample."""

import numpy as np
import pytest
from test_manager import CharTokenizer, make_batch

from tandem.rewards import FormatTerm, RewardManager, reward_components

SCORER = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "crash":
        raise RuntimeError("scorer bug")
    if solution_str == "no_format":
        return {"score": 1.0, "correct": 1.0}
    if solution_str == "text":
        return {"score": 1.0, "correct": 1.0, "format": "yes"}
    if solution_str == "nan":
        return {"score": 1.0, "correct": 1.0, "format": float("nan")}
    if solution_str == "inf":
        return {"score": 1.0, "correct": 1.0, "format": float("inf")}
    correct = solution_str == ground_truth
    return {"score": float(correct) + 0.5, "correct": correct, "format": 0.5, "note": "ok"}
"""


def score(tmp_path, texts, **kwargs):
    path = tmp_path / "parts.py"
    path.write_text(SCORER)
    manager = RewardManager(CharTokenizer(), num_workers=0, custom_reward_file=path, **kwargs)
    sources = [f"src{i}" for i in range(len(texts))]
    return manager(make_batch(texts, sources, ["42"] * len(texts))), sources


def test_fields_terms_and_scorer_score_are_components(tmp_path):
    result, sources = score(tmp_path, ["42", "41"], terms=[FormatTerm(r"^\d+$", match_reward=0.25)])
    # the scorer's "format" field meets the format term's column: it is kept as scorer_format
    values = reward_components(result, ["correct", "scorer_format", "format", "scorer_score"], sources)
    np.testing.assert_array_equal(values, [[1.0, 0.5, 0.25, 1.5], [0.0, 0.5, 0.25, 0.5]])
    assert values.dtype == np.float64


def test_a_failed_sample_gets_zero_in_every_term_as_in_its_score(tmp_path):
    result, sources = score(tmp_path, ["42", "crash"])
    np.testing.assert_array_equal(
        reward_components(result, ["correct", "format"], sources), [[1, 0.5], [0, 0]]
    )
    result, sources = score(tmp_path, ["crash"])  # no field anywhere: still no error for a failed batch
    np.testing.assert_array_equal(reward_components(result, ["correct"], sources), [[0.0]])


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("no_format", "is missing or NaN"),
        ("nan", "is missing or NaN"),
        ("inf", "is inf, not a finite number"),
        ("text", "is 'yes', not a number"),
    ],
)
def test_a_bad_value_names_the_key_the_sample_and_the_fix(tmp_path, text, problem):
    result, sources = score(tmp_path, ["42", text])
    with pytest.raises(ValueError) as info:
        reward_components(result, ["correct", "format"], sources)
    message = str(info.value)
    assert (
        f"reward term 'format' (algorithm.gdpo_reward_keys) of sample 1 (data_source 'src1') {problem}"
        in message
    )
    assert "return every term in the scorer's dict for every sample" in message


def test_a_key_no_scorer_returns_lists_the_fields(tmp_path):
    result, sources = score(tmp_path, ["42"])
    with pytest.raises(
        ValueError, match=r"names 'length', but no sample's scorer returned a field 'length' "
    ):
        reward_components(result, ["length"], sources)
    with pytest.raises(ValueError, match=r"fields are: correct, format, note, scorer_score\)"):
        reward_components(result, ["length"], sources)

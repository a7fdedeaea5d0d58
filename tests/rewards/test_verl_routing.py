"""Every data_source name verl's default_compute_score routes (verl/utils/reward_score/__init__.py at verl
b178a3cd), against the scorer Tandem picks for it. The table holds facts read from verl's function: the name,
and the module verl calls for it.

Tandem scores with the same rule where it has one; where it has none, the data_source check at `tandem
config` refuses the rows (a missing scorer is named there, never a silent 0), and the reason is below.
"""

import pytest

from tandem.rewards.registry import scorer_name_for

# verl's data_source -> the reward_score module verl calls for it
VERL_ROUTES = {
    "openai/gsm8k": "gsm8k",
    "lighteval/MATH": "math_reward",
    "DigitalLearningGmbH/MATH-lighteval": "math_reward",
    "HuggingFaceH4/MATH-500": "math_reward",
    "math_dapo": "math_dapo",
    "math": "math_dapo",
    "math_dapo_reasoning": "math_dapo",
    "aime24": "math_dapo",  # verl: any data_source starting with "aime"
    "aime_2025": "math_dapo",
    **dict.fromkeys(
        [
            "numina_aops_forum",
            "numina_synthetic_math",
            "numina_amc_aime",
            "numina_synthetic_amc",
            "numina_cn_k12",
            "numina_olympiads",
        ],
        "prime_math",
    ),
    **dict.fromkeys(
        ["codecontests", "apps", "codeforces", "taco"], "prime_code"
    ),  # sandbox_fusion with a URL
    "hiyouga/geometry3k": "geo3k",
    **dict.fromkeys(
        [
            "searchR1_nq",
            "searchR1_triviaqa",
            "searchR1_popqa",
            "searchR1_hotpotqa",
            "searchR1_2wikimultihopqa",
            "searchR1_musique",
            "searchR1_bamboogle",
        ],
        "search_r1_like_qa_em",
    ),
}

# verl's module -> Tandem's scorer with the same rule; None: Tandem has no scorer for it (why, in the comment)
TANDEM_SCORER = {
    "gsm8k": "gsm8k",
    "math_reward": "math",  # the last \boxed{}; Tandem compares with math_verify first, then as normalised text
    "math_dapo": "math_dapo",
    "geo3k": "geo3k",
    "prime_math": None,  # PRIME's sympy-based grader is not ported
    "prime_code": "code",  # the pass rate over the first 10 test cases, locally or on Sandbox Fusion
    "search_r1_like_qa_em": None,  # search-R1's exact match is not ported (its rows need a search tool too)
}


@pytest.mark.parametrize("data_source", sorted(VERL_ROUTES))
def test_each_verl_data_source_goes_to_the_scorer_of_verls_rule(data_source):
    assert scorer_name_for(data_source) == TANDEM_SCORER[VERL_ROUTES[data_source]]


def test_the_table_covers_every_module_verl_routes_to():
    assert set(VERL_ROUTES.values()) == set(TANDEM_SCORER)
    assert len(VERL_ROUTES) == 27  # 25 names of verl and two of its aime* prefix

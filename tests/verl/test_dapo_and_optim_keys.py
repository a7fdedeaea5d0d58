"""verl keys of the DAPO and megatron example scripts that issue 44 / 46 found unread: the overlong penalty
under reward_kwargs, the megatron optimizer's schedule name, the model config's context length and
data.trust_remote_code."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tandem.config import ConfigError, load_config
from tandem.config.verl.translate import translate_overrides

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/: the rewards' test helpers
from rewards.test_manager import CharTokenizer, make_batch

DAPO = [
    "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.len=4",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=0.5",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.log=False",
    "+reward_model.reward_kwargs.max_resp_len=6",
]


def test_dapos_reward_kwargs_map_to_the_overlong_term():
    t = translate_overrides(DAPO)
    assert t.problems == []
    assert t.overrides == [
        "reward.overlong.enable=True",
        "reward.overlong.buffer_len=4",
        "reward.overlong.penalty_factor=0.5",
        "reward.overlong.max_length=6",
    ]
    cfg = load_config("verl", [*DAPO, "data.max_response_length=8"])
    over = cfg.reward.overlong
    assert (over.enable, over.buffer_len, over.penalty_factor, over.max_length) == (True, 4, 0.5, 6)


def test_the_penalty_is_whole_at_max_length_when_it_is_set():
    """verl's DAPO reward manager: expected length max_resp_len - len, then -(l - expected) / len x factor."""
    from tandem.rewards import reward_manager_from_config

    cfg = load_config("verl", [*DAPO, "data.max_response_length=8", "reward_model.num_workers=0"])
    with reward_manager_from_config(cfg, CharTokenizer()) as manager:
        result = manager(make_batch(["12", "1234", "123456", "12345678"], ["gsm8k"] * 4, ["7"] * 4))
    # lengths 3, 5, 7, 9 (with the EOS token); max_length 6, buffer 4: the ramp starts after 2 tokens,
    # -(l - 2) / 4 x 0.5, whole (-0.5) from 6 tokens on
    np.testing.assert_allclose(result.extra["overlong"], [-0.125, -0.375, -0.5, -0.5])


def test_a_buffer_as_long_as_max_length_is_refused_naming_it():
    with pytest.raises(ConfigError, match=r"reward.overlong.buffer_len=4 must be > 0 and below "):
        load_config("verl", [*DAPO[:4], "+reward_model.reward_kwargs.max_resp_len=4"])


@pytest.mark.parametrize(
    ("style", "expected"), [("constant", "constant"), ("cosine", "cosine"), ("linear", "linear")]
)
def test_megatrons_lr_decay_style_is_the_schedule(style, expected):
    cfg = load_config("verl", [f"actor_rollout_ref.actor.optim.lr_decay_style={style}"])
    assert cfg.actor.optim.lr_scheduler == expected


def test_a_schedule_tandem_lacks_is_refused_naming_the_key():
    with pytest.raises(
        ConfigError, match=r"lr_decay_style.*constant, cosine and linear, not 'inverse-square-root'"
    ):
        load_config("verl", ["actor_rollout_ref.actor.optim.lr_decay_style=inverse-square-root"])


def test_keys_with_no_effect_say_why():
    t = translate_overrides(
        [
            "data.trust_remote_code=True",
            "+actor_rollout_ref.model.override_config.model_config.max_position_embeddings=32768",
        ]
    )
    assert t.problems == [] and t.overrides == []
    reasons = " ".join(note for *_, note in t.no_effect)
    assert "transformers refuses a folder that needs its own code" in reasons
    assert "rotary positions for any length" in reasons

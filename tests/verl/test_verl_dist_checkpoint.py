"""verl's megatron distributed checkpoint keys (config/verl/dist_checkpoint.py): a role's
use_dist_checkpointing and dist_checkpointing_path read together into actor.megatron.dist_checkpoint /
critic.megatron_dist_checkpoint; the refusals; Tandem's own keys' checks (config and start-up)."""

from __future__ import annotations

import pytest

from tandem.config import ConfigError, load_config
from tandem.trainer.start_checks.training_engine import dist_checkpoint_problems

MEGATRON = ["actor_rollout_ref.actor.strategy=megatron"]
ACTOR = "actor_rollout_ref.actor.megatron."
REF = "actor_rollout_ref.ref.megatron."


def test_each_role_s_switch_and_folder_map_to_its_starting_weights():
    cfg = load_config(
        "verl",
        [
            *MEGATRON,
            f"{ACTOR}use_dist_checkpointing=True",
            f"{ACTOR}dist_checkpointing_path=/data/mcore/actor",
            f"{REF}use_dist_checkpointing=True",
            f"{REF}dist_checkpointing_path=/data/mcore/actor",
            "critic.megatron.dist_checkpointing_path=/data/mcore/critic",  # order does not matter
            "critic.megatron.use_dist_checkpointing=True",
            f"{ACTOR}dist_checkpointing_prefix=''",
        ],
    )
    assert cfg.actor.megatron.dist_checkpoint == "/data/mcore/actor"
    assert cfg.critic.megatron_dist_checkpoint == "/data/mcore/critic"


def test_a_folder_without_its_switch_is_not_read_as_on_verl():
    cfg = load_config(
        "verl",
        [
            *MEGATRON,
            f"{ACTOR}dist_checkpointing_path=/data/x",
            "critic.megatron.use_dist_checkpointing=False",
        ],
    )
    assert cfg.actor.megatron.dist_checkpoint is None and cfg.critic.megatron_dist_checkpoint is None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            [f"{ACTOR}use_dist_checkpointing=True", f"{ACTOR}dist_checkpointing_path="],
            f"{ACTOR}use_dist_checkpointing=True needs {ACTOR}dist_checkpointing_path=FOLDER",
        ),
        (
            [
                f"{ACTOR}use_dist_checkpointing=True",
                f"{ACTOR}dist_checkpointing_path=/a",
                f"{REF}use_dist_checkpointing=True",
                f"{REF}dist_checkpointing_path=/b",
            ],
            f"{REF}dist_checkpointing_path=/b: the reference is the actor's starting weights "
            f"(actor.megatron.dist_checkpoint), here {ACTOR}dist_checkpointing_path=/a",
        ),
        (
            [f"{REF}use_dist_checkpointing=True", f"{REF}dist_checkpointing_path=/b"],
            "here the Hugging Face folder (model.path)",
        ),
        ([f"{ACTOR}dist_checkpointing_prefix=model."], "with no prefix (verl's default '')"),
        (["reward_model.megatron.use_dist_checkpointing=True"], "not a megatron distributed checkpoint"),
    ],
)
def test_what_tandem_cannot_start_from_is_refused_by_name(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_config("verl", [*MEGATRON, *overrides])
    assert message in str(info.value)


def test_tandem_s_keys_need_the_megatron_engine_and_a_megatron_folder(tmp_path):
    with pytest.raises(
        ConfigError, match="actor.megatron.dist_checkpoint: a megatron distributed checkpoint starts"
    ):
        load_config("ppo", ["actor.megatron.dist_checkpoint=/x"])
    cfg = load_config(
        "ppo",
        [
            "actor.strategy=megatron",
            f"actor.megatron.dist_checkpoint={tmp_path}",
            f"critic.megatron_dist_checkpoint={tmp_path / 'nope'}",
        ],
    )
    assert dist_checkpoint_problems(cfg) == [
        f"actor.megatron.dist_checkpoint={tmp_path}: not a megatron distributed checkpoint (no metadata.json in "
        "it); `tandem convert hf-to-mcore MODEL_DIR OUT_DIR` writes one from a Hugging Face folder",
        f"critic.megatron_dist_checkpoint={tmp_path / 'nope'}: not a megatron distributed checkpoint (no such "
        "folder); `tandem convert hf-to-mcore MODEL_DIR OUT_DIR` writes one from a Hugging Face folder",
    ]
    (tmp_path / "metadata.json").write_text("{}")
    assert len(dist_checkpoint_problems(cfg)) == 1
    assert dist_checkpoint_problems(cfg, "sft") == []

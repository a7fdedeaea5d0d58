"""What Tandem says about verl keys: a key verl has that Tandem does not support, a misspelled one (the nearest
verl key Tandem reads), the key as the user wrote it, and counts that read right."""

from __future__ import annotations

from pathlib import Path

from tandem.config.verl.translate import translate_overrides

from .verl_config import composed

DATA = Path(__file__).parent / "data"


def _leaves(tree, prefix=""):
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def test_no_key_of_verls_config_is_taken_for_a_misspelling():
    keys = list(_leaves(composed("ppo_trainer")))
    assert len(keys) > 500
    problems = [m for k in keys for _, m in translate_overrides([f"{k}=null"]).problems]
    assert not [m for m in problems if "not a key of verl's config" in m or "Did you mean" in m]


def test_a_verl_feature_tandem_lacks_says_so_without_a_guess():
    t = translate_overrides(["+actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts=2"])
    ((key, message),) = t.problems
    assert key == "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts"
    assert message.startswith(
        "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts=2: Tandem repeats a prompt rollout.n times"
    )
    assert "not built" in message and "Did you mean" not in message
    # verl's default (no separate count) asks for nothing: accepted
    assert (
        translate_overrides(["actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts=null"]).problems == []
    )


def test_a_misspelled_verl_key_gets_the_verl_key_it_meant():
    # lr is covered by the section rename (actor_rollout_ref.actor.optim. -> actor.optim.), not a literal entry
    ((_, message),) = translate_overrides(["actor_rollout_ref.actor.optim.lrr=1e-6"]).problems
    assert "Did you mean 'actor_rollout_ref.actor.optim.lr'?" in message
    ((_, message),) = translate_overrides(
        ["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpuu=2"]
    ).problems
    assert "Did you mean 'actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu'?" in message
    ((_, message),) = translate_overrides(["model.lora_rnak=8"], sft=True).problems
    assert "Did you mean 'model.lora_rank'?" in message


def test_messages_name_the_key_the_user_wrote():
    ((key, message),) = translate_overrides(["data.truncation=left"], sft=True).problems
    assert key == "data.truncation" and message.startswith("data.truncation=left: ")
    ((key, message),) = translate_overrides(["optim.min_lr=1e-6"], sft=True).problems
    assert key == "optim.min_lr" and "optim.min_lr" in message.split(":")[0]
    assert "actor_rollout_ref" not in message


def test_the_count_of_keys_read_reads_right():
    one = translate_overrides(["actor_rollout_ref.model.path=M"]).summary()
    assert "tandem: read 1 verl key as Tandem's" in one
    two = translate_overrides(["actor_rollout_ref.model.path=M", "trainer.logger=console"]).summary()
    assert "tandem: read 2 verl keys as Tandem's" in two

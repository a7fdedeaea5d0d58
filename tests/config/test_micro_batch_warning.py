"""Micro-batch sizes set while token budgets cut the micro-batches (actor.use_dynamic_bsz, the default) are
not used: a start-up warning names them, says the budget wins and how to use them instead."""

import logging

import pytest

from tandem.config import load_config

LOGGER = "tandem.config.checks.sizes"


def warnings_of(caplog, *overrides, preset="grpo"):
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        load_config(preset, list(overrides))
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_a_micro_batch_size_set_under_a_token_budget_is_named(caplog):
    (message,) = warnings_of(caplog, "actor.micro_batch_size_per_rank=2")
    assert message == (
        "actor.micro_batch_size_per_rank=2 (from override 'actor.micro_batch_size_per_rank=2') is not used: "
        "actor.use_dynamic_bsz=true (Tandem's default; verl's is false) cuts every role's micro-batches by a "
        "token budget per rank (actor.max_tokens_per_micro_batch=null: the default for the device), and the "
        "token budget wins. To cut micro-batches by these sample counts instead, set actor.use_dynamic_bsz=false"
    )


def test_log_prob_keys_and_an_explicit_budget(caplog):
    (message,) = warnings_of(
        caplog,
        "rollout.log_prob_micro_batch_size_per_rank=16",
        "reference.log_prob_micro_batch_size_per_rank=32",
        "actor.max_tokens_per_micro_batch=4096",
    )
    assert message.startswith(
        "rollout.log_prob_micro_batch_size_per_rank=16 (from override "
        "'rollout.log_prob_micro_batch_size_per_rank=16'), reference.log_prob_micro_batch_size_per_rank=32 "
        "(from override 'reference.log_prob_micro_batch_size_per_rank=32') are not used:"
    )
    assert "(actor.max_tokens_per_micro_batch=4096 tokens)" in message


@pytest.mark.parametrize(
    "overrides",
    [
        (),  # the presets' own sizes are not the user's
        ("actor.use_dynamic_bsz=false", "actor.micro_batch_size_per_rank=2"),  # used: no token budget
        ("critic.micro_batch_size_per_rank=2",),  # grpo runs no critic
        ("reference.log_prob_micro_batch_size_per_rank=2", "actor.use_kl_loss=false"),  # nor a reference
    ],
)
def test_no_warning_when_nothing_unused_was_set(caplog, overrides):
    assert warnings_of(caplog, *overrides) == []


def test_the_critic_of_a_run_that_has_one(caplog):
    (message,) = warnings_of(caplog, "critic.micro_batch_size_per_rank=2", preset="ppo")
    assert message.startswith("critic.micro_batch_size_per_rank=2 (from override")

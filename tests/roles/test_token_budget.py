"""The micro-batch token budget a worker gives its engines (actor.max_tokens_per_micro_batch)."""

import torch

from tandem.roles.engines import token_budget

from .roles_helpers import tiny_config


def test_default_budget_per_device_and_never_below_one_full_sample(tmp_path):
    cfg = tiny_config(tmp_path, 1)  # base sizes: prompts + responses of a few hundred tokens at most
    assert token_budget(cfg, torch.device("cpu")) == 2048
    assert token_budget(cfg, torch.device("cuda", 0)) == 16384
    long = tiny_config(tmp_path, 1, "data.max_prompt_length=2000", "data.max_response_length=1000")
    assert token_budget(long, torch.device("cpu")) == 3000  # one full sample always fits


def test_an_explicit_budget_wins_and_sample_counts_need_none(tmp_path):
    assert (
        token_budget(tiny_config(tmp_path, 1, "actor.max_tokens_per_micro_batch=512"), torch.device("cpu"))
        == 512
    )
    assert token_budget(tiny_config(tmp_path, 1, "actor.use_dynamic_bsz=false"), torch.device("cpu")) is None

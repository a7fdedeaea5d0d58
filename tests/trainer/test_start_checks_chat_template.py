"""The agent loop's chat-template check at start-up (start_checks/multi_turn.py check_chat_template_stops): tools or a
simulated user need a template that ends an assistant turn at one of the rollout's stop ids. A template that
does not is a config error (exit 2) before any worker or Ray starts, naming the tokenizer, its folder and the
stop ids; the same folder with <|im_end|> among the stop ids passes."""

from __future__ import annotations

import pytest

from tandem.cli import main
from tandem.config import ConfigError
from tandem.data import write_splits
from tandem.models.tiny import save_tiny
from tandem.trainer import RLTrainer

from .trainer_helpers import run_config

AGENT = ["rollout.mode=async", "rollout.engine=vllm", "rollout.multi_turn.max_assistant_turns=2"]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat")
    files = write_splits("addition", root / "data", n_train=8, n_val=4, seed=0, digits=1)
    # save_tiny's template ends an assistant turn with <|im_end|>; its stop id is <|endoftext|> alone
    # unless stop_at_im_end (Qwen's chat models: both)
    return {
        **files,
        "model": save_tiny(root / "eos_only"),
        "chat_model": save_tiny(root / "chat", stop_at_im_end=True),
    }


def test_a_template_that_ends_turns_without_a_stop_token_is_a_config_error(assets, tmp_path):
    cfg = run_config(assets, tmp_path, "grpo", *AGENT, "rollout.multi_turn.tools=[calculator]")
    with pytest.raises(ConfigError) as info:
        RLTrainer(cfg)
    message = str(info.value)
    assert f"the chat template of actor.model_path={assets['model']} (" in message
    # <|endoftext|> is id 1 in the tiny vocabulary
    assert "with the stop ids [1] of actor.model_path=" in message
    assert "does not end an assistant turn with a stop token ('<|endoftext|>')" in message
    assert "it renders '<|im_end|>\\n' after the content" in message
    assert "(generation_config.json eos_token_id); or give the tokenizer a chat template" in message
    assert "actor.tokenizer_path" in message


def test_a_simulated_user_needs_it_too_and_a_template_ending_at_a_stop_id_passes(assets, tmp_path):
    user = [*AGENT, "rollout.multi_turn.interaction=try_again", "rollout.multi_turn.max_user_turns=1"]
    with pytest.raises(ConfigError, match="does not end an assistant turn with a stop token"):
        RLTrainer(run_config(assets, tmp_path, "grpo", *user))
    chat = {**assets, "model": assets["chat_model"]}
    RLTrainer(run_config(chat, tmp_path, "grpo", *user, "rollout.multi_turn.tools=[calculator]"))
    # one turn and no tools: the loop inserts nothing, so the template is not asked
    RLTrainer(run_config(assets, tmp_path, "grpo", *AGENT))


def test_tandem_train_exits_2_before_ray_starts(assets, tmp_path, capsys, monkeypatch):
    import ray

    started = []

    def refuse(*args, **kwargs):  # a Ray an earlier test left running must not hide a start from this one
        started.append(kwargs)
        raise RuntimeError("Ray started before the config error")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", refuse)
    done = main(
        [
            "train",
            "grpo",
            f"actor.model_path={assets['model']}",
            f"data.train_files=[{assets['train']}]",
            f"data.val_files=[{assets['val']}]",
            f"trainer.output_dir={tmp_path}",
            "data.train_batch_size=4",
            "actor.ppo_mini_batch_size=2",
            "trainer.device=cpu",
            *AGENT,
            "rollout.multi_turn.tools=[calculator]",
        ]
    )
    err = capsys.readouterr().err
    assert done == 2, err
    assert "tandem train: config error" in err and "does not end an assistant turn with a stop token" in err
    assert started == []

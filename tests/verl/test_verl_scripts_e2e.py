"""verl's example scripts run through Tandem's CLI, 2 training steps each, on verl-format GSM8K rows.

Each script's override list (tests/verl/scripts.py) is passed as it is to `tandem train`, with only the
changes in `cpu_changes` below: the model and data paths, and the sizes 2 CPU cores cannot hold.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tandem.cli import main
from tandem.data.synthetic import write_rows
from tandem.models.tiny import save_tiny

from .scripts import SCRIPTS

INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


def gsm8k_rows(split: str, n: int) -> list[dict]:
    """Rows as verl's examples/data_preprocess/gsm8k.py writes them (short made-up problems)."""
    rows = []
    for i in range(n):
        a, b = 3 + i, 4 + 2 * i
        question = f"Tom has {a} apples and buys {b} more. How many apples does he have?"
        answer = f"He has {a} + {b} = {a + b} apples.\n#### {a + b}"
        rows.append(
            {
                "data_source": "openai/gsm8k",
                "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                "extra_info": {"split": split, "index": i, "answer": answer, "question": question},
            }
        )
    return rows


def cpu_changes(script: list[str], model: Path, train: Path, val: Path, out: Path) -> list[str]:
    """The script with the paths and sizes a 2-core CPU run needs, every change listed here."""
    changes = {
        "actor_rollout_ref.model.path": str(model),
        "critic.model.path": str(model),
        "data.train_files": str(train),
        "data.val_files": str(val),
        "data.train_batch_size": "4",
        "data.max_prompt_length": "256",
        "data.max_response_length": "16",
        "actor_rollout_ref.actor.ppo_mini_batch_size": "4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "8",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": "8",
        "critic.ppo_micro_batch_size_per_gpu": "4",
        "actor_rollout_ref.rollout.tensor_model_parallel_size": "1",
        "actor_rollout_ref.rollout.n": "2",
        "actor_rollout_ref.model.lora_rank": "8",
        "trainer.n_gpus_per_node": "1",
        "trainer.logger": "[console,jsonl]",  # for wandb (an account and the network): jsonl, a file
        "trainer.total_epochs": "1",
    }
    changed = []
    for text in script:
        key = text.partition("=")[0]
        changed.append(f"{key}={changes[key]}" if key in changes else text)
    return [*changed, "trainer.total_training_steps=2", f"trainer.default_local_dir={out}"]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("verl_scripts")
    model = save_tiny(root / "model")
    train = write_rows(gsm8k_rows("train", 8), root / "gsm8k" / "train.parquet")
    val = write_rows(gsm8k_rows("test", 4), root / "gsm8k" / "test.parquet")
    return model, train, val


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", ["grpo_qwen2_7b", "ppo_deepseek_7b", "lora_grpo_qwen25_3b"])
def test_verl_example_script_trains_two_steps(name, assets, ray_local, tmp_path, capsys):
    model, train, val = assets
    out = tmp_path / "run"
    assert main(["train", *cpu_changes(SCRIPTS[name], model, train, val, out)]) == 0
    printed = capsys.readouterr().err
    assert "tandem: read " in printed and "the same run in Tandem's keys:" in printed
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    steps = [m for m in metrics if "score/mean" in m]
    assert [m["step"] for m in steps] == [1, 2]
    assert all(0.0 <= m["score/mean"] <= 1.0 for m in steps)  # verl's strict GSM8K scorer: 0 or 1
    config = (out / "config.yaml").read_text()
    if name == "ppo_deepseek_7b":
        assert "critic/vf_loss" in steps[0] and "adv_estimator: gae" in config
    else:
        assert "actor/kl_loss" in steps[0] and "use_kl_loss: true" in config
    if name == "lora_grpo_qwen25_3b":
        assert "rank: 8" in config
    checkpoint = out / "checkpoints" / "global_step_2"
    assert (out / "checkpoints" / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert (checkpoint / "actor" / "huggingface" / "config.json").is_file()  # where verl's tools look
    if name == "lora_grpo_qwen25_3b":  # the weights filled in afterwards, by `tandem export CHECKPOINT`
        assert main(["export", str(checkpoint)]) == 0
        assert (checkpoint / "actor" / "huggingface" / "model.safetensors").is_file()

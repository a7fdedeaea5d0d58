"""Two GRPO steps in process (1 rank, Hugging Face generate) of an actor that starts from a saved PEFT adapter
(actor.lora.adapter_path) whose config excludes modules (lora.exclude_modules), with chat-template variables
(data.chat_template_kwargs.enable_thinking=false on a Qwen3-like test template). One run, three checks:

- the step's old log-probs equal PEFT's own model loaded from the adapter folder on the same rows, and so do
  the rollout's: the rollout generated with the adapter's weights, not the base folder's;
- the excluded modules took no adapter and did not move (the merged export holds the folder's weights for them,
  bit for bit), while the adapted ones did;
- the prompts trained on are the template's rendering with the variable: each ends with the empty think block.
"""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from data.thinking_template import prompt_ids, thinking_tokenizer  # tests/ is on sys.path (pytest's rootdir)
from engine.test_lora_start import save_peft_adapter
from tandem.commands.export import export_checkpoint
from tandem.data import write_splits
from tandem.models.tiny import save_tiny, save_tokenizer
from tandem.trainer import RLTrainer

from .trainer_helpers import custom_reward, run_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
EXCLUDED = r"model\.layers\.0\..*"  # the first layer keeps its weights: no adapter anywhere in it


def record_step_batches(trainer: RLTrainer) -> dict[int, object]:
    """step -> the step's whole batch as the trainer dumps it (old and rollout log-probs, prompts, responses)."""
    seen: dict[int, object] = {}
    dump = trainer.dumps.train

    def recorded(step, batch):
        seen[step] = batch
        return dump(step, batch)

    trainer.dumps.train = recorded
    return seen


def response_log_probs(model, batch) -> torch.Tensor:
    """Each response token's log-prob under ``model``, from the batch's own inputs (left-padded prompts)."""
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
        ).logits.float()
    width = batch["responses"].shape[1]
    scores = logits[:, -width - 1 : -1].log_softmax(-1)
    return scores.gather(-1, batch["responses"][..., None]).squeeze(-1)


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapter_start")
    files = write_splits("addition", root / "data", n_train=4, n_val=2, seed=0, digits=1)
    model = save_tiny(root / "model", stop_at_im_end=True)
    adapter = root / "adapter"
    targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
    save_peft_adapter(model, adapter, r=4, lora_alpha=8, target_modules=targets, exclude_modules=EXCLUDED)
    return {
        **files,
        "model": model,
        "adapter": adapter,
        "tokenizer": save_tokenizer(thinking_tokenizer(), root / "thinking_tokenizer"),
    }


def test_an_adapter_start_trains_two_steps_from_the_adapter_s_log_probs(assets, tmp_path):
    from peft import PeftModel

    cfg = run_config(
        assets,
        tmp_path,
        "grpo",
        "trainer.backend=inprocess",
        "trainer.workers_per_node=1",
        "trainer.total_training_steps=2",
        "trainer.save_freq=2",
        "rollout.engine=hf",
        "data.train_batch_size=2",
        "data.max_prompt_length=64",
        "rollout.n=2",
        "actor.ppo_mini_batch_size=1",  # two optimizer steps a step: the actor's own old-log-prob pass
        f"actor.tokenizer_path={assets['tokenizer']}",
        f"actor.lora.adapter_path={assets['adapter']}",
        "data.chat_template_kwargs.enable_thinking=false",
        *custom_reward("by_length"),
    )
    assert cfg.actor.lora.rank == 4 and cfg.actor.lora.exclude_modules == [EXCLUDED]  # from the folder
    trainer = RLTrainer(cfg)
    batches = record_step_batches(trainer)
    history = trainer.fit()
    assert [m["step"] for m in history] == [1, 2]

    # step 1: the old log-probs (the actor's pass) and the rollout's are PEFT's on the same rows
    first = batches[1]
    base = AutoModelForCausalLM.from_pretrained(assets["model"], dtype=torch.float32)
    peft = PeftModel.from_pretrained(base, assets["adapter"]).eval()
    expected = response_log_probs(peft, first)
    mask = first["response_mask"].bool()
    assert mask.sum() > 0
    torch.testing.assert_close(first["old_log_probs"][mask], expected[mask], rtol=0, atol=1e-5)
    torch.testing.assert_close(first["rollout_log_probs"][mask], expected[mask], rtol=0, atol=1e-5)
    with peft.disable_adapter():  # the adapter matters: the base model's log-probs are others
        assert (response_log_probs(peft, first)[mask] - expected[mask]).abs().max() > 1e-3

    # the prompts trained on: the template's rendering with enable_thinking=false (the empty think block)
    questions = [row["prompt"][0]["content"] for row in pq.read_table(assets["train"]).to_pylist()]
    allowed = {tuple(prompt_ids(q, no_thinking=True)) for q in questions}
    for step in (1, 2):
        prompts, prompt_mask = (
            batches[step]["prompts"],
            batches[step]["attention_mask"][:, : batches[step]["prompts"].shape[1]],
        )
        trained = {tuple(row[m.bool()].tolist()) for row, m in zip(prompts, prompt_mask)}
        assert trained and trained <= allowed, step

    # after two steps: the excluded first layer holds the folder's weights bit for bit, the adapted ones moved
    final = tmp_path / "tandem" / cfg.trainer.experiment_name / "checkpoints" / "global_step_2"
    exported = export_checkpoint(final, tmp_path / "hf")
    trained, initial = (
        load_file(exported / "model.safetensors"),
        load_file(assets["model"] / "model.safetensors"),
    )
    adapters = load_file(exported / "lora_adapter" / "adapter_model.safetensors")
    assert adapters and not [name for name in adapters if ".layers.0." in name]
    for name, tensor in initial.items():
        module, kind = name.rsplit(".", 2)[-2:]
        adapted = (
            ".layers.0." not in name
            and module.endswith(("q_proj", "k_proj", "v_proj", "o_proj"))
            and kind == "weight"
        )
        assert torch.equal(trained[name], tensor) != adapted, name

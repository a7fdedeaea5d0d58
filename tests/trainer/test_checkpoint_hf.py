"""Each actor checkpoint holds a Hugging Face folder where verl's tools look (global_step_N/actor/huggingface),
and verl's latest_checkpointed_iteration.txt names the newest step: a real run of the tiny model, in process."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from tandem.commands.export import export_checkpoint
from tandem.engine.hf_io import merge_adapter
from tandem.trainer import RLTrainer
from tandem.trainer.checkpoint import LATEST_ITERATION, CheckpointManager, verify
from tandem.trainer.checkpoint_hf import hf_folder, write_checkpoint_hf

from .trainer_helpers import custom_reward, make_assets, run_config

pytestmark = pytest.mark.timeout(600)  # ~5-10 s a test: hf rollout, 1 rank in process, 2 steps


class KeepsFinalWeights(RLTrainer):
    """Records the actor's weights after the last step (what the final checkpoint holds)."""

    def finish(self) -> None:
        super().finish()
        self.final_weights = self.groups.actor.full_weights("actor")


def train(assets, out, *overrides: str) -> KeepsFinalWeights:
    cfg = run_config(
        assets,
        out,
        "grpo",
        "trainer.backend=inprocess",
        "trainer.workers_per_node=1",
        "trainer.total_training_steps=2",
        "trainer.save_freq=1",
        "trainer.max_checkpoints_to_keep=1",
        "rollout.engine=hf",  # no vLLM start-up: the checkpoint is what is tested
        *custom_reward("by_length"),
        *overrides,
    )
    trainer = KeepsFinalWeights(cfg)
    trainer.fit()
    return trainer


def logits(model_dir, weights=None) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if weights is not None:
        model.load_state_dict(weights, strict=False)
    ids = torch.tensor([[1, 5, 9, 3, 7, 2]])
    with torch.no_grad():
        return model(ids).logits


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("assets"))


def test_checkpoints_hold_a_hugging_face_folder_and_the_weights_when_asked(assets, tmp_path):
    trainer = train(assets, tmp_path / "with", "trainer.save_hf_model=true")
    root = trainer.checkpoints.root
    assert sorted(p.name for p in root.iterdir()) == ["global_step_2", LATEST_ITERATION]  # step 1 pruned
    assert (root / LATEST_ITERATION).read_text() == "2"
    hf = hf_folder(root / "global_step_2")
    assert hf == root / "global_step_2" / "actor" / "huggingface"
    saved = load_file(hf / "model.safetensors")  # HF parameter names
    assert "model.embed_tokens.weight" in saved and "model.layers.0.self_attn.q_proj.weight" in saved
    for name, tensor in saved.items():
        torch.testing.assert_close(tensor, trainer.final_weights[name], rtol=0, atol=0)
    # the same logits as the trainer's weights in the initial model folder's architecture
    torch.testing.assert_close(
        logits(hf), logits(assets["model"], trainer.final_weights), rtol=1e-6, atol=1e-6
    )
    assert (
        AutoTokenizer.from_pretrained(hf)("1+2=").input_ids
        == AutoTokenizer.from_pretrained(assets["model"])("1+2=").input_ids
    )
    manifest = (root / "global_step_2" / "MANIFEST.json").read_text()
    assert '"actor/huggingface/model.safetensors"' in manifest and verify(root / "global_step_2") == []


def test_without_the_weights_the_folder_holds_config_and_tokenizer_and_export_fills_it_in(assets, tmp_path):
    trainer = train(assets, tmp_path / "without")
    checkpoint = trainer.checkpoints.root / "global_step_2"
    hf = hf_folder(checkpoint)
    assert not any(p.suffix == ".safetensors" for p in hf.iterdir())
    assert (hf / "config.json").read_bytes() == (assets["model"] / "config.json").read_bytes()
    assert AutoConfig.from_pretrained(hf).model_type == "qwen2"
    assert (
        AutoTokenizer.from_pretrained(hf).get_vocab()
        == AutoTokenizer.from_pretrained(assets["model"]).get_vocab()
    )
    assert (hf / "tokenizer.json").read_bytes() == (assets["model"] / "tokenizer.json").read_bytes()

    # `tandem export CHECKPOINT CHECKPOINT/actor/huggingface` (out_dir None: that folder): the weights added in
    # place, the checkpoint still intact
    assert export_checkpoint(checkpoint) == hf
    torch.testing.assert_close(
        logits(hf), logits(assets["model"], trainer.final_weights), rtol=1e-6, atol=1e-6
    )
    assert verify(checkpoint) == [] and not (checkpoint / "actor" / ".partial-huggingface").exists()
    assert CheckpointManager(checkpoint.parent).resolve("auto") == checkpoint

    # the run resumes from that checkpoint (huggingface/ beside the engine's shards) and goes on
    resumed = train(assets, tmp_path / "without", "trainer.total_training_steps=3")
    assert [m["step"] for m in resumed.history] == [3]
    assert (checkpoint.parent / LATEST_ITERATION).read_text() == "3" and not checkpoint.exists()


def test_a_lora_checkpoint_holds_the_merged_model_and_the_adapter_folder_as_tandem_export_writes_them(
    assets, tmp_path
):
    trainer = train(assets, tmp_path / "lora", "trainer.save_hf_model=true", "actor.lora.rank=4")
    hf = hf_folder(trainer.checkpoints.root / "global_step_2")
    torch.testing.assert_close(
        logits(hf), logits(assets["model"], trainer.final_weights), rtol=1e-6, atol=1e-6
    )
    adapter = load_file(hf / "lora_adapter" / "adapter_model.safetensors")
    assert adapter and all("lora_A" in name or "lora_B" in name for name in adapter)
    merged = merge_adapter(hf / "lora_adapter", tmp_path / "merged")  # the base model + the adapters
    torch.testing.assert_close(logits(merged), logits(hf), rtol=1e-5, atol=1e-5)


def test_a_tokenizer_folder_of_its_own_is_the_one_the_checkpoint_holds(assets, tmp_path):
    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tokenizer / name).write_bytes((assets["model"] / name).read_bytes())
    settings = json.loads((tokenizer / "tokenizer_config.json").read_text())
    (tokenizer / "tokenizer_config.json").write_text(json.dumps({**settings, "model_max_length": 77}))
    cfg = SimpleNamespace(
        trainer=SimpleNamespace(save_hf_model=False),
        actor=SimpleNamespace(model_path=str(assets["model"]), tokenizer_path=str(tokenizer)),
    )
    hf = write_checkpoint_hf(cfg, None, tmp_path / "global_step_1")
    assert hf == tmp_path / "global_step_1" / "actor" / "huggingface"
    assert AutoTokenizer.from_pretrained(hf).model_max_length == 77  # actor.tokenizer_path's, not the model's
    assert (hf / "config.json").read_bytes() == (assets["model"] / "config.json").read_bytes()

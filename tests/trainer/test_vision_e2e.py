"""GRPO on a tiny Qwen2-VL, end to end on Ray: prompts with images (verl's images column), vLLM rolling them
out with the images, the FSDP2 actor and reference reading the same image inputs; the rollout's log-probs
stay the trainer's after every update and sync, the vision tower trains, and a resumed run equals the
uninterrupted one."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from data.data_helpers import png  # tests/ is on sys.path (pytest's rootdir)
from tandem.commands.export import export_checkpoint
from tandem.data import write_rows
from tandem.models.tiny_vlm import save_tiny_vlm
from tandem.trainer import RLTrainer

from .trainer_helpers import as_if_killed_after, assert_same_steps, by_step, custom_reward, run_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
COLOURS = {"red": (220, 20, 20), "green": (20, 200, 40), "blue": (30, 40, 230)}


def rows(count: int, offset: int) -> list[dict]:
    out = []
    for i in range(count):
        name, colour = list(COLOURS.items())[(i + offset) % 3]
        with_image = i % 4 != 3  # every fourth prompt is text only
        out.append(
            {
                "prompt": [{"role": "user", "content": ("<image>" if with_image else "") + "Colour?"}],
                "data_source": "colours",
                "reward_model": {"ground_truth": name, "style": "rule"},
                "extra_info": {"index": offset + i},
                "images": [{"bytes": png(28 * (2 + i % 2), 56, colour, diagonal=True), "path": None}]
                if with_image
                else None,
            }
        )
    return out


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("vision")
    return {
        "model": save_tiny_vlm(root / "model"),
        "train": write_rows(rows(16, 0), root / "train.parquet"),
        "val": write_rows(rows(8, 100), root / "val.parquet"),
    }


def grpo_config(assets, tmp_path, *extra: str):
    """GRPO on the tiny Qwen2-VL with vLLM, fp32, a KL loss to the reference, one optimizer step per step."""
    return run_config(
        assets,
        tmp_path,
        "grpo",
        "rollout.engine=vllm",
        "data.max_prompt_length=48",
        "actor.ppo_mini_batch_size=4",
        "actor.fsdp.param_dtype=float32",
        "actor.use_kl_loss=true",
        *extra,
        *custom_reward("by_length"),
    )


def test_grpo_on_a_vision_language_model_keeps_rollout_and_trainer_log_probs_equal_and_resumes(
    ray_local, assets, tmp_path
):
    def config(experiment: str):
        return grpo_config(
            assets,
            tmp_path,
            "trainer.total_training_steps=3",
            "trainer.save_freq=2",
            f"trainer.experiment_name={experiment}",
        )

    cfg = config("straight")
    history = by_step(RLTrainer(cfg).fit())
    assert sorted(history) == [1, 2, 3]
    for step, m in history.items():
        assert m["actor/optimizer_steps"] == 1 and m["actor/grad_norm"] > 0, step
        # vLLM's log-probs of its samples (images in) against the FSDP2 actor's recomputation, fp32
        assert m["rollout_mismatch/max_ratio"] == pytest.approx(1.0, abs=1e-5), step
        assert m["rollout_mismatch/min_ratio"] == pytest.approx(1.0, abs=1e-5), step
    assert history[3]["actor/kl_loss"] > 0  # the reference (the folder's weights) reads the images too
    final = tmp_path / "tandem" / cfg.trainer.experiment_name / "checkpoints" / "global_step_3"
    exported = export_checkpoint(final, tmp_path / "hf")  # a Qwen2-VL folder again, processor included
    trained, initial = (
        load_file(exported / "model.safetensors"),
        load_file(assets["model"] / "model.safetensors"),
    )
    assert trained.keys() == initial.keys()
    vision = [name for name in initial if name.startswith("visual.")]
    assert vision and all(
        not torch.equal(trained[name], initial[name]) for name in vision
    )  # the tower trained
    assert (exported / "processor_config.json").is_file()

    # killed after step 2, resumed: step 3 (its images, samples, losses, KL) as the uninterrupted run's
    as_if_killed_after(tmp_path / "tandem/straight", tmp_path / "tandem/resumed", 2)
    resumed = by_step(RLTrainer(config("resumed")).fit())
    assert sorted(resumed) == [3]
    assert_same_steps(resumed, history, (3,))


LANGUAGE_LINEARS = "actor.lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]"


@pytest.mark.parametrize("sync", ["merged", "adapter"])
def test_lora_on_a_vision_language_model_syncs_the_rollout_and_exports_a_peft_folder(
    ray_local, assets, tmp_path, sync
):
    """actor.lora on the tiny Qwen2-VL. Merged: adapters on every linear, the vision tower's too, and vLLM
    gets the merged weights after each update. Adapter: vLLM serves adapters on the language model only (on
    the tower it would skip them silently: refused at start), so they go on the language model's linears.
    Either way rollout log-probs are the trainer's, the reference is the actor with its adapters off, and
    the export is the merged Qwen2-VL and a PEFT adapter folder that merges onto the base into it."""
    from peft import PeftModel
    from transformers import Qwen2VLForConditionalGeneration

    def config(*extra: str):
        lora = ["actor.lora.rank=8", "actor.lora.alpha=16", f"actor.lora.rollout_sync={sync}"]
        return grpo_config(assets, tmp_path, *lora, "trainer.total_training_steps=2", *extra)

    if sync == "adapter":
        with pytest.raises(Exception, match="vLLM does not serve LoRA adapters on the vision tower"):
            RLTrainer(config()).fit()
    cfg = config(LANGUAGE_LINEARS) if sync == "adapter" else config()
    history = by_step(RLTrainer(cfg).fit())
    for step, m in history.items():
        assert m["rollout_mismatch/max_ratio"] == pytest.approx(1.0, abs=1e-5), step
        assert m["rollout_mismatch/min_ratio"] == pytest.approx(1.0, abs=1e-5), step
    # B = 0 at the start: step 1's policy is the base model, the reference; step 2's is not
    assert history[1]["actor/kl_loss"] == 0.0 and history[2]["actor/kl_loss"] > 0
    final = tmp_path / "tandem" / cfg.trainer.experiment_name / "checkpoints" / "global_step_2"
    exported = export_checkpoint(final, tmp_path / "hf")
    trained, initial = (
        load_file(exported / "model.safetensors"),
        load_file(assets["model"] / "model.safetensors"),
    )
    assert trained.keys() == initial.keys()
    moved = [name for name in initial if not torch.equal(trained[name], initial[name])]
    # merged: the tower's linears took adapters; adapter: the language model's alone
    assert any(name.startswith("visual.") for name in moved) == (sync == "merged")
    assert any(".q_proj." in name for name in moved) and not any("norm" in name for name in moved)
    base = Qwen2VLForConditionalGeneration.from_pretrained(assets["model"], dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, exported / "lora_adapter").merge_and_unload().state_dict()
    ours = Qwen2VLForConditionalGeneration.from_pretrained(exported, dtype=torch.float32).state_dict()
    for name, tensor in ours.items():
        torch.testing.assert_close(merged[name], tensor, rtol=0, atol=1e-6, msg=name)


def test_a_frozen_vision_tower_stays_the_folder_s_while_the_language_model_trains(
    ray_local, assets, tmp_path
):
    """actor.freeze_vision_tower: 2 steps with images; the rollout's log-probs stay the trainer's after the sync
    (which still sends the tower: see roles/rollout.py), and the export holds the folder's tower bit for bit while
    every language-model weight the images' prompts reach moved."""
    cfg = grpo_config(assets, tmp_path, "actor.freeze_vision_tower=true", "trainer.total_training_steps=2")
    history = by_step(RLTrainer(cfg).fit())
    for step, m in history.items():
        assert m["rollout_mismatch/max_ratio"] == pytest.approx(1.0, abs=1e-5), step
        assert m["rollout_mismatch/min_ratio"] == pytest.approx(1.0, abs=1e-5), step
    final = tmp_path / "tandem" / cfg.trainer.experiment_name / "checkpoints" / "global_step_2"
    exported = export_checkpoint(final, tmp_path / "hf")
    trained, initial = (
        load_file(exported / "model.safetensors"),
        load_file(assets["model"] / "model.safetensors"),
    )
    vision = [name for name in initial if name.startswith("visual.")]
    assert vision and all(torch.equal(trained[name], initial[name]) for name in vision)
    language = [name for name in initial if ".layers." in name and name.endswith("proj.weight")]
    assert language and all(not torch.equal(trained[name], initial[name]) for name in language)

"""End to end on the real stack: Ray worker processes, FSDP2 over gloo, the HF rollout engine,
reward processes, the tiny model. A few steps each; every test checks numbers, not just that it ran."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tandem.commands.export import export_checkpoint
from tandem.engine.flops import ModelFlops
from tandem.trainer import RLTrainer
from tandem.trainer.checkpoint import COMPLETE, TRAINER_STATE
from tandem.trainer.tracking import read_jsonl

from .trainer_helpers import (
    MOE_HALVED,
    as_if_killed_after,
    assert_same_steps,
    by_step,
    custom_reward,
    make_assets,
    run_config,
    shard_bytes,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEP_KEYS = {
    "score/mean",
    "rewards/mean",
    "advantages/mean",
    "returns/mean",
    "actor/pg_loss",
    "actor/pg_clipfrac",
    "actor/grad_norm",
    "actor/lr",
    "actor/entropy",
    "response_length/mean",
    "response_length/max",
    "response_length/clip_ratio",
    "timing_s/step",
    "timing_s/generate",
    "timing_share/generate",
    "perf/tokens_per_s",
    "memory/peak_rss_gib",
    "memory/peak_rss_gib_sum",
    "memory/controller_peak_rss_gib",
    "rollout_mismatch/max_ratio",
    "reward/error_count",
}


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("assets"))


@pytest.fixture(scope="module")
def moe_assets(tmp_path_factory):
    """The same task on a tiny Mixtral: 4 experts of the dense model's width, 2 per token."""
    return make_assets(tmp_path_factory.mktemp("moe_assets"), num_experts=4, experts_per_token=2)


def rollout_tp2_config(assets, tmp_path, *extra: str):
    """GRPO for 3 steps into one vLLM engine over both ranks (rollout.tensor_parallel=2)."""
    return run_config(
        assets,
        tmp_path,
        "grpo",
        "rollout.engine=vllm",
        "rollout.tensor_parallel=2",
        "trainer.total_training_steps=3",
        *extra,
        *custom_reward("by_length"),
    )


def test_grpo_trains_validates_checkpoints_exports_and_evaluates(ray_local, assets, tmp_path):
    cfg = run_config(
        assets,
        tmp_path,
        "grpo",
        "trainer.total_training_steps=2",
        "trainer.test_freq=1",
        "trainer.val_before_train=true",
        *custom_reward("by_length"),
    )
    history = by_step(RLTrainer(cfg).fit())
    assert sorted(history) == [0, 1, 2]
    assert set(history[0]) >= {"val/acc", "val/addition/acc", "val/score_mean"}
    for step in (1, 2):
        missing = STEP_KEYS - set(history[step])
        assert not missing, f"step {step} lacks {missing}"
        assert "actor/kl_loss" in history[step] and "val/acc" in history[step]
        assert history[step]["perf/samples"] == 16  # 4 prompts x 4 samples
        assert 0 <= history[step]["score/mean"] <= 1
        # rollout and trainer compute the same log-probs (fp32): the largest ratio is 1
        assert history[step]["rollout_mismatch/max_ratio"] == pytest.approx(1.0, abs=1e-4)
    # k3 >= 0; it is 0 on the first mini-batch (actor == reference) and grows after its update
    assert 0 < history[1]["actor/kl_loss"] < history[2]["actor/kl_loss"]
    assert history[2]["timing_s/weight_sync"] > 0  # the updated actor went into the rollout engine
    assert [line["step"] for line in read_jsonl(tmp_path / "tandem/grpo/metrics.jsonl")] == [0, 1, 2]

    checkpoint = tmp_path / "tandem/grpo/checkpoints/global_step_2"
    assert (checkpoint / COMPLETE).is_file() and (checkpoint / TRAINER_STATE).is_file()
    exported = export_checkpoint(checkpoint, tmp_path / "exported")
    before, after = (
        load_file(assets["model"] / "model.safetensors"),
        load_file(exported / "model.safetensors"),
    )
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before), "training changed no weight"

    # Greedy validation of the checkpoint in a fresh worker group equals the run's own at step 2.
    evaluated = RLTrainer(cfg, train=False).evaluate(str(checkpoint))
    assert evaluated["val/acc"] == pytest.approx(history[2]["val/acc"])
    assert evaluated["val/score_mean"] == pytest.approx(history[2]["val/score_mean"])

    # verl's trainer.val_only=True on the same command line: the resumed actor (step 2) validated once, logged
    # at its step, and no step trained (no new checkpoint); the same numbers as the run's own step-2 validation
    val_only = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, val_only=True))
    (only,) = RLTrainer(val_only).fit()
    assert only["step"] == 2 and only["val/acc"] == pytest.approx(history[2]["val/acc"])
    assert "actor/pg_loss" not in only and only["val/score_mean"] == pytest.approx(
        history[2]["val/score_mean"]
    )
    assert [line["step"] for line in read_jsonl(tmp_path / "tandem/grpo/metrics.jsonl")] == [0, 1, 2, 2]
    assert sorted(p.name for p in (tmp_path / "tandem/grpo/checkpoints").glob("global_step_*")) == [
        "global_step_2"
    ]


def test_ppo_with_critic_on_sequence_parallel_warms_up_the_critic_first(ray_local, assets, tmp_path):
    """Both ranks of each group split every sequence (Ulysses, engine/fsdp/ulysses.py): actor, reference and
    critic run sequence parallel, one data-parallel share."""
    cfg = run_config(
        assets,
        tmp_path,
        "ppo",
        "trainer.total_training_steps=2",
        "trainer.critic_warmup=1",
        "actor.fsdp.sequence_parallel=2",
        "trainer.profile.steps=[2]",  # and traces of rank 1's calls in step 2 (roles/profile.py)
        "trainer.profile.ranks=[1]",
        *custom_reward("by_length"),
    )
    history = by_step(RLTrainer(cfg).fit())
    profiles = tmp_path / "tandem/ppo/profile"
    traces = sorted(p.relative_to(profiles) for p in profiles.rglob("*") if p.is_file())
    expected = ["generate", "compute_log_probs", "compute_ref_log_probs", "update_actor"]
    assert [str(p) for p in traces] == sorted(
        [f"step2/actor_rollout_ref_rank1_{phase}.pt.trace.json" for phase in expected]
        + [f"step2/critic_rank1_{phase}.pt.trace.json" for phase in ("compute_values", "update_critic")]
    ), traces
    update = json.loads((profiles / traces[-1]).read_text())
    names = {event.get("name", "") for event in update["traceEvents"]}
    assert any(name.startswith("aten::") for name in names)  # torch's ops, as Perfetto shows them
    for step in (1, 2):
        assert {"critic/vf_loss", "critic/grad_norm", "values/mean", "actor/reward_kl_penalty"} <= set(
            history[step]
        )
        # the rollout's log-probs of its samples equal the sequence-parallel actor's (fp32)
        assert history[step]["rollout_mismatch/max_ratio"] == pytest.approx(1.0, abs=1e-4)
        assert history[step]["perf/samples"] == 16  # every sample once: the group shares one data share
    assert "actor/pg_loss" not in history[1]  # step 1 trains only the critic
    assert "actor/pg_loss" in history[2]
    # The actor has not moved before step 2's update, so the KL penalty in the reward is exactly 0.
    assert history[1]["actor/reward_kl_penalty"] == 0 and history[2]["actor/reward_kl_penalty"] == 0
    assert history[1]["rewards/mean"] == pytest.approx(history[1]["score/mean"])
    assert (tmp_path / "tandem/ppo/checkpoints/global_step_2/critic").is_dir()
    # MFU of each update (engine/flops.py): model FLOPs / (the phase's seconds x peak x 2 ranks)
    models = {
        "actor": ModelFlops.from_folder(assets["model"]),
        "critic": ModelFlops.from_folder(assets["model"], "value"),
    }
    longest = 32 + 6  # data.max_prompt_length + max_response_length
    for step, role in ((1, "critic"), (2, "critic"), (2, "actor")):
        m, model = history[step], models[role]
        peak, flops = m["perf/peak_flops_per_device"], m[f"perf/update_flops/{role}"]
        assert 1e8 < peak < 1e14  # torch.mm measured by the workers
        tokens = m["perf/total_tokens"]  # forward + backward: 3 x (2 N T + the attention term, <= 4 L H T n)
        attention = 4 * model.layers * model.hidden * tokens * longest
        assert 3 * 2 * model.params * tokens < flops <= 3 * (2 * model.params * tokens + attention)
        assert m[f"perf/mfu/{role}"] == pytest.approx(flops / (m[f"timing_s/update_{role}"] * peak * 2))
        assert 0 < m[f"perf/mfu/{role}"] < 1
    assert "perf/mfu/actor" not in history[1] and "perf/update_flops/actor" not in history[1]


def test_dapo_dynamic_sampling_fills_the_batch_with_varied_groups(ray_local, assets, tmp_path):
    cfg = run_config(
        assets,
        tmp_path,
        "dapo",
        "trainer.total_training_steps=2",
        "algorithm.dynamic_sampling.gen_batch_size=4",
        "algorithm.dynamic_sampling.max_num_gen_batches=20",
        "reward.overlong.buffer_len=2",
        *custom_reward("by_length"),
    )
    history = by_step(RLTrainer(cfg).fit())
    for step in (1, 2):
        m = history[step]
        assert m["perf/samples"] == 16  # exactly data.train_batch_size x n, the surplus cut
        assert m["dynamic_sampling/groups_kept"] >= 4
        assert m["dynamic_sampling/prompts_drawn"] == 4 * m["dynamic_sampling/rounds"]
        assert m["dynamic_sampling/kept_ratio"] == pytest.approx(
            m["dynamic_sampling/groups_kept"] / m["dynamic_sampling/prompts_drawn"]
        )
        # every kept group has a spread, so each has positive and negative advantages
        assert m["advantages/max"] > 0 > m["advantages/min"]
        assert m["reward/overlong_mean"] <= 0  # the soft overlong penalty is on (buffer of 2 tokens)


def test_resumed_run_equals_uninterrupted_run(ray_local, assets, tmp_path):
    def config(experiment):
        return run_config(
            assets,
            tmp_path,
            "grpo",
            "trainer.total_training_steps=4",
            "trainer.save_freq=2",
            f"trainer.experiment_name={experiment}",
            *custom_reward("by_length"),
        )

    straight = by_step(RLTrainer(config("straight")).fit())
    as_if_killed_after(tmp_path / "tandem/straight", tmp_path / "tandem/resumed", 2)
    resumed = by_step(RLTrainer(config("resumed")).fit())
    assert sorted(resumed) == [3, 4] and sorted(straight) == [1, 2, 3, 4]
    assert_same_steps(resumed, straight, (3, 4))
    lines = read_jsonl(tmp_path / "tandem/resumed/metrics.jsonl")
    assert [line["step"] for line in lines] == [1, 2, 3, 4]


def test_a_raising_reward_function_is_counted_and_the_run_goes_on(ray_local, assets, tmp_path):
    cfg = run_config(
        assets, tmp_path, "grpo", "trainer.total_training_steps=2", *custom_reward("sometimes_raises")
    )
    history = by_step(RLTrainer(cfg).fit())
    errors = [history[s]["reward/error_count"] for s in (1, 2)]
    assert sum(errors) > 0, "the scorer raised on no sample: pick another length rule"
    assert history[2]["reward/error_count_total"] == sum(errors)
    assert all(math.isfinite(history[s]["actor/pg_loss"]) for s in (1, 2))


def test_grpo_on_a_moe_model_with_a_tensor_parallel_vllm_engine_syncs_weights_and_starts_from_the_export(
    ray_local, moe_assets, tmp_path
):
    """A mixture-of-experts model (tiny Mixtral) trained on FSDP2 with its load-balancing loss and rolled out
    by vLLM with rollout.tensor_parallel=2: one engine over both ranks (each holds half of every matrix, each
    expert's included), fed the same prompts by Dispatch.REPLICA, refreshed from the actor after every update
    (the fused expert tensors sent under their checkpoint names). A shared-memory segment left by a killed
    engine on the same ranks is removed at start (vLLM names them after the ranks alone)."""
    from tandem.rollout.vllm import VLLMRollout

    stale = Path("/dev/shm/-tp:0-[0-1]-cpushm_0")
    if stale.parent.is_dir() and not stale.exists():
        stale.write_bytes(bytes(16))
    assets = moe_assets
    cfg = rollout_tp2_config(assets, tmp_path)
    history = by_step(RLTrainer(cfg).fit())
    for step in (1, 2, 3):
        m = history[step]
        assert m["perf/samples"] == 16 and 0 <= m["score/mean"] <= 1  # each prompt once, not once per rank
        # vLLM's log-probs of its own samples equal the FSDP2 actor's recomputation (fp32; measured
        # |log ratio| <= 1e-6 after each of 2 syncs)
        assert m["rollout_mismatch/max_ratio"] == pytest.approx(1.0, abs=1e-5)
        assert m["rollout_mismatch/min_ratio"] == pytest.approx(1.0, abs=1e-5)
        # the routers' balance term, between even routing (1) and collapse onto 2 of the 4 experts (2)
        assert 1.0 <= m["actor/router_aux_loss"] <= 2.0
    assert history[2]["timing_s/weight_sync"] > 0 and history[3]["timing_s/weight_sync"] > 0
    # shard-only sync: each rank received half of the attention and embedding matrices (2 KV heads: one each)
    # and the experts whole (vLLM cuts those itself); a full gather would have delivered the whole model
    folder_bytes, expected = shard_bytes(assets["model"], MOE_HALVED)
    for step in (2, 3):
        assert history[step]["weight_sync/full_gather_bytes"] == folder_bytes
        assert history[step]["weight_sync/bytes"] == expected < folder_bytes

    exported = export_checkpoint(tmp_path / "tandem/grpo/checkpoints/global_step_3", tmp_path / "hf")
    engine = VLLMRollout.from_pretrained(exported, max_model_len=64)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tandem.data import PromptDataset, collate_prompts
    from tandem.rollout import SamplingParams

    tokenizer = AutoTokenizer.from_pretrained(exported)
    data = PromptDataset([str(assets["val"])], tokenizer, max_prompt_length=32)
    prompts = collate_prompts([data[i] for i in range(4)], tokenizer.pad_token_id)
    out = engine.generate(prompts, SamplingParams(max_tokens=6, n=2, temperature=1.0, seed=0))
    model = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32)
    with torch.no_grad():
        logits = model(
            input_ids=out["input_ids"], attention_mask=out["attention_mask"], position_ids=out["position_ids"]
        ).logits
    width = out["prompts"].shape[1]
    lp = logits[:, width - 1 : -1].log_softmax(-1).gather(-1, out["responses"][..., None]).squeeze(-1)
    assert float(((lp - out["rollout_log_probs"]) * out["response_mask"]).abs().max()) < 1e-4


@pytest.fixture(scope="module")
def one_kv_head_assets(tmp_path_factory):
    """The dense model with one KV head for its 4 query heads."""
    return make_assets(tmp_path_factory.mktemp("one_kv_head"), num_kv_heads=1)


def test_grpo_into_a_tensor_parallel_vllm_engine_sends_each_rank_only_its_shard(
    ray_local, one_kv_head_assets, tmp_path
):
    """FSDP2 actor -> one vLLM engine over both ranks (rollout.tensor_parallel=2): after every update each rank
    receives only the part of each weight matrix its half of the engine keeps, from the FSDP2 shards by one
    all-to-all (models/tp_cuts.py, engine/fsdp/reshard.py), and the rollout's log-probs stay the trainer's. With a
    single KV head vLLM replicates keys and values: both ranks receive them whole."""
    assets = one_kv_head_assets
    cfg = rollout_tp2_config(assets, tmp_path, "actor.ppo_mini_batch_size=4")
    history = by_step(RLTrainer(cfg).fit())
    for step in (1, 2, 3):
        m = history[step]
        assert m["actor/optimizer_steps"] == 1  # the weights change every step
        assert m["rollout_mismatch/max_ratio"] == pytest.approx(1.0, abs=1e-5), step
        assert m["rollout_mismatch/min_ratio"] == pytest.approx(1.0, abs=1e-5), step
    halved = (
        ".q_proj.",
        ".o_proj.weight",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
        "embed_tokens.weight",
    )
    folder_bytes, expected = shard_bytes(assets["model"], halved)
    for step in (2, 3):
        assert history[step]["weight_sync/full_gather_bytes"] == folder_bytes
        assert history[step]["weight_sync/bytes"] == expected
    assert expected < 0.6 * folder_bytes  # the norms and the single KV head are all that arrive whole


@pytest.mark.parametrize("sync", ["merged", "adapter"])
def test_grpo_with_lora_syncs_the_rollout_and_its_reference_is_the_base_model(
    ray_local, assets, tmp_path, sync
):
    """actor.lora: adapters on every linear train; vLLM gets the merged weights after each update, or
    (rollout_sync=adapter) the adapters alone, served on its base weights, here by one engine over both ranks
    (rollout.tensor_parallel=2: vLLM cuts the adapters as it cuts the layers); the KL term's reference is the
    actor with its adapters off (no reference engine is built). With adapter sync, a run killed after step 2
    and resumed gives the uninterrupted run's step 3."""

    def config(experiment: str):
        return run_config(
            assets,
            tmp_path,
            "grpo",
            "rollout.engine=vllm",
            f"rollout.tensor_parallel={2 if sync == 'adapter' else 1}",
            "actor.lora.rank=8",
            "actor.lora.alpha=16",
            f"actor.lora.rollout_sync={sync}",
            "actor.use_kl_loss=true",
            "actor.ppo_mini_batch_size=4",  # one optimizer step per step: step 1's update starts from the base
            "trainer.total_training_steps=3",
            "trainer.save_freq=2",
            f"trainer.experiment_name={experiment}",
            *custom_reward("by_length"),
        )

    history = by_step(RLTrainer(config("grpo")).fit())
    for step in (1, 2, 3):
        m = history[step]
        assert m["rollout_mismatch/max_ratio"] == pytest.approx(1.0, abs=1e-5), step
        assert m["rollout_mismatch/min_ratio"] == pytest.approx(1.0, abs=1e-5), step
    model_bytes = sum(
        t.numel() * t.element_size() for t in load_file(assets["model"] / "model.safetensors").values()
    )
    synced = [history[step]["weight_sync/bytes"] for step in (2, 3)]
    if sync == "adapter":  # A [8, in] and B [out, 8] of every linear, float32: a few % of the model
        assert all(0 < b < 0.2 * model_bytes for b in synced), (synced, model_bytes)
    else:
        assert all(b >= model_bytes for b in synced), (synced, model_bytes)
    # B = 0 at the start: the actor is the base model until its first update, so KL to the reference is 0
    assert history[1]["actor/kl_loss"] == 0.0
    assert history[2]["actor/kl_loss"] > 0 and history[3]["actor/kl_loss"] > 0
    exported = export_checkpoint(tmp_path / "tandem/grpo/checkpoints/global_step_3", tmp_path / "hf")
    assert (exported / "lora_adapter" / "adapter_model.safetensors").is_file()
    trained, initial = (
        load_file(exported / "model.safetensors"),
        load_file(assets["model"] / "model.safetensors"),
    )
    assert trained.keys() == initial.keys()
    assert torch.equal(trained["model.embed_tokens.weight"], initial["model.embed_tokens.weight"])  # frozen
    assert not torch.equal(
        trained["model.layers.0.self_attn.q_proj.weight"], initial["model.layers.0.self_attn.q_proj.weight"]
    )
    if sync == "adapter":  # the adapters and their optimizer state come back from the checkpoint
        as_if_killed_after(tmp_path / "tandem/grpo", tmp_path / "tandem/resumed", 2)
        resumed = by_step(RLTrainer(config("resumed")).fit())
        assert sorted(resumed) == [3]
        assert_same_steps(resumed, history, (3,))

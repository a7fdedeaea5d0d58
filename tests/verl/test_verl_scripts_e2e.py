"""verl's example scripts run through Tandem's CLI, 2 training steps each, on verl-format GSM8K rows.

Each script's override list (tests/verl/scripts.py) is passed as it is to `tandem train`, with only the
changes in `cpu_changes` below: the model and data paths, and the sizes 2 CPU cores cannot hold.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from tandem.cli import main
from tandem.data.synthetic import write_rows
from tandem.models.tiny import save_tiny

from .e2e_scripts import DAPO_QWEN3_30B_MATH, GRPO_QWEN25_VL_7B_GEO3K, REMAX_QWEN25_3B
from .megatron_scripts import MEGATRON_SCRIPTS
from .scripts import SCRIPTS
from .test_translation import write_multiturn_config

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/: the shared verl-format fixtures
from rollout.test_vllm import TINY_VLLM
from tools.verl_rows import TOOL_YAML, fit_to_call, gsm8k_rows, write_parquet

INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


def single_turn_rows(split: str, n: int) -> list[dict]:
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
    train = write_rows(single_turn_rows("train", 8), root / "gsm8k" / "train.parquet")
    val = write_rows(single_turn_rows("test", 4), root / "gsm8k" / "test.parquet")
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


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_verl_multiturn_gsm8k_tool_script_puts_the_tools_step_rewards_in_the_score(
    ray_local, tmp_path, monkeypatch, capsys
):
    """verl's multi-turn GSM8K script (its Hydra config, its tool YAML, rows carrying tools_kwargs): GRPO
    with the agent loop on vLLM (verl's script names SGLang) for 2 steps.

    The random tiny model never writes a tool call, so it is first fitted (plain PyTorch, seconds) to
    answer every prompt with one call, ``calc_gsm8k_reward(answer="3")``. The GSM8K tool's step rewards are
    0.0 or -0.05 per call, never positive, and -0.05 for each row whose answer is not 3 (7 of the 8). The
    final answer holds no "#### N", so verl's strict GSM8K scorer gives 0 and a step's score is its tool
    reward alone: reward/score_mean equals reward/tool_reward_mean, below 0 (measured: -0.05 x 3 / 8)."""
    rows = gsm8k_rows(8, interaction=False)
    train = write_parquet(tmp_path / "train.parquet", rows)
    val = write_parquet(tmp_path / "test.parquet", gsm8k_rows(4, interaction=False, split="test"))
    model = save_tiny(tmp_path / "model", stop_at_im_end=True, **TINY_VLLM)
    fit_to_call(model, [row["prompt"] for row in rows])
    examples = write_multiturn_config(tmp_path / "verl")
    monkeypatch.chdir(tmp_path / "verl")  # the config's hydra.searchpath is relative to verl's checkout
    out = tmp_path / "run"
    script = cpu_changes(SCRIPTS["multiturn_gsm8k_tool"], model, train, val, out)
    script = [
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={TOOL_YAML}"
        if o.startswith("actor_rollout_ref.rollout.multi_turn.tool_config_path=")
        else "data.max_response_length=400"  # room for 3 turns on a tiny model, not 1024 tokens a sample
        if o.startswith("data.max_response_length=")
        else o
        for o in script
    ]
    # verl's dump keys; the folders are relative to the current directory, as in verl
    dumps = [
        "rollout_data_dir=dumps/rollouts",
        "validation_data_dir=dumps/validation",
        "log_val_generations=2",
    ]
    script += [f"trainer.{key}" for key in dumps]
    argv = ["train", f"--config-path={examples}", "--config-name=gsm8k_multiturn_grpo", *script]
    assert main(argv) == 0
    printed = capsys.readouterr().err
    assert "rollout.engine=auto   (Tandem has no SGLang engine yet" in printed
    assert "read verl config " in printed and "gsm8k_multiturn_grpo.yaml with its defaults" in printed
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    steps = [m for m in metrics if "reward/tool_reward_mean" in m and m["step"] > 0]
    assert [m["step"] for m in steps] == [1, 2]
    for m in steps:
        assert m["agent/tool_calls_per_sample"] > 0
        # every call is 0.0 or -0.05, and -0.05 where the row's answer is not 3: below 0
        assert m["reward/tool_reward_mean"] <= -0.05 / 8 + 1e-9
        assert m["reward/score_mean"] == pytest.approx(m["reward/tool_reward_mean"], abs=1e-6)
        assert m["score/mean"] == pytest.approx(m["reward/tool_reward_mean"], abs=1e-5)
        rows = [json.loads(line) for line in (tmp_path / f"verl/dumps/rollouts/{m['step']}.jsonl").open()]
        assert len(rows) == 8 and sum(r["score"] for r in rows) / 8 == pytest.approx(
            m["score/mean"], abs=1e-6
        )
        tools = [t for r in rows for t in r["turns"] if t["role"] == "tool"]  # one per call, parsed or not
        assert len(tools) == 8 * m["agent/tool_calls_per_sample"]
        calls = [
            c["name"] for r in rows for t in r["turns"] if t["role"] == "assistant" for c in t["tool_calls"]
        ]
        assert "calc_gsm8k_reward" in calls
    assert sorted(p.name for p in (tmp_path / "verl/dumps/validation").iterdir()) == ["0.jsonl", "2.jsonl"]
    generations = [json.loads(line) for line in (out / "val_generations.jsonl").open()]
    assert [g["step"] for g in generations] == [0, 0, 2, 2]  # the same 2 prompts each pass
    assert [g["input"] for g in generations[:2]] == [g["input"] for g in generations[2:]]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_verls_virtual_pipeline_megatron_script_leaves_an_unrewarded_policy_where_it_is(
    assets, ray_local, tmp_path
):
    """verl's grpo_trainer/run_qwen2-7b_sgl_megatron.sh (pipeline 2 x virtual pipeline 2, the interleaved
    schedule) for 2 steps, as issue 44 ran it: the untrained model scores 0 on every sample, so every
    advantage is 0 and at step 1 the KL loss (k3, to a reference that is the same weights), ppo_kl and the
    gradient must be 0. Micro-batches of 2 samples make 4 of them per update, past the schedule's warm-up
    (with megatron's batched p2p the activations and gradients crossed there: kl_loss 0.10, grad norm 3019)."""
    model, train, val = assets
    out = tmp_path / "run"
    script = cpu_changes(MEGATRON_SCRIPTS["grpo_trainer_run_qwen2_7b_sgl_megatron"], model, train, val, out)
    sizes = {  # 2 CPU ranks: the pipeline's 2 stages, no tensor parallel; 2 samples a micro-batch
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size": "1",
        "trainer.n_gpus_per_node": "2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "2",
    }
    script = [f"{o.partition('=')[0]}={sizes.get(o.partition('=')[0], o.partition('=')[2])}" for o in script]
    assert main(["train", "actor_rollout_ref.actor.strategy=megatron", *script]) == 0
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    first = next(m for m in metrics if m["step"] == 1 and "actor/kl_loss" in m)
    assert first["score/mean"] == 0
    assert abs(first["actor/kl_loss"]) < 1e-9 and abs(first["actor/ppo_kl"]) < 1e-6, first
    assert first["actor/grad_norm"] < 1e-4, first


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_verls_expert_parallel_megatron_script_trains_a_moe_model(ray_local, tmp_path):
    """verl's gspo_trainer/test_gspo_qwen30b_a3b_ep.sh (GSPO on a Qwen3-MoE actor with expert parallel, megatron
    offload, full recompute, DAPO's overlong penalty) for 2 steps on a tiny Qwen3-MoE (4 experts, 2 a token):
    expert parallel 2 over the 2 CPU ranks instead of TP 4 x EP 4 over 16 GPUs. The experts move (a gradient
    reaches them) and vLLM follows the trained weights: the step-2 mismatch is at float rounding."""
    from tandem.models.tiny_families import save_family

    model = save_family("qwen3_moe", tmp_path / "model")
    train = write_rows(single_turn_rows("train", 8), tmp_path / "train.parquet")
    val = write_rows(single_turn_rows("test", 4), tmp_path / "test.parquet")
    out = tmp_path / "run"
    script = cpu_changes(MEGATRON_SCRIPTS["gspo_trainer_test_gspo_qwen30b_a3b_ep"], model, train, val, out)
    sizes = {  # 2 CPU ranks: both hold half of every layer's experts; the penalty's lengths fit 16 tokens; prompt and
        # response within the tiny model's 256 positions (the script cuts prompts from the left)
        "data.max_prompt_length": "200",
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size": "1",
        "actor_rollout_ref.actor.megatron.expert_model_parallel_size": "2",
        "actor_rollout_ref.ref.megatron.tensor_model_parallel_size": "1",
        "actor_rollout_ref.ref.megatron.expert_model_parallel_size": "2",
        "trainer.n_gpus_per_node": "2",
        "trainer.nnodes": "1",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.len": "8",
        "+reward_model.reward_kwargs.max_resp_len": "16",
    }
    script = [f"{o.partition('=')[0]}={sizes.get(o.partition('=')[0], o.partition('=')[2])}" for o in script]
    assert main(["train", "actor_rollout_ref.actor.strategy=megatron", *script]) == 0
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    steps = {m["step"]: m for m in metrics if "actor/grad_norm" in m}
    assert sorted(steps) == [1, 2]
    assert all(0 < m["actor/grad_norm"] < float("inf") for m in steps.values())
    assert "reward/overlong_mean" in steps[1]
    assert abs(steps[2]["rollout_mismatch/max_ratio"] - 1) < 1e-3, steps[2]


# --- DAPO, vision (geo3k) and ReMax: tests/verl/e2e_scripts.py ------------------------------------------------------

DAPO_INSTRUCTION = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{}\n\nRemember to put your "
    'answer on its own line after "Answer:".'
)


def dapo_math_rows(n: int) -> list[dict]:
    """Rows as DAPO-Math-17k holds them (data_source math_dapo), with short made-up problems."""
    return [
        {
            "data_source": "math_dapo",
            "prompt": [{"role": "user", "content": DAPO_INSTRUCTION.format(f"What is {i} + {i + 2}?")}],
            "ability": "MATH",
            "reward_model": {"ground_truth": str(2 * i + 2), "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": str(i)},
        }
        for i in range(n)
    ]


def geo3k_rows(split: str, n: int) -> list[dict]:
    """Rows as verl's examples/data_preprocess/geo3k.py writes them: one 56 x 56 image each (4 image tokens on the
    tiny Qwen2-VL), an '<image>' in the problem; the same number of characters in every problem."""
    from data.data_helpers import png  # tests/ is on sys.path

    rows = []
    for i in range(n):
        problem = f"<image>Find x if angle A is {10 + i} degrees."
        rows.append(
            {
                "data_source": "hiyouga/geometry3k",
                "prompt": [{"role": "user", "content": f"{problem} Put the final answer in \\boxed{{}}."}],
                "images": [{"bytes": png(56, 56, (30 * i % 255, 90, 200), diagonal=True), "path": None}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(80 - i)},
                "extra_info": {"split": split, "index": i, "answer": str(80 - i), "question": problem},
            }
        )
    return rows


def with_sizes(script: list[str], sizes: dict[str, str]) -> list[str]:
    return [f"{o.partition('=')[0]}={sizes.get(o.partition('=')[0], o.partition('=')[2])}" for o in script]


def step_metrics(out: Path, key: str) -> dict[int, dict]:
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    steps = {m["step"]: m for m in metrics if key in m and m["step"] > 0}
    assert sorted(steps) == [1, 2], sorted(steps)
    for m in steps.values():
        bad = {k: v for k, v in m.items() if isinstance(v, float) and not math.isfinite(v)}
        assert not bad, bad
    return steps


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_verls_dapo_script_penalises_overlong_responses_with_the_geometric_mean_loss(
    assets, ray_local, tmp_path
):
    """gmpo_trainer/test_dapo_qwen3_30b_math.sh for 2 steps on DAPO-Math rows: verl's dapo reward manager's
    overlong buffer (reward.overlong) with buffer 8 of 16 response tokens, so a response of L > 8 tokens gets
    (8 - L) / 8; with every response longer than 8 tokens the step's mean penalty is (8 - mean length) / 8."""
    model, _, _ = assets
    train = write_rows(dapo_math_rows(8), tmp_path / "dapo-math-17k.parquet")
    val = write_rows(dapo_math_rows(4), tmp_path / "aime-2024.parquet")
    out = tmp_path / "run"
    sizes = {  # one CPU rank: no Ulysses split; the buffer within 16 response tokens; one node
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size": "1",
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size": "1",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.len": "8",
        "+reward_model.reward_kwargs.max_resp_len": "16",
        "trainer.nnodes": "1",
    }
    script = with_sizes(cpu_changes(DAPO_QWEN3_30B_MATH, model, train, val, out), sizes)
    assert main(["train", *script]) == 0
    config = (out / "config.yaml").read_text()
    assert "policy_loss: geo_mean" in config and "buffer_len: 8" in config
    steps = step_metrics(out, "reward/overlong_mean")
    for m in steps.values():
        assert -1.0 <= m["reward/overlong_mean"] <= 0.0
        if m["response_length/min"] > 8:
            expected = (8 - m["response_length/mean"]) / 8
            assert m["reward/overlong_mean"] == pytest.approx(expected, abs=1e-6), m
        if (
            m["score/max"] == m["score/min"]
        ):  # every sample scored alike: GRPO's advantages and gradient are 0
            assert m["actor/grad_norm"] == 0 and m["advantages/max"] == m["advantages/min"] == 0, m
    validation = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    assert [m["step"] for m in validation if "val/score_mean" in m] == [0, 2]  # val_before_train, and the end


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_verls_qwen25_vl_geo3k_script_trains_on_the_images(ray_local, tmp_path):
    """grpo_trainer/run_qwen2_5_vl-7b.sh for 2 steps on geo3k rows (a tiny Qwen2-VL for Qwen2.5-VL-7B): each
    prompt reaches the rollout and the actor with its image's 4 tokens (the actor's log-probs are vLLM's), and
    geo3k's scorer (0.9 x correct + 0.1 x format) scores the samples."""
    from tandem.models.tiny_vlm import IMAGE_PAD, save_tiny_vlm

    model = save_tiny_vlm(tmp_path / "model")
    train = write_rows(geo3k_rows("train", 8), tmp_path / "geo3k" / "train.parquet")
    val = write_rows(geo3k_rows("test", 4), tmp_path / "geo3k" / "test.parquet")
    out = tmp_path / "run"
    script = cpu_changes(GRPO_QWEN25_VL_7B_GEO3K, model, train, val, out)
    # the script's disable_mm_preprocessor_cache=True, an older vLLM name, reaches vLLM as mm_processor_cache_gb=0
    assert "+actor_rollout_ref.rollout.engine_kwargs.vllm.disable_mm_preprocessor_cache=True" in script
    assert main(["train", *script]) == 0
    steps = step_metrics(out, "actor/kl_loss")
    # The prompt as the chat template renders it: one image pad, which the processor widens to 4 tokens.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    text = geo3k_rows("train", 1)[0]["prompt"]
    rendered = tokenizer.apply_chat_template(text, add_generation_prompt=True, tokenize=True)
    ids = list(rendered if isinstance(rendered, list) else rendered["input_ids"])
    assert ids.count(tokenizer.convert_tokens_to_ids(IMAGE_PAD)) == 1
    for m in steps.values():
        assert m["prompt_length/min"] == m["prompt_length/max"] == len(ids) + 3, m
        assert 0.0 <= m["score/mean"] <= 1.0
        # the actor's log-probs, computed with the images, equal those vLLM generated with them
        assert abs(m["rollout_mismatch/max_ratio"] - 1) < 1e-3, m


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_verls_remax_script_subtracts_the_greedy_baseline(assets, ray_local, tmp_path):
    """remax_trainer/run_qwen2.5-3b_seq_balance.sh for 2 steps: a greedy sample per prompt is scored as the
    baseline (reward_baselines), and each token's advantage is its return minus its sample's baseline. With every
    response the full 16 tokens, the token means give returns/mean - advantages/mean = reward_baselines/mean."""
    model, train, val = assets
    out = tmp_path / "run"
    assert main(["train", *cpu_changes(REMAX_QWEN25_3B, model, train, val, out)]) == 0
    steps = step_metrics(out, "reward_baselines/mean")
    for m in steps.values():
        assert 0.0 <= m["reward_baselines/mean"] <= 1.0  # verl's strict GSM8K scorer on the greedy sample
        assert "actor/reward_kl_penalty" in m  # algorithm.use_kl_in_reward=True, kl_penalty=kl
        if m["response_length/min"] == 16:
            baseline = m["returns/mean"] - m["advantages/mean"]
            assert baseline == pytest.approx(m["reward_baselines/mean"], abs=1e-5), m

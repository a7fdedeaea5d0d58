"""Tiny random Llama 3, Qwen3 and Qwen3-MoE folders, and what each spawned rank of
tests/engine/test_megatron_families.py does with them.

The models are built with transformers' own config classes (each family's distinctive features kept: Llama 3's
`rope_type: llama3` with an original context short enough that all three of its frequency bands occur, Qwen3's
per-head q/k norms with head_dim != hidden / heads, Qwen3-MoE's experts and norm_topk_prob) and saved with the
tiny tokenizer. Every norm weight is drawn at random (transformers initialises them to 1, where a q / k swap would
not show).

One spawn of 2 gloo ranks per family: first FSDP2 (rank 0 holds every row, rank 1 none, so its micro-batches are
those of one rank: a mixture-of-experts balance term depends on which tokens meet in one micro-batch), then each
megatron layout in turn (megatron's parallel state rebuilt between them): the weights streamed out, a TP rollout's
cuts, the logits of every position, two actor updates (on two batches) and the response log-probs between them.
Each rank writes `rank{r}.pt`.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, LlamaConfig, PretrainedConfig, Qwen3Config, Qwen3MoeConfig

from tandem.config.schema import MegatronConfig
from tandem.models.tiny import build_tokenizer, padded_vocab_size, save_tokenizer
from tandem.models.tp_cuts import TensorParallelCuts
from tandem.roles.actor import Actor
from tandem.roles.common import MODEL_INPUTS

from . import megatron_scenarios as sc
from .ranks import start_ranks

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def family_config(family: str, **overrides) -> PretrainedConfig:
    """A 2-layer model of `family` (llama3, qwen3, qwen3_moe) over the tiny tokenizer's vocabulary."""
    tokenizer = build_tokenizer()
    shared = {
        "vocab_size": padded_vocab_size(tokenizer),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "attention_dropout": 0.0,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": tokenizer.eos_token_id,
    }
    if family == "llama3":  # head_dim 16: wavelengths 6 to 6e3 positions, either side of 64 / 4 and 64
        config = LlamaConfig(
            **shared, max_position_embeddings=1024, rope_scaling=LLAMA3_ROPE, tie_word_embeddings=False
        )
    elif family == "qwen3":
        config = Qwen3Config(**shared, head_dim=32, tie_word_embeddings=True)
    elif family == "qwen3_moe":
        config = Qwen3MoeConfig(
            **shared,
            head_dim=32,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=True,
            tie_word_embeddings=False,
        )
    else:
        raise ValueError(f"unknown family {family!r}")
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def save_family(path: str | Path, family: str, seed: int = 0, **overrides) -> str:
    """A Hugging Face folder of a random `family` model (norm weights random too) with the tiny tokenizer."""
    config = family_config(family, **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "norm" in name:
                    param.copy_(1.0 + 0.2 * torch.randn_like(param))
    model.save_pretrained(path, safe_serialization=True)
    save_tokenizer(build_tokenizer(), path)
    return str(path)


def megatron_config(layout: tuple) -> tuple[MegatronConfig, bool]:
    """(tensor, pipeline[, sequence parallel[, expert[, context parallel[, activation checkpointing]]]]) ->
    the engine's settings and its activation_checkpointing."""
    tp, pp, sp, ep, cp, checkpointing = (*layout, *(False, 1, 1, False)[len(layout) - 2 :])
    parallel = MegatronConfig(
        tensor_parallel=tp,
        pipeline_parallel=pp,
        sequence_parallel=sp,
        expert_parallel=ep,
        context_parallel=cp,
    )
    return parallel, checkpointing


def _step(engine, model_path: str, share) -> dict:
    before = sc.weights(engine)
    step = sc.step(Actor(engine, sc.role_config(model_path, model_path)), engine, share)
    after = sc.weights(engine)
    return {**step, "update": {name: after[name] - before[name] for name in before}}


def _two_steps(engine, model_path: str, shares: tuple) -> dict:
    """Two actor updates, the first batch's response log-probs between them."""
    out = {"step": _step(engine, model_path, shares[0])}
    actor = Actor(engine, sc.role_config(model_path, model_path))
    out["log_probs1"] = actor.compute_log_probs(shares[0], with_entropy=False)["old_log_probs"]
    out["step2"] = _step(engine, model_path, shares[1])
    return out


def worker(rank: int, world: int, init_method: str, runs: list, out_dir: str) -> None:
    """`runs`: (name, a layout for `megatron_config` or None for FSDP2, model folder)."""
    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world, timeout=timedelta(seconds=300)
    )
    torch.set_num_threads(1)
    from megatron.core import parallel_state as ps

    batches = (sc.rollout_batch(), sc.rollout_batch(seed=1))
    result: dict = {}
    try:
        for name, layout, path in runs:
            if layout is None:  # FSDP2 first: the megatron engine adapts torch.cuda for a CPU process
                engine = sc.make_engine("fsdp", path, "lm", MegatronConfig())
                shares = tuple(b.split([len(b), 0])[rank] for b in batches)
                result[name] = _two_steps(engine, path, shares)
                del engine
                continue
            parallel, checkpointing = megatron_config(layout)
            engine = sc.make_engine("megatron", path, "lm", parallel, activation_checkpointing=checkpointing)
            shares = tuple(b.chunk(engine.dp_size)[engine.dp_rank] for b in batches)
            share = shares[0]
            out: dict = {"dispatch_info": engine.dispatch_info(), "state0": sc.weights(engine)}
            if engine.layout.tp_size > 1:  # into a rollout engine of the same TP size
                cuts = TensorParallelCuts(engine.config, engine.layout.tp_size, world)
                out["cuts0"] = {n: (p.clone(), c) for n, p, c, _ in engine.state_dict_cuts(cuts.cuts)}
            out["norms"] = {
                type(m).__name__ for c in engine.chunks for m in c.modules() if "Norm" in type(m).__name__
            }
            rotary = engine.chunks[0].rotary_pos_emb  # under context parallel: RowRotary around it
            out["inv_freq"] = getattr(rotary, "rotary", rotary).inv_freq.clone()
            out["logits"] = engine.forward(share.select(*MODEL_INPUTS), sc.full_logits(engine), 2)["logits"]
            out.update(_two_steps(engine, path, shares))
            result[name] = out
            del engine
            ps.destroy_model_parallel()
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run(runs: list, out_dir: Path, world: int = 2) -> list[dict]:
    """Spawn `world` ranks doing `runs` (see `worker`) in order; each rank's results by run name."""
    out_dir.mkdir(parents=True, exist_ok=True)
    init_method = f"file://{out_dir / f'store-{uuid.uuid4().hex}'}"
    start_ranks(worker, (world, init_method, runs, str(out_dir)), world)
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(world)]

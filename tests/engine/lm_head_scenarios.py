"""What each spawned rank does in the chunked-LM-head tests (test_lm_head.py): the same engine calls with
the plain head and with `fsdp.lm_head_chunk_tokens`, on 1 and 2 ranks, and on 2 ranks with compiled decoder
layers and head (`fsdp.torch_compile`, `fsdp.lm_head_compile`); the chunked head with `fsdp.attn_implementation=sdpa_split` on 1 and 2 ranks
(test_attention.py); the parent compares the results.

The numbers are the roles' own: roles/common.response_log_probs (log-probs and entropy at a temperature)
and roles/sft.next_token_log_probs, in a forward pass and in a loss whose gradient reaches the head.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from tandem.algos import agg_loss
from tandem.config.schema import FSDPConfig, OptimConfig
from tandem.roles.common import response_log_probs
from tandem.roles.sft import next_token_log_probs

from .fsdp_scenarios import PROMPT_LEN, gather_state, make_engine, rollout_batch, shard, spawn

TEMPERATURE = 0.7
CHUNK = 4  # tokens per chunk: micro-batches of 2-3 rows x 6 response tokens cut into several chunks
SHARDS = {1: [6], 2: [4, 2]}
SDPA_SPLIT = "sdpa_split"  # the case run with actor.fsdp.attn_implementation=sdpa_split
EMPTY = {1: [1], 2: [1, 0]}  # rank 1 picks no rows: the head's gradient reduction must still match
# Adam's first step moves every element by about lr * g / (|g| + eps): an element whose gradient is float noise
# (~1e-9, e.g. an input embedding's) moves by an amount that depends on the summation order. lr is kept small
# and eps at 1e-6 (Adam's 1e-8 would turn noise of 1e-9 into a step of lr / 10) so that stays under 1e-5.
OPTIM = OptimConfig(lr=1e-4, weight_decay=0.01, eps=1e-6)


def stats_fn(output, micro):
    responses = micro["input_ids"][:, PROMPT_LEN:]
    log_probs, entropy = response_log_probs(output, responses, TEMPERATURE, True)
    return {
        "log_probs": log_probs,
        "entropy": entropy,
        "sft": next_token_log_probs(output, micro["input_ids"]),
    }


def make_loss_fn(global_tokens):
    def loss_fn(output, micro):
        responses = micro["input_ids"][:, PROMPT_LEN:]
        log_probs, entropy = response_log_probs(output, responses, TEMPERATURE, True)
        mask = micro["response_mask"]
        pg = agg_loss(-micro["advantages"] * log_probs, mask, global_num_tokens=global_tokens)
        loss = pg - 0.01 * agg_loss(entropy, mask, global_num_tokens=global_tokens)
        return loss, {"loss": loss.detach()}

    return loss_fn


def run_case(
    model_path: str,
    chunk: int | None,
    packing: bool,
    compiled: bool,
    world: int,
    rank: int,
    attention: str = "auto",
) -> dict:
    fsdp = FSDPConfig(
        lm_head_chunk_tokens=chunk,
        torch_compile=compiled,
        lm_head_compile=compiled,
        attn_implementation=attention,
    )
    engine = make_engine(model_path, "lm", optim=OPTIM, fsdp=fsdp, grad_clip=1.0, packing=packing)
    result: dict = {
        "chunk": engine.lm_head_chunk,
        "packing": engine.packing,
        "compiled": engine.compile_seconds,
        "head_compiled": engine.lm_head_compiled,
        "attention": engine.config._attn_implementation,
    }
    result["state0"] = gather_state(engine)
    batch = rollout_batch(6, seed=5)
    mine = shard(batch, SHARDS[world], rank)
    result["forward"] = engine.forward(mine, stats_fn, 2)
    tokens = engine.all_reduce_sum(mine["response_mask"].sum())
    result["step"] = dataclasses.asdict(engine.train_step(mine, make_loss_fn(tokens), 3))
    result["state"] = gather_state(engine)
    one = shard(rollout_batch(1, seed=6), EMPTY[world], rank)
    tokens = engine.all_reduce_sum(one["response_mask"].sum())
    result["empty_step"] = dataclasses.asdict(engine.train_step(one, make_loss_fn(tokens), 2))
    result["empty_state"] = gather_state(engine)
    return result


def worker(
    rank: int, world: int, init_method: str, model_path: str, out_dir: str, sdpa_split: bool = True
) -> None:
    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world, timeout=timedelta(seconds=120)
    )
    try:
        # (chunk, packing, compiled)
        cases = (
            [(None, True, False), (CHUNK, True, False), (None, False, False), (CHUNK, False, False)]
            if world == 1
            else [(CHUNK, True, False), (CHUNK, True, True)]
        )
        results = {case: run_case(model_path, *case, world, rank) for case in cases}
        # test_attention.py: packed in one row, attention a sequence at a time (engine/attention.py)
        if sdpa_split:
            results[SDPA_SPLIT] = run_case(
                model_path, CHUNK, True, False, world, rank, attention="sdpa_split"
            )
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def worker_without_sdpa_split(rank: int, world: int, init_method: str, model_path: str, out_dir: str) -> None:
    worker(rank, world, init_method, model_path, out_dir, sdpa_split=False)


def run(world: int, model_path: str | Path, out_dir: str | Path, sdpa_split: bool = True) -> list[dict]:
    """The cases on `world` ranks, by rank; `sdpa_split`: with the case test_attention.py reads (the untied
    model's run, read by test_lm_head.py alone, goes without)."""
    return spawn(worker if sdpa_split else worker_without_sdpa_split, world, model_path, out_dir)

"""What each spawned rank does in the Ulysses sequence-parallel tests (test_ulysses.py): the same engine
calls on 1 rank (the reference) and on 2 and 4 ranks with `fsdp.sequence_parallel`; the parent compares.

A case is (head, sequence_parallel, chunk, packing, activation_checkpointing). The data are split over the
DATA-parallel ranks (world / sequence_parallel): the ranks of a sequence-parallel group get the same rows.
The numbers are the roles' own: log-probs and entropy at a temperature, SFT log-probs, values, and a loss
whose gradient reaches every parameter (the LM head's too).
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from tandem.algos import agg_loss
from tandem.config.schema import FSDPConfig
from tandem.roles.critic import response_values

from .fsdp_scenarios import PROMPT_LEN, RESPONSE_LEN, gather_state, make_engine, rollout_batch, shard, spawn
from .lm_head_scenarios import CHUNK, OPTIM, make_loss_fn, stats_fn

SHARDS = {1: [6], 2: [4, 2]}  # rows per data-parallel rank
EMPTY = {1: [1], 2: [1, 0]}  # one row: data-parallel rank 1 has none

# (head, sequence_parallel, chunk, packing, activation_checkpointing) run by each world size
REFERENCE = [("lm", 1, None, True, False), ("value", 1, None, True, False)]
CASES = {
    1: REFERENCE,
    2: [
        ("lm", 2, None, True, False),
        ("lm", 2, CHUNK, False, False),
        ("value", 2, None, True, True),
    ],
    # DP 2 x SP 2; SP 4 with the tiny model's 2 key/value heads (each repeated for 2 ranks)
    4: [("lm", 2, CHUNK, True, False), ("lm", 4, None, False, False)],
}


def value_stats_fn(output, micro):
    return {"values": response_values(output, RESPONSE_LEN)}


def make_value_loss_fn(global_tokens):
    def loss_fn(output, micro):
        values = response_values(output, RESPONSE_LEN)
        loss = agg_loss(
            0.5 * (values - micro["returns"]) ** 2, micro["response_mask"], global_num_tokens=global_tokens
        )
        return loss, {"loss": loss.detach()}

    return loss_fn


def run_case(model_path: str, case: tuple, world: int, rank: int) -> dict:
    head, sp, chunk, packing, checkpointing = case
    fsdp = FSDPConfig(sequence_parallel=sp, lm_head_chunk_tokens=chunk)
    engine = make_engine(
        model_path,
        head,
        optim=OPTIM,
        fsdp=fsdp,
        grad_clip=1.0,
        packing=packing,
        activation_checkpointing=checkpointing,
    )
    forward_fn, loss_fn = (stats_fn, make_loss_fn) if head == "lm" else (value_stats_fn, make_value_loss_fn)
    dp = world // sp
    result: dict = {
        "dp": (engine.dp_rank, engine.dp_size),
        "dispatch": engine.dispatch_info(),
        "chunk": engine.lm_head_chunk,
        "packing": engine.packing,
    }
    mine = shard(rollout_batch(6, seed=5), SHARDS[dp], engine.dp_rank)
    result["forward"] = engine.forward(mine, forward_fn, 2)
    tokens = engine.all_reduce_sum(mine["response_mask"].sum())
    result["tokens"] = int(tokens)
    result["step"] = dataclasses.asdict(engine.train_step(mine, loss_fn(tokens), 3))
    result["state"] = gather_state(engine)
    one = shard(rollout_batch(1, seed=6), EMPTY[dp], engine.dp_rank)
    tokens = engine.all_reduce_sum(one["response_mask"].sum())
    result["empty_step"] = dataclasses.asdict(engine.train_step(one, loss_fn(tokens), 2))
    result["empty_state"] = gather_state(engine)
    result["after"] = engine.forward(mine, forward_fn, 2)
    return result


def worker(rank: int, world: int, init_method: str, model_path: str, out_dir: str) -> None:
    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world, timeout=timedelta(seconds=180)
    )
    try:
        results = {case: run_case(model_path, case, world, rank) for case in CASES[world]}
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run(world: int, model_path: str | Path, out_dir: str | Path) -> list[dict]:
    return spawn(worker, world, model_path, out_dir)


__all__ = ["CASES", "PROMPT_LEN", "REFERENCE", "run"]

"""What each spawned rank does in the mixture-of-experts engine tests (tests/engine/test_moe.py).

A tiny Mixtral trains on FSDP2 with the routers' load-balancing loss (engine/moe.py): one step packed,
one padded, one with the loss switched off, and a resume. The row split is chosen so that one rank's
micro-batches (rows 0-2, 3-5) are the two ranks' shards: the balance term is not linear in the tokens,
so only the same token groups can give the same numbers on 1 and 2 ranks.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from tandem.algos import agg_loss, log_probs_from_logits
from tandem.config.schema import FSDPConfig
from tandem.engine.base import scatter_rows

from .fsdp_scenarios import PROMPT_LEN, RESPONSE_LEN, gather_state, make_engine, rollout_batch, shard

ROWS = 6
SHARDS = {1: [6], 2: [3, 3]}
MICRO = 3  # one rank: rows 0-2 and 3-5; two ranks: one micro-batch each, the same rows
COEF = 0.5  # large, so that the balance term moves the gradient visibly


def response_log_probs(output, micro) -> torch.Tensor:
    """[b, RESPONSE_LEN] log-probs of the response tokens, packed or padded (0 at padding)."""
    rows = micro["input_ids"].shape[0]
    positions = torch.arange(PROMPT_LEN - 1, PROMPT_LEN - 1 + RESPONSE_LEN).expand(rows, -1)
    logits, where = output.at(positions)
    labels = micro["input_ids"][:, PROMPT_LEN:][where]
    return scatter_rows(log_probs_from_logits(logits.float(), labels), where)


def step(engine, batch, world: int, rank: int) -> dict:
    mine = shard(batch, SHARDS[world], rank)
    global_tokens = engine.all_reduce_sum(mine["response_mask"].sum())

    def loss_fn(output, micro):
        log_probs = response_log_probs(output, micro)
        loss = agg_loss(
            -micro["advantages"] * log_probs, micro["response_mask"], global_num_tokens=global_tokens
        )
        return loss, {}

    return dataclasses.asdict(engine.train_step(mine, loss_fn, MICRO))


def run_rank(rank: int, world: int, init_method: str, model_path: str, out_dir: str) -> None:
    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world, timeout=timedelta(seconds=120)
    )
    try:
        out = Path(out_dir)
        batch = rollout_batch(ROWS, seed=2)
        result: dict = {}
        for name, packing, coef in (("packed", True, COEF), ("padded", False, COEF), ("off", True, 0.0)):
            engine = make_engine(model_path, "lm", packing=packing, router_aux_loss_coef=coef)
            result[name] = step(engine, batch, world, rank)
            result[f"{name}_state"] = gather_state(engine)
        result["default_coef"] = make_engine(model_path, "lm", optim=None).routing.coef

        # Resume: a fresh engine loading the checkpoint takes the same next step as this one.
        engine = make_engine(model_path, "lm", packing=True, router_aux_loss_coef=COEF)
        step(engine, batch, world, rank)
        engine.save(out / "ckpt")
        result["continued"] = step(engine, rollout_batch(ROWS, seed=4), world, rank)
        resumed = make_engine(model_path, "lm", packing=True, router_aux_loss_coef=COEF)
        resumed.load(out / "ckpt")
        result["resumed"] = step(resumed, rollout_batch(ROWS, seed=4), world, rank)
        result["weights"] = {name: tuple(t.shape) for name, t in engine.state_dict_iter()}
        if world == 2:
            try:
                make_engine(model_path, "lm", fsdp=FSDPConfig(sequence_parallel=2))
            except ValueError as err:
                result["sp_error"] = str(err)
        torch.save(result, out / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()

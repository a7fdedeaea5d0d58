"""What each rank does in the router-replay role tests (tests/engine/test_router_replay_roles.py): the actor with
actor.router_replay=R2 on a tiny Mixtral, on FSDP2 (1 rank) or megatron (2 ranks: TP 2 with sequence parallel
and expert parallel 2, or context parallel 2 with expert parallel 2), the same sequence of calls on all.

The old-log-prob pass records the routing; a forward that carries it changes no number; two steps of the real
actor (old-log-prob pass, then its PPO update on 2 mini-batches, which replays the pass's routing); then every
router's weight is moved by the same seeded noise and the step-0 routing is replayed, next to a fresh forward.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from tandem.config import load_config
from tandem.config.schema import MegatronConfig
from tandem.engine.router_replay import ROUTED_EXPERTS
from tandem.roles.actor import Actor, update_keys
from tandem.roles.common import model_inputs, response_log_probs

from . import megatron_scenarios as sc

NOISE = 0.5


def config(model_path: str):
    return load_config(
        "grpo",
        [
            f"actor.model_path={model_path}",
            "trainer.device=cpu",
            "trainer.workers_per_node=1",
            "data.train_batch_size=2",
            f"data.max_prompt_length={sc.PROMPT}",
            f"data.max_response_length={sc.RESPONSE}",
            "rollout.n=3",
            "actor.ppo_mini_batch_size=1",  # 2 mini-batches: the old log-probs come from their own pass
            "actor.router_replay=R2",
        ],
    )


def log_probs_fn(output, micro):
    return {"log_probs": response_log_probs(output, micro["responses"], 1.0, with_entropy=False)[0]}


def move_routers(engine, strategy: str) -> None:
    """Add the same seeded noise to every router's weight (megatron's `router`, transformers' `gate`)."""
    suffix = "mlp.router.weight" if strategy == "megatron" else "mlp.gate.weight"
    modules = engine.chunks if strategy == "megatron" else [engine.model]
    with torch.no_grad():
        for module in modules:
            for name, param in module.named_parameters():
                if name.endswith(suffix):
                    layer = int(name.split("layers.")[1].split(".")[0])
                    local = param.to_local() if hasattr(param, "to_local") else param
                    gen = torch.Generator().manual_seed(100 + layer)
                    local.add_(torch.randn(local.shape, generator=gen) * NOISE)


def run(strategy: str, parallel: MegatronConfig, model_path: str) -> dict:
    cfg = config(model_path)
    engine = sc.make_engine(strategy, model_path, "lm", parallel, router_replay=True)
    actor = Actor(engine, cfg)
    rows = sc.rollout_batch(seed=3)
    batch = rows.select(*[key for key in rows.keys() if key != "old_log_probs"])  # the pass gives them
    inputs = model_inputs(batch, "responses")
    first = actor.compute_log_probs(inputs)
    routed = first.select(ROUTED_EXPERTS)
    result = {"routed": first[ROUTED_EXPERTS], "old_log_probs": first["old_log_probs"]}
    result["replayed_same"] = engine.forward(inputs.union(routed), log_probs_fn, 2)["log_probs"]
    steps = []
    for _ in range(2):
        old = actor.compute_log_probs(inputs)
        train = batch.union(old.select("old_log_probs", ROUTED_EXPERTS))
        keys = [*model_inputs(train).keys(), *update_keys(cfg), *actor.correction.update_keys, ROUTED_EXPERTS]
        steps.append(actor.update(train.select(*keys), mini_batches=2))
    result["steps"] = steps
    move_routers(engine, strategy)
    result["replayed_moved"] = engine.forward(inputs.union(routed), log_probs_fn, 2)["log_probs"]
    fresh = engine.forward(inputs, log_probs_fn, 2, record_routing=True)
    result["fresh_moved"], result["fresh_routed"] = fresh["log_probs"], fresh[ROUTED_EXPERTS]
    return result


def worker(
    rank: int, world: int, init_method: str, strategy: str, layout: tuple, path: str, out: str
) -> None:
    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world, timeout=timedelta(seconds=300)
    )
    torch.set_num_threads(1)
    try:
        tp, sp, ep, cp = (*layout, 1)[:4]
        parallel = MegatronConfig(
            tensor_parallel=tp, sequence_parallel=sp, expert_parallel=ep, context_parallel=cp
        )
        torch.save(run(strategy, parallel, path), Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()

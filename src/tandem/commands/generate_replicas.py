"""`tandem generate` over several engines: one Ray actor per device, the engines side by side (data-parallel
replicas), each on `tensor_parallel` consecutive devices (`config.generate.GenerateLayout`).

The unit of work stays the batch of `batch_size` consecutive rows, as with one engine: each replica is dealt
whole batches, round-robin (round k gives replica r the k x replicas + r-th batch still to do), and a batch is
rendered, padded and seeded exactly as one engine would (its rows' seeds are their row numbers, its padding
its own longest prompt). So a row's samples do not depend on the number of replicas or on which one ran it,
and the parts folder, written by this process as each round comes back, resumes as with one engine: a run
with another replica count finishes the same file. Two rounds are in flight at a time, so a replica that
finishes early starts its next batch without waiting for the others.

Where verl differs: its main_generation splits each batch of data.batch_size rows over every GPU and writes
the file at the end; Tandem gives each engine whole batches (batch_size prompts per engine call, as with one
engine) and keeps every finished batch, so an interrupted run loses at most the two rounds in flight.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from tandem.batch import Batch
from tandem.config.errors import ConfigError
from tandem.config.generate import GenerateConfig, GenerateLayout
from tandem.controller import Dispatch, ResourcePool, Worker, WorkerContext, WorkerGroup, dispatch, init_ray
from tandem.data.prompts import collate_prompts
from tandem.rollout import PROMPT_INDEX, RolloutSpec, SamplingParams, build_rollout

REPLICA_KEY = "generate_replica"  # per prompt row: the replica (part of the round) that generates it
IN_FLIGHT_ROUNDS = 2


def _by_replica(prompts: Batch, parts: int, _kwargs: Any) -> list[list[int]]:
    """Dispatch.REPLICA parts: replica r gets the rows the controller dealt it (`REPLICA_KEY`)."""
    slot = prompts[REPLICA_KEY]
    return [(slot == r).nonzero().flatten().tolist() for r in range(parts)]


class GenerateWorker(Worker):
    """One device's process: it holds its replica's engine (the whole engine, or one tensor-parallel cut of a
    vLLM engine spanning `tensor_parallel` consecutive ranks, built on the group's torch.distributed group)."""

    def __init__(self, ctx: WorkerContext, spec: RolloutSpec, tensor_parallel: int) -> None:
        super().__init__(ctx)
        self.tensor_parallel = tensor_parallel
        self.engine = build_rollout(replace(spec, device=ctx.torch_device))

    def replica_info(self) -> tuple[int, int, bool]:
        """The tensor_parallel consecutive ranks of one engine get the same prompts; the first answers."""
        tp = self.tensor_parallel
        return self.ctx.rank // tp, self.ctx.world_size // tp, self.ctx.rank % tp == 0

    @dispatch(Dispatch.REPLICA, parts=_by_replica)
    def generate(self, prompts: Batch, sampling: SamplingParams) -> dict[str, Any] | None:
        """This replica's batch (None when the round had none for it): its responses and response mask."""
        if len(prompts) == 0:
            return None
        out = self.engine.generate(own_padding(prompts.exclude(REPLICA_KEY)), sampling)
        return {
            "replica": self.replica_info()[0],
            "responses": out["responses"],
            "response_mask": out["response_mask"],
        }


def own_padding(prompts: Batch) -> Batch:
    """A batch cut out of a round's prompts, padded only as far as its own longest prompt: the left columns
    that are padding in every row go, so the engine sees what `collate_prompts` makes of these rows alone."""
    mask = prompts["attention_mask"]
    first = int((mask.sum(dim=0) > 0).nonzero()[0])
    if first == 0:
        return prompts
    keys = [k for k in ("input_ids", "attention_mask", "position_ids") if k in prompts]
    out = prompts.exclude(*keys)
    for key in keys:
        out[key] = prompts[key][:, first:]
    return out


def check_devices(layout: GenerateLayout, device: str, cfg: GenerateConfig, names: dict[str, str]) -> None:
    """Refuse at start-up, naming this machine's hardware, a one-node layout it cannot hold (a Ray cluster's
    nodes are checked by the resource pool, which names the cluster's)."""
    if layout.nnodes != 1 or cfg.ray_address or os.environ.get("RAY_ADDRESS"):
        return
    if device == "cuda":
        have, what = torch.cuda.device_count(), "CUDA GPUs"
        need = layout.workers_per_node
    else:
        have, what = os.cpu_count() or 1, "CPU cores"
        need = layout.workers_per_node * cfg.cpus_per_worker
    if need > have:
        per_node = names.get("workers_per_node", "workers_per_node")
        raise ConfigError(
            f"{layout.describe(device)} needs {need:g} {what} ({per_node}={layout.workers_per_node}"
            f"{f' x cpus_per_worker={cfg.cpus_per_worker:g}' if device == 'cpu' else ''}); this machine has "
            f"{have}: use fewer replicas (replicas=, {per_node}=), or join a Ray cluster that has them "
            "(ray_address=auto after `ray start`)"
        )


def generate_on_replicas(
    layout: GenerateLayout,
    spec: RolloutSpec,
    items: Sequence[dict[str, Any]],
    batches: Sequence[range],
    todo: Sequence[int],
    sampling: SamplingParams,
    pad_id: int,
    write: Callable[[int, dict[str, Any]], None],
    *,
    cpus_per_worker: float = 1.0,
    ray_address: str | None = None,
) -> None:
    """Generate the batches `todo` on `layout.replicas` engines built from `spec` on each worker's device
    (`spec.device`'s type: cuda or cpu); `write(batch,
    output)` takes each batch's output (responses, response_mask, replica) in this process as its round comes
    back. Ray: the one this process runs, else a local one (`ray_address` None) or a cluster's."""
    init_ray(address=ray_address)
    gpus = 1 if spec.device is not None and spec.device.type == "cuda" else 0
    pool = ResourcePool(layout.nnodes, layout.workers_per_node, cpus_per_worker, gpus, name="generate")
    try:
        with WorkerGroup.ray(
            GenerateWorker,
            pool,
            name="generate",
            args=(spec, layout.tensor_parallel),
        ) as group:
            replicas = layout.replicas
            rounds = [list(todo[k : k + replicas]) for k in range(0, len(todo), replicas)]
            in_flight: deque[tuple[list[int], Any]] = deque()
            for dealt in rounds:
                in_flight.append(
                    (dealt, group.generate.async_(_round_prompts(items, batches, dealt, pad_id), sampling))
                )
                if len(in_flight) == IN_FLIGHT_ROUNDS:
                    _collect(*in_flight.popleft(), write)
            while in_flight:
                _collect(*in_flight.popleft(), write)
    finally:
        pool.remove()


def _round_prompts(
    items: Sequence[dict[str, Any]], batches: Sequence[range], dealt: list[int], pad_id: int
) -> Batch:
    """The prompts of one round: batch dealt[r]'s rows for replica r, each row's number as its seed key."""
    rows = [r for b in dealt for r in batches[b]]
    prompts = collate_prompts([items[r] for r in rows], pad_id)
    prompts[PROMPT_INDEX] = torch.tensor(rows)  # seeds each row's samples by its row alone
    prompts[REPLICA_KEY] = torch.tensor([slot for slot, b in enumerate(dealt) for _ in batches[b]])
    return prompts


def _collect(dealt: list[int], future: Any, write: Callable[[int, dict[str, Any]], None]) -> None:
    outputs = future.result()
    for slot, batch in enumerate(dealt):
        write(batch, outputs[slot])

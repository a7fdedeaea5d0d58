"""What each spawned rank does in the FSDP engine tests; the parent compares the results.

The same sequence of engine calls runs with world size 1 (whole batches) and world size 2
(each rank its shard), so every recorded number can be compared between the two runs.
Each rank writes `rank{r}.pt` into the output folder: a dict of plain tensors and floats.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import uuid
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tandem.algos import agg_loss, log_probs_from_logits
from tandem.batch import Batch
from tandem.config.schema import FSDPConfig, OptimConfig
from tandem.engine import EngineSpec, FSDPEngine

from .ranks import start_ranks

PROMPT_LEN, RESPONSE_LEN = 5, 6
# Rows per rank: uneven shards, and micro-batches that do not divide them.
PROBE_SHARDS = {1: [5], 2: [3, 2]}  # forward check, micro-batches of 2
TRAIN_SHARDS = {1: [6], 2: [4, 2]}
TRAIN_MICRO = {1: 4, 2: 3}  # 1 rank: 4 + 2; 2 ranks: 3 + 1 and 2 (+ a dummy pass)
EMPTY_SHARDS = {1: [1], 2: [1, 0]}  # one row over two ranks: rank 1 has nothing
# warm-up makes the lr differ between steps, so a resumed schedule is checked too.
OPTIM = OptimConfig(lr=1e-3, weight_decay=0.01, warmup_steps=2, lr_scheduler="cosine", min_lr_ratio=0.1)
TOTAL_STEPS = 10
GRAD_CLIP = 0.5


def rollout_batch(rows: int, seed: int) -> Batch:
    """Left-padded prompts + right-padded responses, as the rollout returns them."""
    gen = torch.Generator().manual_seed(seed)
    length = PROMPT_LEN + RESPONSE_LEN
    prompt_lens = torch.randint(2, PROMPT_LEN + 1, (rows,), generator=gen)
    response_lens = torch.randint(1, RESPONSE_LEN + 1, (rows,), generator=gen)
    cols = torch.arange(length)
    prompt_mask = (cols[None, :PROMPT_LEN] >= PROMPT_LEN - prompt_lens[:, None]).long()
    response_mask = (cols[None, :RESPONSE_LEN] < response_lens[:, None]).long()
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    input_ids = torch.randint(4, 260, (rows, length), generator=gen) * attention_mask  # pad id 0
    return Batch(
        {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
            "response_mask": response_mask,
            "advantages": torch.randn(rows, RESPONSE_LEN, generator=gen),
            "returns": torch.randn(rows, RESPONSE_LEN, generator=gen),
        }
    )


def shard(batch: Batch, sizes: list[int], rank: int) -> Batch:
    return batch.split(sizes)[rank]


def logits_fn(output, micro: Batch) -> dict[str, torch.Tensor]:
    return {"logits": output.logits.float()}


def response_outputs(output, micro: Batch) -> torch.Tensor:
    """The model outputs that predict / value each response token."""
    return output.logits[:, PROMPT_LEN - 1 : -1].float()


def make_loss_fn(head: str, global_tokens: torch.Tensor):
    """token-mean over all response tokens of the global batch (global count from all ranks)."""

    def lm_loss(output, micro: Batch):
        log_probs = log_probs_from_logits(response_outputs(output, micro), micro["input_ids"][:, PROMPT_LEN:])
        loss = agg_loss(
            -micro["advantages"] * log_probs, micro["response_mask"], global_num_tokens=global_tokens
        )
        return loss, {"loss": loss.detach()}

    def value_loss(output, micro: Batch):
        values = response_outputs(output, micro)[..., 0]
        loss = agg_loss(
            0.5 * (values - micro["returns"]) ** 2, micro["response_mask"], global_num_tokens=global_tokens
        )
        return loss, {"loss": loss.detach()}

    return lm_loss if head == "lm" else value_loss


def nan_loss(output, micro: Batch):
    return output.logits.float().sum() * float("nan"), {}


def make_engine(
    model_path: str,
    head: str,
    *,
    optim: OptimConfig | None = OPTIM,
    fsdp: FSDPConfig | None = None,
    grad_clip: float = GRAD_CLIP,
    device: torch.device | str = "cpu",
    **kwargs,
) -> FSDPEngine:
    return FSDPEngine(
        EngineSpec(
            model_path=model_path,
            head=head,
            device=torch.device(device),
            optim=optim,
            fsdp=fsdp or FSDPConfig(),
            grad_clip=grad_clip,
            total_training_steps=TOTAL_STEPS,
            **kwargs,
        )
    )


def gather_state(engine: FSDPEngine) -> dict[str, torch.Tensor] | None:
    """Full weights on rank 0 (None elsewhere); every rank must call (collective)."""
    state = {name: tensor.clone() for name, tensor in engine.state_dict_iter()}
    return state if engine.dp_rank == 0 else None


def train(engine: FSDPEngine, head: str, batch: Batch, world: int, rank: int) -> dict:
    mine = shard(batch, TRAIN_SHARDS[world], rank)
    global_tokens = engine.all_reduce_sum(mine["response_mask"].sum())
    return dataclasses.asdict(engine.train_step(mine, make_loss_fn(head, global_tokens), TRAIN_MICRO[world]))


def run_head(head: str, model_path: str, out: Path, world: int, rank: int) -> dict:
    engine = make_engine(model_path, head)
    model = engine.model
    result: dict = {"tied": head != "lm" or model.lm_head.weight is model.model.embed_tokens.weight}
    result["state0"] = gather_state(engine)
    probe = rollout_batch(5, seed=1)
    result["logits0"] = engine.forward(shard(probe, PROBE_SHARDS[world], rank), logits_fn, 2)["logits"]

    result["step1"] = train(engine, head, rollout_batch(6, seed=2), world, rank)
    result["lr_after_schedule_step"] = engine.scheduler_step()
    result["state1"] = gather_state(engine)
    result["logits1"] = engine.forward(shard(probe, PROBE_SHARDS[world], rank), logits_fn, 2)["logits"]
    engine.export_hf(out / f"export-{head}")
    if head == "value":
        return result

    # One row over two ranks: rank 1's shard is empty, both must still take part.
    one = shard(rollout_batch(1, seed=3), EMPTY_SHARDS[world], rank)
    result["empty_forward"] = engine.forward(one, logits_fn, 2)["logits"]
    global_tokens = engine.all_reduce_sum(one["response_mask"].sum())
    result["empty_step"] = dataclasses.asdict(engine.train_step(one, make_loss_fn(head, global_tokens), 2))
    engine.scheduler_step()

    # Resume: a fresh engine loading the checkpoint takes the same next step as this one.
    engine.save(out / "ckpt")
    next_batch = rollout_batch(6, seed=4)
    result["continued_step"] = train(engine, head, next_batch, world, rank)
    result["continued_state"] = gather_state(engine)
    resumed = make_engine(model_path, head)
    resumed.load(out / "ckpt")
    result["resumed_global_step"] = resumed.global_step
    result["resumed_step"] = train(resumed, head, next_batch, world, rank)
    result["resumed_state"] = gather_state(resumed)
    return result


def single_rank_checks(model_path: str) -> dict:
    """Checks that need no second rank: activation checkpointing, a non-finite step, a frozen engine."""
    result = {}
    batch = rollout_batch(6, seed=2)
    checkpointed = make_engine(model_path, "lm", activation_checkpointing=True)
    result["checkpointed_step1"] = train(checkpointed, "lm", batch, 1, 0)
    result["checkpointed_state1"] = gather_state(checkpointed)

    before = gather_state(checkpointed)
    result["nan_step"] = dataclasses.asdict(checkpointed.train_step(batch, nan_loss, 4))
    result["nan_state_unchanged"] = all(
        torch.equal(before[k], v) for k, v in gather_state(checkpointed).items()
    )
    result["step_after_nan"] = train(checkpointed, "lm", batch, 1, 0)

    frozen = make_engine(model_path, "lm", optim=None)
    result["frozen_logits"] = frozen.forward(rollout_batch(5, seed=1), logits_fn, 5)["logits"]
    try:
        frozen.train_step(batch, nan_loss, 4)
    except RuntimeError as err:
        result["frozen_train_error"] = str(err)
    frozen_dir = Path(tempfile.mkdtemp(prefix="frozen-"))
    frozen.save(frozen_dir)
    try:  # a trained engine resuming from a frozen engine's checkpoint: no optimizer state there
        checkpointed.load(frozen_dir)
    except ValueError as err:
        result["frozen_checkpoint_error"] = str(err)
    checkpointed.load(frozen_dir, weights_only=True)  # its weights alone load
    result["frozen_weights_loaded"] = all(
        torch.equal(v, gather_state(frozen)[k]) for k, v in gather_state(checkpointed).items()
    )
    shutil.rmtree(frozen_dir, ignore_errors=True)
    return result


def worker(rank: int, world: int, init_method: str, model_path: str, out_dir: str) -> None:
    dist.init_process_group(
        "gloo",
        init_method=init_method,
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=120),
    )
    try:
        torch.manual_seed(1000 + rank)  # the engine must not depend on the global RNG
        out = Path(out_dir)
        results = {head: run_head(head, model_path, out, world, rank) for head in ("lm", "value")}
        if world == 1:
            results["single"] = single_rank_checks(model_path)
        torch.save(results, out / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def file_store(directory: str | Path) -> str:
    """A rendezvous file for init_process_group: no TCP port to race for (a free port picked here
    can be taken by another process, e.g. Ray's, before rank 0 binds it)."""
    store = Path(directory) / f"dist-store-{uuid.uuid4().hex}"
    return f"file://{store}"


def run(world: int, model_path: str | Path, out_dir: str | Path) -> list[dict]:
    """Spawn `world` ranks running `worker`; their results, by rank."""
    return spawn(worker, world, model_path, out_dir)


def spawn(rank_fn, world: int, model_path: str | Path, out_dir: str | Path, tries: int = 2) -> list[dict]:
    """Spawn `world` ranks of `rank_fn(rank, world, init_method, model_path, out_dir)`, each saving its results
    as `rank{r}.pt` in `out_dir`; those results, by rank.

    A rank killed by a signal (an exception inside a rank is a failure as it is): once in three full runs of
    the suite, a gloo rank aborted ("terminate called without an active exception", SIGABRT) after its work,
    at the process group's teardown. When every rank saved its results they are taken (the abort said);
    otherwise the ranks run again, once. A crash that repeats still fails."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = [out_dir / f"rank{rank}.pt" for rank in range(world)]
    for attempt in range(tries):
        for file in files:
            file.unlink(missing_ok=True)
        args = (world, file_store(out_dir), str(model_path), str(out_dir))
        try:
            start_ranks(rank_fn, args, world)
        except mp.ProcessExitedException as error:  # killed by a signal: no Python exception inside the rank
            done = all(file.is_file() for file in files)
            print(f"spawn: {error} (attempt {attempt + 1}; every rank's results saved: {done})", flush=True)
            if not done and attempt + 1 < tries:
                continue
            if not done:
                raise
        return [torch.load(file, weights_only=False) for file in files]
    raise AssertionError("unreachable")


def gpu_worker(rank: int, world: int, init_method: str, model_path: str, out_dir: str) -> None:
    """CUDA paths the CPU runs cannot reach: bf16 compute, offload / onload, fsdp.cpu_offload."""
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method=init_method, rank=rank, world_size=world, device_id=device)
    try:
        result: dict = {}
        probe = rollout_batch(5, seed=1)
        engine = FSDPEngine(
            EngineSpec(
                model_path=model_path,
                head="lm",
                device=device,
                optim=OPTIM,
                fsdp=FSDPConfig(),  # param_dtype auto: bfloat16 on CUDA
                grad_clip=GRAD_CLIP,
                total_training_steps=TOTAL_STEPS,
            )
        )
        result["logits"] = engine.forward(probe, logits_fn, 2)["logits"]
        result["step1"] = train(engine, "lm", rollout_batch(6, seed=2), world, rank)
        before = gather_state(engine)
        result["weights_dtypes"] = {t.dtype for t in before.values()}
        torch.cuda.synchronize()
        allocated = torch.cuda.memory_allocated(device)
        engine.offload()
        result["freed_bytes"] = allocated - torch.cuda.memory_allocated(device)
        result["param_devices_offloaded"] = {p.device.type for p in engine.model.parameters()}
        try:
            engine.forward(probe, logits_fn, 2)
        except RuntimeError as err:
            result["offloaded_forward_error"] = str(err)
        engine.onload()
        after = gather_state(engine)
        result["onload_unchanged"] = all(torch.equal(before[k], after[k]) for k in before)
        result["step2"] = train(engine, "lm", rollout_batch(6, seed=4), world, rank)

        offloaded = FSDPEngine(
            EngineSpec(
                model_path=model_path,
                head="lm",
                device=device,
                optim=OPTIM,
                fsdp=FSDPConfig(cpu_offload=True),
                grad_clip=GRAD_CLIP,
                total_training_steps=TOTAL_STEPS,
            )
        )
        result["cpu_offload_param_devices"] = {p.device.type for p in offloaded.model.parameters()}
        result["cpu_offload_step1"] = train(offloaded, "lm", rollout_batch(6, seed=2), world, rank)
        offloaded.export_hf(Path(out_dir) / "export-cpu-offload")
        result = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in result.items()}
        torch.save(result, Path(out_dir) / f"gpu-rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_gpu(model_path: str | Path, out_dir: str | Path) -> dict:
    out_dir = Path(out_dir)
    start_ranks(gpu_worker, (1, file_store(out_dir), str(model_path), str(out_dir)), 1)
    return torch.load(out_dir / "gpu-rank0.pt", weights_only=False)

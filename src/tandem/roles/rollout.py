"""The rollout role: a rollout engine, and how the actor's weights reach it.

Hybrid layout (the actor in the same worker): the engine is refreshed from the actor's training engine
in process before the first generation after an update, one tensor at a time: whole tensors, the cuts
of a tensor-parallel vLLM engine's share (`TensorParallelCuts`), or actor.lora's adapters alone
(rollout_sync=adapter). Separate layout (rollout.layout=separate): the actor's rank 0 sends the weights
over a WeightBus and this role receives them (`join_bus`, `receive_weights`).

rollout.mode=async adds the agent loop (multi-turn, tools); trainer.async_mode=streaming a
`RolloutStream` that generates in the background (`stream_submit` / `stream_collect`).
"""

from __future__ import annotations

import shutil
import tempfile
import time
import weakref
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from tandem.batch import Batch
from tandem.config.schema import TandemConfig
from tandem.controller import WorkerContext
from tandem.engine.base import TrainEngine, strategy_param_dtype
from tandem.models.tp_cuts import TensorParallelCuts, loader_input
from tandem.roles.weight_bus import WeightBus
from tandem.rollout import PROMPT_INDEX, ROLLOUT_KEYS, RolloutSpec, SamplingParams, build_rollout
from tandem.rollout.agent import AGENT_COUNT_KEYS, AGENT_FINISH_KEY, TRAJECTORY_KEY, AgentLoop, AgentSettings
from tandem.rollout.base import METRICS_KEY
from tandem.rollout.stream import RolloutStream
from tandem.rollout_options import facts, resolve_engine
from tandem.train_engine_options import facts as train_engine
from tandem.train_engine_options import settings


class RolloutRole:
    """This rank's rollout engine (see the module docstring). ``actor_engine``: the actor's training engine
    in the same worker (hybrid layout), or None (a separate rollout pool, fed over the weight bus)."""

    def __init__(self, cfg: TandemConfig, ctx: WorkerContext, actor_engine: TrainEngine | None) -> None:
        self.cfg = cfg
        self.ctx = ctx
        self.actor_engine = actor_engine
        start = time.perf_counter()
        self.engine = build_rollout(rollout_spec(cfg, ctx.torch_device, actor_engine))
        self.agent = agent_loop_from_config(cfg, self.engine) if cfg.rollout.mode == "async" else None
        # reported with the first step
        self.metrics: dict[str, float] = {"timing_s/rollout_start": time.perf_counter() - start}
        # The rollout starts from actor.model_path's weights; an actor that starts from others (a megatron
        # distributed checkpoint, a saved LoRA adapter) is synced before the first generation.
        self.stale = self.hybrid and starts_from_other_weights(cfg)
        self.bus: WeightBus | None = None  # rollout.layout=separate: the weight channel, once joined
        self._adapter_root: Path | None = None  # actor.lora.rollout_sync=adapter: the adapter folders' home
        # the cuts of a shard-only sync into this rank's tensor-parallel engine (None: whole tensors)
        self.cuts = self._tp_cuts() if actor_engine is not None else None
        self.stream: RolloutStream | None = None  # trainer.async_mode=streaming: from the first submit

    @property
    def hybrid(self) -> bool:
        """The actor lives in this worker: weights are synced in process, and the engine sleeps between
        generations to give the memory back to training (a separate engine keeps it)."""
        return self.actor_engine is not None

    def replica_info(self) -> tuple[int, int, bool]:
        """Dispatch.REPLICA layout: the rollout.tensor_parallel ranks of one vLLM engine (consecutive ranks)
        get the same prompts and run the same requests in step; the first of them answers."""
        tp = self.cfg.rollout.tensor_parallel
        return self.ctx.rank // tp, self.ctx.world_size // tp, self.ctx.rank % tp == 0

    def weights_changed(self) -> None:
        """The actor's weights moved (an update, a checkpoint load): a hybrid rollout syncs them before its
        next generation; a separate one is sent them."""
        self.stale = self.hybrid

    def pop_metrics(self) -> dict[str, float]:
        """The rollout's timings and numbers since the last call."""
        metrics, self.metrics = self.metrics, {}
        return metrics

    # ---- generation ------------------------------------------------------------------------------

    def generate(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        """n responses per prompt from this replica's prompts (see `RoleWorker.generate`); syncs the
        actor's weights first if stale."""
        self.engine.wake()
        if self.stale:
            self.sync_from_actor()
        start = time.perf_counter()
        if sampling.seed is not None and PROMPT_INDEX not in prompts:
            # Without step-wide prompt indices, ranks would key their first prompts alike: mix the rank in.
            sampling = replace(sampling, seed=sampling.seed * 1_000_003 + self.replica_info()[0])
        if len(prompts) == 0:  # an empty shard: every rank still takes part in the weight sync above
            out = _empty_rollout(prompts, sampling, agent=self.agent is not None)
        elif self.stream is not None:  # the engine belongs to the stream's thread (validation)
            out = self.stream.generate(prompts, sampling)
        elif self.agent is not None:
            out = self.agent.generate(self.engine.turn_engine, prompts, sampling)
        else:
            out = self.engine.generate(prompts, sampling)
        if self.hybrid:  # give the memory back to training (a separate engine keeps it)
            self.engine.sleep()
        self._record(out, time.perf_counter() - start)
        return out

    def _record(self, out: Batch, seconds: float) -> None:
        # Rank-specific numbers leave through pop_metrics: merged batches need equal meta on all ranks.
        for key, value in out.meta.pop(METRICS_KEY, {}).items():
            self.metrics[f"rollout/{key}"] = value
        self.metrics["timing_s/generate"] = seconds

    # ---- streaming generation (trainer.async_mode=streaming) ----------------------------------------

    def stream_submit(self, prompts: Batch, sampling: SamplingParams) -> int:
        """Start generating this rank's share of the prompts (rows rank, rank + world size, ...) in the
        background; returns the number of groups it took."""
        if self.stream is None:
            if self.agent is None:
                raise RuntimeError(
                    f"worker group {self.ctx.group_name!r}: streaming needs the agent loop (rollout.mode=async)"
                )
            self.stream = RolloutStream(self.agent, self.engine.turn_engine())
        mine = prompts.reorder(torch.arange(self.ctx.rank, len(prompts), self.ctx.world_size))
        return self.stream.submit(mine, sampling) if len(mine) else 0

    def stream_collect(self, min_groups: int, timeout_s: float) -> tuple[list[Batch], dict[str, float]]:
        """This rank's finished groups (waiting up to ``timeout_s`` for ``min_groups``) and its numbers."""
        if self.stream is None:
            return [], {"groups_in_flight": 0.0, "idle_s": 0.0}
        return self.stream.collect(min_groups, timeout_s)

    # ---- weights over the bus (separate layout) ------------------------------------------------

    def join_bus(self, address: str, world_size: int, bucket_bytes: int, timeout_s: float) -> None:
        """Join the weight bus as a receiver (bus rank 1 + this rank; the actor's rank 0 is the source)."""
        self.bus = WeightBus(
            address,
            1 + self.ctx.rank,
            world_size,
            device=str(self.ctx.torch_device),
            bucket_bytes=bucket_bytes,
            timeout_s=timeout_s,
        )

    def receive_weights(self, version: int = 0) -> None:
        """Load the weights the actor sends into the engine, bucket by bucket. With a rollout stream, once the
        turns in flight have finished (`RolloutStream.update_weights`); ``version`` (the actor's update count)
        then tags the samples generated with them."""
        if self.bus is None:
            raise RuntimeError(
                f"worker group {self.ctx.group_name!r} rank {self.ctx.rank}: no weight bus joined"
            )
        start = time.perf_counter()
        engine, bus = self.engine, self.bus
        engine.wake()
        if self.stream is not None:
            times = self.stream.update_weights(lambda: engine.update_weights(bus.receive()), version)
            self.metrics["timing_s/weight_drain"] = times["drain_s"]
        else:
            engine.update_weights(bus.receive())
        self.metrics["timing_s/weight_receive"] = time.perf_counter() - start

    # ---- weights from the actor in process (hybrid layout) ---------------------------------------

    def sync_now(self) -> None:
        """Copy the actor's current weights into the engine now."""
        self.engine.wake()
        self.sync_from_actor()

    def sync_from_actor(self) -> None:
        """The actor's tensors into this rank's engine; `weight_sync/bytes`: what this rank received. Whole
        tensors, or into a tensor-parallel vLLM engine only the part of each that this rank's share of the
        engine keeps (`_tp_cuts`; `weight_sync/full_gather_bytes` then says what whole ones weigh). Under
        actor.lora.rollout_sync=adapter, the adapters alone (the engine keeps the base weights it loaded)."""
        if self.cfg.actor.lora.syncs_adapters:
            self._sync_adapter()
            return
        start = time.perf_counter()
        received, whole = [0], [0]
        cuts, actor = self.cuts, self.actor_engine

        def counted() -> Iterator[tuple[str, Tensor]]:
            if cuts is None:
                for name, tensor in actor.state_dict_iter():
                    received[0] += tensor.numel() * tensor.element_size()
                    yield name, tensor
                return
            for name, piece, cut, shape in actor.state_dict_cuts(cuts.cuts):
                received[0] += piece.numel() * piece.element_size()
                whole[0] += shape.numel() * piece.element_size()
                yield name, loader_input(piece, cut, shape)

        self.engine.update_weights(counted())
        self.metrics["timing_s/weight_sync"] = time.perf_counter() - start
        self.metrics["weight_sync/bytes"] = received[0]
        if cuts is not None:  # what a full gather would have delivered, for comparison
            self.metrics["weight_sync/full_gather_bytes"] = whole[0]
        self.stale = False

    def _tp_cuts(self) -> TensorParallelCuts | None:
        """The cuts of a shard-only sync into this rank's tensor-parallel vLLM engine (models/tp_cuts.py),
        or None: whole tensors (one rank per engine, rollout.shard_weight_sync=false, a megatron actor of
        another tensor-parallel size than the rollout's, LoRA merged into whole weights, an architecture
        shard-only sync does not know)."""
        a, r = self.cfg.actor, self.cfg.rollout
        # an engine that holds whole tensors gathers any cut; one that holds tensor-parallel pieces, its own
        layout = (
            not train_engine(a.strategy).tensor_parallel_weights
            or settings(a).tensor_parallel == r.tensor_parallel
        )
        if not (r.shard_weight_sync and layout and a.lora.rank == 0):
            return None
        return TensorParallelCuts.for_model(self.actor_engine.config, r.tensor_parallel, self.ctx.world_size)

    def _sync_adapter(self) -> None:
        """actor.lora's adapters, gathered on every rank, into this rank's vLLM engine as a PEFT folder of this
        role's own (the one before it is removed once the engine serves the new one)."""
        start = time.perf_counter()
        if self._adapter_root is None:  # removed with the process (weakref.finalize)
            self._adapter_root = Path(tempfile.mkdtemp(prefix="tandem-adapters-"))
            weakref.finalize(self, shutil.rmtree, self._adapter_root, True)
        served = list(self._adapter_root.iterdir())
        folder = self._adapter_root / f"sync-{time.time_ns()}"
        size = self.actor_engine.save_adapter(folder)  # collective: every rank gathers the adapters
        self.engine.load_adapter(folder)
        for old in served:
            shutil.rmtree(old, ignore_errors=True)
        self.metrics["timing_s/weight_sync"] = time.perf_counter() - start
        self.metrics["weight_sync/bytes"] = size
        self.stale = False


def starts_from_other_weights(cfg: TandemConfig) -> bool:
    """The actor's first weights are not actor.model_path's, which a rollout engine loads: a megatron distributed
    checkpoint (actor.megatron.dist_checkpoint) or a saved adapter (actor.lora.adapter_path, whose B is not 0).
    A hybrid rollout syncs them before its first generation; a separate one is sent the actor's weights before
    its first generation anyway (trainer/rollouts.py)."""
    a = cfg.actor
    dist_start = train_engine(a.strategy).dist_checkpoint and bool(a.megatron.dist_checkpoint)
    return dist_start or bool(a.lora.adapter_path)


def _empty_rollout(prompts: Batch, sampling: SamplingParams, *, agent: bool = False) -> Batch:
    """A 0-row rollout output with the right keys and widths, for a rank that got no prompts
    (``agent``: with the agent loop's columns too)."""
    width, length = prompts["input_ids"].shape[1], sampling.max_tokens
    shapes = {
        "prompts": (width, torch.long),
        "responses": (length, torch.long),
        "response_mask": (length, torch.long),
        "input_ids": (width + length, torch.long),
        "attention_mask": (width + length, torch.long),
        "position_ids": (width + length, torch.long),
        "rollout_log_probs": (length, torch.float32),
    }
    assert set(shapes) == set(ROLLOUT_KEYS)
    tensors = {key: torch.zeros(0, w, dtype=dtype) for key, (w, dtype) in shapes.items()}
    non_tensors = {key: np.empty(0, dtype=object) for key in prompts.non_tensors}
    if agent:
        tensors.update({key: torch.zeros(0, dtype=torch.float32) for key in AGENT_COUNT_KEYS})
        non_tensors.update({key: np.empty(0, dtype=object) for key in (AGENT_FINISH_KEY, TRAJECTORY_KEY)})
    return Batch(tensors, non_tensors, dict(prompts.meta), batch_size=0)


def agent_loop_from_config(cfg: TandemConfig, rollout: Any) -> AgentLoop:
    """The agent loop of rollout.mode=async: rollout.multi_turn's tools and interaction, the rollout
    engine's stop ids, the actor's tokenizer and data.chat_template_kwargs (to render inserted messages as
    the prompts were rendered)."""
    from transformers import AutoTokenizer

    from tandem.rollout.agent import toolset_from_config
    from tandem.tools import build_interaction

    m = cfg.rollout.multi_turn
    tokenizer = AutoTokenizer.from_pretrained(cfg.actor.tokenizer_path or cfg.actor.model_path)
    tools = toolset_from_config(m)
    settings = AgentSettings(
        max_assistant_turns=m.max_assistant_turns,
        max_user_turns=m.max_user_turns,
        max_parallel_calls=m.max_parallel_calls,
        tool_call_format=m.format,
        trajectory_timeout_s=m.trajectory_timeout_s,
    )
    return AgentLoop(
        tokenizer,
        rollout.eos_token_ids,
        settings=settings,
        tools=tools,
        interaction=build_interaction(m.interaction, m.interaction_file),
        pad_token_id=rollout.pad_token_id,
        template_kwargs=cfg.data.chat_template_kwargs,
    )


def rollout_spec(
    cfg: TandemConfig, device: torch.device | None, actor_engine: TrainEngine | None = None
) -> RolloutSpec:
    """The one description of the run's rollout engine, from the config: rollout.engine resolved ("auto": vllm
    where installed), the actor's model folder and override_config, the lengths, rollout.* sizes. `device`: the
    rank's (None: not chosen yet, the start-up check); `actor_engine`: the actor's engine in the same worker,
    whose compute dtype an engine that computes in the actor's dtype takes (see `rollout_dtype`; the others,
    hf, keep float32)."""
    r, d, a = cfg.rollout, cfg.data, cfg.actor
    engine = resolve_engine(r.engine)
    in_actor_dtype = device is not None and facts(engine).actor_dtype
    return RolloutSpec(
        engine=engine,
        model_path=a.model_path,
        tokenizer_path=a.tokenizer_path,
        device=device,
        dtype=rollout_dtype(cfg, device, actor_engine) if in_actor_dtype else torch.float32,
        override_config=a.override_config,  # the model config the actor trains
        max_model_len=d.max_prompt_length + d.max_response_length,
        tensor_parallel=r.tensor_parallel,
        gpu_memory_utilization=r.gpu_memory_utilization,
        kv_cache_gib=r.cpu_kv_cache_gib,
        seed=cfg.trainer.seed,
        engine_kwargs=r.engine_kwargs,
        lora_rank=a.lora.rank if a.lora.syncs_adapters else 0,
    )


def rollout_dtype(
    cfg: TandemConfig, device: torch.device, actor_engine: TrainEngine | None = None
) -> torch.dtype:
    """The rollout computes in the actor's compute dtype. Hybrid: the actor engine's own (param_dtype=auto
    may have measured it, and the FSDP engine's ranks agreed on it). A separate rollout pool: the actor's
    config resolved by the rule its engine applies (engine/base.py `strategy_param_dtype`; megatron-core:
    float32 on a CPU), on this rank alone."""
    if actor_engine is not None:
        return actor_engine.param_dtype
    a = cfg.actor
    return strategy_param_dtype(a.strategy, a.fsdp, a.megatron, device)


def check_servable_adapters(vision_adapters: list[str], expert_adapters: list[str]) -> None:
    """vLLM serves LoRA adapters on a vision-language model's language model only: adapters on its vision
    tower would be skipped without a word (measured on Qwen2-VL: rollout/trainer ratios 1.02-1.04 after the
    first sync), so the adapter sync refuses them. Adapters on a mixture-of-experts model's fused expert tensors
    and routers (PEFT's layout, engine/fsdp/lora.py) reach the rollout merged: whether vLLM's MoE LoRA serves
    PEFT's fused expert adapters and a router's is not checked here (it needs a GPU), so the adapter sync
    refuses them too."""
    if expert_adapters:
        raise ValueError(
            f"actor.lora.rollout_sync=adapter: actor.lora.target_modules puts {len(expert_adapters)} adapters on a "
            f"mixture-of-experts model's experts or routers ({', '.join(expert_adapters[:2])}, ...), which Tandem "
            "syncs into the rollout merged only; use actor.lora.rollout_sync=merged, or name the attention "
            "projections alone (e.g. [q_proj,k_proj,v_proj,o_proj])"
        )
    if vision_adapters:
        raise ValueError(
            f"actor.lora.rollout_sync=adapter: vLLM does not serve LoRA adapters on the vision tower, and "
            f"actor.lora.target_modules puts {len(vision_adapters)} there ({', '.join(vision_adapters[:3])}, ...); "
            "name the language model's projections (e.g. [q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,"
            "down_proj]) or use actor.lora.rollout_sync=merged"
        )

"""The worker that hosts roles: any of actor, rollout, ref, critic, reward_model in one process.

Colocating actor + rollout (+ ref) in one worker is the hybrid engine: the rollout engine is
refreshed from the actor's training engine before each generation after an update, in process,
one tensor at a time. Other layouts are several worker groups with different roles, on the same
or on separate resource pools (tandem.controller). With rollout.layout=separate the rollout engines
are a group of their own; the actor's rank 0 sends them the weights over a WeightBus, a process group
spanning both groups (join_weight_bus, send_weights / receive_weights).
"""

from __future__ import annotations

import resource
import shutil
import tempfile
import time
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from tandem.batch import Batch
from tandem.config.schema import OptimConfig, TandemConfig
from tandem.controller import Dispatch, Worker, WorkerContext, dispatch
from tandem.engine.base import Head, TrainEngine, resolve_param_dtype
from tandem.engine.flops import peak_flops
from tandem.engine.fsdp.lora import WithoutAdapter, save_adapter
from tandem.models.tp_cuts import TensorParallelCuts, loader_input
from tandem.roles.actor import Actor
from tandem.roles.critic import Critic
from tandem.roles.engines import role_engine
from tandem.roles.profile import PhaseProfiler, profiled
from tandem.roles.reference import Reference
from tandem.roles.reward_model import RewardModel
from tandem.roles.sft import SFT
from tandem.roles.weight_bus import WeightBus, free_address
from tandem.rollout import PROMPT_INDEX, ROLLOUT_KEYS, SamplingParams, build_rollout, resolve_engine
from tandem.rollout.agent import AGENT_COUNT_KEYS, AGENT_FINISH_KEY, TRAJECTORY_KEY, AgentLoop, AgentSettings
from tandem.rollout.base import METRICS_KEY
from tandem.rollout.stream import RolloutStream

ROLES = ("actor", "rollout", "ref", "critic", "reward_model")


class RoleWorker(Worker):
    """One rank of a worker group holding the given roles (see the module docstring)."""

    def __init__(
        self,
        ctx: WorkerContext,
        cfg: TandemConfig,
        roles: Sequence[str],
        total_training_steps: int | None = None,
    ) -> None:
        super().__init__(ctx)
        roles = tuple(roles)
        unknown = [r for r in roles if r not in ROLES]
        if unknown or not roles:
            raise ValueError(f"RoleWorker roles {list(roles)}: each must be one of {list(ROLES)}")
        if "rollout" in roles and "actor" not in roles and cfg.rollout.layout != "separate":
            raise ValueError(
                "the rollout role needs the actor in the same worker (the hybrid engine syncs weights "
                "from the actor's engine in process); put 'actor' and 'rollout' in one worker group"
            )
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # one bar per model load per rank would flood the driver's log
        self.cfg = cfg
        self.roles = roles
        self.total_training_steps = total_training_steps
        torch.manual_seed(cfg.trainer.seed)
        self.actor = self.reference = self.critic = self.reward_model = self.rollout = None
        if "actor" in roles:
            a = cfg.actor
            self.actor = Actor(self._engine(a.model_path, "lm", a.optim, a.grad_clip, lora=a.lora), cfg)
        if "ref" in roles:
            if self.actor is not None and cfg.actor.lora.rank > 0:
                # the actor with its adapters off is the reference policy: no second copy of the base weights
                self.reference = Reference(WithoutAdapter(self.actor.engine), cfg)
            else:
                self.reference = Reference(self._engine(cfg.actor.model_path, "lm", None, None), cfg)
        if "critic" in roles:
            c = cfg.critic
            self.critic = Critic(self._engine(c.model_path, "value", c.optim, c.grad_clip, lora=c.lora), cfg)
        if "reward_model" in roles:
            rm = cfg.reward.reward_model
            self.reward_model = RewardModel(self._engine(rm.model_path, "value", None, None), cfg)
        self.agent: AgentLoop | None = None
        if "rollout" in roles:
            start = time.perf_counter()
            # The rollout computes in the actor's dtype (param_dtype=auto may have measured it), or resolves it
            # the same way in a separate rollout pool.
            dtype = self.actor.engine.param_dtype if self.actor is not None else None
            self.rollout = build_rollout(cfg.rollout.engine, **rollout_kwargs(cfg, ctx.torch_device, dtype))
            if cfg.rollout.mode == "async":
                self.agent = agent_loop_from_config(cfg, self.rollout)
            self._rollout_start_s = time.perf_counter() - start
        # The rollout starts from actor.model_path, as the actor does: in sync until the first update.
        self._rollout_stale = False
        self._bus: WeightBus | None = None  # rollout.layout=separate: the weight channel, once joined
        self._adapter_root: Path | None = None  # actor.lora.rollout_sync=adapter: the adapter folders' home
        if self.actor is not None and cfg.actor.lora.syncs_adapters:
            check_servable_adapters(self.actor.engine.vision_adapters())
        # the cuts of a shard-only sync into this rank's tensor-parallel engine (None: whole tensors)
        self._cuts = self._rollout_cuts() if self.actor is not None and self.rollout is not None else None
        self._stream: RolloutStream | None = None  # trainer.async_mode=streaming: from the first submit
        self._metrics: dict[str, float] = {}
        self._profiler = PhaseProfiler(cfg.trainer.profile, ctx.group_name, ctx.rank)
        if self.rollout is not None:  # reported with the first step
            self._metrics["timing_s/rollout_start"] = self._rollout_start_s
        models = (self.actor, self.reference, self.critic, self.reward_model)
        compiled = [s for s in (getattr(r.engine, "compile_seconds", None) for r in models if r) if s]
        if compiled:  # fsdp.torch_compile's warm-ups, paid before the first step
            self._metrics["timing_s/compile"] = sum(compiled)
        # For perf/mfu/*: one device's FLOP/s in the dtype the updates run in (engine/flops.py)
        trained = self.actor if self.actor is not None else self.critic
        self._peak_flops = (
            peak_flops(ctx.torch_device, trained.engine.param_dtype, cfg.trainer.peak_flops)
            if trained
            else None
        )

    def _engine(
        self,
        model_path: str | None,
        head: Head,
        optim: OptimConfig | None,
        grad_clip: float | None,
        lora: Any = None,
    ) -> TrainEngine:
        return role_engine(
            self.cfg,
            self.ctx.torch_device,
            model_path,
            head,
            optim,
            grad_clip,
            self.total_training_steps,
            self.ctx.group_name,
            lora=lora,
        )

    def dispatch_info(self) -> tuple[int, int, bool]:
        """Dispatch.MP layout from this worker's engines (they share one): plain data parallel on FSDP; on
        megatron the ranks of a tensor / pipeline group get the same rows and TP rank 0 of the last stage
        answers. Generation follows `replica_info` instead (the rollout's own tensor parallel)."""
        engines = [r.engine for r in (self.actor, self.critic, self.reference, self.reward_model) if r]
        return engines[0].dispatch_info() if engines else super().dispatch_info()

    def replica_info(self) -> tuple[int, int, bool]:
        """Dispatch.REPLICA layout: the rollout.tensor_parallel ranks of one vLLM engine (consecutive ranks)
        get the same prompts and run the same requests in step; the first of them answers."""
        tp = self.cfg.rollout.tensor_parallel if self.rollout is not None else 1
        return self.ctx.rank // tp, self.ctx.world_size // tp, self.ctx.rank % tp == 0

    def _role(self, name: str) -> Any:
        roles = {
            "actor": self.actor,
            "ref": self.reference,
            "critic": self.critic,
            "reward_model": self.reward_model,
        }
        role = roles.get(name)
        if role is None:
            raise ValueError(
                f"worker group {self.ctx.group_name!r} has roles {list(self.roles)}, not {name!r}"
            )
        return role

    # ---- rollout (hybrid engine) ---------------------------------------------------------------

    @dispatch(Dispatch.REPLICA)
    @profiled
    def generate(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        """n responses per prompt from this replica's prompts (one rank's, or those of the ranks of one
        tensor-parallel engine, which all run them); syncs the actor's weights first if stale.

        Give the prompts a `prompt_index` column (their index in the step) before the call, and seeded
        samples are the same whatever the number of ranks (rollout/base.py)."""
        rollout = self._role_rollout()
        rollout.wake()
        if self._rollout_stale:
            self._sync_rollout_weights()
        start = time.perf_counter()
        if sampling.seed is not None and PROMPT_INDEX not in prompts:
            # Without step-wide prompt indices, ranks would key their first prompts alike: mix the rank in.
            sampling = replace(sampling, seed=sampling.seed * 1_000_003 + self.replica_info()[0])
        if len(prompts) == 0:  # an empty shard: every rank still takes part in the weight sync above
            out = _empty_rollout(prompts, sampling, agent=self.agent is not None)
        elif self._stream is not None:  # the engine belongs to the stream's thread (validation)
            out = self._stream.generate(prompts, sampling)
        elif self.agent is not None:
            out = self.agent.generate(rollout.turn_engine, prompts, sampling)
        else:
            out = rollout.generate(prompts, sampling)
        if self.actor is not None:  # hybrid: give the memory back to training (a separate engine keeps it)
            rollout.sleep()
        self._record(out, time.perf_counter() - start)
        return out

    # ---- weight sync of the separate layout ----------------------------------------------------

    @dispatch(Dispatch.ONE_TO_ALL)
    def weight_bus_address(self) -> str:
        """A free "host:port" on this rank's node, for a bus hosted by this group's rank 0."""
        return free_address()

    @dispatch(Dispatch.ONE_TO_ALL)
    def join_weight_bus(self, address: str, world_size: int, bucket_bytes: int, timeout_s: float) -> None:
        """Join the weight bus: the actor's rank 0 as its source (bus rank 0, hosting `address`), every
        rollout-only rank as a receiver (bus rank 1 + its rank); the actor's other ranks stay off it."""
        if self.actor is not None and self.ctx.rank != 0:
            return
        rank = 0 if self.actor is not None else 1 + self.ctx.rank
        device = str(self.ctx.torch_device)
        self._bus = WeightBus(
            address, rank, world_size, device=device, bucket_bytes=bucket_bytes, timeout_s=timeout_s
        )

    @dispatch(Dispatch.ONE_TO_ALL)
    def send_weights(self) -> None:
        """The actor's full weights to the rollout group (every actor rank takes part in the gathers)."""
        weights = self._role("actor").engine.state_dict_iter()
        if self._bus is None:  # not the source: the collective gathers still need this rank
            for _ in weights:
                pass
            return
        stats = self._bus.send(weights)
        self._metrics["timing_s/weight_sync"] = stats["weight_sync_s"]
        self._metrics["weight_sync/bytes"] = stats["weight_sync_bytes"]
        self._metrics["weight_sync/buckets"] = stats["weight_sync_buckets"]

    @dispatch(Dispatch.ONE_TO_ALL)
    def receive_weights(self, version: int = 0) -> None:
        """Load the weights the actor sends into this rank's rollout engine, bucket by bucket. With a
        rollout stream, once the turns in flight have finished (`RolloutStream.update_weights`);
        ``version`` (the actor's update count) then tags the samples generated with them."""
        if self._bus is None:
            raise RuntimeError(
                f"worker group {self.ctx.group_name!r} rank {self.ctx.rank}: no weight bus joined"
            )
        start = time.perf_counter()
        rollout = self._role_rollout()
        rollout.wake()
        if self._stream is not None:
            times = self._stream.update_weights(lambda: rollout.update_weights(self._bus.receive()), version)
            self._metrics["timing_s/weight_drain"] = times["drain_s"]
        else:
            rollout.update_weights(self._bus.receive())
        self._metrics["timing_s/weight_receive"] = time.perf_counter() - start

    # ---- streaming generation (trainer.async_mode=streaming) ----------------------------------------

    @dispatch(Dispatch.ONE_TO_ALL)
    def stream_submit(self, prompts: Batch, sampling: SamplingParams) -> int:
        """Start generating this rank's share of the prompts (rows rank, rank + world size, ...) in the
        background; returns the number of groups it took. Give the prompts a `prompt_index` column first,
        and seeded samples do not depend on the number of ranks."""
        if self._stream is None:
            if self.agent is None:
                raise RuntimeError(
                    f"worker group {self.ctx.group_name!r}: streaming needs the agent loop (rollout.mode=async)"
                )
            self._stream = RolloutStream(self.agent, self._role_rollout().turn_engine())
        mine = prompts.reorder(torch.arange(self.ctx.rank, len(prompts), self.ctx.world_size))
        return self._stream.submit(mine, sampling) if len(mine) else 0

    @dispatch(Dispatch.ONE_TO_ALL)
    def stream_collect(self, min_groups: int, timeout_s: float) -> tuple[list[Batch], dict[str, float]]:
        """This rank's finished groups (waiting up to ``timeout_s`` for ``min_groups``) and its numbers."""
        if self._stream is None:
            return [], {"groups_in_flight": 0.0, "idle_s": 0.0}
        return self._stream.collect(min_groups, timeout_s)

    @dispatch(Dispatch.ONE_TO_ALL)
    def sync_rollout_weights(self) -> None:
        """Copy the actor's current weights into the rollout engine now."""
        self._role_rollout().wake()
        self._sync_rollout_weights()

    def _sync_rollout_weights(self) -> None:
        """The actor's tensors into this rank's engine; `weight_sync/bytes`: what this rank received. Whole
        tensors, or into a tensor-parallel vLLM engine only the part of each that this rank's share of the
        engine keeps (`_rollout_cuts`; `weight_sync/full_gather_bytes` then says what whole ones weigh). Under
        actor.lora.rollout_sync=adapter, the adapters alone (the engine keeps the base weights it loaded)."""
        if self.cfg.actor.lora.syncs_adapters:
            self._sync_rollout_adapter()
            return
        start = time.perf_counter()
        received, whole = [0], [0]
        cuts = self._cuts

        def counted() -> Iterator[tuple[str, Tensor]]:
            if cuts is None:
                for name, tensor in self.actor.engine.state_dict_iter():
                    received[0] += tensor.numel() * tensor.element_size()
                    yield name, tensor
                return
            for name, piece, cut, shape in self.actor.engine.state_dict_cuts(cuts.cuts):
                received[0] += piece.numel() * piece.element_size()
                whole[0] += shape.numel() * piece.element_size()
                yield name, loader_input(piece, cut, shape)

        self._role_rollout().update_weights(counted())
        self._metrics["timing_s/weight_sync"] = time.perf_counter() - start
        self._metrics["weight_sync/bytes"] = received[0]
        if cuts is not None:  # what a full gather would have delivered, for comparison
            self._metrics["weight_sync/full_gather_bytes"] = whole[0]
        self._rollout_stale = False

    def _rollout_cuts(self) -> TensorParallelCuts | None:
        """The cuts of a shard-only sync into this rank's tensor-parallel vLLM engine (models/tp_cuts.py),
        or None: whole tensors (one rank per engine, rollout.shard_weight_sync=false, a megatron actor of
        another tensor-parallel size than the rollout's, LoRA merged into whole weights, an architecture
        shard-only sync does not know)."""
        a, r = self.cfg.actor, self.cfg.rollout
        layout = a.strategy == "fsdp" or a.megatron.tensor_parallel == r.tensor_parallel
        if not (r.shard_weight_sync and layout and a.lora.rank == 0):
            return None
        return TensorParallelCuts.for_model(self.actor.engine.config, r.tensor_parallel, self.ctx.world_size)

    def _sync_rollout_adapter(self) -> None:
        """actor.lora's adapters, gathered on every rank, into this rank's vLLM engine as a PEFT folder of this
        worker's own (the one before it is removed once the engine serves the new one)."""
        start = time.perf_counter()
        state = self.actor.engine.adapter_state()
        if self._adapter_root is None:  # removed with the process (weakref.finalize)
            self._adapter_root = Path(tempfile.mkdtemp(prefix="tandem-adapters-"))
            weakref.finalize(self, shutil.rmtree, self._adapter_root, True)
        served = list(self._adapter_root.iterdir())
        folder = self._adapter_root / f"sync-{time.time_ns()}"
        save_adapter(folder, self.cfg.actor.lora, state, self.cfg.actor.model_path)
        self._role_rollout().load_adapter(folder)
        for old in served:
            shutil.rmtree(old, ignore_errors=True)
        self._metrics["timing_s/weight_sync"] = time.perf_counter() - start
        self._metrics["weight_sync/bytes"] = sum(t.numel() * t.element_size() for t in state.values())
        self._rollout_stale = False

    def _role_rollout(self) -> Any:
        if self.rollout is None:
            raise ValueError(f"worker group {self.ctx.group_name!r} has roles {list(self.roles)}, no rollout")
        return self.rollout

    def _record(self, out: Batch, seconds: float) -> None:
        # Rank-specific numbers leave through pop_metrics: merged batches need equal meta on all ranks.
        for key, value in out.meta.pop(METRICS_KEY, {}).items():
            self._metrics[f"rollout/{key}"] = value
        self._metrics["timing_s/generate"] = seconds

    @dispatch(Dispatch.ONE_TO_ALL)
    def profile_step(self, step: int, folder: str) -> None:
        """trainer.profile: the training step starting now, and the folder its traces go to (roles/profile.py)."""
        self._profiler.set_step(step, folder)

    # ---- forward passes --------------------------------------------------------------------------

    @dispatch(Dispatch.MP)
    @profiled
    def compute_log_probs(self, batch: Batch, with_entropy: bool = True) -> Batch:
        """old_log_probs (+ entropy) of the batch's responses under the current actor."""
        return self._role("actor").compute_log_probs(batch, with_entropy)

    @dispatch(Dispatch.MP)
    @profiled
    def compute_ref_log_probs(self, batch: Batch) -> Batch:
        """ref_log_probs under the reference policy."""
        return self._role("ref").compute_ref_log_probs(batch)

    @dispatch(Dispatch.MP)
    @profiled
    def compute_values(self, batch: Batch) -> Batch:
        """values of the response tokens under the critic."""
        return self._role("critic").compute_values(batch)

    @dispatch(Dispatch.MP)
    @profiled
    def compute_rm_scores(self, batch: Batch) -> Batch:
        """rm_scores per sample from the reward model."""
        return self._role("reward_model").compute_scores(batch)

    # ---- updates ---------------------------------------------------------------------------------

    @dispatch(Dispatch.MP)
    @profiled
    def update_actor(self, batch: Batch) -> dict[str, float]:
        """The PPO update of the actor on this rank's share; metrics are global (the same on every rank)."""
        metrics = self._role("actor").update(batch)
        self._rollout_stale = self.rollout is not None and self.actor is not None  # hybrid: in process
        return metrics

    @dispatch(Dispatch.MP)
    @profiled
    def update_critic(self, batch: Batch) -> dict[str, float]:
        """The value update of the critic; metrics are global."""
        return self._role("critic").update(batch)

    @dispatch(Dispatch.MP)
    def sft_step(self, batch: Batch) -> dict[str, float]:
        """One supervised optimizer step of the actor (loss on `loss_mask` tokens); metrics are global."""
        metrics = SFT(self._role("actor").engine, self.cfg).update(batch)
        self._rollout_stale = self.rollout is not None and self.actor is not None  # hybrid: in process
        return metrics

    @dispatch(Dispatch.MP)
    def sft_nll(self, batch: Batch) -> Batch:
        """Per row `nll_sum` and `num_tokens` of the `loss_mask` tokens under the actor."""
        return SFT(self._role("actor").engine, self.cfg).nll(batch)

    # ---- checkpoints, export, metrics --------------------------------------------------------------

    def _trainable(self) -> dict[str, TrainEngine]:
        return {name: role.engine for name, role in (("actor", self.actor), ("critic", self.critic)) if role}

    @dispatch(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> list[str]:
        """Sharded checkpoints of the trainable roles into path/<role>; returns the roles saved."""
        for name, engine in self._trainable().items():
            engine.save(Path(path) / name)
        return list(self._trainable())

    @dispatch(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str, weights_only: bool = False) -> list[str]:
        """Restore what save_checkpoint wrote (`weights_only`: the models' weights alone, for an export); the
        rollout is refreshed before the next generation."""
        for name, engine in self._trainable().items():
            folder = Path(path) / name
            if not folder.exists():
                raise FileNotFoundError(f"checkpoint {path} has no {name!r} folder (expected {folder})")
            engine.load(folder, weights_only=weights_only)
        self._rollout_stale = self.rollout is not None and self.actor is not None  # hybrid: in process
        return list(self._trainable())

    @dispatch(Dispatch.ONE_TO_ALL)
    def export_hf(self, role: str, path: str) -> None:
        """A Hugging Face folder of the role's current weights (rank 0 writes)."""
        self._role(role).engine.export_hf(path)

    @dispatch(Dispatch.RANK_ZERO)
    def full_weights(self, role: str) -> dict[str, torch.Tensor]:
        """{name: full tensor} of the role's model (gathered on every rank, returned by rank 0); for tests."""
        return {
            name: tensor.detach().cpu().clone() for name, tensor in self._role(role).engine.state_dict_iter()
        }

    @dispatch(Dispatch.ONE_TO_ALL)
    def pop_metrics(self) -> dict[str, float]:
        """This rank's timings and rollout numbers since the last call, and its peak memory so far."""
        metrics, self._metrics = self._metrics, {}
        if self._peak_flops:
            metrics["perf/peak_flops_per_device"] = self._peak_flops
        # ru_maxrss is in KiB on Linux: the process's peak resident memory since it started.
        metrics["memory/peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        if self.ctx.torch_device.type == "cuda":
            metrics["memory/peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
            metrics["memory/peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
        return metrics


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
    engine's stop ids, the actor's tokenizer (to render inserted messages)."""
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
    )
    return AgentLoop(
        tokenizer,
        rollout.eos_token_ids,
        settings=settings,
        tools=tools,
        interaction=build_interaction(m.interaction, m.interaction_file),
        pad_token_id=rollout.pad_token_id,
    )


def rollout_kwargs(
    cfg: TandemConfig, device: torch.device, dtype: torch.dtype | None = None
) -> dict[str, Any]:
    """The rollout engine's constructor arguments from the config; `dtype`: the actor engine's compute dtype
    (None: resolved from the actor's param_dtype here)."""
    kwargs: dict[str, Any] = {
        "model_path": cfg.actor.model_path,
        "tokenizer_path": cfg.actor.tokenizer_path,
        "device": device,
    }
    if resolve_engine(cfg.rollout.engine) == "vllm":
        r, d = cfg.rollout, cfg.data
        kwargs.update(
            dtype=dtype or actor_dtype(cfg, device),
            max_model_len=d.max_prompt_length + d.max_response_length,
            tensor_parallel=r.tensor_parallel,
            gpu_memory_utilization=r.gpu_memory_utilization,
            kv_cache_gib=r.cpu_kv_cache_gib,
            seed=cfg.trainer.seed,
        )
        if cfg.actor.lora.syncs_adapters:
            kwargs["lora_rank"] = cfg.actor.lora.rank
    return kwargs


def check_servable_adapters(vision_adapters: list[str]) -> None:
    """vLLM serves LoRA adapters on a vision-language model's language model only: adapters on its vision
    tower would be skipped without a word (measured on Qwen2-VL: rollout/trainer ratios 1.02-1.04 after the
    first sync), so the adapter sync refuses them."""
    if vision_adapters:
        raise ValueError(
            f"actor.lora.rollout_sync=adapter: vLLM does not serve LoRA adapters on the vision tower, and "
            f"actor.lora.target_modules puts {len(vision_adapters)} there ({', '.join(vision_adapters[:3])}, ...); "
            "name the language model's projections (e.g. [q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,"
            "down_proj]) or use actor.lora.rollout_sync=merged"
        )


def actor_dtype(cfg: TandemConfig, device: torch.device) -> torch.dtype:
    """The actor's compute dtype as its engine resolves it (megatron-core: float32 on a CPU)."""
    a = cfg.actor
    if a.strategy == "megatron":
        return resolve_param_dtype(a.megatron.param_dtype, device, "megatron.param_dtype", cpu_probe=False)
    return resolve_param_dtype(a.fsdp.param_dtype, device)

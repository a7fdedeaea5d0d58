"""The worker that hosts roles: any of actor, rollout, ref, critic, reward_model in one process.

Colocating actor + rollout (+ ref) in one worker is the hybrid engine: the rollout role (roles/rollout.py)
refreshes its engine from the actor's training engine before each generation after an update, in process,
one tensor at a time. Other layouts are several worker groups with different roles, on the same
or on separate resource pools (tandem.controller). With rollout.layout=separate the rollout engines
are a group of their own; the actor's rank 0 sends them the weights over a WeightBus, a process group
spanning both groups (join_weight_bus, send_weights / receive_weights).
"""

from __future__ import annotations

import resource
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from tandem.batch import Batch
from tandem.config.schema import OptimConfig, TandemConfig
from tandem.controller import Dispatch, Worker, WorkerContext, dispatch
from tandem.engine.base import Head, TrainEngine
from tandem.engine.flops import peak_flops
from tandem.roles.actor import Actor
from tandem.roles.common import balanced_parts, mini_batch_parts
from tandem.roles.critic import Critic
from tandem.roles.engines import role_engine
from tandem.roles.profile import PhaseProfiler, profiled
from tandem.roles.reference import Reference
from tandem.roles.reward_model import RewardModel
from tandem.roles.rollout import RolloutRole, check_servable_adapters
from tandem.roles.sft import SFT
from tandem.roles.weight_bus import WeightBus, free_address, send_from
from tandem.rollout import SamplingParams

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
            engine = self._engine(
                a.model_path,
                "lm",
                a.optim,
                a.grad_clip,
                lora=a.lora,
                override_config=a.override_config,
                freeze_vision_tower=a.freeze_vision_tower,
            )
            self.actor = Actor(engine, cfg)
        if "ref" in roles:
            if self.actor is not None and cfg.actor.lora.rank > 0:
                # the actor with its adapters off is the reference policy: no second copy of the base weights
                self.reference = Reference(self.actor.engine.without_adapter(), cfg)
            else:
                engine = self._engine(
                    cfg.actor.model_path,
                    "lm",
                    None,
                    None,
                    param_offload=cfg.reference.megatron_param_offload,
                    override_config=cfg.actor.override_config,  # verl's reference: the actor's model config
                )
                self.reference = Reference(engine, cfg)
        if "critic" in roles:
            c = cfg.critic
            engine = self._engine(
                c.model_path,
                "value",
                c.optim,
                c.grad_clip,
                lora=c.lora,
                override_config=c.override_config,
                override_key="critic.override_config",
                attn_implementation=c.attn_implementation,
            )
            self.critic = Critic(engine, cfg)
        if "reward_model" in roles:
            rm = cfg.reward.reward_model
            self.reward_model = RewardModel(self._engine(rm.model_path, "value", None, None), cfg)
        if "rollout" in roles:
            self.rollout = RolloutRole(cfg, ctx, self.actor.engine if self.actor is not None else None)
        if self.actor is not None and cfg.actor.lora.syncs_adapters:
            check_servable_adapters(self.actor.engine.vision_adapters(), self.actor.engine.expert_adapters())
        self._bus: WeightBus | None = None  # rollout.layout=separate, the actor's rank 0: the bus it sends on
        self._metrics: dict[str, float] = {}
        self._profiler = PhaseProfiler(cfg.trainer.profile, ctx.group_name, ctx.rank)
        models = (self.actor, self.reference, self.critic, self.reward_model)
        compiled = [r.engine.compile_seconds for r in models if r and r.engine.compile_seconds]
        if compiled:  # fsdp.torch_compile's and lm_head_compile's warm-ups, paid before the first step
            self._metrics["timing_s/compile"] = sum(compiled)
        # For perf/mfu/*: one device's FLOP/s in the dtype the updates run in (engine/flops.py)
        trained = self.actor if self.actor is not None else self.critic
        dtype = trained.engine.param_dtype if trained else None
        self._peak_flops = peak_flops(ctx.torch_device, dtype, cfg.trainer.peak_flops) if trained else None

    def _engine(
        self,
        model_path: str | None,
        head: Head,
        optim: OptimConfig | None,
        grad_clip: float | None,
        lora: Any = None,
        param_offload: bool = False,
        override_config: dict[str, Any] | None = None,
        override_key: str = "actor.override_config",
        attn_implementation: str | None = None,
        freeze_vision_tower: bool = False,
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
            param_offload=param_offload,
            override_config=override_config,
            override_key=override_key,
            attn_implementation=attn_implementation,
            freeze_vision_tower=freeze_vision_tower,
        )

    def dispatch_info(self) -> tuple[int, int, bool]:
        """Dispatch.MP layout from this worker's engines (they share one): plain data parallel on FSDP; on
        megatron the ranks of a tensor / pipeline group get the same rows and TP rank 0 of the last stage
        answers. Generation follows `replica_info` instead (the rollout's own tensor parallel)."""
        engines = [r.engine for r in (self.actor, self.critic, self.reference, self.reward_model) if r]
        return engines[0].dispatch_info() if engines else super().dispatch_info()

    def replica_info(self) -> tuple[int, int, bool]:
        """Dispatch.REPLICA layout: the rollout's (`RolloutRole.replica_info`), else one replica per rank."""
        return self.rollout.replica_info() if self.rollout is not None else super().replica_info()

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

    def _role_rollout(self) -> RolloutRole:
        if self.rollout is None:
            raise ValueError(f"worker group {self.ctx.group_name!r} has roles {list(self.roles)}, no rollout")
        return self.rollout

    # ---- rollout (roles/rollout.py) ------------------------------------------------------------------

    @dispatch(Dispatch.REPLICA)
    @profiled
    def generate(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        """n responses per prompt from this replica's prompts (one rank's, or those of the ranks of one
        tensor-parallel engine, which all run them); syncs the actor's weights first if stale.

        Give the prompts a `prompt_index` column (their index in the step) before the call, and seeded
        samples are the same whatever the number of ranks (rollout/base.py)."""
        return self._role_rollout().generate(prompts, sampling)

    @dispatch(Dispatch.ONE_TO_ALL)
    def sync_rollout_weights(self) -> None:
        """Copy the actor's current weights into the rollout engine now."""
        self._role_rollout().sync_now()

    # ---- weight sync of the separate layout ----------------------------------------------------

    @dispatch(Dispatch.ONE_TO_ALL)
    def weight_bus_address(self) -> str:
        """A free "host:port" on this rank's node, for a bus hosted by this group's rank 0."""
        return free_address()

    @dispatch(Dispatch.ONE_TO_ALL)
    def join_weight_bus(self, address: str, world_size: int, bucket_bytes: int, timeout_s: float) -> None:
        """Join the weight bus: the actor's rank 0 as its source (bus rank 0, hosting `address`), every
        rollout-only rank as a receiver (bus rank 1 + its rank); the actor's other ranks stay off it."""
        if self.actor is None:
            self._role_rollout().join_bus(address, world_size, bucket_bytes, timeout_s)
        elif self.ctx.rank == 0:
            device = str(self.ctx.torch_device)
            self._bus = WeightBus(
                address, 0, world_size, device=device, bucket_bytes=bucket_bytes, timeout_s=timeout_s
            )

    @dispatch(Dispatch.ONE_TO_ALL)
    def send_weights(self) -> None:
        """The actor's full weights to the rollout group (every actor rank takes part in the gathers)."""
        self._metrics.update(send_from(self._bus, self._role("actor").engine.state_dict_iter()))

    @dispatch(Dispatch.ONE_TO_ALL)
    def receive_weights(self, version: int = 0) -> None:
        """Load the weights the actor sends into this rank's rollout engine, bucket by bucket; ``version`` (the
        actor's update count) tags what a rollout stream generates with them (`RolloutRole.receive_weights`)."""
        self._role_rollout().receive_weights(version)

    # ---- streaming generation (trainer.async_mode=streaming) ----------------------------------------

    @dispatch(Dispatch.ONE_TO_ALL)
    def stream_submit(self, prompts: Batch, sampling: SamplingParams) -> int:
        """Start generating this rank's share of the prompts (rows rank, rank + world size, ...) in the
        background; returns the number of groups it took. Give the prompts a `prompt_index` column first,
        and seeded samples do not depend on the number of ranks."""
        return self._role_rollout().stream_submit(prompts, sampling)

    @dispatch(Dispatch.ONE_TO_ALL)
    def stream_collect(self, min_groups: int, timeout_s: float) -> tuple[list[Batch], dict[str, float]]:
        """This rank's finished groups (waiting up to ``timeout_s`` for ``min_groups``) and its numbers."""
        return self._role_rollout().stream_collect(min_groups, timeout_s)

    def _weights_changed(self) -> None:
        if self.rollout is not None:  # hybrid: synced in process before the next generation
            self.rollout.weights_changed()

    @dispatch(Dispatch.ONE_TO_ALL)
    def profile_step(self, step: int, folder: str) -> None:
        """trainer.profile: the training step starting now, and the folder its traces go to (roles/profile.py)."""
        self._profiler.set_step(step, folder)

    # ---- forward passes --------------------------------------------------------------------------

    @dispatch(Dispatch.MP, parts=balanced_parts)
    @profiled
    def compute_log_probs(self, batch: Batch, with_entropy: bool = True) -> Batch:
        """old_log_probs (+ entropy) of the batch's responses under the current actor."""
        return self._role("actor").compute_log_probs(batch, with_entropy)

    @dispatch(Dispatch.MP, parts=balanced_parts)
    @profiled
    def compute_ref_log_probs(self, batch: Batch) -> Batch:
        """ref_log_probs under the reference policy."""
        return self._role("ref").compute_ref_log_probs(batch)

    @dispatch(Dispatch.MP, parts=balanced_parts)
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

    @dispatch(Dispatch.MP, parts=mini_batch_parts)
    @profiled
    def update_actor(self, batch: Batch, mini_batches: int) -> dict[str, float]:
        """The PPO update of the actor on this rank's part of each of the `mini_batches` mini-batches of
        `batch` (`mini_batch_parts`); metrics are global (the same on every rank)."""
        metrics = self._role("actor").update(batch, mini_batches)
        self._weights_changed()
        return metrics

    @dispatch(Dispatch.MP, parts=mini_batch_parts)
    @profiled
    def update_critic(self, batch: Batch, mini_batches: int) -> dict[str, float]:
        """The value update of the critic, mini-batches as for `update_actor`; metrics are global."""
        return self._role("critic").update(batch, mini_batches)

    @dispatch(Dispatch.MP)
    def sft_step(self, batch: Batch) -> dict[str, float]:
        """One supervised optimizer step of the actor (loss on `loss_mask` tokens); metrics are global."""
        metrics = SFT(self._role("actor").engine, self.cfg).update(batch)
        self._weights_changed()
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
        self._weights_changed()
        return list(self._trainable())

    @dispatch(Dispatch.ONE_TO_ALL)
    def export_hf(self, role: str, path: str) -> None:
        """A Hugging Face folder of the role's current weights (rank 0 writes)."""
        self._role(role).engine.export_hf(path)

    @dispatch(Dispatch.RANK_ZERO)
    def full_weights(self, role: str) -> dict[str, torch.Tensor]:
        """{name: full tensor} of the role's model (gathered on every rank, returned by rank 0); for tests."""
        weights = self._role(role).engine.state_dict_iter()
        return {name: tensor.detach().cpu().clone() for name, tensor in weights}

    @dispatch(Dispatch.ONE_TO_ALL)
    def pop_metrics(self) -> dict[str, float]:
        """This rank's timings and rollout numbers since the last call, and its peak memory so far."""
        rollout = self.rollout.pop_metrics() if self.rollout is not None else {}
        metrics, self._metrics = {**rollout, **self._metrics}, {}
        if self._peak_flops:
            metrics["perf/peak_flops_per_device"] = self._peak_flops
        # ru_maxrss is in KiB on Linux: the process's peak resident memory since it started.
        metrics["memory/peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        if self.ctx.torch_device.type == "cuda":
            metrics["memory/peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
            metrics["memory/peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
        return metrics
